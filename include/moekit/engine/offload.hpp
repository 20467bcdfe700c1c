#pragma once
/// \file How moe-run wires its experts to moekit: the host-memory loader, the pipeline settings,
/// the minimum expert budget, and the table of presets (the one place a preset name maps to an
/// OffloadPipeline type).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/memory_loader.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/presets.hpp"
#include "moekit/score/uniform.hpp"

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

/// Parameters of the presets (each flag of moe-run that configures one; defaults are the
/// papers' settings as the library's Config defaults).
struct PresetParams {
  // HOBBIT (and NextUse, which uses HOBBIT's scorer)
  float t1 = 0.6f;                                 ///< --t1: cumulative weight run at --precision
  float t2 = 0.9f;                                 ///< --t2: cumulative weight run at low precision
  moekit::Precision low = moekit::Precision::q4;   ///< --low-precision (HOBBIT low, Fate's int2 share)
  std::uint32_t lookahead = 2;                     ///< --lookahead: HOBBIT's stacked-gate layers ahead
  // Fate
  std::uint32_t shallow_layers = 3;                ///< --shallow-layers: layers cached in full
  double fate_low_fraction = 0.25;                 ///< --fate-low-fraction: prefill share at low
  double fate_percentile = 0.75;                   ///< --fate-percentile: decode prefetch cut
  // MoBiLE
  float gamma = 0.7f;                              ///< --gamma: accept iff max prob > gamma
  std::uint32_t k_little = 0;                      ///< --k-little: little pass's k (0 = K/2)
  // EdgeMoE
  std::string bitwidth_table;                      ///< --bitwidth-table (empty: uniform --precision)
  // Fiddler (0 = measured at start-up)
  std::string popularity_file;                     ///< --popularity (empty: calibration run)
  double cpu_seconds_per_token = 0;                ///< --cpu-latency
  double copy_seconds = 0;                         ///< --copy-latency
};

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

/// The presets moe-run knows. A pipeline type is fixed at compile time, so a run-time name
/// compiles every preset; a caller that needs one calls `with_preset<PresetId::...>` and
/// compiles only that one.
enum class PresetId { baseline, hobbit, fate, edgemoe, mobile, fiddler, nextuse };

/// A named preset and what it combines.
struct PresetInfo {
  PresetId id;
  std::string_view name;
  std::string_view summary;
};

/// Every preset moe-run knows, in `--help` order.
inline constexpr PresetInfo preset_table[] = {
    {PresetId::baseline, "baseline", "LRU cache, on-demand loads at --precision, no prediction"},
    {PresetId::hobbit, "hobbit",
     "HOBBIT: misses at --precision / --low-precision / skipped by --t1/--t2, stacked-gate "
     "prefetch (--lookahead), multidimensional cache"},
    {PresetId::fate, "fate",
     "Fate: cross-layer gate prefetch (--fate-percentile), shallow-favoring ARC "
     "(--shallow-layers), prefill's least popular --fate-low-fraction at --low-precision"},
    {PresetId::edgemoe, "edgemoe",
     "EdgeMoE: per-expert bit widths (--bitwidth-table, default uniform --precision), "
     "activation-path preloading (profile from a calibration run), EdgeMoE eviction"},
    {PresetId::mobile, "mobile",
     "MoBiLE: little pass with --k-little experts, fallback to full top-k when the max "
     "probability <= --gamma (KV rolled back), router-replay prefetch"},
    {PresetId::fiddler, "fiddler",
     "Fiddler: most popular experts placed at start (--popularity or a calibration run "
     "of the prompt), misses run on the CPU from host memory when cheaper than a load "
     "(latencies measured at start-up)"},
    {PresetId::nextuse, "nextuse",
     "moekit's ExpectedNextUse cache with HOBBIT's --t1/--t2 precisions, no predictor"},
};

/// The name of preset `id` (as --preset spells it).
constexpr std::string_view preset_name(PresetId id) {
  for (const auto& p : preset_table)
    if (p.id == id) return p.name;
  return {};
}

/// The preset called `name`; throws `Error(invalid_argument)` naming --preset for an unknown name.
inline PresetId check_preset_name(std::string_view name) {
  for (const auto& p : preset_table)
    if (p.name == name) return p.id;
  std::string known;
  for (const auto& p : preset_table) known += (known.empty() ? "" : ", ") + std::string(p.name);
  moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                       "--preset: unknown preset '" + std::string(name) + "' (known: " + known +
                           ")");
}

