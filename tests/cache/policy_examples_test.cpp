// Exact worked examples from the papers, one policy at a time, through ExpertCache.

#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "moekit/cache/arc.hpp"
#include "moekit/cache/belady.hpp"
#include "moekit/cache/edgemoe.hpp"
#include "moekit/cache/expert_cache.hpp"
#include "moekit/cache/expected_next_use.hpp"
#include "moekit/cache/fld.hpp"
#include "moekit/cache/lfu.hpp"
#include "moekit/cache/lhu.hpp"
#include "moekit/cache/lru.hpp"
#include "moekit/cache/multidim.hpp"
#include "moekit/cache/shallow_favoring.hpp"
#include "moekit/cache/static_popularity.hpp"

using namespace moekit;

namespace {

constexpr ModelShape small{.n_layers = 4, .n_experts = 8, .top_k = 2, .hidden = 64, .ffn = 128};
const std::size_t f16b = small.expert_bytes(Precision::f16);
const std::size_t q4b = small.expert_bytes(Precision::q4);

/// One demand: a hit if a copy serves it, else an insertion. Returns true on a hit.
template <class P>
bool use(ExpertCache<P>& c, ExpertKey k, Precision p = Precision::f16,
         std::uint32_t layer = 0xffffffffu) {
  const std::uint32_t l = layer == 0xffffffffu ? k.layer : layer;
  if (c.resident_at(k, p)) {
    c.on_hit(k, c.access(p, l));
    return true;
  }
  c.count_miss();
  REQUIRE(c.insert(k, c.access(p, l)).ok());
  c.check_invariants();
  return false;
}

/// HOBBIT's miss penalty of one demand, in units of a full-precision load.
double penalty(const ModelShape& s, Precision p) {
  return double(s.expert_bytes(p)) / double(s.expert_bytes(Precision::f16));
}

}  // namespace

// ---- HOBBIT ----------------------------------------------------------------------------------

TEST_CASE("HOBBIT Fig. 11: LHU keeps the expert used at high precision, LFU the busy one",
          "[cache][lhu][lfu][hobbit]") {
  // Expert 4 is used often but mostly at low precision; expert 6 less often, always high.
  auto history = [](auto& c) {
    use(c, {0, 4}, Precision::f16);
    for (int i = 0; i < 5; ++i) CHECK(use(c, {0, 4}, Precision::q4));  // served by the f16 copy
    for (int i = 0; i < 3; ++i) use(c, {0, 6}, Precision::f16);
    use(c, {0, 1}, Precision::f16);  // needs a slot: the policies disagree
  };
  ExpertCache<LfuPolicy> lfu(small, 2 * f16b, Precision::f16);
  ExpertCache<LhuPolicy> lhu(small, 2 * f16b, Precision::f16);
  history(lfu);
  history(lhu);
  CHECK(lfu.policy().uses({0, 4}) == 6);
  CHECK(lhu.policy().high_uses({0, 4}) == 1);
  CHECK(lhu.policy().high_uses({0, 6}) == 3);
  CHECK(lfu.resident({0, 4}));
  CHECK_FALSE(lfu.resident({0, 6}));
  CHECK(lhu.resident({0, 6}));
  CHECK_FALSE(lhu.resident({0, 4}));

  // The next uses follow the same pattern: 4 at low precision, 6 at high.
  double pen_lfu = 0, pen_lhu = 0;
  for (auto [k, p] : {std::pair{ExpertKey{0, 4}, Precision::q4}, {ExpertKey{0, 6}, Precision::f16}}) {
    if (!use(lfu, k, p)) pen_lfu += penalty(small, p);
    if (!use(lhu, k, p)) pen_lhu += penalty(small, p);
  }
  CHECK(pen_lfu == 1.0);                      // a high-precision miss
  CHECK(pen_lhu == penalty(small, Precision::q4));  // a low-precision miss
  CHECK(pen_lhu < 0.3 * pen_lfu);
}

