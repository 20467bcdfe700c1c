// BeladyPolicy and CostAwareBeladyPolicy (cache/belady.hpp): the offline references.
// Exact worked examples through ExpertCache (helpers: cache_test_support.hpp).

#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "cache/cache_test_support.hpp"
#include "moekit/cache/belady.hpp"
#include "moekit/cache/lru.hpp"

using namespace moekit;
using namespace moekit::test;

// ---- Belady -------------------------------------------------------------------------------------

namespace {
/// Fewest misses of a demand-paging cache of `cap` entries on `seq` (exhaustive search).
std::size_t brute_force_min_misses(const std::vector<std::uint32_t>& seq, std::size_t cap) {
  std::map<std::pair<std::size_t, std::uint32_t>, std::size_t> memo;
  std::function<std::size_t(std::size_t, std::uint32_t)> go = [&](std::size_t i,
                                                                  std::uint32_t mask) {
    if (i == seq.size()) return std::size_t{0};
    const auto key = std::pair{i, mask};
    if (auto it = memo.find(key); it != memo.end()) return it->second;
    const std::uint32_t bit = 1u << seq[i];
    std::size_t best;
    if (mask & bit) {
      best = go(i + 1, mask);
    } else if (std::size_t(__builtin_popcount(mask)) < cap) {
      best = 1 + go(i + 1, mask | bit);
    } else {
      best = ~std::size_t{0};
      for (std::uint32_t m = mask; m; m &= m - 1)
        best = std::min(best, 1 + go(i + 1, (mask & ~(m & -m)) | bit));
    }
    return memo[key] = best;
  };
  return go(0, 0);
}

template <class P>
std::size_t misses_with(P policy, const std::vector<std::uint32_t>& seq, std::size_t cap) {
  const ModelShape one{.n_layers = 1, .n_experts = 8, .top_k = 1, .hidden = 64, .ffn = 128};
  ExpertCache<P> c(one, cap * one.expert_bytes(Precision::f16), Precision::f16, std::move(policy));
  std::size_t m = 0;
  for (auto e : seq) m += use(c, {0, e}) ? 0 : 1;
  return m;
}
}  // namespace

TEST_CASE("Belady on the textbook reference string and against brute force", "[cache][belady]") {
  // Silberschatz's reference string, 3 frames: the optimal algorithm faults 9 times, LRU 12.
  const std::vector<std::uint32_t> ref = {7, 0, 1, 2, 0, 3, 0, 4, 2, 3,
                                          0, 3, 2, 1, 2, 0, 1, 7, 0, 1};
  BeladyPolicy::Config cfg;
  for (auto e : ref) cfg.future.push_back({0, e});
  CHECK(misses_with(BeladyPolicy(cfg), ref, 3) == 9);
  CHECK(misses_with(LruPolicy{}, ref, 3) == 12);
  CHECK(brute_force_min_misses(ref, 3) == 9);

  std::mt19937 rng(5);
  for (int trial = 0; trial < 40; ++trial) {
    std::uniform_int_distribution<std::uint32_t> d(0, 5);
    std::vector<std::uint32_t> seq(14);
    for (auto& e : seq) e = d(rng);
    const std::size_t cap = 1 + trial % 4;
    BeladyPolicy::Config bc;
    CostAwareBeladyPolicy::Config cc;
    for (auto e : seq) bc.future.push_back({0, e}), cc.future.push_back({{0, e}, Precision::f16});
    CAPTURE(trial, cap);
    const std::size_t opt = brute_force_min_misses(seq, cap);
    CHECK(misses_with(BeladyPolicy(bc), seq, cap) == opt);
    CHECK(misses_with(CostAwareBeladyPolicy(cc), seq, cap) == opt);  // one precision: Belady
  }
}

TEST_CASE("Belady rejects demands outside its future", "[cache][belady]") {
  ExpertCache<BeladyPolicy> c(small, 2 * f16b, Precision::f16,
                              BeladyPolicy({.future = {{0, 1}, {0, 2}}}));
  use(c, {0, 1});
  CHECK_THROWS_WITH(c.insert({0, 3}, c.access(Precision::f16, 0)), Catch::Contains("future"));
}

TEST_CASE("Cost-aware reference weighs misses by bytes", "[cache][belady]") {
  // Pool of one f16 + one q4 copy. A (f16) is needed again soon at high precision; B (q4) later at
  // q4; C at f16 arrives. Plain Belady evicts B (farther). Cost-aware: B frees few bytes and is
  // cheap to reload, A frees many but is expensive; the score distance × freed / cost decides.
  const std::vector<FutureAccess> fut = {{{0, 0}, Precision::f16},
                                         {{0, 1}, Precision::q4},
                                         {{0, 2}, Precision::q4},
                                         {{0, 0}, Precision::f16},
                                         {{0, 1}, Precision::q4}};
  ExpertCache<CostAwareBeladyPolicy> c(small, f16b + q4b, Precision::f16,
                                       CostAwareBeladyPolicy({.future = fut}));
  use(c, {0, 0}, Precision::f16);
  use(c, {0, 1}, Precision::q4);
  use(c, {0, 2}, Precision::q4);  // needs q4 bytes: A scores 2·1, B scores 3·1 → B goes
  CHECK(c.resident({0, 0}));
  CHECK_FALSE(c.resident({0, 1}));
  // A copy that cannot serve its next demand (needs more bits) goes first.
  const std::vector<FutureAccess> up = {{{0, 3}, Precision::q4},
                                        {{0, 4}, Precision::q4},
                                        {{0, 5}, Precision::q4},
                                        {{0, 3}, Precision::f16},
                                        {{0, 4}, Precision::q4}};
  ExpertCache<CostAwareBeladyPolicy> d(small, 2 * q4b, Precision::q4,
                                       CostAwareBeladyPolicy({.future = up}));
  use(d, {0, 3}, Precision::q4);
  use(d, {0, 4}, Precision::q4);
  use(d, {0, 5}, Precision::q4);  // Belady would evict 4 (farther); 3's copy is dead
  CHECK_FALSE(d.resident({0, 3}));
  CHECK(d.resident({0, 4}));
}