/// What a preset needs from the model and the machine beyond the settings.
struct PresetNeeds {
  bool routers = false;      ///< the router weights (HOBBIT, Fate gate predictors)
  bool calibration = false;  ///< routing counts / activation paths of a calibration run
  bool latencies = false;    ///< CPU vs load latencies (Fiddler)
};

inline PresetNeeds preset_needs(std::string_view name, const OffloadSettings& o) {
  PresetNeeds n;
  n.routers = name == "hobbit" || name == "fate";
  n.calibration = name == "edgemoe" || (name == "fiddler" && o.preset.popularity_file.empty());
  n.latencies =
      name == "fiddler" && (o.preset.cpu_seconds_per_token <= 0 || o.preset.copy_seconds <= 0);
  return n;
}

/// The per-expert precision table of EdgeMoE: --bitwidth-table or every expert at --precision.
inline moekit::PrecisionTable edgemoe_table(const moekit::ModelShape& s, const OffloadSettings& o) {
  if (o.preset.bitwidth_table.empty())
    return moekit::PrecisionTable(s.n_layers, s.n_experts, o.precision);
  moekit::PrecisionTable t = moekit::PrecisionTable::load(o.preset.bitwidth_table);
  if (t.n_layers() != s.n_layers || t.n_experts() != s.n_experts)
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         "--bitwidth-table: '" + o.preset.bitwidth_table + "' is for " +
                             std::to_string(t.n_layers()) + " layers × " +
                             std::to_string(t.n_experts()) + " experts; the model has " +
                             std::to_string(s.n_layers) + " × " + std::to_string(s.n_experts));
  return t;
}

/// Stored precisions preset `name` reads (the expert source must hold every one).
inline std::vector<moekit::Precision> required_precisions(std::string_view name,
                                                          const moekit::ModelShape& s,
                                                          const OffloadSettings& o) {
  std::vector<moekit::Precision> out{o.precision};
  auto add = [&](moekit::Precision p) {
    if (p != moekit::Precision::skip && std::find(out.begin(), out.end(), p) == out.end())
      out.push_back(p);
  };
  if (name == "hobbit" || name == "nextuse" || (name == "fate" && o.preset.fate_low_fraction > 0))
    add(o.preset.low);
  if (name == "edgemoe") {
    const moekit::PrecisionTable table = edgemoe_table(s, o);
    for (moekit::Precision p : table.all()) add(p);
  }
  return out;
}

/// Checks the preset flags against each other; names the flag.
inline void check_preset_params(std::string_view name, const OffloadSettings& o) {
  auto bad = [](const std::string& m) {
    moekit::detail::fail(moekit::ErrorKind::invalid_argument, m);
  };
  const PresetParams& q = o.preset;
  if (!(q.t1 >= 0 && q.t1 <= q.t2 && q.t2 <= 1))
    bad("--t1/--t2: need 0 <= t1 <= t2 <= 1 (t1 = " + std::to_string(q.t1) +
        ", t2 = " + std::to_string(q.t2) + ")");
  if ((name == "hobbit" || name == "nextuse" || name == "fate") &&
      moekit::bits(q.low) > moekit::bits(o.precision))
    bad("--low-precision: " + std::string(moekit::name(q.low)) + " is more precise than --precision " +
        std::string(moekit::name(o.precision)));
  if (!(q.fate_low_fraction >= 0 && q.fate_low_fraction <= 1))
    bad("--fate-low-fraction: must be in [0, 1]");
  if (!(q.fate_percentile >= 0 && q.fate_percentile < 1))
    bad("--fate-percentile: must be in [0, 1)");
  if (!(q.gamma >= 0 && q.gamma <= 1)) bad("--gamma: must be in [0, 1]");
}

/// EdgeMoE's scorer over `table`. Out of line: inlined into `with_preset`, g++ 12 -O3 reports a
/// false -Wfree-nonheap-object on the table's vector.
[[gnu::noinline]] inline moekit::StaticBitwidthScorer edgemoe_scorer(const moekit::PrecisionTable& table) {
  return moekit::StaticBitwidthScorer({.table = table});
}

