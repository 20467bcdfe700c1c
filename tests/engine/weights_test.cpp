// moe-run's checkpoint reader: tensors checked against the config, errors naming the tensor;
// experts encoded per precision with the [w1][w3][w2] blob layout.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine_test_support.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;

namespace {
nlohmann::json fixture_config(const std::filesystem::path& dir) {
  std::ifstream in(dir / "config.json");
  return nlohmann::json::parse(in);
}
std::string load_error(const nlohmann::json& j, const std::filesystem::path& dir) {
  try {
    (void)load_weights(parse_config(j, "config.json"), dir, {Precision::f32});
  } catch (const moekit::Error& e) {
    return e.message();
  }
  return {};
}
}  // namespace

TEST_CASE("checkpoint tensors that do not fit the config are named", "[engine][weights]") {
  const auto dir = engine_test::data_dir() / "mixtral";
  if (!std::filesystem::exists(dir / "config.json")) {
    WARN("fixture tests/data/mixtral is missing; skipped");
    return;
  }
  auto j = fixture_config(dir);
  j["intermediate_size"] = 64;
  std::string msg = load_error(j, dir);
  INFO(msg);
  CHECK(msg.find("model.layers.0.block_sparse_moe.experts.0.w1.weight") != std::string::npos);
  CHECK(msg.find("[32, 32]") != std::string::npos);  // what the file has
  CHECK(msg.find("[64, 32]") != std::string::npos);  // what the config implies

  j = fixture_config(dir);
  j["num_hidden_layers"] = 3;
  msg = load_error(j, dir);
  INFO(msg);
  CHECK(msg.find("model.layers.2.input_layernorm.weight") != std::string::npos);

  CHECK(load_error(fixture_config(dir), dir).empty());
}

TEST_CASE("host experts hold each precision in the expert blob layout", "[engine][weights]") {
  const moekit::ModelShape s{.n_layers = 1, .n_experts = 2, .top_k = 1, .hidden = 32, .ffn = 64};
  HostExperts ex(s, {Precision::f32, Precision::q8});
  std::vector<float> w1(64 * 32), w3(64 * 32), w2(32 * 64);
  for (std::size_t i = 0; i < w1.size(); ++i) {
    w1[i] = 0.01f * float(i % 17);
    w3[i] = -0.02f * float(i % 5);
    w2[i] = 0.03f * float(i % 7);
  }
  ex.set({0, 1}, w1, w3, w2);
  CHECK(ex.total_bytes() == 2 * (s.expert_bytes(Precision::f32) + s.expert_bytes(Precision::q8)));
  const auto f32 = ex.bytes({0, 1}, Precision::f32);
  REQUIRE(f32.size() == s.expert_bytes(Precision::f32));
  const moekit::ExpertWeights v = moekit::io::expert_view(s, f32, Precision::f32);
  CHECK(reinterpret_cast<const float*>(v.w1.data)[5] == w1[5]);
  CHECK(reinterpret_cast<const float*>(v.w3.data)[7] == w3[7]);
  CHECK(reinterpret_cast<const float*>(v.w2.data)[9] == w2[9]);
  CHECK(ex.bytes({0, 1}, Precision::q8).size() == s.expert_bytes(Precision::q8));
  CHECK_THROWS_AS(ex.bytes({0, 1}, Precision::q4), moekit::Error);
  CHECK_THROWS_AS(ex.bytes({1, 0}, Precision::f32), moekit::Error);
}
