// Replay speed of moe-sim's engine: expert accesses (demands the pipeline serves) per second of
// wall time, for the LRU preset (presets::Baseline<SimLoader>) and the Belady reference, at
// Mixtral-8x7B shapes (32 layers, 8 experts, top-2) with half of the experts cached. Target
// (issue 6): >= 5 M accesses/s for LRU. The trace is synthetic decode routing with per-layer
// expert skew (the shared traces are too short to time); the best of `--reps` runs is reported.
//
// Usage: moekit_bench_replay_speed [--tokens N] [--reps N]

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moekit/cache/belady.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/presets.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/uniform.hpp"
#include "moekit/sim/hardware.hpp"
#include "moekit/sim/replay.hpp"
#include "moekit/sim/sim_loader.hpp"
#include "moekit/sim/trace.hpp"

using namespace moekit;
using namespace moekit::sim;
using Clock = std::chrono::steady_clock;

namespace {

RoutingTrace synthetic_trace(std::size_t tokens) {
  const TraceDims d{.n_layers = 32, .n_experts = 8, .top_k = 2};
  RoutingTrace tr(d, "synthetic-skewed-decode", /*synthetic=*/true);
  tr.reserve_tokens(tokens);
  std::mt19937 rng(42);
  std::vector<std::discrete_distribution<std::uint32_t>> pick;
  for (std::uint32_t l = 0; l < d.n_layers; ++l) {
    std::vector<double> w(d.n_experts);
    for (std::uint32_t e = 0; e < d.n_experts; ++e) w[e] = 1.0 / (1.0 + double((e + l) % 8));
    pick.emplace_back(w.begin(), w.end());
  }
  const float wts[2] = {0.75f, 0.25f};
  for (std::size_t t = 0; t < tokens; ++t) {
    if (t % 512 == 0) tr.begin_sequence("seq" + std::to_string(t / 512));
    const std::size_t g = tr.append_token(Phase::decode);
    for (std::uint32_t l = 0; l < d.n_layers; ++l) {
      std::uint32_t ids[2];
      ids[0] = pick[l](rng);
      do ids[1] = pick[l](rng);
      while (ids[1] == ids[0]);
      tr.set_route(g, l, ids, wts);
    }
  }
  return tr;
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Rate {
  double wall = 0, cpu = 0;  ///< accesses per wall second, per CPU second of this process
};

// Best of `reps`. The CPU-time rate is the one to read on a shared machine: other engineers'
// builds steal wall time, not this process's CPU time.
template <class Make>
Rate best_rate(int reps, const RoutingTrace& tr, const ComputeModel& cm, Make make,
               std::uint64_t& accesses) {
  Rate best;
  for (int r = 0; r < reps; ++r) {
    auto p = make();
    const auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    const ReplayReport rep = replay(*p, tr, cm);
    const double c = cpu_seconds() - c0;
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    accesses = rep.pipeline.demands;
    best.wall = std::max(best.wall, double(accesses) / s);
    best.cpu = std::max(best.cpu, double(accesses) / c);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t tokens = 20000;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc)
      tokens = std::stoul(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--tokens N] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  const RoutingTrace tr = synthetic_trace(tokens);
  const ModelShape shape = mixtral_8x7b;
  const HardwareModel hw = rtx4090_pcie4();
  const ComputeModel cm = hw.compute_model(shape, mixtral_8x7b_dense());
  const PipelineConfig cfg{.expert_budget_bytes = 128 * shape.expert_bytes(Precision::f16)};

  std::uint64_t n_lru = 0, n_bel = 0;
  const Rate lru = best_rate(
      reps, tr, cm,
      [&] {
        return std::make_unique<presets::Baseline<SimLoader>>(shape, cfg,
                                                              SimLoader(shape, hw.link));
      },
      n_lru);
  using Belady = CallOrderedPolicy<BeladyPolicy>;
  using BeladySim =
      OffloadPipeline<UniformScorer, NoPredictor, Belady, SimLoader, OnDemandScheduler>;
  const DemandSequence future = demand_sequence(tr);
  const Rate bel = best_rate(
      reps, tr, cm,
      [&] {
        return std::make_unique<BeladySim>(shape, cfg, SimLoader(shape, hw.link), UniformScorer{},
                                           NoPredictor{}, Belady(future));
      },
      n_bel);

  constexpr double target = 5e6;
  std::printf(
      "replay speed, Mixtral-8x7B shapes, 128/256 slots, %zu decode tokens (SYNTHETIC "
      "routing), best of %d\n",
      tokens, reps);
  std::printf("%-8s %12s %14s %10s %14s %10s\n", "policy", "accesses", "per CPU s", "vs 5 M/s",
              "per wall s", "vs 5 M/s");
  auto row = [&](const char* name, std::uint64_t n, Rate r) {
    std::printf("%-8s %12llu %14.3e %9.2fx %14.3e %9.2fx\n", name,
                static_cast<unsigned long long>(n), r.cpu, r.cpu / target, r.wall, r.wall / target);
  };
  row("lru", n_lru, lru);
  row("belady", n_bel, bel);
  return 0;
}
