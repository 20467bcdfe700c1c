#pragma once
/// \file Start-up measurements some presets need: a calibration run that records the routing of
/// a calibration text (moe-run: a WikiText-2 slice distinct from the evaluated text, or the prompt
/// plus a few greedy tokens) — per-(layer, expert) token counts for Fiddler's placement and
/// EdgeMoE's prior, and per-token activation paths for EdgeMoE's preloading — and
/// Fiddler's two latencies (one token through one expert on the CPU; one expert loaded through the
/// run's loader and run), timed on this machine rather than taken from the paper.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/cache/expert_arena.hpp"
#include "moekit/core/gate_view.hpp"
#include "moekit/core/layer_context.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/io/expert_blob.hpp"
#include "moekit/precision/expert_ffn.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "moekit/predict/activation_path.hpp"

#include "moekit/engine/config.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/forwarding_pipeline.hpp"
#include "moekit/engine/line_fit.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/popularity_file.hpp"
#include "moekit/engine/routing_replay.hpp"

namespace moekit::engine {

/// Called after each layer a calibration run routes, with the layers routed so far and the
/// run's total (layers × forwards): what a progress line needs.
using LayerProgress = std::function<void(std::uint64_t done, std::uint64_t total)>;

/// Forwards a pipeline's per-layer calls and records the routing it sees.
template <class Pipeline>
class RouteRecorder : public ForwardingPipeline<Pipeline> {
 public:
  RouteRecorder(Pipeline& inner, std::uint32_t n_layers, std::uint32_t n_experts,
                LayerProgress progress = {}, std::uint64_t forwards = 1)
      : ForwardingPipeline<Pipeline>(inner),
        progress_(std::move(progress)),
        total_layers_(forwards * n_layers),
        n_layers_(n_layers),
        n_experts_(n_experts),
        counts_(std::size_t{n_layers} * n_experts, 0.0),
        sets_(n_layers) {}

  void begin_sequence() {
    flush();
    this->inner().begin_sequence();
  }
  const moekit::LayerPlan& route(const moekit::LayerContext& c, const moekit::GateView& g) {
    if (c.layer == 0) flush();
    sets_[c.layer].assign(g.experts.begin(), g.experts.end());
    k_ = g.k;
    n_tokens_ = g.n_tokens;
    for (std::uint32_t e : g.experts) counts_[std::size_t{c.layer} * n_experts_ + e] += 1;
    const moekit::LayerPlan& plan = this->inner().route(c, g);
    if (progress_) progress_(++layers_routed_, total_layers_);
    return plan;
  }

  /// Tokens routed to each (layer, expert) so far, [L × E].
  [[nodiscard]] const std::vector<double>& counts() const noexcept { return counts_; }
  /// Activation paths of every recorded token (call after the last forward).
  std::shared_ptr<moekit::ActivationPathProfile> paths() {
    flush();
    return profile_;
  }

 private:
  // Turns the last forward's per-layer routing into one path per token.
  void flush() {
    if (n_tokens_ == 0 || sets_.back().empty()) return;
    if (!profile_)
      profile_ = std::make_shared<moekit::ActivationPathProfile>(n_layers_, n_experts_, k_);
    std::vector<std::vector<std::uint32_t>> tok(n_layers_);
    std::vector<std::span<const std::uint32_t>> view(n_layers_);
    for (std::uint32_t t = 0; t < n_tokens_; ++t) {
      bool complete = true;
      for (std::uint32_t l = 0; l < n_layers_; ++l) {
        if (sets_[l].size() != std::size_t{n_tokens_} * k_)
          complete = false;
        else
          tok[l].assign(sets_[l].begin() + t * k_, sets_[l].begin() + (t + 1) * k_);
        view[l] = tok[l];
      }
      if (complete && k_ == profile_->top_k()) profile_->add_path(view);
    }
    for (auto& s : sets_) s.clear();
    n_tokens_ = 0;
  }

