// Cost of every cache policy through ExpertCache: ns per demand access (hit or miss, including
// pins and the insertion with its evictions) and ns per insertion that evicted, for a Mixtral-like
// 32 layers × 8 experts (top-2) and a DeepSeek-like 28 layers × 64 experts (top-6), at 50% of the
// experts resident, on a skewed synthetic routing stream (fixed seed). Printed as a ratio to the
// target of 200 ns per access (ratio < 1 meets it). ns/access is thread CPU time over the whole
// replay (includes the timing of evicting inserts, ~2 clock reads each); ns/evicting is the
// median wall time of one insertion that evicted (ExpertCache's work included; the median ignores
// preemptions), best of 3 runs. Because the machine is shared, every row also prints its ratio to
// LRU's ns/access measured in the same run, with LRU re-measured next to each policy (the rows'
// runs interleave with LRU runs, so a load change hits both sides of the ratio).
//
// Usage: moekit_bench_policy_cost [tokens [policy-name-substring]]   (default 4000 tokens per
// shape, every policy)

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "moekit/cache/arc.hpp"
#include "moekit/cache/belady.hpp"
#include "moekit/cache/edgemoe.hpp"
#include "moekit/cache/expected_next_use.hpp"
#include "moekit/cache/expert_cache.hpp"
#include "moekit/cache/fld.hpp"
#include "moekit/cache/lfu.hpp"
#include "moekit/cache/lhu.hpp"
#include "moekit/cache/lru.hpp"
#include "moekit/cache/multidim.hpp"
#include "moekit/cache/shallow_favoring.hpp"
#include "moekit/cache/static_popularity.hpp"
#include "moekit/presets/nextuse_fit.hpp"

using namespace moekit;
using Clock = std::chrono::steady_clock;

// The machine is shared: the per-access figure uses this thread's CPU time, not wall time.
double thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}

