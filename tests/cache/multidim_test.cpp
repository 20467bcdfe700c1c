// MultiDimPolicy (cache/multidim.hpp): HOBBIT's multidimensional policy (Eq. 3) and its pools.
// Exact worked examples through ExpertCache (helpers: cache_test_support.hpp).

#include <catch2/catch.hpp>

#include <cstdint>

#include "cache/cache_test_support.hpp"
#include "moekit/cache/multidim.hpp"

using namespace moekit;
using namespace moekit::test;

TEST_CASE("MultiDimPolicy validates its weights", "[cache][multidim]") {
  CHECK_THROWS_WITH(MultiDimPolicy({.w_lru = 0.5, .w_lfu = 0.5, .w_lhu = 0.5, .w_fld = 0.0}),
                    Catch::Contains("sum to 1"));
  CHECK_THROWS_WITH(MultiDimPolicy({.w_lru = 1.5, .w_lfu = -0.5, .w_lhu = 0, .w_fld = 0}),
                    Catch::Contains("w_lfu"));
  CHECK_THROWS_WITH(MultiDimPolicy({.high = Precision::q4, .low = Precision::q8}),
                    Catch::Contains("Config.low"));
  CHECK_NOTHROW(MultiDimPolicy({.w_lru = 0.1, .w_lfu = 0.2, .w_lhu = 0.3, .w_fld = 0.4}));
}

TEST_CASE("MultiDimPolicy's high pool is larger than its low pool by default (HOBBIT §3.3)",
          "[cache][multidim][hobbit]") {
  // 97 slots' worth of bytes (and half a low slot) at the 67 : 30 split: 67 high, 30 low.
  const std::size_t bh = mixtral_8x7b.expert_bytes(Precision::f16);
  const std::size_t bl = mixtral_8x7b.expert_bytes(Precision::q4);
  ExpertCache<MultiDimPolicy> c(mixtral_8x7b, 67 * bh + 30 * bl + bl / 2, Precision::f16);
  REQUIRE(c.pools().size() == 2);
  CHECK(c.pools()[0].capacity_bytes == 67 * bh);
  CHECK(c.pools()[1].capacity_bytes == 30 * bl + bl / 2);
  CHECK(c.pools()[0].capacity_bytes / bh > c.pools()[1].capacity_bytes / bl);
  CHECK_THROWS_WITH(MultiDimPolicy({.high_slot_fraction = 1.5}),
                    Catch::Contains("high_slot_fraction"));
}

TEST_CASE("MultiDimPolicy splits the budget into equal high and low slot counts on request",
          "[cache][multidim]") {
  const std::size_t bh = mixtral_8x7b.expert_bytes(Precision::f16);
  const std::size_t bl = mixtral_8x7b.expert_bytes(Precision::q4);
  ExpertCache<MultiDimPolicy> c(mixtral_8x7b, 10 * (bh + bl) + 5, Precision::f16,
                                MultiDimPolicy({.high_slot_fraction = 0.5}));
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
  tok();                              // T = 1
  use(c, {0, 1}, Precision::f16, 0);  // R=1 F=1 H=1
  use(c, {1, 2}, Precision::f16, 1);  // R=1 F=1 H=1
  tok();                              // T = 2
  use(c, {0, 1}, Precision::f16, 0);  // R=2 F=2 H=2
  use(c, {3, 3}, Precision::f16, 3);  // R=2 F=1 H=1
  use(c, {2, 4}, Precision::q4, 2);   // low pool: R=2 F=1 H=0
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