TEST_CASE("LFU counts restart per sequence only with sequence scope", "[cache][lfu]") {
  for (CountScope scope : {CountScope::sequence, CountScope::model}) {
    ExpertCache<LfuPolicy> c(small, 2 * f16b, Precision::f16, LfuPolicy({.scope = scope}));
    for (int i = 0; i < 4; ++i) use(c, {0, 0});  // 0 is popular in sequence 1
    use(c, {0, 1});
    c.begin_sequence();
    CHECK(c.resident({0, 0}));  // contents kept
    use(c, {0, 1});
    use(c, {0, 1});  // 1 is popular in sequence 2
    use(c, {0, 2});  // evicts the least frequent
    if (scope == CountScope::sequence) {
      CHECK(c.policy().uses({0, 0}) == 0);
      CHECK_FALSE(c.resident({0, 0}));
      CHECK(c.resident({0, 1}));
    } else {
      CHECK(c.policy().uses({0, 0}) == 4);
      CHECK(c.resident({0, 0}));
      CHECK_FALSE(c.resident({0, 1}));
    }
  }
}

TEST_CASE("FLD evicts the layer that runs farthest in the future", "[cache][fld]") {
  CHECK(layer_distance(2, 2, 4) == 0);
  CHECK(layer_distance(3, 2, 4) == 1);
  CHECK(layer_distance(1, 2, 4) == 3);
  CHECK(layer_distance(0, 2, 4) == 2);
  ExpertCache<FldPolicy> c(small, 4 * f16b, Precision::f16);
  for (std::uint32_t l = 0; l < 4; ++l) use(c, {l, 0}, Precision::f16, l);
  use(c, {2, 5}, Precision::f16, 2);  // layer 2 runs: layer 1 is 3 layers away
  CHECK_FALSE(c.resident({1, 0}));
  use(c, {2, 6}, Precision::f16, 2);  // then layer 0 (2 away)
  CHECK_FALSE(c.resident({0, 0}));
  CHECK(c.resident({3, 0}));
}

TEST_CASE("MultiDimPolicy validates its weights", "[cache][multidim]") {
  CHECK_THROWS_WITH(MultiDimPolicy({.w_lru = 0.5, .w_lfu = 0.5, .w_lhu = 0.5, .w_fld = 0.0}),
                    Catch::Contains("sum to 1"));
  CHECK_THROWS_WITH(MultiDimPolicy({.w_lru = 1.5, .w_lfu = -0.5, .w_lhu = 0, .w_fld = 0}),
                    Catch::Contains("w_lfu"));
  CHECK_THROWS_WITH(MultiDimPolicy({.high = Precision::q4, .low = Precision::q8}),
                    Catch::Contains("Config.low"));
  CHECK_NOTHROW(MultiDimPolicy({.w_lru = 0.1, .w_lfu = 0.2, .w_lhu = 0.3, .w_fld = 0.4}));
}

TEST_CASE("MultiDimPolicy splits the budget into equal high and low slot counts",
          "[cache][multidim]") {
  const std::size_t bh = mixtral_8x7b.expert_bytes(Precision::f16);
  const std::size_t bl = mixtral_8x7b.expert_bytes(Precision::q4);
  ExpertCache<MultiDimPolicy> c(mixtral_8x7b, 10 * (bh + bl) + 5, Precision::f16);
  REQUIRE(c.pools().size() == 2);
  CHECK(c.pools()[0].capacity_bytes == 10 * bh);
  CHECK(c.pools()[1].capacity_bytes == 10 * bl + 5);
  CHECK(c.pool_of({0, 0}, Precision::bf16) == 0);
  CHECK(c.pool_of({0, 0}, Precision::q8) == 1);
  // A byte split instead of slots.
  ExpertCache<MultiDimPolicy> d(mixtral_8x7b, 10 * bh, Precision::f16,
                                MultiDimPolicy({.high_pool_bytes = 7 * bh}));
  CHECK(d.pools()[0].capacity_bytes == 7 * bh);
  CHECK(d.pools()[1].capacity_bytes == 3 * bh);
}