  LayerProgress progress_;
  std::uint64_t total_layers_, layers_routed_ = 0;
  std::uint32_t n_layers_, n_experts_;
  std::vector<double> counts_;
  std::vector<std::vector<std::uint32_t>> sets_;
  std::uint32_t k_ = 0, n_tokens_ = 0;
  std::shared_ptr<moekit::ActivationPathProfile> profile_;
};

/// The routing of a calibration run.
struct Calibration {
  std::vector<double> counts;  ///< [L × E] tokens per expert
  std::shared_ptr<const moekit::ActivationPathProfile> paths;
  std::size_t tokens = 0;  ///< tokens routed (prompt + greedy continuation)
  std::string source;      ///< what calibrated, for the output (set by the caller)
};

/// The tokens a calibration run routes: the first `max_tokens` of a text file (after the BOS),
/// with `source` saying which.
struct CalibrationText {
  std::vector<Token> tokens;
  std::string source;
};

/// Reads the calibration text `path` and encodes its first `max_tokens` tokens after `bos` (if
/// any). Refuses a text that is the evaluated one (`evaluated`, e.g. --perplexity's file):
/// calibration is not evaluation. Errors name `flag` and the file.
template <class Tokenizer>
CalibrationText calibration_text(const std::string& path, const Tokenizer& tok,
                                 std::optional<Token> bos, std::size_t max_tokens,
                                 const std::string& evaluated = {},
                                 std::string_view flag = "--calib-text") {
  namespace fs = std::filesystem;
  auto bad = [&](const std::string& why) {
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         std::string(flag) + ": '" + path + "' " + why);
  };
  std::error_code ec;
  if (!evaluated.empty() && fs::equivalent(path, evaluated, ec))
    bad("is the evaluated text (--perplexity): calibrate on a different text");
  std::ifstream in(path, std::ios::binary);
  if (!in) bad("cannot be opened");
  std::ostringstream text;
  text << in.rdbuf();
  CalibrationText c;
  if (bos) c.tokens.push_back(*bos);
  const std::vector<Token> body = tok.encode(text.str(), false);
  c.tokens.insert(c.tokens.end(), body.begin(),
                  body.begin() + std::ptrdiff_t(std::min(body.size(), max_tokens)));
  if (c.tokens.size() < 2 + (bos ? 1u : 0u)) bad("holds fewer than 2 tokens");
  c.source = "the first " + std::to_string(c.tokens.size() - (bos ? 1 : 0)) + " tokens of " + path;
  return c;
}

/// Runs `prompt` and then `extra` greedy tokens through the baseline preset (same experts, same
/// budget) and records the routing. With `replay` (moe-run --routing-trace) the run replays the
/// trace, as the measured run will, and the replay is rewound afterwards, so that the measured
/// run starts at the trace's first token as it would without calibration. `kernels`: the run's,
/// given explicitly (at real size a calibration with f32 activations over quantized experts takes
/// minutes). `progress` (optional) hears of every layer routed (LayerProgress).
inline Calibration calibrate(const ModelConfig& cfg, const DenseWeights& dense,
                             const OffloadSettings& o, const ExpertBacking& experts,
                             std::span<const Token> prompt, int extra, moekit::ThreadPool* pool,
                             const ModelKernels& kernels, RoutingReplay* replay = nullptr,
                             const LayerProgress& progress = {}) {
  const moekit::ModelShape s = cfg.shape();
  OffloadSettings base = o;
  base.preset = {};
  return with_pipeline<moekit::presets::BaselineSpec>(
      s, base, experts.make_loader(), PresetInputs{}, [&](auto& p) {
        // One forward for the prompt (this Model has no ubatch), one per greedy token.
        RouteRecorder rec(p, s.n_layers, s.n_experts, progress,
                          1 + static_cast<std::uint64_t>(std::max(extra, 0)));
        const auto ctx = static_cast<std::uint32_t>(prompt.size() + std::max(extra, 0) + 1);
        Model<decltype(rec)> model(cfg, dense, rec, ctx, pool);
        kernels.apply(model);
        model.set_routing_replay(replay);
        model.begin_sequence();
        auto logits = model.prefill(prompt);
        for (int i = 0; i < extra; ++i) {
          const auto next =
              static_cast<Token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
          logits = model.decode(next);
        }
        if (replay) replay->rewind();
        Calibration c;
        c.counts = rec.counts();
        c.paths = rec.paths();
        c.tokens = prompt.size() + static_cast<std::size_t>(std::max(extra, 0));
        return c;
      });
}