/// What presets need from the model beyond the settings (filled per `preset_needs`).
struct PresetInputs {
  /// Routers of every MoE layer, [L·E·hidden] f32 (`router_stack`); must outlive the pipeline.
  std::span<const float> routers{};
  /// Tokens routed to each (layer, expert), [L × E] (Fiddler's placement, EdgeMoE's prior).
  std::vector<double> popularity{};
  /// Activation paths (EdgeMoE's preloading).
  std::shared_ptr<const moekit::ActivationPathProfile> paths{};
  double cpu_seconds_per_token = 0;  ///< Fiddler: one token through one expert on the CPU
  double copy_seconds = 0;           ///< Fiddler: load one expert into the cache and run it
};

/// Builds the pipeline of preset `Id` with its experts served by `loader` and calls
/// `f(pipeline)`; throws `Error(invalid_argument)` naming the flag for a missing input.
template <PresetId Id, class Loader, class F>
decltype(auto) with_preset(const moekit::ModelShape& s, const OffloadSettings& o, Loader loader,
                           const PresetInputs& in, F&& f) {
  namespace mk = moekit;
  namespace pr = moekit::presets;
  constexpr std::string_view name = preset_name(Id);
  check_preset_params(name, o);
  mk::PipelineConfig pc = pipeline_config(s, o);
  const PresetParams& q = o.preset;
  const mk::HobbitRule rule{.t1 = q.t1, .t2 = q.t2, .high = o.precision, .low = q.low};
  auto need_routers = [&] {
    if (in.routers.size() != std::size_t{s.n_layers} * s.n_experts * s.hidden)
      mk::detail::fail(mk::ErrorKind::internal,
                       "--preset " + std::string(name) + ": the router weights were not provided");
  };
  if constexpr (Id == PresetId::hobbit) {
    need_routers();
    using P = pr::Hobbit<Loader>;
    auto p = std::make_unique<P>(
        s, pc, std::move(loader), mk::HobbitThresholdScorer({.rule = rule}),
        mk::StackedGatePredictor({.router_weights = in.routers, .n_layers = s.n_layers,
                                  .n_experts = s.n_experts, .hidden = s.hidden,
                                  .top_k = s.top_k, .lookahead = q.lookahead, .rule = rule}),
        mk::MultiDimPolicy({.high = o.precision, .low = q.low}));
    return f(*p);
  } else if constexpr (Id == PresetId::fate) {
    need_routers();
    using P = pr::Fate<Loader>;
    const mk::Precision low = q.fate_low_fraction > 0 ? q.low : o.precision;
    auto p = std::make_unique<P>(
        s, pc, std::move(loader),
        mk::PopularityScorer({.int2_fraction = q.fate_low_fraction, .high = o.precision,
                              .low = low, .decode_precision = o.precision}),
        mk::CrossLayerGatePredictor({.router_weights = in.routers, .n_layers = s.n_layers,
                                     .n_experts = s.n_experts, .hidden = s.hidden,
                                     .top_k = s.top_k, .percentile = q.fate_percentile,
                                     .decode_precision = o.precision,
                                     .int2_fraction = q.fate_low_fraction,
                                     .prefill_high = o.precision, .prefill_low = low}),
        mk::ShallowFavoring<mk::ArcPolicy>({.shallow_layers = std::min(q.shallow_layers, s.n_layers)}));
    return f(*p);
  } else if constexpr (Id == PresetId::edgemoe) {
    if (!in.paths)
      mk::detail::fail(mk::ErrorKind::internal,
                       "--preset edgemoe: no activation-path profile (calibration run missing)");
    const mk::PrecisionTable table = edgemoe_table(s, o);
    for (mk::Precision p : table.all())
      if (mk::bits(p) > mk::bits(pc.base_precision)) pc.base_precision = p;  // slots fit the widest
    pc.sizing_precision = o.precision;
    using P = pr::EdgeMoe<Loader>;
    auto p = std::make_unique<P>(
        s, pc, std::move(loader), edgemoe_scorer(table),
        mk::ActivationPathPredictor(
            {.profile = in.paths,
             .precisions = std::vector<mk::Precision>(table.all().begin(), table.all().end())}),
        mk::EdgeMoePolicy({.prior_counts = in.popularity}));
    return f(*p);
  } else if constexpr (Id == PresetId::mobile) {
    using P = pr::Mobile<Loader>;
    auto p = std::make_unique<P>(
        s, pc, std::move(loader), mk::UniformScorer({.precision = o.precision}),
        mk::RouterReplayPredictor({.top_k = s.top_k, .precision = o.precision}),
        mk::LruPolicy{}, mk::OnDemandScheduler{},
        mk::BigLittlePolicy({.gamma = q.gamma, .k_little = std::min(q.k_little, s.top_k)}));
    return f(*p);
  } else if constexpr (Id == PresetId::fiddler) {
    if (in.popularity.size() != s.expert_count())
      mk::detail::fail(mk::ErrorKind::internal, "--preset fiddler: no popularity profile");
    if (!(in.cpu_seconds_per_token > 0 && in.copy_seconds > 0))
      mk::detail::fail(mk::ErrorKind::internal, "--preset fiddler: CPU/load latencies not measured");
    using P = pr::Fiddler<Loader>;
    auto p = std::make_unique<P>(
        s, pc, std::move(loader), mk::UniformScorer({.precision = o.precision}), mk::NoPredictor{},
        mk::StaticPopularityPolicy({.counts = in.popularity}),
        mk::FiddlerScheduler({.cpu_seconds_per_token = in.cpu_seconds_per_token,
                              .copy_seconds = in.copy_seconds}));
    // Placement: the most popular experts (ties to the lower index) until the budget is full.
    std::vector<std::uint32_t> order(s.expert_count());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      return in.popularity[a] > in.popularity[b];
    });
    for (std::uint32_t i : order) {
      const mk::ExpertKey k{i / s.n_experts, i % s.n_experts};
      if (!p->preload(k, o.precision)) break;
    }
    return f(*p);
  } else if constexpr (Id == PresetId::nextuse) {
    using P = pr::NextUse<Loader>;
    auto p = std::make_unique<P>(s, pc, std::move(loader), mk::HobbitThresholdScorer({.rule = rule}));
    return f(*p);
  } else {
    static_assert(Id == PresetId::baseline);
    using P = pr::Baseline<Loader>;
    auto p = std::make_unique<P>(s, pc, std::move(loader), mk::UniformScorer({.precision = o.precision}));
    return f(*p);
  }
}