namespace {

constexpr double target_ns = 200.0;

struct Stream {
  ModelShape shape;
  std::vector<std::vector<FutureAccess>> steps;  // per (token, layer)
  std::vector<FutureAccess> flat;
  std::vector<double> counts;
};

Stream make_stream(const ModelShape& s, std::uint32_t tokens, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<double>> w(s.n_layers, std::vector<double>(s.n_experts));
  for (auto& layer : w) {
    std::vector<std::uint32_t> perm(s.n_experts);
    for (std::uint32_t e = 0; e < s.n_experts; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (std::uint32_t r = 0; r < s.n_experts; ++r) layer[perm[r]] = 1.0 / (1.0 + r);
  }
  Stream st{s, {}, {}, std::vector<double>(s.expert_count(), 0.0)};
  for (std::uint32_t t = 0; t < tokens; ++t)
    for (std::uint32_t l = 0; l < s.n_layers; ++l) {
      std::vector<double> ww = w[l];
      std::vector<FutureAccess> step;
      for (std::uint32_t j = 0; j < s.top_k; ++j) {
        std::discrete_distribution<std::uint32_t> d(ww.begin(), ww.end());
        const std::uint32_t e = d(rng);
        ww[e] = 0.0;
        const Precision p = std::bernoulli_distribution(0.65)(rng) ? Precision::f16 : Precision::q4;
        step.push_back({{l, e}, p});
        st.flat.push_back({{l, e}, p});
        st.counts[s.index({l, e})] += 1;
      }
      st.steps.push_back(std::move(step));
    }
  return st;
}

struct Cost {
  double ns_per_access = 0, ns_per_eviction = 0, miss_ratio = 0;
  std::uint64_t evictions = 0;
};

template <class P>
Cost measure(const Stream& st, P policy) {
  const ModelShape& s = st.shape;
  ExpertCache<P> cache(s, s.expert_count() / 2 * s.expert_bytes(Precision::f16), Precision::f16,
                       std::move(policy));
  std::vector<ExpertKey> pinned;
  pinned.reserve(s.top_k);
  std::vector<double> evict_ns;
  evict_ns.reserve(st.flat.size());
  std::uint64_t accesses = 0, misses = 0;
  const double t0 = thread_cpu_ns();
  for (std::size_t i = 0; i < st.steps.size(); ++i) {
    const std::uint32_t layer = static_cast<std::uint32_t>(i % s.n_layers);
    if (layer == 0) cache.begin_token();
    for (const FutureAccess& d : st.steps[i]) {
      ++accesses;
      if (cache.resident_at(d.key, d.precision)) {
        cache.on_hit(d.key, cache.access(d.precision, layer));
      } else {
        ++misses;
        cache.count_miss();
        const std::uint64_t ev0 = cache.stats().evictions;
        const auto a = Clock::now();
        const bool ok = cache.insert(d.key, cache.access(d.precision, layer)).ok();
        const auto b = Clock::now();
        if (cache.stats().evictions != ev0) {
          evict_ns.push_back(std::chrono::duration<double, std::nano>(b - a).count());
        }
        if (!ok) continue;
      }
      cache.pin_hard(d.key);
      pinned.push_back(d.key);
    }
    for (ExpertKey k : pinned) cache.unpin_hard(k);
    pinned.clear();
  }
  const double total = thread_cpu_ns() - t0;
  double median = 0.0;
  if (!evict_ns.empty()) {
    std::nth_element(evict_ns.begin(), evict_ns.begin() + evict_ns.size() / 2, evict_ns.end());
    median = evict_ns[evict_ns.size() / 2];
  }
  return {total / double(accesses), median, double(misses) / double(accesses),
          cache.stats().evictions};
}

const char* only = nullptr;  // run only the policies whose name contains this

template <class P>
void row(const char* name, const Stream& st, P policy) {
  if (only && !std::strstr(name, only)) return;
  // Best of 3 runs each, alternating with LRU: the minimum is the least disturbed run.
  Cost best{}, lru{};
  for (int r = 0; r < 3; ++r) {
    const Cost l = measure(st, LruPolicy{});
    const Cost c = measure(st, policy);
    if (r == 0 || l.ns_per_access < lru.ns_per_access) lru = l;
    if (r == 0 || c.ns_per_access < best.ns_per_access) best = c;
  }
  std::printf("%-26s %9.1f %8.2f %7.2f %13.1f %10llu %8.1f%%\n", name, best.ns_per_access,
              best.ns_per_access / target_ns, best.ns_per_access / lru.ns_per_access,
              best.ns_per_eviction, static_cast<unsigned long long>(best.evictions),
              100.0 * best.miss_ratio);
}

}  // namespace

int main(int argc, char** argv) {
  const std::uint32_t tokens = argc > 1 ? static_cast<std::uint32_t>(std::atoi(argv[1])) : 4000;
  if (argc > 2) only = argv[2];
  const ModelShape shapes[] = {
      {.n_layers = 32, .n_experts = 8, .top_k = 2, .hidden = 4096, .ffn = 14336},
      {.n_layers = 28, .n_experts = 64, .top_k = 6, .hidden = 2048, .ffn = 1408}};
  for (const ModelShape& s : shapes) {
    const Stream st = make_stream(s, tokens, 42);
    std::printf("\n%u layers x %u experts (top-%u), %zu of %zu resident (f16), %zu accesses\n",
                s.n_layers, s.n_experts, s.top_k, s.expert_count() / 2, s.expert_count(),
                st.flat.size());
    std::printf("%-26s %9s %8s %7s %13s %10s %9s\n", "policy", "ns/access", "/200ns", "/LRU",
                "ns/evict(med)", "evictions", "misses");
    row("lru", st, LruPolicy{});
    row("lfu seq", st, LfuPolicy{});
    row("lhu seq", st, LhuPolicy{});
    row("fld", st, FldPolicy{});
    row("hobbit multidim", st, MultiDimPolicy{});
    row("arc per layer", st, ArcPolicy{});
    row("fate shallow(3)+arc", st, ShallowFavoringArcPolicy({3}));
    row("edgemoe", st, EdgeMoePolicy{});
    row("expected next use", st, ExpectedNextUsePolicy{});
    row("next use, nextuse-fit", st, ExpectedNextUsePolicy(presets::NextUseFitSpec::fitted));
    row("fiddler static", st, StaticPopularityPolicy({.counts = st.counts}));
    {
      BeladyPolicy::Config c;
      for (const auto& f : st.flat) c.future.push_back(f.key);
      row("belady (offline)", st, BeladyPolicy(std::move(c)));
    }
    row("cost-aware belady", st, CostAwareBeladyPolicy({.future = st.flat}));
  }
  return 0;
}