/// Fiddler's latencies on this machine, in seconds.
struct FiddlerLatencies {
  double cpu_seconds_per_token = 0;   ///< slope: each further token through one expert on the CPU
  double cpu_seconds_per_expert = 0;  ///< intercept: the fixed part of one expert call (>= 0)
  double copy_seconds = 0;            ///< load one expert through the loader, then run it
  std::uint32_t experts_sampled = 0;  ///< experts the CPU line was measured on
};

/// Token counts the CPU line is fitted over (design spec fiddler.md §2.1: n ∈ {1, ..., 32}).
inline constexpr std::uint32_t fiddler_token_counts[] = {1, 2, 4, 8, 16, 32};

/// Fiddler's latencies. CPU: up to 8 experts spread over the model (different layers, each read
/// from host memory as the engine's CPU path reads it) run at every token count of
/// `fiddler_token_counts`; per count the median over the experts; then the line a + c·n fitted
/// through the medians (`fit_cpu_line`). Copy: the median of `reps` loads of a different expert
/// each through a fresh loader of `experts` into a 4 KiB-aligned buffer, each followed by a
/// one-token run. `kernels`: the run's, given explicitly, so the experts run as the engine will
/// run them (their activations and row streaming; activations.hpp).
inline FiddlerLatencies measure_fiddler_latencies(const moekit::ModelShape& s, moekit::Precision p,
                                                  const ExpertBacking& experts,
                                                  moekit::ThreadPool* pool,
                                                  const ModelKernels& kernels, int reps = 9) {
  using clock = std::chrono::steady_clock;
  moekit::KernelOptions opts{};
  opts.pool = pool;
  opts.int8_activations = kernels.int8_experts;
  opts.streaming = kernels.row_streaming;
  constexpr std::uint32_t max_n = 32;
  std::vector<float> x(std::size_t{max_n} * s.hidden, 0.01f), y(std::size_t{max_n} * s.hidden);
  ExpertLoader loader = experts.make_loader();
  auto run = [&](std::span<const std::byte> b, std::uint32_t n) {
    std::fill(y.begin(), y.end(), 0.f);
    moekit::expert_ffn(moekit::io::expert_view(s, b, p, loader.matrix_order(p)),
                       std::span<const float>(x).first(std::size_t{n} * s.hidden), n,
                       std::span<float>(y).first(std::size_t{n} * s.hidden), 1.f, opts);
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const auto N = static_cast<std::uint32_t>(s.expert_count());
  const std::uint32_t m = std::min<std::uint32_t>(8, N);
  constexpr std::size_t counts = std::size(fiddler_token_counts);
  std::vector<std::vector<double>> by_count(counts);
  run(loader.host_bytes({0, 0}, p), 1);  // the kernels' first-call costs, once
  for (std::uint32_t i = 0; i < m; ++i) {
    const std::uint32_t idx = static_cast<std::uint32_t>((std::uint64_t{i} * N + N / 2) / m) % N;
    const auto host = loader.host_bytes({idx / s.n_experts, idx % s.n_experts}, p);
    for (std::size_t c = 0; c < counts; ++c) {
      const auto t0 = clock::now();
      run(host, fiddler_token_counts[c]);
      by_count[c].push_back(std::chrono::duration<double>(clock::now() - t0).count());
    }
  }
  std::vector<double> ns, ts;
  for (std::size_t c = 0; c < counts; ++c) {
    ns.push_back(fiddler_token_counts[c]);
    ts.push_back(median(by_count[c]));
  }
  const auto [intercept, slope] = fit_cpu_line(ns, ts);
  std::vector<double> copy;
  moekit::ExpertArena arena(1, s.expert_bytes(p));
  const std::uint32_t n = static_cast<std::uint32_t>(s.expert_count());
  for (int i = 0; i < reps; ++i) {
    const std::uint32_t idx = static_cast<std::uint32_t>(1 + i) % n;  // not the warmed expert
    const moekit::ExpertKey k{idx / s.n_experts, idx % s.n_experts};
    const auto t0 = clock::now();
    const auto dest = arena.acquire(0, s.expert_bytes(p));
    const auto t = loader.submit({k, p, moekit::LoadPriority::on_demand, dest});
    loader.wait(t);
    run(dest, 1);
    copy.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    arena.release(0);
  }
  return {slope, intercept, std::max(median(copy), 1e-9), m};
}

}  // namespace moekit::engine
