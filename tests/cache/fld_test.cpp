// FldPolicy (cache/fld.hpp): evicts the layer that runs farthest in the future.
// Exact worked examples through ExpertCache (helpers: cache_test_support.hpp).

#include <catch2/catch.hpp>

#include <cstdint>

#include "cache/cache_test_support.hpp"
#include "moekit/cache/fld.hpp"

using namespace moekit;
using namespace moekit::test;

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
