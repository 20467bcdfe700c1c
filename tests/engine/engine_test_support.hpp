#pragma once
// Helpers shared by the engine tests: fixture discovery, the reference files, scratch
// directories and greedy runs of moe-run's Model.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "moekit/engine/config.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/weights.hpp"

namespace engine_test {

inline std::filesystem::path data_dir() { return MOEKIT_TEST_DATA_DIR; }

/// The transformers fixtures of the three architectures (tests/data, scripts/make_fixtures.py).
inline std::vector<std::filesystem::path> architecture_fixtures() {
  return {data_dir() / "mixtral", data_dir() / "qwen2_moe", data_dir() / "olmoe"};
}

/// A checkpoint's config and weights, on the heap (the weights are large).
struct LoadedModel {
  moekit::engine::ModelConfig cfg;
  moekit::engine::ModelWeights weights;
};

/// The checkpoint in `dir` with its experts at `p`; null when the fixture has no reference.json.
inline std::unique_ptr<LoadedModel> load_model(const std::filesystem::path& dir,
                                               moekit::Precision p = moekit::Precision::f32) {
  if (!std::filesystem::exists(dir / "reference.json")) return nullptr;
  auto l = std::make_unique<LoadedModel>();
  l->cfg = moekit::engine::load_config(dir);
  l->weights = moekit::engine::load_weights(l->cfg, dir, {p});
  return l;
}

/// reference.json of a fixture, with its f32 logits [n_positions × vocab].
struct Reference {
  nlohmann::json json;
  std::vector<std::uint32_t> prompt_ids, generated_ids, sequence_ids;
  std::vector<float> logits;
  std::size_t vocab = 0;
};

inline std::vector<float> read_f32(const std::filesystem::path& p, std::size_t count) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw moekit::Error(moekit::ErrorKind::io, "cannot open " + p.string());
  std::vector<float> v(count);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(float)));
  if (in.gcount() != static_cast<std::streamsize>(count * sizeof(float)))
    throw moekit::Error(moekit::ErrorKind::invalid_format, p.string() + " is too short");
  return v;
}

/// The reference of `dir`: reference.json, or the object `key` of another JSON file in `dir`
/// (gguf_reference.json's "q8_0").
inline Reference load_reference(const std::filesystem::path& dir,
                                const std::string& file = "reference.json",
                                const std::string& key = "") {
  Reference r;
  std::ifstream in(dir / file);
  r.json = nlohmann::json::parse(in);
  if (!key.empty()) r.json = nlohmann::json(r.json.at(key));
  r.prompt_ids = r.json.at("prompt_ids").get<std::vector<std::uint32_t>>();
  r.generated_ids = r.json.at("generated_ids").get<std::vector<std::uint32_t>>();
  r.sequence_ids = r.json.at("sequence_ids").get<std::vector<std::uint32_t>>();
  const auto shape = r.json.at("logits").at("shape").get<std::vector<std::size_t>>();
  r.vocab = shape.at(1);
  r.logits = read_f32(dir / r.json.at("logits").at("file").get<std::string>(), shape[0] * shape[1]);
  return r;
}