TEST_CASE("MultiDimPolicy ranks by HOBBIT Eq. 3 and resets records per sequence",
          "[cache][multidim]") {
  // Pool 0 (f16) holds 3 experts.
  ExpertCache<MultiDimPolicy> c(small, 3 * f16b + 3 * q4b, Precision::f16);
  auto tok = [&] { c.begin_token(); };
  tok();                                    // T = 1
  use(c, {0, 1}, Precision::f16, 0);        // R=1 F=1 H=1
  use(c, {1, 2}, Precision::f16, 1);        // R=1 F=1 H=1
  tok();                                    // T = 2
  use(c, {0, 1}, Precision::f16, 0);        // R=2 F=2 H=2
  use(c, {3, 3}, Precision::f16, 3);        // R=2 F=1 H=1
  use(c, {2, 4}, Precision::q4, 2);         // low pool: R=2 F=1 H=0
  // While layer 0 runs (T = 2, L = 4):
  //  (0,1): .25*(2/2 + 2/2 + 2/2) + .25*(1 - 0/4) = 1.0
  //  (1,2): .25*(1/2 + 1/2 + 1/2) + .25*(1 - 1/4) = 0.5625
  //  (3,3): .25*(2/2 + 1/2 + 1/2) + .25*(1 - 3/4) = 0.5625
  CHECK(c.policy().priority({0, 1}, 0) == Approx(1.0));
  CHECK(c.policy().priority({1, 2}, 0) == Approx(0.5625));
  CHECK(c.policy().priority({3, 3}, 0) == Approx(0.5625));
  CHECK(c.policy().priority({2, 4}, 0) == Approx(0.25 * (1 + 0.5 + 0) + 0.25 * 0.5));
  // Equal priority: the smaller R goes, so (1,2).
  use(c, {0, 5}, Precision::f16, 0);
  CHECK_FALSE(c.resident({1, 2}));
  CHECK(c.resident({3, 3}));
  CHECK(c.resident({2, 4}));  // a low-precision copy never competes with the high pool

  // A prefetch landing is not a use.
  const auto r = c.insert({1, 7}, c.access(Precision::q4, 0, 1, /*prefetch=*/true));
  REQUIRE(r.ok());
  CHECK(c.policy().record({1, 7}).uses == 0);

  c.begin_sequence();
  CHECK(c.policy().sequence_token() == 0);
  CHECK(c.policy().record({0, 1}).uses == 0);
  CHECK(c.policy().record({0, 1}).high_uses == 0);
  CHECK(c.policy().record({0, 1}).last_token == 0);
  CHECK(c.resident({0, 1}));  // contents kept
  // After the reset only FLD separates the residents: from layer 3, layer 0 and 3 are near.
  CHECK(c.policy().priority({0, 1}, 3) == Approx(0.25 * (1 - 1.0 / 4)));
}

// ---- Fate ---------------------------------------------------------------------------------------

TEST_CASE("Fate shallow-favoring allocation arithmetic (fate.md §7.7)", "[cache][fate]") {
  auto a = shallow_favoring_allocation(100, 60, 24, 3);
  CHECK(a[0] == 60);
  CHECK(a[1] == 40);
  for (std::size_t l = 2; l < 24; ++l) CHECK(a[l] == 0);
  a = shallow_favoring_allocation(600, 60, 24, 3);
  CHECK((a[0] == 60 && a[1] == 60 && a[2] == 60));
  for (std::size_t l = 3; l < 24; ++l) CHECK(a[l] == 20);
  a = shallow_favoring_allocation(601, 60, 24, 3);
  CHECK(a[3] == 21);
  for (std::size_t l = 4; l < 24; ++l) CHECK(a[l] == 20);
  for (std::size_t total : {1440u, 5000u}) {
    a = shallow_favoring_allocation(total, 60, 24, 3);
    for (auto x : a) CHECK(x == 60);
  }
  a = shallow_favoring_allocation(150, 60, 3, 3);  // NL == L: no division by zero
  CHECK((a[0] == 60 && a[1] == 60 && a[2] == 30));
  for (std::size_t total = 0; total < 1500; total += 37) {
    a = shallow_favoring_allocation(total, 60, 24, 3);
    std::size_t sum = 0;
    for (auto x : a) {
      sum += x;
      CHECK(x <= 60);
    }
    CHECK(sum <= total);
  }
}