/// Builds the pipeline of preset `name` (checked against the preset table) and calls
/// `f(pipeline)`. Every preset's pipeline type, and `f` for each, is compiled.
template <class Loader, class F>
decltype(auto) with_preset(std::string_view name, const moekit::ModelShape& s,
                           const OffloadSettings& o, Loader loader, const PresetInputs& in, F&& f) {
  auto run = [&]<PresetId Id>() -> decltype(auto) {
    return with_preset<Id>(s, o, std::move(loader), in, std::forward<F>(f));
  };
  switch (check_preset_name(name)) {
    case PresetId::hobbit: return run.template operator()<PresetId::hobbit>();
    case PresetId::fate: return run.template operator()<PresetId::fate>();
    case PresetId::edgemoe: return run.template operator()<PresetId::edgemoe>();
    case PresetId::mobile: return run.template operator()<PresetId::mobile>();
    case PresetId::fiddler: return run.template operator()<PresetId::fiddler>();
    case PresetId::nextuse: return run.template operator()<PresetId::nextuse>();
    case PresetId::baseline: break;
  }
  return run.template operator()<PresetId::baseline>();
}

/// The in-memory form used before presets took inputs: any preset that needs no model inputs.
template <class F>
decltype(auto) with_preset(std::string_view name, const moekit::ModelShape& s,
                           const OffloadSettings& o, const HostExperts& experts, F&& f) {
  return with_preset(name, s, o, host_loader(experts), PresetInputs{}, std::forward<F>(f));
}

/// The same for one preset known at compile time.
template <PresetId Id, class F>
decltype(auto) with_preset(const moekit::ModelShape& s, const OffloadSettings& o,
                           const HostExperts& experts, F&& f) {
  return with_preset<Id>(s, o, host_loader(experts), PresetInputs{}, std::forward<F>(f));
}

}  // namespace moekit::engine