/// ‖a − b‖∞ / ‖b‖∞.
inline double relative_error(const float* a, const float* b, std::size_t n) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
    ref = std::max(ref, double(std::abs(b[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

inline std::uint32_t argmax(const float* v, std::size_t n) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return static_cast<std::uint32_t>(best);
}

/// What a shell command did: its exit status (-1 when it did not exit normally) and output.
struct Command {
  int status = -1;
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& f) {
  std::ifstream in(f);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Runs `cmd` through the shell; its stderr goes through `scratch`/stderr.txt.
inline Command run_command(const std::string& cmd, const std::filesystem::path& scratch) {
  const std::filesystem::path err = scratch / "stderr.txt";
  Command c;
  FILE* pipe = ::popen((cmd + " 2>'" + err.string() + "'").c_str(), "r");
  if (pipe == nullptr) return c;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) c.out.append(buf, n);
  const int status = ::pclose(pipe);
  c.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  c.err = slurp(err);
  return c;
}

/// A fresh directory in the build tree (on disk: O_DIRECT is refused by tmpfs).
inline std::filesystem::path scratch(const std::string& area, const std::string& name) {
  const std::filesystem::path d =
      std::filesystem::path(MOEKIT_BINARY_DIR) / "test-scratch" / area / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

/// A greedy run: logits of every position (prefill rows, then one row per decode step),
/// row-major, and the generated tokens (the prefill's argmax, then each step's).
struct GreedyRun {
  std::vector<float> logits;
  std::vector<moekit::engine::Token> tokens;
};

/// Prefills `prompt` (all logits) then decodes `steps` greedy tokens, feeding back each argmax.
template <class Pipeline>
GreedyRun greedy(const moekit::engine::ModelConfig& cfg, const moekit::engine::DenseWeights& dense,
                 Pipeline& pipeline, std::span<const moekit::engine::Token> prompt, int steps,
                 moekit::ThreadPool* pool) {
  moekit::engine::Model<Pipeline> model(
      cfg, dense, pipeline, static_cast<std::uint32_t>(prompt.size() + steps + 1), pool);
  model.begin_sequence();
  const auto pre = model.prefill(prompt, /*all_logits=*/true);
  GreedyRun r;
  r.logits.assign(pre.begin(), pre.end());
  const std::size_t V = cfg.vocab_size;
  moekit::engine::Token next = argmax(pre.data() + pre.size() - V, V);
  r.tokens.push_back(next);
  for (int i = 0; i < steps; ++i) {
    const auto lg = model.decode(next);
    r.logits.insert(r.logits.end(), lg.begin(), lg.end());
    next = argmax(lg.data(), V);
    r.tokens.push_back(next);
  }
  return r;
}

/// Logits of every position of `seq` (positions × vocab), teacher-forced as the default model's
/// references were recorded: one prefill of the first `prompt` tokens (all logits), then one
/// decode step per further token; `int8_activations` as moe-run's --activations int8 (where the
/// rows of the quantized expert blobs are comes from the pipeline's loader: WeightView::order).
template <class Pipeline>
std::vector<float> teacher_forced(const moekit::engine::ModelConfig& cfg,
                                  const moekit::engine::DenseWeights& dense, Pipeline& pipeline,
                                  std::span<const moekit::engine::Token> seq, std::size_t prompt,
                                  moekit::ThreadPool* pool, bool int8_activations = false) {
  moekit::engine::Model<Pipeline> model(cfg, dense, pipeline,
                                        static_cast<std::uint32_t>(seq.size() + 1), pool);
  model.set_int8_expert_activations(int8_activations);
  model.begin_sequence();
  const auto pre = model.prefill(seq.first(prompt), /*all_logits=*/true);
  std::vector<float> rows(pre.begin(), pre.end());
  for (std::size_t t = prompt; t < seq.size(); ++t) {
    const auto lg = model.decode(seq[t]);
    rows.insert(rows.end(), lg.begin(), lg.end());
  }
  return rows;
}

/// Worst error of `rows` (positions × vocab) at a reference's top-k tokens of each position,
/// relative to that position's largest |reference logit|.
inline double worst_top_k_error(const std::vector<float>& rows, std::size_t vocab,
                                const std::vector<std::vector<std::uint32_t>>& top_ids,
                                const std::vector<std::vector<float>>& top_logits) {
  double worst = 0;
  for (std::size_t t = 0; t < top_ids.size(); ++t) {
    double scale = 0;
    for (float v : top_logits.at(t)) scale = std::max(scale, double(std::abs(v)));
    for (std::size_t j = 0; j < top_ids[t].size(); ++j)
      worst = std::max(worst,
                       std::abs(rows.at(t * vocab + top_ids[t][j]) - top_logits[t].at(j)) / scale);
  }
  return worst;
}

/// Worst per-position relative error of `got` against `want` (both positions × vocab).
inline double worst_relative_error(const std::vector<float>& got, const std::vector<float>& want,
                                   std::size_t vocab) {
  double worst = 0;
  for (std::size_t t = 0; t < want.size() / vocab && t < got.size() / vocab; ++t)
    worst = std::max(worst, relative_error(got.data() + t * vocab, want.data() + t * vocab, vocab));
  return worst;
}

}  // namespace engine_test