TEST_CASE("ShallowFavoringArcPolicy turns a byte budget into per-layer pools", "[cache][fate]") {
  const ModelShape qwen{.n_layers = 24, .n_experts = 60, .top_k = 4, .hidden = 2048, .ffn = 1408};
  const std::size_t b = qwen.expert_bytes(Precision::q4);
  ExpertCache<ShallowFavoringArcPolicy> c(qwen, 601 * b + b - 1, Precision::q4);
  REQUIRE(c.pools().size() == 24);
  CHECK(c.pools()[0].capacity_bytes == 60 * b);
  CHECK(c.pools()[3].capacity_bytes == 21 * b);
  CHECK(c.pools()[23].capacity_bytes == 20 * b);
  CHECK(c.policy().inner().capacity(3) == 21);
  CHECK(c.pool_of({5, 1}, Precision::q2) == 5);
}

TEST_CASE("ARC textbook sequence with ghost hits (c = 2)", "[cache][arc]") {
  const ModelShape one{.n_layers = 1, .n_experts = 8, .top_k = 2, .hidden = 64, .ffn = 128};
  ExpertCache<ArcPolicy> c(one, 2 * one.expert_bytes(Precision::f16), Precision::f16);
  const ArcPolicy& arc = c.policy();
  auto keys = [&](ArcList l) {
    std::vector<std::uint32_t> v;
    for (auto k : arc.keys(0, l)) v.push_back(k.expert);
    return v;
  };
  using V = std::vector<std::uint32_t>;
  REQUIRE(arc.capacity(0) == 2);
  CHECK_FALSE(use(c, {0, 1}));
  CHECK_FALSE(use(c, {0, 2}));
  CHECK(keys(ArcList::t1) == V{2, 1});
  CHECK_FALSE(use(c, {0, 3}));  // |T1| = c: LRU(T1) leaves without a ghost
  CHECK(keys(ArcList::t1) == V{3, 2});
  CHECK(keys(ArcList::b1).empty());
  CHECK(use(c, {0, 2}));  // hit: to T2
  CHECK(keys(ArcList::t2) == V{2});
  CHECK_FALSE(use(c, {0, 4}));  // |T1| = 1 > p = 0: LRU(T1) = 3 becomes a B1 ghost
  CHECK(keys(ArcList::t1) == V{4});
  CHECK(keys(ArcList::b1) == V{3});
  CHECK_FALSE(use(c, {0, 3}));  // B1 ghost hit: p = 0 + max(0/1, 1) = 1; |T1| = p: LRU(T2) goes
  CHECK(arc.target(0) == 1.0);
  CHECK(keys(ArcList::t2) == V{3});
  CHECK(keys(ArcList::b2) == V{2});
  CHECK(keys(ArcList::t1) == V{4});
  CHECK_FALSE(use(c, {0, 2}));  // B2 ghost hit: p = 1 - max(0/1, 1) = 0; |T1| > p: LRU(T1) goes
  CHECK(arc.target(0) == 0.0);
  CHECK(keys(ArcList::t2) == V{2, 3});
  CHECK(keys(ArcList::t1).empty());
  CHECK(keys(ArcList::b1) == V{4});
  CHECK(keys(ArcList::b2).empty());
}

TEST_CASE("ARC resists a scan and keeps its list bounds (fate.md §7.8-9)", "[cache][arc]") {
  const ModelShape one{.n_layers = 1, .n_experts = 16, .top_k = 2, .hidden = 64, .ffn = 128};
  ExpertCache<ArcPolicy> c(one, 4 * one.expert_bytes(Precision::f16), Precision::f16);
  use(c, {0, 0});
  use(c, {0, 0});
  use(c, {0, 1});
  use(c, {0, 1});
  for (std::uint32_t e = 2; e < 12; ++e) use(c, {0, e});
  CHECK(c.resident({0, 0}));
  CHECK(c.resident({0, 1}));

  std::mt19937 rng(42);
  std::uniform_int_distribution<std::uint32_t> d(0, 15);
  const ArcPolicy& a = c.policy();
  for (int i = 0; i < 2000; ++i) {
    use(c, {0, d(rng) % (1 + d(rng))});  // skewed towards small ids
    const auto t1 = a.list_size(0, ArcList::t1), t2 = a.list_size(0, ArcList::t2);
    const auto b1 = a.list_size(0, ArcList::b1), b2 = a.list_size(0, ArcList::b2);
    REQUIRE(t1 + t2 <= 4);
    REQUIRE(t1 + b1 <= 4);
    REQUIRE(t1 + t2 + b1 + b2 <= 8);
    REQUIRE((a.target(0) >= 0.0 && a.target(0) <= 4.0));
    REQUIRE(t1 + t2 == c.resident_count());
  }
}

