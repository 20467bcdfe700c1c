// ArcPolicy (cache/arc.hpp): adaptive replacement per pool, with prefetches that do not adapt.
// Exact worked examples through ExpertCache (helpers: cache_test_support.hpp).

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "cache/cache_test_support.hpp"
#include "moekit/cache/arc.hpp"

using namespace moekit;
using namespace moekit::test;

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
