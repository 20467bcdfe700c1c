#pragma once
/// \file NextUse, moekit's own: HOBBIT's mixed-precision misses over the ExpectedNextUse cache (the
/// online policy closest to Belady on the real Mixtral traces, bench/RESULTS.md). No predictor,
/// so it needs no router weights or hidden states.

#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/cache/expected_next_use.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/presets/hobbit.hpp"
#include "moekit/presets/preset_spec.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/hobbit_threshold.hpp"

namespace moekit::presets {

struct NextUseSpec : PresetDefaults {
  static constexpr std::string_view name = "nextuse";
  static constexpr std::string_view summary =
      "moekit's ExpectedNextUse cache with HOBBIT's --t1/--t2 precisions, no predictor";

  template <class Loader>
  using Pipeline = OffloadPipeline<HobbitThresholdScorer, NoPredictor, ExpectedNextUsePolicy,
                                   Loader, OnDemandScheduler>;

  struct Config {  // the components' defaults
    HobbitRule rule{};
    ExpectedNextUsePolicy::Config cache{};
  };
  static Config configure(const ModelShape&, Precision base, const PresetParams& q) {
    return {.rule = HobbitSpec::rule(base, q)};
  }
  static void check(Precision base, const PresetParams& q) { HobbitSpec::check(base, q); }
  static std::vector<Precision> precisions(const ModelShape& s, Precision base,
                                           const PresetParams& q, const PresetInputs& in) {
    return HobbitSpec::precisions(s, base, q, in);  // base and --low-precision
  }

  template <class Loader>
  static std::unique_ptr<Pipeline<Loader>> build(const ModelShape& s, const PipelineConfig& pc,
                                                 Loader loader, const Config& c,
                                                 const PresetInputs&) {
    return std::make_unique<Pipeline<Loader>>(s, pc, std::move(loader),
                                              HobbitThresholdScorer({c.rule}), NoPredictor{},
                                              ExpectedNextUsePolicy(c.cache));
  }
};

/// moekit's own: HOBBIT's mixed-precision misses with the ExpectedNextUse cache. No predictor, so
/// it needs no router weights or hidden states.
template <class Loader>
using NextUse = NextUseSpec::Pipeline<Loader>;

}  // namespace moekit::presets