TEST_CASE("ARC: a prefetch insertion never adapts p; the first demand of a prefetched ghost does",
          "[cache][arc]") {
  const ModelShape one{.n_layers = 1, .n_experts = 8, .top_k = 2, .hidden = 64, .ffn = 128};
  // The textbook state of the test above just before its B1 ghost hit: T1 = {4}, T2 = {2},
  // B1 = {3}, p = 0, c = 2.
  auto make = [&] {
    auto c = std::make_unique<ExpertCache<ArcPolicy>>(one, 2 * one.expert_bytes(Precision::f16),
                                                      Precision::f16);
    for (std::uint32_t e : {1u, 2u, 3u, 2u, 4u}) use(*c, {0, e});
    REQUIRE(c->policy().list_of({0, 3}) == ArcList::b1);
    REQUIRE(c->policy().target(0) == 0.0);
    return c;
  };
  auto prefetch = [](ExpertCache<ArcPolicy>& c, ExpertKey k) {
    REQUIRE(c.insert(k, c.access(Precision::f16, 0, 1, /*prefetch=*/true)).ok());
  };

  // A demand of the ghost adapts p to 1 and, with |T1| = p, evicts LRU(T2) (reference behaviour).
  auto demand = make();
  use(*demand, {0, 3});
  CHECK(demand->policy().target(0) == 1.0);
  CHECK(demand->resident({0, 4}));
  CHECK_FALSE(demand->resident({0, 2}));

  // A prefetch of the same ghost is not an access: p stays 0, REPLACE sees a complete miss with
  // |T1| = 1 > p and evicts LRU(T1) = 4; the prefetched entry waits in T1.
  auto pre = make();
  prefetch(*pre, {0, 3});
  CHECK(pre->policy().target(0) == 0.0);
  CHECK_FALSE(pre->resident({0, 4}));
  CHECK(pre->resident({0, 2}));
  CHECK(pre->policy().list_of({0, 3}) == ArcList::t1);
  // Its first demand is ARC's access: the deferred B1 ghost hit, counted with the entry itself on
  // B1 (|B1| = 1 after 4 joined it, + 1): p = 0 + max(|B2| / 2, 1) = 1; the entry moves to T2.
  REQUIRE(pre->policy().list_size(0, ArcList::b1) == 1);
  CHECK(use(*pre, {0, 3}));
  CHECK(pre->policy().target(0) == 1.0);
  CHECK(pre->policy().list_of({0, 3}) == ArcList::t2);
  // A second demand is an ordinary T2 hit: p does not move again.
  CHECK(use(*pre, {0, 3}));
  CHECK(pre->policy().target(0) == 1.0);

  // A prefetch of an expert ARC never saw: no adaptation at insertion or at its first demand,
  // which leaves it in T1 (a first access), not T2.
  auto fresh = make();
  prefetch(*fresh, {0, 6});
  CHECK(fresh->policy().target(0) == 0.0);
  CHECK(use(*fresh, {0, 6}));
  CHECK(fresh->policy().target(0) == 0.0);
  CHECK(fresh->policy().list_of({0, 6}) == ArcList::t1);
  CHECK(use(*fresh, {0, 6}));  // its second demand promotes it
  CHECK(fresh->policy().list_of({0, 6}) == ArcList::t2);

  // A prefetch of a B2 ghost that is evicted unused never lowers p.
  auto b2 = make();
  use(*b2, {0, 3});  // B1 ghost hit: p = 1, 2 → B2
  REQUIRE(b2->policy().list_of({0, 2}) == ArcList::b2);
  prefetch(*b2, {0, 2});
  CHECK(b2->policy().target(0) == 1.0);
  use(*b2, {0, 5});
  use(*b2, {0, 7});
  CHECK(b2->policy().target(0) == 1.0);
}

