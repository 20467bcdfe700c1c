// The default model, models/moekit-tiny-moe (a trained Mixtral-architecture model with the real
// Mixtral tokenizer, bf16 weights), against transformers' reference.json written when its training
// finished: prompt tokenisation, top-5 logits at every position, greedy tokens.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/precision/thread_pool.hpp"
#include "moekit/presets.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/tokenizer.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;
using Baseline = moekit::presets::Baseline<moekit::MemoryLoader>;

TEST_CASE("moekit-tiny-moe matches transformers' reference", "[engine][golden][tiny]") {
  // MOEKIT_TINY_MODEL_DIR points the test at another copy (e.g. a checkpoint being trained).
  const char* override_dir = std::getenv("MOEKIT_TINY_MODEL_DIR");
  const std::filesystem::path dir =
      override_dir ? std::filesystem::path(override_dir)
                   : std::filesystem::path(MOEKIT_SOURCE_DIR) / "models/moekit-tiny-moe";
  if (!std::filesystem::exists(dir / "reference.json")) {
    WARN(dir.string() << "/reference.json not present (written when training finishes); skipped");
    return;
  }
  std::ifstream in(dir / "reference.json");
  const auto ref = nlohmann::json::parse(in);
  const ModelConfig cfg = load_config(dir);
  const Tokenizer tok(dir / "tokenizer.model");
  const auto prompt_ids = ref.at("prompt_ids").get<std::vector<std::uint32_t>>();
  CHECK(tok.encode(ref.at("prompt_text").get<std::string>(), true) == prompt_ids);

  const ModelWeights w = load_weights(cfg, dir, {Precision::f32});
  const auto shape = cfg.shape();
  Baseline pipeline(shape, pipeline_config(shape, {0, Precision::f32}), host_loader(w.experts),
                    moekit::UniformScorer({Precision::f32}));
  moekit::ThreadPool pool(2);

  // Teacher-forced over sequence_ids: prefill of the prompt, then one decode step per token.
  const auto seq = ref.at("sequence_ids").get<std::vector<std::uint32_t>>();
  const auto top_ids = ref.at("top5_ids").get<std::vector<std::vector<std::uint32_t>>>();
  const auto top_logits = ref.at("top5_logits").get<std::vector<std::vector<float>>>();
  const auto gaps = ref.at("greedy_gaps").get<std::vector<double>>();
  const auto generated = ref.at("generated_ids").get<std::vector<std::uint32_t>>();
  const std::size_t V = cfg.vocab_size, P = prompt_ids.size();
  REQUIRE(seq.size() > P);
  const auto rows = engine_test::teacher_forced(cfg, w.dense, pipeline,
                                                std::span<const std::uint32_t>(seq), P, &pool);
  REQUIRE(rows.size() == seq.size() * V);
  REQUIRE(top_ids.size() == seq.size());
  const double worst = engine_test::worst_top_k_error(rows, V, top_ids, top_logits);
  INFO("worst relative error of the top-5 logits: " << worst);
  CHECK(worst <= 1e-4);

  // Greedy tokens: compared wherever the reference's top-2 gap is well above the engine's error.
  REQUIRE(generated.size() == gaps.size());
  for (std::size_t i = 0; i < generated.size(); ++i) {
    if (gaps[i] < 1e-3) continue;
    INFO("greedy step " << i << ", gap " << gaps[i]);
    CHECK(engine_test::argmax(rows.data() + (P - 1 + i) * V, V) == generated[i]);
  }
}
