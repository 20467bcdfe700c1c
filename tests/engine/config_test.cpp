// moe-run's config.json reader: the three architectures' fields and errors that name the field.

#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "engine_test_support.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/tensor_census.hpp"

using namespace moekit::engine;
using nlohmann::json;

namespace {

json mixtral_json() {
  return json{{"model_type", "mixtral"}, {"vocab_size", 320},        {"hidden_size", 32},
              {"num_hidden_layers", 2},  {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"intermediate_size", 32}, {"num_local_experts", 4},   {"num_experts_per_tok", 2},
              {"rms_norm_eps", 1e-5},    {"rope_theta", 50000.0},    {"sliding_window", nullptr},
              {"eos_token_id", 2},       {"bos_token_id", 1}};
}

json qwen_json() {
  return json{{"model_type", "qwen2_moe"},
              {"vocab_size", 320},
              {"hidden_size", 32},
              {"num_hidden_layers", 4},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 4},
              {"intermediate_size", 128},
              {"moe_intermediate_size", 32},
              {"shared_expert_intermediate_size", 64},
              {"num_experts", 8},
              {"num_experts_per_tok", 4},
              {"rope_parameters", {{"rope_theta", 20000.0}, {"rope_type", "default"}}}};
}

// The message of the moekit::Error `f` throws (empty if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const moekit::Error& e) {
    return e.message();
  }
  return {};
}

}  // namespace

TEST_CASE("Mixtral config: fields, defaults and the sliding window", "[engine][config]") {
  json j = mixtral_json();
  ModelConfig c = parse_config(j, "m/config.json");
  CHECK(c.arch == Architecture::mixtral);
  CHECK(c.head_dim == 8);
  CHECK(c.kv_dim() == 16);
  CHECK(c.rope_theta == 50000.0);
  CHECK(c.norm_topk_prob);  // Mixtral always renormalises
  CHECK(c.window == std::vector<std::uint32_t>{0, 0});
  CHECK(c.n_moe_layers == 2);
  CHECK(c.bos_token_id == 1u);
  CHECK(c.eos_token_ids == std::vector<std::uint32_t>{2});
  const auto s = c.shape();
  CHECK(s.n_experts == 4);
  CHECK(s.top_k == 2);
  CHECK(s.ffn == 32);

  j["sliding_window"] = 8;
  j.erase("rope_theta");
  c = parse_config(j, "m/config.json");
  CHECK(c.window == std::vector<std::uint32_t>{8, 8});
  CHECK(c.rope_theta == 1e6);  // MixtralConfig.default_theta
}

TEST_CASE("Qwen2-MoE config: shared expert, sparse step and mlp-only layers", "[engine][config]") {
  json j = qwen_json();
  ModelConfig c = parse_config(j, "q/config.json");
  CHECK(c.shared_ffn == 64);
  CHECK_FALSE(c.norm_topk_prob);
  CHECK(c.qkv_bias);
  CHECK(c.rope_theta == 20000.0);
  CHECK(c.moe_index == std::vector<std::int32_t>{0, 1, 2, 3});
  CHECK(c.shape().n_shared_experts == 1);

  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  c = parse_config(j, "q/config.json");
  CHECK(c.moe_index == std::vector<std::int32_t>{-1, 0, -1, -1});
  CHECK(c.n_moe_layers == 1);
  CHECK(c.dense_ffn == 128);

  j = qwen_json();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 16;
  j["max_window_layers"] = 2;
  c = parse_config(j, "q/config.json");
  CHECK(c.window == std::vector<std::uint32_t>{16, 0, 0, 0});  // odd (i+1) and i < max_window
}

