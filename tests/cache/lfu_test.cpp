// LfuPolicy (cache/lfu.hpp): use counts, per sequence or per model.
// Exact worked examples through ExpertCache (helpers: cache_test_support.hpp).

#include <catch2/catch.hpp>

#include <cstdint>

#include "cache/cache_test_support.hpp"
#include "moekit/cache/lfu.hpp"

using namespace moekit;
using namespace moekit::test;

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
