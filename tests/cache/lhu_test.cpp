// LhuPolicy (cache/lhu.hpp): HOBBIT's least-high-precision-used policy, against LFU on HOBBIT's own
// example. Exact worked examples through ExpertCache (helpers: cache_test_support.hpp).

#include <catch2/catch.hpp>

#include <cstdint>

#include "cache/cache_test_support.hpp"
#include "moekit/cache/lfu.hpp"
#include "moekit/cache/lhu.hpp"

using namespace moekit;
using namespace moekit::test;

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
  for (auto [k, p] :
       {std::pair{ExpertKey{0, 4}, Precision::q4}, {ExpertKey{0, 6}, Precision::f16}}) {
    if (!use(lfu, k, p)) pen_lfu += penalty(small, p);
    if (!use(lhu, k, p)) pen_lhu += penalty(small, p);
  }
  CHECK(pen_lfu == 1.0);                            // a high-precision miss
  CHECK(pen_lhu == penalty(small, Precision::q4));  // a low-precision miss
  CHECK(pen_lhu < 0.3 * pen_lfu);
}
