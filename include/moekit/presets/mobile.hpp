#pragma once
/// \file MoBiLE (2025): big-little experts — a little pass with fewer experts per token, recomputed
/// with the full top-k when the output is not confident — with router-replay prefetch for the
/// recomputation.

#include <algorithm>
#include <memory>
#include <string_view>
#include <utility>

#include "moekit/cache/lru.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/router_replay.hpp"
#include "moekit/presets/preset_spec.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/big_little.hpp"
#include "moekit/score/uniform.hpp"

namespace moekit::presets {

struct MobileSpec : PresetDefaults {
  static constexpr std::string_view name = "mobile";
  static constexpr std::string_view summary =
      "MoBiLE: little pass with --k-little experts, fallback to full top-k when the max "
      "probability <= --gamma (KV rolled back), router-replay prefetch";

  template <class Loader>
  using Pipeline = OffloadPipeline<UniformScorer, RouterReplayPredictor, LruPolicy, Loader,
                                   OnDemandScheduler, BigLittlePolicy>;

  /// Every expert, and every replayed prefetch, at `precision`.
  struct Config {
    Precision precision = UniformScorer::Config{}.precision;
    BigLittlePolicy::Config tokens{};
  };
  static Config configure(const ModelShape& s, Precision base, const PresetParams& q) {
    return {.precision = base,
            .tokens = {.gamma = q.gamma, .k_little = std::min(q.k_little, s.top_k)}};
  }

  static UniformScorer scorer(const Config& c) { return UniformScorer({.precision = c.precision}); }
  static BigLittlePolicy token_policy(const Config& c) { return BigLittlePolicy(c.tokens); }

  template <class Loader>
  static std::unique_ptr<Pipeline<Loader>> build(const ModelShape& s, const PipelineConfig& pc,
                                                 Loader loader, const Config& c,
                                                 const PresetInputs&) {
    return std::make_unique<Pipeline<Loader>>(
        s, pc, std::move(loader), scorer(c),
        RouterReplayPredictor({.top_k = s.top_k, .precision = c.precision}), LruPolicy{},
        OnDemandScheduler{}, token_policy(c));
  }
};

/// MoBiLE (2025): big-little experts with confidence fallback and router-replay prefetch.
template <class Loader>
using Mobile = MobileSpec::Pipeline<Loader>;

}  // namespace moekit::presets