TEST_CASE("config errors name the file and the field", "[engine][config]") {
  auto fails_with = [](json j, const std::string& field) {
    const std::string msg = error_of([&] { (void)parse_config(j, "dir/config.json"); });
    INFO(msg);
    CHECK(msg.find("dir/config.json") != std::string::npos);
    CHECK(msg.find(field) != std::string::npos);
  };
  json j = mixtral_json();
  j.erase("hidden_size");
  fails_with(j, "'hidden_size' is missing");
  j = mixtral_json();
  j["num_key_value_heads"] = 3;
  fails_with(j, "num_key_value_heads");
  j = mixtral_json();
  j["model_type"] = "llama";
  fails_with(j, "model_type");
  j = mixtral_json();
  j["hidden_act"] = "gelu";
  fails_with(j, "hidden_act");
  j = mixtral_json();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}};
  fails_with(j, "rope_parameters.rope_type");
  j = mixtral_json();
  j["sliding_window"] = 0;
  fails_with(j, "sliding_window");
  j = mixtral_json();
  j["num_experts_per_tok"] = 5;
  fails_with(j, "num_experts_per_tok");
  j = mixtral_json();
  j["vocab_size"] = "many";
  fails_with(j, "vocab_size");
  j = qwen_json();
  j["mlp_only_layers"] = {0, 1, 2, 3};
  fails_with(j, "mlp_only_layers");
  j = mixtral_json();
  j["num_hidden_layers"] = 1000000000;  // bounded before any per-layer table is sized
  fails_with(j, "'num_hidden_layers' is 1000000000, more than moekit reads");
  j = mixtral_json();
  j["num_local_experts"] = 1000000000;
  fails_with(j, "'num_local_experts' is 1000000000, more than moekit reads");
  j = mixtral_json();
  j["head_dim"] = 0;
  fails_with(j, "'head_dim' must be > 0");
  j = qwen_json();
  j["layer_types"] = {"full_attention", "chunked_attention", "full_attention", "full_attention"};
  fails_with(j, "layer_types");

  const std::string missing = error_of([] { (void)load_config("/nonexistent/model"); });
  CHECK(missing.find("/nonexistent/model/config.json") != std::string::npos);
}

TEST_CASE("the fixtures' config.json files parse", "[engine][config]") {
  for (const char* name : {"mixtral", "mixtral_swa", "qwen2_moe", "olmoe"}) {
    const auto dir = engine_test::data_dir() / name;
    if (!std::filesystem::exists(dir / "config.json")) {
      WARN("fixture " << name << " missing; skipped");
      continue;
    }
    const ModelConfig c = load_config(dir);
    INFO(name);
    CHECK(c.vocab_size == 320);
    CHECK(c.qk_norm == (std::string(name) == "olmoe"));
    CHECK((c.window[0] == 8) == (std::string(name) == "mixtral_swa"));
  }
}

TEST_CASE("tensor census: layer and expert counts against the tensors present",
          "[engine][config]") {
  ModelConfig c = parse_config(mixtral_json(), "dir/config.json");
  std::vector<std::string> names{"model.embed_tokens.weight", "lm_head.weight"};
  for (std::uint32_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    names.push_back(p + "self_attn.q_proj.weight");
    for (std::uint32_t e = 0; e < c.n_experts; ++e)
      names.push_back(p + "block_sparse_moe.experts." + std::to_string(e) + ".w1.weight");
  }
  moekit::engine::check_tensor_census(c, names, "dir");  // agrees
  auto refused = [&](const ModelConfig& cfg, const std::vector<std::string>& n,
                     const std::string& want) {
    const std::string msg = error_of([&] { moekit::engine::check_tensor_census(cfg, n, "dir"); });
    INFO(msg);
    CHECK(msg.find("dir/config.json") != std::string::npos);
    CHECK(msg.find(want) != std::string::npos);
  };
  ModelConfig fewer = c;
  fewer.n_layers = c.n_layers - 1;
  refused(fewer, names,
          "'num_hidden_layers' is " + std::to_string(fewer.n_layers) +
              " but the checkpoint 'dir' holds tensors of " + std::to_string(c.n_layers) +
              " layers");
  ModelConfig more = c;
  more.n_layers = c.n_layers + 1;
  more.moe_index.push_back(static_cast<std::int32_t>(c.n_layers));
  refused(more, names, "has no tensor of layer " + std::to_string(c.n_layers));
  ModelConfig fewer_experts = c;
  fewer_experts.n_experts = c.n_experts - 1;
  refused(fewer_experts, names, "would be unused");
  ModelConfig more_experts = c;
  more_experts.n_experts = c.n_experts + 1;
  refused(more_experts, names, "has no tensor of expert " + std::to_string(c.n_experts));
  // The dense part alone (experts in a store): no expert named, none checked.
  std::vector<std::string> dense;
  for (const auto& n : names)
    if (n.find("experts.") == std::string::npos) dense.push_back(n);
  moekit::engine::check_tensor_census(c, dense, "dir");
}
