#pragma once
/// \file Fate's decode timing on this machine: T, the compute that can hide a prefetch, and
/// t_expert, one expert's load, from which Fate's decode prefetch cap n = floor(T / t_expert)
/// follows (fate.md §2.2, M2: "measure the average per-layer decode times t_moe, t_attn, t_gate
/// and the transfer time of one expert").
///
/// T is measured where the prefetch has to hide: a prefetch for layer l+1 is issued when layer l
/// routes and is needed when layer l+1 routes, so T is the time between consecutive `route` calls
/// of a decode token (layer l's experts, then layer l+1's attention and router) less the time
/// `resolve` waited for loads in between (the pipeline's stall seconds): the median over the
/// decode tokens of a short greedy run of the baseline preset at the run's budget. t_expert is the
/// median time of one expert's load at the prefetch precision through a fresh loader of the run's
/// experts, a different expert each time.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "moekit/cache/expert_arena.hpp"
#include "moekit/core/gate_view.hpp"
#include "moekit/core/layer_context.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "moekit/engine/config.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/forwarding_pipeline.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"

namespace moekit::engine {

/// Forwards a pipeline's calls and records, in decode tokens, the compute time between the
/// `route` calls of consecutive layers (wall time less the pipeline's stall seconds).
template <class Pipeline>
class LayerClock : public ForwardingPipeline<Pipeline> {
 public:
  explicit LayerClock(Pipeline& inner) : ForwardingPipeline<Pipeline>(inner) {}

  const moekit::LayerPlan& route(const moekit::LayerContext& c, const moekit::GateView& g) {
    const auto now = std::chrono::steady_clock::now();
    const double stall = this->inner().stats().stall_seconds;
    if (c.phase == moekit::Phase::decode && c.layer > 0 && c.layer == last_layer_ + 1)
      intervals_.push_back(std::chrono::duration<double>(now - last_).count() -
                           (stall - last_stall_));
    last_ = now;
    last_stall_ = stall;
    last_layer_ = c.layer;
    return this->inner().route(c, g);
  }

  /// Compute seconds between consecutive layers' `route` calls, one per measured pair.
  [[nodiscard]] const std::vector<double>& intervals() const noexcept { return intervals_; }

 private:
  std::vector<double> intervals_;
  std::chrono::steady_clock::time_point last_{};
  double last_stall_ = 0;
  std::uint32_t last_layer_ = 0xffffffffu;
};

/// Fate's T and t_expert, in seconds.
struct DecodeTiming {
  double layer_seconds = 0;        ///< T: compute between consecutive layers' routing (median)
  double expert_load_seconds = 0;  ///< t_expert: one expert's load at the prefetch precision
  std::size_t layer_samples = 0;   ///< intervals T is the median of
};

/// Measures T over `decode_tokens` greedy tokens after `prompt` (baseline preset, budget, experts
/// and `kernels` of the run, given explicitly: T is the compute of the kernels the run will use)
/// and t_expert at `load_precision` (median of `reps` loads).
inline DecodeTiming measure_decode_timing(const ModelConfig& cfg, const DenseWeights& dense,
                                          const OffloadSettings& o, const ExpertBacking& experts,
                                          std::span<const Token> prompt, int decode_tokens,
                                          moekit::Precision load_precision,
                                          moekit::ThreadPool* pool, const ModelKernels& kernels,
                                          int reps = 9) {
  const moekit::ModelShape s = cfg.shape();
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  OffloadSettings base = o;
  base.preset = {};
  DecodeTiming t;
  with_pipeline<moekit::presets::BaselineSpec>(
      s, base, experts.make_loader(), PresetInputs{}, [&](auto& p) {
        LayerClock clock(p);
        const auto ctx = static_cast<std::uint32_t>(prompt.size() + std::max(decode_tokens, 1) + 1);
        Model<decltype(clock)> model(cfg, dense, clock, ctx, pool);
        kernels.apply(model);
        model.begin_sequence();
        auto logits = model.prefill(prompt);
        for (int i = 0; i < decode_tokens; ++i) {
          const auto next =
              static_cast<Token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
          logits = model.decode(next);
        }
        t.layer_seconds = std::max(median(clock.intervals()), 0.0);
        t.layer_samples = clock.intervals().size();
      });
  using clock = std::chrono::steady_clock;
  ExpertLoader loader = experts.make_loader();
  moekit::ExpertArena arena(1, s.expert_bytes(load_precision));
  const auto n = static_cast<std::uint32_t>(s.expert_count());
  std::vector<double> loads;
  for (int i = 0; i < reps; ++i) {
    const std::uint32_t idx = static_cast<std::uint32_t>(n - 1 - (i % n));  // distinct experts
    const moekit::ExpertKey k{idx / s.n_experts, idx % s.n_experts};
    const auto dest = arena.acquire(0, s.expert_bytes(load_precision));
    const auto t0 = clock::now();
    loader.wait(loader.submit({k, load_precision, moekit::LoadPriority::prefetch, dest}));
    loads.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    arena.release(0);
  }
  t.expert_load_seconds = std::max(median(loads), 1e-9);
  return t;
}

}  // namespace moekit::engine
