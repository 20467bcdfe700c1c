#pragma once
/// \file HOBBIT (Tang et al., 2024): misses at high or low precision or skipped by the T1/T2
/// cumulative-gate rule, stacked-gate prefetch p layers ahead, a multidimensional cache with
/// high and low pools, the high one larger (MultiDimPolicy's default split; `--hobbit-high-pool`).

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/cache/multidim.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/stacked_gate.hpp"
#include "moekit/presets/preset_spec.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/hobbit_threshold.hpp"

namespace moekit::presets {

struct HobbitSpec : PresetDefaults {
  static constexpr std::string_view name = "hobbit";
  static constexpr std::string_view summary =
      "HOBBIT: misses at --precision / --low-precision / skipped by --t1/--t2, stacked-gate "
      "prefetch (--lookahead), multidimensional cache with high and low pools "
      "(--hobbit-high-pool)";
  static constexpr PresetNeeds needs{.routers = true};

  /// HOBBIT's pipeline around predictor `P` (hobbit-oracle and moe-sim's stand-in swap the
  /// stacked gate for an oracle; the rest stays HOBBIT's).
  template <class Loader, class P = StackedGatePredictor>
  using PipelineWith =
      OffloadPipeline<HobbitThresholdScorer, P, MultiDimPolicy, Loader, OnDemandScheduler>;
  template <class Loader>
  using Pipeline = PipelineWith<Loader>;

  /// The scorer's and the predictor's rule; the cache's high/low pools follow it.
  struct Config {
    HobbitRule rule{};
    std::uint32_t lookahead = StackedGatePredictor::Config{}.lookahead;
    MultiDimPolicy::Config cache{};  ///< weights and pool split (`high`/`low` are the rule's)
  };

  /// The T1/T2 rule of the knobs, with the base precision as "high".
  static HobbitRule rule(Precision base, const PresetParams& q) {
    return {.t1 = q.t1, .t2 = q.t2, .high = base, .low = q.low};
  }
  static Config configure(const ModelShape&, Precision base, const PresetParams& q) {
    Config c{.rule = rule(base, q), .lookahead = q.lookahead};
    c.cache.high_slot_fraction = q.high_slot_fraction;
    return c;
  }
  static void check(Precision base, const PresetParams& q) { check_low_precision(base, q); }
  static std::vector<Precision> precisions(const ModelShape&, Precision base, const PresetParams& q,
                                           const PresetInputs&) {
    std::vector<Precision> out{base};
    add_precision(out, q.low);
    return out;
  }

  static HobbitThresholdScorer scorer(const Config& c) { return HobbitThresholdScorer({c.rule}); }
  static MultiDimPolicy cache(const Config& c) {
    MultiDimPolicy::Config m = c.cache;
    m.high = c.rule.high;
    m.low = c.rule.low;
    return MultiDimPolicy(m);
  }
  static StackedGatePredictor predictor(const ModelShape& s, const Config& c,
                                        const PresetInputs& in) {
    return StackedGatePredictor({.router_weights = in.routers,
                                 .n_layers = s.n_layers,
                                 .n_experts = s.n_experts,
                                 .hidden = router_width(name, s, in),
                                 .top_k = s.top_k,
                                 .lookahead = c.lookahead,
                                 .rule = c.rule});
  }

  /// HOBBIT's pipeline at `pc` over `loader` around `predictor`, the rest as `c` says.
  template <class Loader, class P>
  static std::unique_ptr<PipelineWith<Loader, P>> build_with(const ModelShape& s,
                                                             const PipelineConfig& pc,
                                                             Loader loader, const Config& c,
                                                             P predictor) {
    return std::make_unique<PipelineWith<Loader, P>>(s, pc, std::move(loader), scorer(c),
                                                     std::move(predictor), cache(c));
  }
  template <class Loader>
  static std::unique_ptr<Pipeline<Loader>> build(const ModelShape& s, const PipelineConfig& pc,
                                                 Loader loader, const Config& c,
                                                 const PresetInputs& in) {
    return build_with(s, pc, std::move(loader), c, predictor(s, c, in));
  }
};

/// HOBBIT (Tang et al., 2024): mixed-precision misses, stacked-gate prefetch, multidimensional
/// cache.
template <class Loader>
using Hobbit = HobbitSpec::Pipeline<Loader>;

}  // namespace moekit::presets
