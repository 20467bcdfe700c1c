#pragma once
/// \file How moe-run wires its experts to moekit: the host-memory loader, the pipeline settings,
/// the minimum expert budget, and its presets, taken from the registry
/// (moekit/presets/registry.hpp): the flags they read, what moe-run does at start-up for each,
/// and `with_pipeline`, which builds one over the engine's loader.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/memory_loader.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/presets/registry.hpp"
#include "moekit/score/static_bitwidth.hpp"

#include "moekit/engine/weights.hpp"

namespace moekit::engine {

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

/// Parameters of the presets (each flag of moe-run that configures one): the presets' knobs
/// (defaults: the components' own) and what moe-run turns into their inputs.
struct PresetParams : moekit::presets::PresetParams {
  // EdgeMoE
  std::string bitwidth_table;  ///< --bitwidth-table (empty: uniform --precision)
  // Fiddler (0 = measured at start-up)
  std::string popularity_file;       ///< --popularity (empty: calibration run)
  double cpu_seconds_per_token = 0;  ///< --cpu-latency
  double copy_seconds = 0;           ///< --copy-latency
};

/// What presets take from the model and the machine (`moekit::presets::PresetNeeds`).
using PresetInputs = moekit::presets::PresetInputs;
using moekit::presets::PresetEntry;

/// Run-time settings common to every preset.
struct OffloadSettings {
  std::size_t expert_budget = 0;  ///< bytes; 0 = every expert resident
  moekit::Precision precision = moekit::Precision::f16;
  PresetParams preset{};
};

/// Throws `Error(invalid_argument)` naming `flag` when the budget cannot run the model.
inline void check_budget(const moekit::ModelShape& s, const OffloadSettings& o,
                         std::string_view flag = "--expert-budget") {
  const std::size_t min = minimum_expert_budget(s, o.precision);
  if (o.expert_budget != 0 && o.expert_budget < min)
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         std::string(flag) + ": a budget of " + std::to_string(o.expert_budget) +
                             " bytes cannot run this model; the minimum at " +
                             std::string(moekit::name(o.precision)) + " is " + std::to_string(min) +
                             " bytes (top-k = " + std::to_string(s.top_k) + " experts of " +
                             std::to_string(s.expert_bytes(o.precision)) + " bytes)");
}

inline moekit::PipelineConfig pipeline_config(const moekit::ModelShape& s,
                                              const OffloadSettings& o) {
  check_budget(s, o);
  return moekit::PipelineConfig{.expert_budget_bytes = o.expert_budget
                                                           ? o.expert_budget
                                                           : all_resident_budget(s, o.precision),
                                .base_precision = o.precision};
}

/// When the budget holds every routed expert at the base precision, loads them all now, layer
/// after layer, and waits: the first token then finds a warm cache, as llama.cpp's does once it
/// has read its file. Returns the bytes this loaded (0 when not every expert fits, or when a
/// start-up placement already holds them; an expert a placement holds stays at its precision, as
/// EdgeMoE's buffer holds each expert at its stored bit width). The loads are `preload`s: neither
/// demands nor prefetches in the statistics. `on_layer(layers done, layers)`, when given, is
/// called as each layer's loads are submitted (they block once the loader's queue is full).
template <class Pipeline>
std::uint64_t load_all_experts(Pipeline& p,
                               const std::function<void(std::size_t, std::size_t)>& on_layer = {}) {
  const moekit::ModelShape& s = p.shape();
  const moekit::Precision base = p.config().base_precision;
  if (p.config().expert_budget_bytes < all_resident_budget(s, base)) return 0;
  const std::uint64_t before = p.stats().bytes_preloaded;
  for (std::uint32_t l = 0; l < s.n_layers; ++l) {
    for (std::uint32_t e = 0; e < s.n_experts; ++e)  // a placed expert keeps its precision
      if (!p.cache().resident({l, e}) && !p.preload({l, e}, base)) break;
    if (on_layer) on_layer(l + 1, s.n_layers);
  }
  p.finish_loads();
  return p.stats().bytes_preloaded - before;
}

// ---- presets from the registry (moekit/presets/registry.hpp) ---------------------------------

/// The preset called `name`; throws `Error(invalid_argument)` naming --preset for an unknown name.
inline const PresetEntry& find_preset(std::string_view name) {
  if (const PresetEntry* e = moekit::presets::find(name)) return *e;
  moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                       "--preset: unknown preset '" + std::string(name) +
                           "' (known: " + moekit::presets::names() + ")");
}

