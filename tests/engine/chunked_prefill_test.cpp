// Chunked prefill (moe-run --ubatch-size N, llama.cpp's -ub): the prompt run in forwards of at
// most N tokens gives the one-forward logits bit for bit, on every fixture (full attention,
// sliding window, shared expert, QK-norm, dense MLP layers), also under a budget that evicts.

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/precision/thread_pool.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/cli.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;

namespace {

// Prefill (all logits, or only the last) with `ubatch`, then `steps` greedy decode steps.
template <class Pipeline>
std::vector<float> run(const ModelConfig& cfg, const DenseWeights& dense, Pipeline& p,
                       std::span<const Token> prompt, std::uint32_t ubatch, bool all_logits,
                       int steps, moekit::ThreadPool* pool) {
  Model<Pipeline> model(cfg, dense, p, static_cast<std::uint32_t>(prompt.size() + steps), pool);
  model.set_ubatch(ubatch);
  model.begin_sequence();
  const auto pre = model.prefill(prompt, all_logits);
  std::vector<float> out(pre.begin(), pre.end());
  const std::size_t V = cfg.vocab_size;
  Token next = engine_test::argmax(pre.data() + pre.size() - V, V);
  for (int i = 0; i < steps; ++i) {
    const auto lg = model.decode(next);
    out.insert(out.end(), lg.begin(), lg.end());
    next = engine_test::argmax(lg.data(), V);
  }
  return out;
}

}  // namespace

TEST_CASE("chunked prefill equals one-forward prefill bit for bit", "[engine][ubatch]") {
  moekit::ThreadPool pool(2);
  for (const auto& dir :
       {engine_test::data_dir() / "mixtral", engine_test::data_dir() / "mixtral_swa",
        engine_test::data_dir() / "qwen2_moe", engine_test::data_dir() / "olmoe",
        std::filesystem::path(MOEKIT_SOURCE_DIR) / "tests/engine/data/qwen2_moe_dense"}) {
    const std::string name = dir.filename().string();
    INFO(name);
    const ModelConfig cfg = load_config(dir);
    const ModelWeights w = load_weights(cfg, dir, {Precision::f32});
    const auto ref = engine_test::load_reference(dir);
    const auto s = cfg.shape();
    for (std::size_t budget : {std::size_t{0}, minimum_expert_budget(s, Precision::f32)}) {
      const OffloadSettings o{budget, Precision::f32};
      for (bool all : {true, false}) {
        const auto whole = with_pipeline<moekit::presets::BaselineSpec>(
            s, o, w.experts,
            [&](auto& p) { return run(cfg, w.dense, p, ref.prompt_ids, 0, all, 6, &pool); });
        const std::size_t row = all ? 0 : ref.prompt_ids.size() - 1;  // first row returned
        CHECK(engine_test::relative_error(whole.data(), ref.logits.data() + row * cfg.vocab_size,
                                          cfg.vocab_size) <= 1e-4);
        for (std::uint32_t ub : {1u, 2u, 3u, 7u, 8u, 19u, 20u, 512u}) {
          INFO("budget " << budget << ", ubatch " << ub << ", all logits " << all);
          const auto chunked = with_pipeline<moekit::presets::BaselineSpec>(
              s, o, w.experts,
              [&](auto& p) { return run(cfg, w.dense, p, ref.prompt_ids, ub, all, 6, &pool); });
          REQUIRE(chunked.size() == whole.size());
          CHECK(std::memcmp(chunked.data(), whole.data(), whole.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("the prefill chunk flag (--ubatch-size, --ubatch) sets the chunk; 0 is refused",
          "[engine][ubatch][cli]") {
  auto parse = [](std::vector<const char*> args, std::string* err = nullptr) {
    args.insert(args.begin(), "moe-run");
    Cli cli;
    std::ostringstream out, e;
    const int rc = cli.parse(static_cast<int>(args.size()), args.data(), out, e);
    if (err) *err = e.str();
    return std::pair{rc, cli.options().ubatch};
  };
  CHECK(parse({}).second == 512);
  CHECK(parse({"--ubatch", "32"}) == std::pair{0, 32u});
  CHECK(parse({"--ubatch-size", "7"}) == std::pair{0, 7u});
  std::string err;
  CHECK(parse({"--ubatch-size", "0"}, &err).first != 0);
  CHECK(err.find("ubatch") != std::string::npos);
}
