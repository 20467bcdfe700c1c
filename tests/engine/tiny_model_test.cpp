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

#include "config.hpp"
#include "engine_test_support.hpp"
#include "model.hpp"
#include "offload.hpp"
#include "tokenizer.hpp"
#include "weights.hpp"

using namespace moe_run;
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
  Model<Baseline> model(cfg, w.dense, pipeline, 256, &pool);
  model.begin_sequence();

  // Teacher-forced over sequence_ids: prefill of the prompt, then one decode step per token.
  const auto seq = ref.at("sequence_ids").get<std::vector<std::uint32_t>>();
  const auto top_ids = ref.at("top5_ids").get<std::vector<std::vector<std::uint32_t>>>();
  const auto top_logits = ref.at("top5_logits").get<std::vector<std::vector<float>>>();
  const auto gaps = ref.at("greedy_gaps").get<std::vector<double>>();
  const auto generated = ref.at("generated_ids").get<std::vector<std::uint32_t>>();
  const std::size_t V = cfg.vocab_size, P = prompt_ids.size();
  std::vector<float> rows;
  const auto pre = model.prefill(std::span<const std::uint32_t>(seq).first(P), /*all_logits=*/true);
  rows.assign(pre.begin(), pre.end());
  for (std::size_t t = P; t < seq.size(); ++t) {
    const auto lg = model.decode(seq[t]);
    rows.insert(rows.end(), lg.begin(), lg.end());
  }
  REQUIRE(rows.size() == seq.size() * V);
  REQUIRE(top_ids.size() == seq.size());

  double worst = 0;
  for (std::size_t t = 0; t < seq.size(); ++t) {
    double scale = 0;
    for (float v : top_logits[t]) scale = std::max(scale, double(std::abs(v)));
    for (std::size_t j = 0; j < top_ids[t].size(); ++j) {
      const double e = std::abs(rows[t * V + top_ids[t][j]] - top_logits[t][j]) / scale;
      worst = std::max(worst, e);
    }
  }
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
