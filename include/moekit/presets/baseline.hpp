#pragma once
/// \file The baseline preset: LRU cache, on-demand loads at the base precision, no prediction.

#include <memory>
#include <string_view>
#include <utility>

#include "moekit/cache/lru.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/presets/preset_spec.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/uniform.hpp"

namespace moekit::presets {

struct BaselineSpec : PresetDefaults {
  static constexpr std::string_view name = "baseline";
  static constexpr std::string_view summary =
      "LRU cache, on-demand loads at --precision, no prediction";

  template <class Loader>
  using Pipeline =
      OffloadPipeline<UniformScorer, NoPredictor, LruPolicy, Loader, OnDemandScheduler>;

  struct Config {
    UniformScorer::Config scorer{};
  };
  static Config configure(const ModelShape&, Precision base, const PresetParams&) {
    return {.scorer = {.precision = base}};
  }

  template <class Loader>
  static std::unique_ptr<Pipeline<Loader>> build(const ModelShape& s, const PipelineConfig& pc,
                                                 Loader loader, const Config& c,
                                                 const PresetInputs&) {
    return std::make_unique<Pipeline<Loader>>(s, pc, std::move(loader), UniformScorer(c.scorer));
  }
};

/// LRU cache, on-demand loads at the model's precision, no prediction.
template <class Loader>
using Baseline = BaselineSpec::Pipeline<Loader>;

}  // namespace moekit::presets
