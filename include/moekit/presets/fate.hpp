#pragma once
/// \file Fate (Fang et al., 2025): cross-layer gate prefetch, a shallow-favoring ARC cache per
/// layer, popularity precisions (the least popular share of a prefill layer at low precision),
/// ready-first scheduling.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/cache/arc.hpp"
#include "moekit/cache/shallow_favoring.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/cross_layer_gate.hpp"
#include "moekit/presets/preset_spec.hpp"
#include "moekit/sched/ready_first.hpp"
#include "moekit/score/popularity.hpp"

namespace moekit::presets {

struct FateSpec : PresetDefaults {
  static constexpr std::string_view name = "fate";
  static constexpr std::string_view summary =
      "Fate: cross-layer gate prefetch (--fate-percentile), shallow-favoring ARC "
      "(--shallow-layers), prefill's least popular --fate-low-fraction at --low-precision";
  static constexpr PresetNeeds needs{.routers = true, .decode_timing = true, .staged_misses = true};

  using Cache = ShallowFavoring<ArcPolicy>;
  /// Fate's pipeline around predictor `P` (fate-oracle and moe-sim's stand-in swap the
  /// cross-layer gate for an oracle; the rest stays Fate's).
  template <class Loader, class P = CrossLayerGatePredictor>
  using PipelineWith = OffloadPipeline<PopularityScorer, P, Cache, Loader, ReadyFirstScheduler>;
  template <class Loader>
  using Pipeline = PipelineWith<Loader>;

  /// The predictor moves what the scorer asks for: its decode and prefill precisions and its
  /// low-precision share are the scorer's. The cache is sized at the decode precision.
  struct Config {
    /// Misses (wrong prefetches), in decode and prefill, load at int2 (Fate §5.3) and are
    /// upgraded to int4 later.
    PopularityScorer::Config scorer{.on_demand_precision = Precision::q2};
    double percentile = CrossLayerGatePredictor::Config{}.percentile;
    /// Decode prefetch cap n = floor(budget_time / expert_time); expert_time <= 0: taken from
    /// the inputs' measured `layer_seconds` / `expert_load_seconds` when given, else no cap.
    double budget_time = 0;
    double expert_time = 0;
    Cache::Config cache{};
    /// Prefetch staging slots (`--fate-staging-slots`), taken from the budget, at most half the
    /// budget's slots. 0: one per expert of a layer (moekit's: the paper does not size its
    /// staging; the design spec's S_stage = max(E, n), and n <= E). Prefetches wait there,
    /// outside the ARC caches; one that finds them full waits for a slot (PipelineConfig::
    /// prefetch_staging_slots).
    std::uint32_t staging_slots = 0;
  };

  static Config configure(const ModelShape& s, Precision base, const PresetParams& q) {
    const Precision low = q.fate_low_fraction > 0 ? q.low : base;
    return {.scorer = {.int2_fraction = q.fate_low_fraction,
                       .high = base,
                       .low = low,
                       .decode_precision = base,
                       .on_demand_precision = low},
            .percentile = q.fate_percentile,
            .cache = {.shallow_layers = std::min(q.shallow_layers, s.n_layers)},
            .staging_slots = q.fate_staging_slots};
  }
  static void check(Precision base, const PresetParams& q) { check_low_precision(base, q); }
  static std::vector<Precision> precisions(const ModelShape&, Precision base, const PresetParams& q,
                                           const PresetInputs&) {
    std::vector<Precision> out{base};
    if (q.fate_low_fraction > 0) add_precision(out, q.low);
    return out;
  }

  /// `pc` with the cache sized at the decode precision (Fate caches what it moves).
  static PipelineConfig pipeline_config(PipelineConfig pc, const Config& c) {
    pc.sizing_precision = c.scorer.decode_precision;
    return pc;
  }
  /// The same, prefetches staged outside the cache in `staging_slots` slots of the budget, and
  /// on-demand copies below the decode precision upgraded to it in the background.
  static PipelineConfig pipeline_config(const ModelShape& s, PipelineConfig pc, const Config& c) {
    pc = pipeline_config(pc, c);
    // At most half the budget's slots, so that the cache keeps the other half (the minimum
    // budget, top_k experts, still runs).
    const std::size_t slots = pc.expert_budget_bytes / s.expert_bytes(pc.sizing_precision);
    pc.prefetch_staging_slots = static_cast<std::uint32_t>(std::min<std::size_t>(
        c.staging_slots ? c.staging_slots : s.n_experts, std::max<std::size_t>(1, slots / 2)));
    const Precision od = c.scorer.on_demand_precision;
    if (od != Precision::skip && bits(od) < bits(c.scorer.decode_precision))
      pc.upgrade_precision = c.scorer.decode_precision;  // low on-demand copies: lazy upgrade
    return pc;
  }
  static PopularityScorer scorer(const Config& c) { return PopularityScorer(c.scorer); }
  static Cache cache(const Config& c) { return Cache(c.cache); }
  /// The decode cap's (T, t_expert): `c`'s times, or the measured inputs when `c` has none.
  static std::pair<double, double> cap_times(const Config& c, const PresetInputs& in) {
    const bool measured = !(c.expert_time > 0) && in.expert_load_seconds > 0;
    return measured ? std::pair{in.layer_seconds, in.expert_load_seconds}
                    : std::pair{c.budget_time, c.expert_time};
  }
  static CrossLayerGatePredictor predictor(const ModelShape& s, const Config& c,
                                           const PresetInputs& in) {
    const auto [T, t] = cap_times(c, in);
    return CrossLayerGatePredictor({.router_weights = in.routers,
                                    .n_layers = s.n_layers,
                                    .n_experts = s.n_experts,
                                    .hidden = router_width(name, s, in),
                                    .top_k = s.top_k,
                                    .percentile = c.percentile,
                                    .budget_time = T,
                                    .expert_time = t,
                                    .decode_precision = c.scorer.decode_precision,
                                    .int2_fraction = c.scorer.int2_fraction,
                                    .prefill_high = c.scorer.high,
                                    .prefill_low = c.scorer.low});
  }

  /// Fate's pipeline at `pc` (as `pipeline_config` sets it) over `loader` around `predictor`, the
  /// rest as `c` says.
  template <class Loader, class P>
  static std::unique_ptr<PipelineWith<Loader, P>> build_with(const ModelShape& s,
                                                             const PipelineConfig& pc,
                                                             Loader loader, const Config& c,
                                                             P predictor) {
    return std::make_unique<PipelineWith<Loader, P>>(
        s, pipeline_config(s, pc, c), std::move(loader), scorer(c), std::move(predictor), cache(c));
  }
  template <class Loader>
  static std::unique_ptr<Pipeline<Loader>> build(const ModelShape& s, const PipelineConfig& pc,
                                                 Loader loader, const Config& c,
                                                 const PresetInputs& in) {
    return build_with(s, pc, std::move(loader), c, predictor(s, c, in));
  }
};

/// Fate (Fang et al., 2025): cross-layer gate prefetch, shallow-favoring per-layer ARC, q4/q2 I/O.
template <class Loader>
using Fate = FateSpec::Pipeline<Loader>;

}  // namespace moekit::presets