TEST_CASE("ARC with zero slots misses everything", "[cache][arc]") {
  ExpertCache<ShallowFavoringArcPolicy> c(small, 8 * f16b, Precision::f16,
                                          ShallowFavoringArcPolicy({.shallow_layers = 1}));
  // 8 slots: layer 0 gets all 8, layers 1..3 get 0.
  CHECK(c.pools()[1].capacity_bytes == 0);
  CHECK(c.insert({1, 0}, c.access(Precision::f16, 1)).status == InsertStatus::too_large);
}

// ---- EdgeMoE ------------------------------------------------------------------------------------

TEST_CASE("EdgeMoE eviction score: distance variants and i == I (edgemoe.md §7.9-10)",
          "[cache][edgemoe]") {
  const ModelShape six{.n_layers = 6, .n_experts = 4, .top_k = 1, .hidden = 64, .ffn = 128};
  const std::size_t b = six.expert_bytes(Precision::f16);
  for (auto variant : {EdgeMoeDistance::forward, EdgeMoeDistance::as_printed}) {
    ExpertCache<EdgeMoePolicy> c(six, 2 * b, Precision::f16, EdgeMoePolicy({.distance = variant}));
    use(c, {3, 0}, Precision::f16, 2);  // equal frequencies
    use(c, {1, 0}, Precision::f16, 2);
    const EdgeMoePolicy& p = c.policy();
    if (variant == EdgeMoeDistance::forward) {
      CHECK(p.distance(3, 2) == 1);
      CHECK(p.distance(1, 2) == 5);
      CHECK(p.score({3, 0}, 2) == Approx(-1.0));
      CHECK(p.score({1, 0}, 2) == Approx(-0.2));
    } else {
      CHECK(p.distance(3, 2) == 5);
      CHECK(p.distance(1, 2) == 1);
    }
    CHECK(p.distance(2, 2) == 6);  // i == I: next needed one full pass later
    use(c, {2, 1}, Precision::f16, 2);
    if (variant == EdgeMoeDistance::forward) {
      CHECK(c.resident({3, 0}));
      CHECK_FALSE(c.resident({1, 0}));
    } else {
      CHECK(c.resident({1, 0}));
      CHECK_FALSE(c.resident({3, 0}));
    }
  }
}

TEST_CASE("EdgeMoE: frequency dominates at equal distance; the prior seeds f", "[cache][edgemoe]") {
  const ModelShape six{.n_layers = 6, .n_experts = 4, .top_k = 1, .hidden = 64, .ffn = 128};
  const std::size_t b = six.expert_bytes(Precision::f16);
  // Score table while layer 0 runs (forward distance d = layer):
  //  (4,0): f = 3, d = 4 → −0.75     (4,1): f = 1, d = 4 → −0.25     (1,0): f = 1, d = 1 → −1
  ExpertCache<EdgeMoePolicy> c(six, 3 * b, Precision::f16);
  for (int i = 0; i < 3; ++i) use(c, {4, 0}, Precision::f16, 0);
  use(c, {4, 1}, Precision::f16, 0);
  use(c, {1, 0}, Precision::f16, 0);
  CHECK(c.policy().score({4, 0}, 0) == Approx(-0.75));
  CHECK(c.policy().score({4, 1}, 0) == Approx(-0.25));
  CHECK(c.policy().score({1, 0}, 0) == Approx(-1.0));
  use(c, {0, 2}, Precision::f16, 0);
  CHECK_FALSE(c.resident({4, 1}));  // the highest score
  CHECK(c.resident({4, 0}));

  std::vector<double> prior(24, 1.0);
  prior[5 * 4 + 2] = 5.0;  // layer 5: expert 2 has 5/8 of the layer's traffic
  EdgeMoePolicy p({.prior_counts = prior, .prior_weight = 100.0});
  p.bind(six);
  CHECK(p.frequency({5, 2}) == Approx(62.5));
  CHECK(p.frequency({5, 0}) == Approx(12.5));
  CHECK_THROWS_WITH(EdgeMoePolicy({.prior_counts = {1.0}}).bind(six),
                    Catch::Contains("prior_counts"));
}

// ---- Fiddler ------------------------------------------------------------------------------------

