// llama.cpp as a second logits reference for the default model (issue 9): moe-run's engine on
// models/moekit-tiny-moe (safetensors, f32) against llama.cpp on the same weights as an f32 GGUF.
//
// The reference is the committed fixture tests/engine/data/moekit_tiny_moe_llama_cpp.json,
// written by `bench/engine/llama_cpp_peer.sh reference` (it installs llama-cpp-python built for
// this CPU, converts the checkpoint with bench/engine/llama_cpp_gguf.py and runs
// bench/engine/llama_cpp_peer.py), so the test runs without llama.cpp.
// MOEKIT_LLAMA_CPP_REFERENCE points at another copy. When the model is retrained the fixture no
// longer matches its reference.json and the test says to rerun the script.

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

namespace {

std::filesystem::path reference_path() {
  if (const char* p = std::getenv("MOEKIT_LLAMA_CPP_REFERENCE")) return p;
  return std::filesystem::path(MOEKIT_SOURCE_DIR) /
         "tests/engine/data/moekit_tiny_moe_llama_cpp.json";
}

// The transformers tests' bound. llama.cpp runs the f32 GGUF with an f32 KV cache and f32
// matmuls, so only summation order separates it from moe-run: measured 4.1e-7 (llama-cpp-python
// 0.3.36, native AVX-512 build; llama.cpp itself is 5.5e-7 from transformers' top-5 logits).
constexpr double tolerance = 1e-4;

}  // namespace

TEST_CASE("moekit-tiny-moe matches llama.cpp's logits when its reference is present",
          "[engine][golden][tiny][llama_cpp]") {
  const std::filesystem::path ref_path = reference_path();
  if (!std::filesystem::exists(ref_path)) {
    WARN("skipped: " << ref_path.string()
                     << " not present (bench/engine/llama_cpp_peer.sh reference writes it; needs "
                        "llama-cpp-python)");
    return;
  }
  std::ifstream in(ref_path);
  const auto ref = nlohmann::json::parse(in);
  const std::filesystem::path dir =
      std::filesystem::path(MOEKIT_SOURCE_DIR) / "models/moekit-tiny-moe";
  REQUIRE(std::filesystem::exists(dir / "reference.json"));

  // The fixture belongs to this checkpoint: the sequence is the model's own greedy continuation.
  {
    std::ifstream min(dir / "reference.json");
    const auto model_ref = nlohmann::json::parse(min);
    INFO(ref_path.string() << " was made for another checkpoint (its sequence differs from "
                           << dir.string()
                           << "/reference.json): rerun bench/engine/llama_cpp_peer.sh reference");
    REQUIRE(ref.at("sequence_ids") == model_ref.at("sequence_ids"));
    REQUIRE(ref.at("prompt_ids") == model_ref.at("prompt_ids"));
  }
  const ModelConfig cfg = load_config(dir);
  const std::size_t V = cfg.vocab_size;

  // Same prompt tokens as llama.cpp's own SentencePiece tokeniser (read from the GGUF vocabulary).
  const Tokenizer tok(dir / "tokenizer.model");
  CHECK(tok.encode(ref.at("prompt_text").get<std::string>(), true) ==
        ref.at("llama_prompt_ids").get<std::vector<std::uint32_t>>());

  const ModelWeights w = load_weights(cfg, dir, {Precision::f32});
  const auto shape = cfg.shape();
  Baseline pipeline(shape, pipeline_config(shape, {0, Precision::f32}), host_loader(w.experts),
                    moekit::UniformScorer({Precision::f32}));
  moekit::ThreadPool pool(2);

  // Teacher-forced like llama.cpp's run: prefill of the prompt, then one decode step per token.
  const auto seq = ref.at("sequence_ids").get<std::vector<std::uint32_t>>();
  const std::size_t P = ref.at("prompt_ids").size();
  REQUIRE(P >= 1);
  REQUIRE(seq.size() > P);
  const auto rows = engine_test::teacher_forced(cfg, w.dense, pipeline,
                                                std::span<const std::uint32_t>(seq), P, &pool);
  REQUIRE(rows.size() == seq.size() * V);

  const auto top_ids = ref.at("top_ids").get<std::vector<std::vector<std::uint32_t>>>();
  const auto top_logits = ref.at("top_logits").get<std::vector<std::vector<float>>>();
  REQUIRE(top_ids.size() == seq.size());
  REQUIRE(top_logits.size() == seq.size());
  for (const auto& ids : top_ids) {
    REQUIRE(ids.size() >= 2);
    for (auto id : ids) REQUIRE(id < V);
  }
  const double worst = engine_test::worst_top_k_error(rows, V, top_ids, top_logits);
  // The argmax, wherever llama.cpp's top-2 gap is well above both engines' error.
  std::size_t argmax_agree = 0, comparable = 0;
  for (std::size_t t = 0; t < seq.size(); ++t) {
    REQUIRE(top_ids[t].size() == top_logits[t].size());
    double scale = 0;
    for (float v : top_logits[t]) scale = std::max(scale, double(std::abs(v)));
    if (top_logits[t][0] - top_logits[t][1] > 1e-3 * scale) {
      ++comparable;
      if (engine_test::argmax(rows.data() + t * V, V) == top_ids[t][0]) ++argmax_agree;
    }
  }
  INFO("worst relative error of llama.cpp's top-" << top_ids[0].size() << " logits: " << worst);
  CHECK(worst <= tolerance);
  INFO("argmax equal at " << argmax_agree << " of " << comparable << " positions with a clear gap");
  CHECK(argmax_agree == comparable);
  CHECK(comparable > 0);
}