/// The codec of the experts moe-run quantizes itself (from an HF checkpoint, in memory or into a
/// store it builds): `group_size` (--group-size) when given, else the preset's
/// (`PresetEntry::quant_group_size`: EdgeMoE's per output channel, 0; groups of 32 for the
/// others). Experts that arrive quantized (`prequantized` names their source: a GGUF file, a
/// --store) keep moekit's groups of 32, and another --group-size is refused naming both.
inline moekit::QuantScheme expert_codec(std::optional<std::uint32_t> group_size,
                                        const PresetEntry& preset,
                                        const std::string& prequantized = {}) {
  const moekit::QuantScheme fixed{};
  if (prequantized.empty())
    return {.group_size = group_size.value_or(preset.quant_group_size), .zero_point = false};
  if (group_size && *group_size != fixed.group_size)
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         "--group-size " + std::to_string(*group_size) + ": the experts of " +
                             prequantized + " are grouped by " + std::to_string(fixed.group_size) +
                             " (convert an HF checkpoint instead)");
  return fixed;
}

/// Checks the preset flags against each other; names the flag.
inline void check_preset_params(const PresetEntry& p, const OffloadSettings& o) {
  moekit::presets::check(p, o.precision, o.preset);
}

/// The per-expert precision table --bitwidth-table names (null without one: the preset's default,
/// every expert at --precision).
inline std::shared_ptr<const moekit::PrecisionTable> bitwidth_table(const moekit::ModelShape& s,
                                                                    const OffloadSettings& o) {
  if (o.preset.bitwidth_table.empty()) return nullptr;
  auto t = std::make_shared<const moekit::PrecisionTable>(
      moekit::PrecisionTable::load(o.preset.bitwidth_table));
  if (t->n_layers() != s.n_layers || t->n_experts() != s.n_experts)
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         "--bitwidth-table: '" + o.preset.bitwidth_table + "' is for " +
                             std::to_string(t->n_layers()) + " layers × " +
                             std::to_string(t->n_experts()) + " experts; the model has " +
                             std::to_string(s.n_layers) + " × " + std::to_string(s.n_experts));
  return t;
}

/// What moe-run does at start-up for preset `p` beyond loading the model.
struct StartupNeeds {
  bool routers = false;        ///< stack the router weights (`router_stack`)
  bool calibration = false;    ///< a calibration run (routing counts, activation paths)
  bool latencies = false;      ///< measure CPU vs load latencies (no --cpu-latency/--copy-latency)
  bool bitwidths = false;      ///< load --bitwidth-table
  bool decode_timing = false;  ///< measure decode compute per layer and one expert's load (Fate)
};

inline StartupNeeds startup_needs(const PresetEntry& p, const OffloadSettings& o) {
  const moekit::presets::PresetNeeds& n = p.needs;
  return {.routers = n.routers,
          .calibration = n.paths || (n.popularity && o.preset.popularity_file.empty()),
          .latencies =
              n.latencies && (o.preset.cpu_seconds_per_token <= 0 || o.preset.copy_seconds <= 0),
          .bitwidths = n.bitwidths && !o.preset.bitwidth_table.empty(),
          .decode_timing = n.decode_timing};
}

/// Stored precisions preset `p` reads (the expert source must hold every one).
inline std::vector<moekit::Precision> required_precisions(const PresetEntry& p,
                                                          const moekit::ModelShape& s,
                                                          const OffloadSettings& o) {
  PresetInputs in;
  if (startup_needs(p, o).bitwidths) in.bitwidths = bitwidth_table(s, o);
  return p.precisions(s, o.precision, o.preset, in);
}

/// Builds the pipeline of preset `Spec` with its experts served by `loader` and calls
/// `f(pipeline)`; throws `Error(invalid_argument)` naming the flag for a bad setting.
template <moekit::presets::PresetSpec Spec, class Loader, class F>
decltype(auto) with_pipeline(const moekit::ModelShape& s, const OffloadSettings& o, Loader loader,
                             const PresetInputs& in, F&& f) {
  auto p = moekit::presets::make_pipeline<Spec>(s, pipeline_config(s, o), o.preset,
                                                std::move(loader), in);
  return f(*p);
}

/// Builds the pipeline of preset `p` (looked up once, `find_preset`) and calls `f(pipeline)`.
/// Every preset's pipeline type, and `f` for each, is compiled.
template <class Loader, class F>
decltype(auto) with_pipeline(const PresetEntry& p, const moekit::ModelShape& s,
                             const OffloadSettings& o, Loader loader, const PresetInputs& in,
                             F&& f) {
  return moekit::presets::visit(p, [&]<class Spec>(std::type_identity<Spec>) -> decltype(auto) {
    return with_pipeline<Spec>(s, o, std::move(loader), in, f);
  });
}

/// The same for one preset known at compile time over experts in host memory, without inputs.
template <moekit::presets::PresetSpec Spec, class F>
decltype(auto) with_pipeline(const moekit::ModelShape& s, const OffloadSettings& o,
                             const HostExperts& experts, F&& f) {
  return with_pipeline<Spec>(s, o, host_loader(experts), PresetInputs{}, std::forward<F>(f));
}

}  // namespace moekit::engine
