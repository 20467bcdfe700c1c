#pragma once
/// \file How moe-run wires its experts to moekit: the host-memory loader, the pipeline settings,
/// the minimum expert budget, and the table of presets (the one place a preset name maps to an
/// OffloadPipeline type).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/memory_loader.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/presets.hpp"
#include "moekit/score/uniform.hpp"

#include "weights.hpp"

namespace moe_run {

/// Smallest expert budget a pipeline accepts: one token's top-k experts at `p`.
inline std::size_t minimum_expert_budget(const moekit::ModelShape& s, moekit::Precision p) {
  return std::size_t{s.top_k} * s.expert_bytes(p);
}

/// Budget that keeps every routed expert resident at `p`.
inline std::size_t all_resident_budget(const moekit::ModelShape& s, moekit::Precision p) {
  return s.expert_count() * s.expert_bytes(p);
}

/// A loader that copies experts out of `experts` (which must outlive it).
inline moekit::MemoryLoader host_loader(const HostExperts& experts) {
  return moekit::MemoryLoader(
      [&experts](moekit::ExpertKey k, moekit::Precision p) { return experts.bytes(k, p); });
}

/// Run-time settings common to every preset.
struct OffloadSettings {
  std::size_t expert_budget = 0;  ///< bytes; 0 = every expert resident
  moekit::Precision precision = moekit::Precision::f16;
};

/// Throws `Error(invalid_argument)` naming `flag` when the budget cannot run the model.
inline void check_budget(const moekit::ModelShape& s, const OffloadSettings& o,
                         std::string_view flag = "--expert-budget") {
  const std::size_t min = minimum_expert_budget(s, o.precision);
  if (o.expert_budget != 0 && o.expert_budget < min)
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         std::string(flag) + ": a budget of " + std::to_string(o.expert_budget) +
                             " bytes cannot run this model; the minimum at " +
                             std::string(moekit::name(o.precision)) + " is " +
                             std::to_string(min) + " bytes (top-k = " + std::to_string(s.top_k) +
                             " experts of " + std::to_string(s.expert_bytes(o.precision)) +
                             " bytes)");
}

inline moekit::PipelineConfig pipeline_config(const moekit::ModelShape& s,
                                              const OffloadSettings& o) {
  check_budget(s, o);
  return moekit::PipelineConfig{
      .expert_budget_bytes = o.expert_budget ? o.expert_budget : all_resident_budget(s, o.precision),
      .base_precision = o.precision};
}

// ---- the preset table ------------------------------------------------------------------------

/// A named preset and what it combines.
struct PresetInfo {
  std::string_view name;
  std::string_view summary;
};

/// Every preset moe-run knows, in `--help` order.
inline constexpr PresetInfo preset_table[] = {
    {"baseline", "LRU cache, on-demand loads at --precision, no prediction"},
};

/// Builds the pipeline of preset `name` (experts served from `experts`) and calls
/// `f(pipeline)`; throws `Error(invalid_argument)` naming the flag for an unknown name.
template <class F>
decltype(auto) with_preset(std::string_view name, const moekit::ModelShape& s,
                           const OffloadSettings& o, const HostExperts& experts, F&& f) {
  const moekit::PipelineConfig pc = pipeline_config(s, o);
  if (name == "baseline") {
    using P = moekit::presets::Baseline<moekit::MemoryLoader>;
    auto p = std::make_unique<P>(s, pc, host_loader(experts),
                                 moekit::UniformScorer({.precision = o.precision}));
    return f(*p);
  }
  std::string known;
  for (const auto& p : preset_table) known += (known.empty() ? "" : ", ") + std::string(p.name);
  moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                       "--preset: unknown preset '" + std::string(name) + "' (known: " + known +
                           ")");
}

}  // namespace moe_run
