#pragma once
/// \file NextUseFit, moekit's own: the NextUse preset with ExpectedNextUse's statistics fitted on
/// real routing. A grid search of (gamma, prior) on the GSM8K Mixtral trace at 128 of 256 slots
/// (bench/cache/belady_gap.cpp, bench/RESULTS.md) picks gamma = 0.5, prior = 8: a layer's expert
/// frequency forgets within a few visits (routing drifts with the text) and weighs as much as 8
/// visits of transitions. On the HumanEval traces (not fitted on) it misses fewer demands than
/// NextUse's defaults at 64, 128 and 192 slots. Same components as NextUse otherwise.

#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/cache/expected_next_use.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/presets/hobbit.hpp"
#include "moekit/presets/nextuse.hpp"
#include "moekit/presets/preset_spec.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/hobbit_threshold.hpp"

namespace moekit::presets {

struct NextUseFitSpec : PresetDefaults {
  static constexpr std::string_view name = "nextuse-fit";
  static constexpr std::string_view summary =
      "nextuse with ExpectedNextUse's (gamma, prior) fitted on real Mixtral routing (0.5, 8)";

  /// The fitted statistics (GSM8K trace, 128 of 256 slots; bench/RESULTS.md, issue 25).
  static constexpr ExpectedNextUsePolicy::Config fitted{.gamma = 0.5, .prior = 8.0};

  template <class Loader>
  using Pipeline = NextUseSpec::Pipeline<Loader>;
  using Config = NextUseSpec::Config;

  static Config configure(const ModelShape& s, Precision base, const PresetParams& q) {
    Config c = NextUseSpec::configure(s, base, q);
    c.cache = fitted;
    return c;
  }
  static void check(Precision base, const PresetParams& q) { NextUseSpec::check(base, q); }
  static std::vector<Precision> precisions(const ModelShape& s, Precision base,
                                           const PresetParams& q, const PresetInputs& in) {
    return NextUseSpec::precisions(s, base, q, in);
  }

  template <class Loader>
  static std::unique_ptr<Pipeline<Loader>> build(const ModelShape& s, const PipelineConfig& pc,
                                                 Loader loader, const Config& c,
                                                 const PresetInputs& in) {
    return NextUseSpec::build(s, pc, std::move(loader), c, in);
  }
};

/// NextUse with ExpectedNextUse's statistics fitted on real routing (see the file comment).
template <class Loader>
using NextUseFit = NextUseFitSpec::Pipeline<Loader>;

}  // namespace moekit::presets
