// LruPolicy (cache/lru.hpp): one global recency order; a hit or an insertion makes an expert the
// most recent, the victim is the least recent one the query allows.

#include <catch2/catch.hpp>

#include <cstdint>

#include "cache/cache_test_support.hpp"
#include "moekit/cache/lru.hpp"

using namespace moekit;
using namespace moekit::test;

TEST_CASE("LRU evicts the least recently used expert, skipping pinned ones", "[cache][lru]") {
  ExpertCache<LruPolicy> c(small, 3 * f16b, Precision::f16);
  for (std::uint32_t e : {0u, 1u, 2u}) CHECK_FALSE(use(c, {0, e}));  // recency: 2 1 0
  CHECK(use(c, {0, 0}));                                             // 0 2 1
  CHECK_FALSE(use(c, {1, 3}));  // evicts 1                              3 0 2
  CHECK_FALSE(c.resident({0, 1}));
  CHECK(use(c, {0, 2}));        //                                       2 3 0
  CHECK_FALSE(use(c, {1, 4}));  // evicts 0                              4 2 3
  CHECK_FALSE(c.resident({0, 0}));
  c.pin_hard({1, 3});  // the least recent is pinned: the next one goes
  CHECK_FALSE(use(c, {1, 5}));
  CHECK(c.resident({1, 3}));
  CHECK_FALSE(c.resident({0, 2}));
  CHECK(c.resident({1, 4}));
  CHECK(c.stats().evictions == 3);
}
