// ShallowFavoring (cache/shallow_favoring.hpp): Fate's per-layer allocation around an inner policy.
// Exact worked examples through ExpertCache (helpers: cache_test_support.hpp).

#include <catch2/catch.hpp>

#include <cstdint>

#include "cache/cache_test_support.hpp"
#include "moekit/cache/shallow_favoring.hpp"

using namespace moekit;
using namespace moekit::test;

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

TEST_CASE("ARC with zero slots misses everything", "[cache][arc]") {
  ExpertCache<ShallowFavoringArcPolicy> c(small, 8 * f16b, Precision::f16,
                                          ShallowFavoringArcPolicy({.shallow_layers = 1}));
  // 8 slots: layer 0 gets all 8, layers 1..3 get 0.
  CHECK(c.pools()[1].capacity_bytes == 0);
  CHECK(c.insert({1, 0}, c.access(Precision::f16, 1)).status == InsertStatus::too_large);
}
