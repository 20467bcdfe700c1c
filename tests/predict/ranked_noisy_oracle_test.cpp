// RankedNoisyOraclePredictor (moe-sim's HOBBIT stand-in): each rank kept at its own recall, and
// the precisions decided by HOBBIT's rule on the *predicted* routing, not taken from the actual
// demand (as NoisyOraclePredictor's `precisions` hand them over).
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "moekit/predict/noisy_oracle.hpp"
#include "moekit/predict/ranked_noisy_oracle.hpp"
#include "moekit/score/hobbit_threshold.hpp"
#include "predict_test_support.hpp"

using namespace moekit;

namespace ranked_oracle_test {
constexpr std::uint32_t n_exp = 8;
using Oracle = RankedNoisyOraclePredictor<HobbitThresholdScorer>;
using Picks = std::vector<std::pair<std::uint32_t, Precision>>;

// Layer 0 then layer 1, one decode token each.
std::vector<RoutedCall> two_calls(float w0) {
  return {{0, 1, 2, {1, 2}, {0.7f, 0.3f}}, {1, 1, 2, {3, 0}, {w0, 1.0f - w0}}};
}

Picks sorted(Picks v) {
  std::sort(v.begin(), v.end());
  return v;
}
}  // namespace ranked_oracle_test
using ranked_oracle_test::n_exp;
using ranked_oracle_test::Oracle;
using ranked_oracle_test::Picks;

TEST_CASE("RankedNoisyOraclePredictor: recall 1 predicts the actual routing at its precisions",
          "[predict][noisy-oracle][hobbit]") {
  Oracle o(
      {.calls = ranked_oracle_test::two_calls(0.8f), .recall_by_rank = {{1.0}}, .n_experts = n_exp},
      {});
  // Expert 3 is the top-1 (high), expert 0's cumulative 0.8 is in (T1, T2]: low.
  CHECK(ranked_oracle_test::sorted(o.predictions(1)) ==
        Picks{{0, Precision::q4}, {3, Precision::f16}});
}

TEST_CASE("RankedNoisyOraclePredictor: precisions come from the predicted gate, not the demand",
          "[predict][noisy-oracle][hobbit]") {
  // The actual top-1 (expert 3) is missed, rank 2 (expert 0) kept: expert 0 is the predicted
  // top-1, so it is prefetched high although its actual demand asks low; the wrong guess ranks
  // second and gets the low precision. NoisyOraclePredictor, handed the demand's precisions,
  // prefetches expert 0 low and the wrong guess high.
  Oracle o({.calls = ranked_oracle_test::two_calls(0.8f),
            .recall_by_rank = {{0.0}, {1.0}},
            .n_experts = n_exp},
           {});
  const Picks p = o.predictions(1);
  REQUIRE(p.size() == 2);
  CHECK(std::count(p.begin(), p.end(), std::pair{0u, Precision::f16}) == 1);
  for (const auto& [e, prec] : p)
    if (e != 0) {
      CHECK(e != 3);
      CHECK(prec == Precision::q4);
    }
  NoisyOraclePredictor old(
      {.calls = {{0, {1, 2}}, {1, {3, 0}}},
       .precisions = {{Precision::f16, Precision::q4}, {Precision::f16, Precision::q4}},
       .recall = 0.5,
       .n_experts = n_exp});
  // Whatever it keeps, a kept expert 0 is low: the demand's precision.
  for (const auto& [e, prec] : old.predictions(1))
    if (e == 0) CHECK(prec == Precision::q4);

  // With the top-1 weight above T2 the wrong guess would be skipped: it is not predicted at all.
  Oracle skip({.calls = ranked_oracle_test::two_calls(0.95f),
               .recall_by_rank = {{0.0}, {1.0}},
               .n_experts = n_exp},
              {});
  const Picks s = skip.predictions(1);  // the wrong guess is listed as a skip
  REQUIRE(s.size() == 2);
  CHECK(s[0] == std::pair{0u, Precision::f16});
  CHECK(s[1].second == Precision::skip);
  test::OwnedList out;
  const test::ResidentSet none;
  skip.observe({.layer = 0}, GateView{.n_tokens = 1,
                                      .k = 2,
                                      .n_experts = n_exp,
                                      .experts = std::vector<std::uint32_t>{1, 2},
                                      .weights = std::vector<float>{0.7f, 0.3f}});
  skip.predict({.layer = 0}, {}, none.view(), out.list);
  REQUIRE(out.items().size() == 1);
  CHECK(out.items()[0].key == ExpertKey{1, 0});
  CHECK(out.items()[0].precision == Precision::f16);
}

TEST_CASE("RankedNoisyOraclePredictor: each rank is kept at its own recall, per distance",
          "[predict][noisy-oracle][hobbit]") {
  std::mt19937 g(5);
  std::vector<RoutedCall> calls;
  for (std::uint32_t i = 0; i < 4000; ++i) {
    const std::uint32_t a = g() % n_exp;
    std::uint32_t b = g() % (n_exp - 1);
    b += b >= a;
    calls.push_back({i % 4, 1, 2, {a, b}, {0.55f, 0.45f}});  // both high: precision = kept
  }
  const auto actual = calls;
  Oracle o({.calls = std::move(calls),
            .recall_by_rank = {{0.9, 0.6}, {0.5, 0.2}},
            .seed = 3,
            .distance = 2,
            .n_experts = n_exp},
           {});
  for (std::uint32_t d = 1; d <= 2; ++d) {
    double top = 0, lower = 0;
    for (std::size_t i = 0; i < actual.size(); ++i) {
      const Picks p = o.predictions(i, d);
      CHECK(p.size() == 2);
      for (const auto& [e, prec] : p) {
        top += e == actual[i].experts[0];
        lower += e == actual[i].experts[1];
        CHECK(prec == Precision::f16);
      }
    }
    const double n = double(actual.size());
    CHECK(top / n == Approx(d == 1 ? 0.9 : 0.6).margin(0.03));
    CHECK(lower / n == Approx(d == 1 ? 0.5 : 0.2).margin(0.03));
  }
  CHECK(o.recall_at(0, 3) == 0.6);  // the last figure serves farther distances
  CHECK(o.recall_at(5, 1) == 0.5);  // the last rank serves deeper ranks
}

TEST_CASE("RankedNoisyOraclePredictor refuses a bad config, naming the field",
          "[predict][noisy-oracle]") {
  CHECK_THROWS_WITH(Oracle({.calls = ranked_oracle_test::two_calls(0.8f), .n_experts = 0}, {}),
                    Catch::Contains("n_experts"));
  CHECK_THROWS_WITH(Oracle({.calls = ranked_oracle_test::two_calls(0.8f),
                            .recall_by_rank = {{1.5}},
                            .n_experts = n_exp},
                           {}),
                    Catch::Contains("[0, 1]"));
  auto bad = ranked_oracle_test::two_calls(0.8f);
  bad[1].weights.pop_back();
  CHECK_THROWS_WITH(Oracle({.calls = bad, .n_experts = n_exp}, {}),
                    Catch::Contains("n_tokens x k"));
}
