#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "moekit/score/big_little.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;

TEST_CASE("BigLittlePolicy: little K/2 in decode, full K in prefill and recomputation",
          "[score][mobile]") {
  BigLittlePolicy p;
  CHECK(p.active_top_k(ctx(0, 4, 0, Phase::prefill, 16), 8) == 8);
  CHECK(p.end_token(std::vector<float>{0, 0, 0, 0}) == TokenVerdict::accept);  // big prefill
  CHECK(p.active_top_k(ctx(0, 4, 16), 8) == 4);
  CHECK(p.active_top_k(ctx(0, 4, 16), 4) == 2);
  CHECK(p.active_top_k(ctx(0, 4, 16), 1) == 1);  // max(1, K/2)
  CHECK(p.active_top_k(ctx(0, 4, 16), 3) == 1);
  CHECK(BigLittlePolicy({.k_little = 6}).little_k(8) == 6);
  BigLittlePolicy little_prefill({.big_prefill = false});
  CHECK(little_prefill.active_top_k(ctx(0, 4, 0, Phase::prefill, 16), 8) == 4);
}

TEST_CASE("BigLittlePolicy: fallback exactly at gamma, never twice per token", "[score][mobile]") {
  // logits ln 7, ln 3: softmax max = 0.7 (as float, exactly 0.7f)
  const std::vector<float> at_gamma{std::log(7.0f), std::log(3.0f)};
  REQUIRE(BigLittlePolicy::max_probability(at_gamma) == 0.7f);
  // dyadic cases
  CHECK(BigLittlePolicy::max_probability(std::vector<float>{0, 0, 0, 0}) == 0.25f);
  CHECK(BigLittlePolicy::max_probability(std::vector<float>{1000, 0}) == 1.0f);  // stable

  BigLittlePolicy p;  // gamma 0.7: accept iff max prob > 0.7
  CHECK(p.active_top_k(ctx(0, 2, 5), 4) == 2);
  CHECK(p.end_token(at_gamma) == TokenVerdict::fallback);  // == gamma is not confident
  CHECK(p.recomputing());
  CHECK(p.active_top_k(ctx(0, 2, 5), 4) == 4);  // the recomputation uses the full K
  CHECK(p.active_top_k(ctx(1, 2, 5), 4) == 4);
  CHECK(p.end_token(std::vector<float>{0, 0}) == TokenVerdict::accept);  // never twice
  CHECK_FALSE(p.recomputing());
  CHECK(p.active_top_k(ctx(0, 2, 6), 4) == 2);
  CHECK(p.end_token(std::vector<float>{std::log(7.0f) + 1e-3f, std::log(3.0f)}) ==
        TokenVerdict::accept);
  CHECK(p.end_token(std::vector<float>{0, 0, 0, 0}) == TokenVerdict::fallback);
  CHECK(p.end_token(std::vector<float>{0, 0, 0, 0}) == TokenVerdict::accept);
  CHECK(p.stats().tokens == 3);
  CHECK(p.stats().fallbacks == 2);
  CHECK(p.stats().fallback_ratio() == Approx(2.0 / 3.0));

  BigLittlePolicy never({.gamma = 0.0f});
  CHECK(never.end_token(std::vector<float>{0, 0, 0, 0}) == TokenVerdict::accept);
  BigLittlePolicy always({.gamma = 1.0f});
  CHECK(always.end_token(std::vector<float>{1000, 0}) == TokenVerdict::fallback);
  CHECK_THROWS_AS(BigLittlePolicy({.gamma = -1.0f}), Error);
}

TEST_CASE("BigLittlePolicy: little prefill is judged and recomputed with the full K",
          "[score][mobile]") {
  BigLittlePolicy p({.big_prefill = false});
  const auto pre = ctx(0, 2, 0, Phase::prefill, 8);
  CHECK(p.active_top_k(pre, 4) == 2);
  CHECK(p.end_token(std::vector<float>{0, 0}) == TokenVerdict::fallback);  // 0.5 <= 0.7
  CHECK(p.active_top_k(pre, 4) == 4);
  CHECK(p.end_token(std::vector<float>{0, 0}) == TokenVerdict::accept);
  CHECK(p.stats().tokens == 0);  // prefill is not counted in the fallback ratio
  CHECK(p.stats().fallback_ratio() == 0.0);
  // begin_sequence forgets a pending recomputation
  CHECK(p.active_top_k(ctx(0, 2, 8), 4) == 2);
  CHECK(p.end_token(std::vector<float>{0, 0}) == TokenVerdict::fallback);
  p.begin_sequence();
  CHECK(p.active_top_k(ctx(0, 2, 0), 4) == 2);
}

TEST_CASE("BigLittlePolicy: replay without logits needs an explicit fallback ratio",
          "[score][mobile]") {
  BigLittlePolicy strict;
  (void)strict.active_top_k(ctx(0, 1, 1), 2);
  CHECK_THROWS_WITH(strict.end_token({}), Catch::Contains("needs the output logits"));
  BigLittlePolicy quarter({.fallback_ratio_without_logits = 0.25});
  int fallbacks = 0;
  for (int t = 0; t < 40; ++t) {
    (void)quarter.active_top_k(ctx(0, 1, t), 2);
    if (quarter.end_token({}) == TokenVerdict::fallback) {
      ++fallbacks;
      CHECK(quarter.end_token({}) == TokenVerdict::accept);  // the recomputation
    }
  }
  CHECK(fallbacks == 10);
  CHECK(quarter.stats().fallback_ratio() == 0.25);
  CHECK_THROWS_AS(BigLittlePolicy({.fallback_ratio_without_logits = 2.0}), Error);
}

TEST_CASE("BigLittlePolicy: share_only judges by the fixed share even when logits are given",
          "[score][mobile]") {
  // A confident forward (one logit far above the rest) would be accepted by confidence; with
  // share_only a quarter of the forwards fall back all the same, and only those.
  const std::vector<float> confident{20.f, 0.f, 0.f, 0.f};
  BigLittlePolicy p({.fallback_ratio_without_logits = 0.25, .share_only = true});
  int fallbacks = 0;
  for (int t = 0; t < 40; ++t) {
    (void)p.active_top_k(ctx(0, 1, t), 2);
    if (p.end_token(confident) == TokenVerdict::fallback) {
      ++fallbacks;
      CHECK(p.end_token(confident) == TokenVerdict::accept);
    }
  }
  CHECK(fallbacks == 10);
  BigLittlePolicy by_confidence({.fallback_ratio_without_logits = 0.25});
  (void)by_confidence.active_top_k(ctx(0, 1, 0), 2);
  CHECK(by_confidence.end_token(confident) == TokenVerdict::accept);
  CHECK_THROWS_AS(BigLittlePolicy({.share_only = true}), Error);  // no share given
}