namespace {
// Mixtral-8x7B-Instruct per-(layer, expert) selection counts over 59,505 tokens [32 × 8], from
// abhibambhaniya/mixtral-offloading-residency-info (MIT licence), via shared/data/stats/.
const std::vector<double> mixtral_counts = {
    21522, 13650, 13027, 11423, 13254, 15835, 19435, 10864, 14974, 21495, 11836, 12877, 23444,
    12183, 9843,  12358, 13711, 12269, 10952, 12839, 10520, 27165, 21424, 10130, 13299, 10549,
    9234,  14359, 21414, 14889, 15379, 19887, 22665, 9599,  13769, 9122,  14095, 21958, 12962,
    14840, 13479, 16430, 12060, 11951, 12567, 20047, 23613, 8863,  9248,  22551, 11107, 9586,
    18311, 14286, 14373, 19548, 27896, 20999, 13560, 10104, 6230,  15372, 9654,  15195, 8490,
    19220, 12996, 12131, 21745, 19161, 16608, 8659,  21944, 8765,  6163,  22835, 13355, 14778,
    22121, 9049,  14100, 18817, 10079, 12417, 26248, 7990,  18273, 11086, 23459, 24705, 20460,
    1694,  13306, 12109, 13076, 10201, 19834, 14389, 10685, 12752, 19578, 15773, 22533, 3466,
    25555, 11645, 29065, 8131,  11641, 12365, 8646,  11962, 9746,  25090, 6861,  16137, 20013,
    12430, 8988,  19745, 21417, 17975, 12812, 16715, 11838, 9730,  8587,  19936, 24146, 9408,
    11049, 20898, 16464, 12513, 13580, 10952, 12343, 12440, 14165, 17111, 12352, 20228, 7977,
    22394, 10897, 13159, 23731, 10080, 13542, 23401, 11339, 12861, 15538, 23744, 12837, 22487,
    11997, 10145, 9982,  12280, 10305, 22503, 12084, 22136, 10964, 14561, 12920, 13537, 9942,
    15004, 14012, 15623, 13989, 18549, 20603, 11288, 14960, 10428, 7748,  12524, 23337, 11846,
    25724, 12443, 16610, 14045, 11166, 13128, 22531, 8762,  22781, 9987,  12019, 23210, 13061,
    10133, 14989, 21222, 12106, 12270, 10244, 11663, 17295, 12280, 21553, 11284, 21798, 12893,
    12930, 20359, 17877, 13844, 11598, 12297, 14431, 15674, 10771, 15477, 11218, 11534, 21178,
    11631, 10570, 26631, 23453, 11058, 14384, 12462, 21820, 12965, 9769,  13099, 15307, 14388,
    13485, 12426, 12188, 20257, 9171,  21788, 10611, 20176, 13056, 13538, 14210, 20941, 10489,
    15989, 11234, 23452, 12480, 17504, 12593, 17554, 9094,  15099};
}  // namespace

TEST_CASE("Fiddler placement on Mixtral's real popularity (fiddler.md §7.13)", "[cache][fiddler]") {
  REQUIRE(mixtral_counts.size() == 256);
  const std::size_t b = mixtral_8x7b.expert_bytes(Precision::f16);
  auto rate = [&](std::size_t n) {
    ExpertCache<StaticPopularityPolicy> c(mixtral_8x7b, n * b + b / 2, Precision::f16,
                                          StaticPopularityPolicy({.counts = mixtral_counts}));
    CHECK(c.policy().placement().size() == n);
    return c.policy().expected_hit_rate();
  };
  CHECK(rate(56) == Approx(0.3340).margin(1e-4));
  CHECK(rate(52) == Approx(0.3128).margin(1e-4));
  CHECK(rate(128) == Approx(0.6321).margin(1e-4));
  CHECK(rate(256) == Approx(1.0));
}

