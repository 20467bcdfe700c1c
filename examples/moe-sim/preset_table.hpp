#pragma once
/// \file The presets moe-sim can replay — the ONE place to add one. A preset that presets.hpp does
/// not define yet has `run = nullptr` and says why; moe-sim reports it as not available.
///
/// To add a preset once it lands in presets.hpp: replace its `nullptr` with
/// `&run_defaults<moekit::presets::Name<moekit::sim::SimLoader>>` (components default-built), or
/// with a small factory like `run_belady` below when a component needs RunParams (T1/T2, γ).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "moekit/cache/belady.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/presets.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/uniform.hpp"
#include "moekit/sim/replay.hpp"
#include "moekit/sim/sim_loader.hpp"
#include "moekit/sim/trace.hpp"
#include "moekit/sim/trace_stats.hpp"

namespace moe_sim {

/// Everything one replay needs besides the trace.
struct RunParams {
  moekit::ModelShape shape{};
  moekit::PipelineConfig config{};
  moekit::sim::LinkModel link{};
  moekit::sim::ComputeModel compute{};
  double t1 = 0.6;     ///< HOBBIT's high-precision threshold (paper default)
  double t2 = 0.9;     ///< HOBBIT's low-precision threshold (paper default)
  double gamma = 0.7;  ///< MoBiLE's fallback threshold (paper default)
};

using RunFn = moekit::sim::ReplayReport (*)(const RunParams&, const moekit::sim::RoutingTrace&);

/// Replays `tr` through a pipeline `P` whose components are default-built.
template <class P>
moekit::sim::ReplayReport run_defaults(const RunParams& rp, const moekit::sim::RoutingTrace& tr) {
  P p(rp.shape, rp.config, moekit::sim::SimLoader(rp.shape, rp.link));
  return moekit::sim::replay(p, tr, rp.compute);
}

/// The Belady reference: the baseline's components with Belady's offline eviction, fed the
/// trace's own demand sequence.
inline moekit::sim::ReplayReport run_belady(const RunParams& rp,
                                            const moekit::sim::RoutingTrace& tr) {
  using namespace moekit;
  using Belady = sim::CallOrderedPolicy<BeladyPolicy>;
  OffloadPipeline<UniformScorer, NoPredictor, Belady, sim::SimLoader, OnDemandScheduler> p(
      rp.shape, rp.config, sim::SimLoader(rp.shape, rp.link),
      UniformScorer({.precision = rp.config.base_precision}), NoPredictor{},
      Belady(sim::demand_sequence(tr)));
  return sim::replay(p, tr, rp.compute);
}

/// Fiddler: static popularity placement profiled on the replayed trace itself (an optimistic
/// profile: Fiddler profiles a calibration set), and the CPU-vs-copy scheduler with latencies
/// from the hardware model (CPU: one token through one expert; copy: transfer + device run).
inline moekit::sim::ReplayReport run_fiddler(const RunParams& rp,
                                             const moekit::sim::RoutingTrace& tr) {
  using namespace moekit;
  const Precision base = rp.config.base_precision;
  FiddlerScheduler sched({.cpu_seconds_per_token = rp.compute.cpu(base, 1),
                          .copy_seconds = rp.link.transfer_s(rp.shape.expert_bytes(base)) +
                                          rp.compute.device(base, 1)});
  presets::Fiddler<sim::SimLoader> p(rp.shape, rp.config, sim::SimLoader(rp.shape, rp.link),
                                     UniformScorer({.precision = base}), NoPredictor{},
                                     StaticPopularityPolicy({.counts = sim::expert_shares(tr)}),
                                     sched);
  // Fiddler places the popular experts at load time: insert every expert, most popular first;
  // the policy admits those that fit its placement (free: before the replay's clock starts).
  const std::vector<double> shares = sim::expert_shares(tr);
  std::vector<std::size_t> order(shares.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return shares[a] > shares[b]; });
  for (std::size_t i : order) {
    const ExpertKey key{static_cast<std::uint32_t>(i / rp.shape.n_experts),
                        static_cast<std::uint32_t>(i % rp.shape.n_experts)};
    (void)p.cache().insert(key, p.cache().access(base, key.layer));
  }
  return sim::replay(p, tr, rp.compute);
}

/// One row of the table.
struct PresetEntry {
  std::string_view name;
  std::string_view what;
  RunFn run;                     ///< nullptr: not available
  std::string_view unavailable;  ///< why, when `run` is nullptr
  bool uses_t1_t2 = false;       ///< sweeps of t1/t2 apply
  bool uses_gamma = false;       ///< sweeps of gamma apply
};

inline constexpr PresetEntry preset_table[] = {
    {"baseline", "LRU cache, on-demand loads at full precision, no prediction",
     &run_defaults<moekit::presets::Baseline<moekit::sim::SimLoader>>, "", false, false},
    {"hobbit", "HOBBIT: T1/T2 mixed precision, stacked-gate prefetch, multidimensional cache",
     nullptr, "not wired in moe-sim yet: its stacked-gate predictor needs the model's router "
     "weights and traces with hidden states", true, false},
    {"fate", "Fate: cross-layer gate prefetch, shallow-favoring ARC cache", nullptr,
     "not wired in moe-sim yet: its cross-layer gate needs the model's router weights and traces "
     "with hidden states", false, false},
    {"edgemoe", "EdgeMoE: static bit-widths, activation-path preload, distance-aware eviction",
     nullptr, "not wired in moe-sim yet: needs a bit-width table (tools::bitwidth_search) and an "
     "activation-path profile", false, false},
    {"mobile", "MoBiLE: big-little experts with fallback at gamma", nullptr,
     "not wired in moe-sim yet: its fallback decision needs output logits, which traces do not "
     "store", false, true},
    {"fiddler", "Fiddler: popular experts placed up front (profiled on the trace), misses on the CPU when cheaper",
     &run_fiddler, "", false, false},
};

/// The reference line every comparison adds.
inline constexpr PresetEntry belady_entry{
    "belady", "Belady's offline optimum (baseline components, future-aware eviction)",
    &run_belady, "", false, false};

}  // namespace moe_sim
