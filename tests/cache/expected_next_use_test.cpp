// ExpectedNextUsePolicy (cache/expected_next_use.hpp): moekit's expected-next-use estimate.
// Exact worked examples through ExpertCache (helpers: cache_test_support.hpp).

#include <catch2/catch.hpp>

#include <cstdint>

#include "cache/cache_test_support.hpp"
#include "moekit/cache/expected_next_use.hpp"

using namespace moekit;
using namespace moekit::test;

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