TEST_CASE("Fiddler placement never evicts and refuses non-placed experts", "[cache][fiddler]") {
  std::vector<double> counts(32, 0.0);
  counts[small.index({0, 3})] = 9;
  counts[small.index({2, 1})] = 7;
  counts[small.index({1, 0})] = 7;  // tie with (2,1): the smaller layer wins
  ExpertCache<StaticPopularityPolicy> c(small, 2 * f16b, Precision::f16,
                                        StaticPopularityPolicy({.counts = counts}));
  const auto placed = c.policy().placement();
  REQUIRE(placed.size() == 2);
  CHECK(placed[0] == ExpertKey{0, 3});
  CHECK(placed[1] == ExpertKey{1, 0});
  CHECK(c.insert({0, 3}, c.access(Precision::f16, 0)).ok());
  CHECK(c.insert({1, 0}, c.access(Precision::f16, 1)).ok());
  CHECK(c.insert({2, 1}, c.access(Precision::f16, 2)).status == InsertStatus::too_large);
  CHECK(c.resident({0, 3}));
  CHECK(c.resident({1, 0}));
  CHECK(c.stats().evictions == 0);
  CHECK_THROWS_WITH(ExpertCache<StaticPopularityPolicy>(small, f16b, Precision::f16),
                    Catch::Contains("counts"));
}

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
  const std::vector<FutureAccess> fut = {
      {{0, 0}, Precision::f16}, {{0, 1}, Precision::q4}, {{0, 2}, Precision::q4},
      {{0, 0}, Precision::f16}, {{0, 1}, Precision::q4}};
  ExpertCache<CostAwareBeladyPolicy> c(small, f16b + q4b, Precision::f16,
                                       CostAwareBeladyPolicy({.future = fut}));
  use(c, {0, 0}, Precision::f16);
  use(c, {0, 1}, Precision::q4);
  use(c, {0, 2}, Precision::q4);  // needs q4 bytes: A scores 2·1, B scores 3·1 → B goes
  CHECK(c.resident({0, 0}));
  CHECK_FALSE(c.resident({0, 1}));
  // A copy that cannot serve its next demand (needs more bits) goes first.
  const std::vector<FutureAccess> up = {{{0, 3}, Precision::q4}, {{0, 4}, Precision::q4},
                                        {{0, 5}, Precision::q4}, {{0, 3}, Precision::f16},
                                        {{0, 4}, Precision::q4}};
  ExpertCache<CostAwareBeladyPolicy> d(small, 2 * q4b, Precision::q4,
                                       CostAwareBeladyPolicy({.future = up}));
  use(d, {0, 3}, Precision::q4);
  use(d, {0, 4}, Precision::q4);
  use(d, {0, 5}, Precision::q4);  // Belady would evict 4 (farther); 3's copy is dead
  CHECK_FALSE(d.resident({0, 3}));
  CHECK(d.resident({0, 4}));
}

// ---- moekit's expected-next-use policy ---------------------------------------------------------

TEST_CASE("ExpectedNextUsePolicy: transition and frequency estimate, worked by hand",
          "[cache][expected_next_use]") {
  const ModelShape one{.n_layers = 1, .n_experts = 4, .top_k = 1, .hidden = 64, .ffn = 128};
  const std::size_t b = one.expert_bytes(Precision::f16);
  ExpertCache<ExpectedNextUsePolicy> c(one, 3 * b, Precision::f16,
                                       ExpectedNextUsePolicy({.gamma = 1.0, .prior = 1.0}));
  auto step = [&](std::uint32_t e) {
    c.begin_token();
    use(c, {0, e});
  };
  step(0);
  step(1);
  step(0);  // folded: {0}, {1}: f(e) = (count + 1/4) / 3, no transition from {1} yet
  const auto& p = c.policy();
  CHECK(p.probability({0, 0}) == Approx(1.25 / 3));
  CHECK(p.probability({0, 2}) == Approx(0.25 / 3));
  step(1);  // folds {0} after {1}; last = {0}, and 0 → 1 was seen once
  CHECK(p.probability({0, 1}) == Approx((1.25 / 4 + 1.0) / 2));
  CHECK(p.probability({0, 0}) == Approx((2.25 / 4) / 2));
  CHECK(p.probability({0, 2}) == Approx((0.25 / 4) / 2));
  step(2);  // 3 residents: 0, 1, 2
  step(3);  // last = {2}, never followed yet: p = f = (count + 1/4) / 6 → 2 is least likely
  CHECK_FALSE(c.resident({0, 2}));  // LRU would have evicted 0
  CHECK(c.resident({0, 0}));
  CHECK(c.resident({0, 1}));
  CHECK_THROWS_WITH(ExpectedNextUsePolicy({.gamma = 0.0}), Catch::Contains("gamma"));
}
