#include <catch2/catch.hpp>

#include <vector>

#include "moekit/predict/router_replay.hpp"
#include "predict/predict_test_support.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::OwnedList;
using test::ResidentSet;
using test::Route;

namespace {
Route little(std::uint32_t e, std::vector<float> logits) {
  Route r(4, {{e}});
  r.logits = std::move(logits);
  return r;
}
}  // namespace

TEST_CASE("RouterReplay: lookahead 3 pushes the top-K of every recorded layer at the fallback",
          "[predict][mobile]") {
  RouterReplayPredictor p(
      {.top_k = 2, .lookahead = 3, .big_pass = RouterReplayPredictor::BigPass::recompute});
  ResidentSet none;
  // little pass (K_s = 1) of token 7 over 3 layers
  const Route l0 = little(2, {0.1f, 0.5f, 0.9f, 0.2f});
  const Route l1 = little(0, {0.8f, 0.0f, 0.1f, 0.7f});
  const Route l2 = little(3, {0.3f, 0.3f, 0.2f, 0.9f});
  OwnedList during;
  for (auto [l, r] : {std::pair{0u, &l0}, {1u, &l1}, {2u, &l2}}) {
    p.observe(ctx(l, 3, 7), r->view());
    p.predict(ctx(l, 3, 7), r->view(), none.view(), during.list);
  }
  CHECK(during.items().empty());  // normal calls predict nothing
  OwnedList none_list;
  p.on_verdict(TokenVerdict::accept, none_list.list);
  CHECK(none_list.items().empty());
  OwnedList a;
  p.on_verdict(TokenVerdict::fallback, a.list);
  std::vector<ExpertKey> keys;
  for (auto& pf : a.items()) keys.push_back(pf.key);
  CHECK(keys == std::vector<ExpertKey>{{0, 2}, {0, 1}, {1, 0}, {1, 3}, {2, 3}, {2, 0}});
  CHECK(a.items()[0].precision == Precision::f16);
  // the big pass (K = 2) routes layer 0 as planned, layer 1 to {0, 2} (one miss), layer 2 as
  // planned
  const Route b0(4, {{2, 1}}), b1(4, {{0, 2}}), b2(4, {{3, 0}});
  p.observe(ctx(0, 3, 7), b0.view());
  p.observe(ctx(1, 3, 7), b1.view());
  p.observe(ctx(2, 3, 7), b2.view());
  CHECK(p.stats().fallbacks == 1);
  CHECK(p.stats().planned == 6);
  CHECK(p.stats().matched == 5);
  // decode without logits is refused with a clear message
  CHECK_THROWS_WITH(p.observe(ctx(0, 3, 8), Route(4, {{1}}).view()),
                    Catch::Contains("GateView.logits"));
  CHECK_THROWS_AS(RouterReplayPredictor({}), Error);
}

namespace {
// The little pass of token 7 over 4 layers (K_s = 1), then a fallback; returns its pushes.
std::vector<ExpertKey> little_pass_then_fallback(RouterReplayPredictor& p) {
  const std::vector<std::vector<float>> logits{{0.1f, 0.5f, 0.9f, 0.2f},
                                               {0.8f, 0.0f, 0.1f, 0.7f},
                                               {0.3f, 0.3f, 0.2f, 0.9f},
                                               {0.9f, 0.8f, 0.0f, 0.0f}};
  const std::uint32_t top[] = {2, 0, 3, 0};
  ResidentSet none;
  for (std::uint32_t l = 0; l < 4; ++l) {
    const Route r = little(top[l], logits[l]);
    OwnedList out;
    p.observe(ctx(l, 4, 7), r.view());
    p.predict(ctx(l, 4, 7), r.view(), none.view(), out.list);
    CHECK(out.items().empty());
  }
  OwnedList a;
  p.on_verdict(TokenVerdict::fallback, a.list);
  std::vector<ExpertKey> keys;
  for (auto& pf : a.items()) keys.push_back(pf.key);
  return keys;
}
}  // namespace

TEST_CASE("RouterReplay: the plan is prefetched `lookahead` layers ahead of the big pass",
          "[predict][mobile]") {
  // MoBiLE: "prefetch 1-3 layers ahead", not every layer's experts at the fallback.
  for (std::uint32_t d : {1u, 2u}) {
    INFO("lookahead " << d);
    RouterReplayPredictor p({.top_k = 2, .lookahead = d});
    const std::vector<ExpertKey> at_fallback = little_pass_then_fallback(p);
    std::vector<ExpertKey> expected{{0, 2}, {0, 1}};
    if (d == 2) expected.insert(expected.end(), {{1, 0}, {1, 3}});
    CHECK(at_fallback == expected);
    // the big pass: layer l pushes layer l + d's plan at distance d
    ResidentSet none;
    const std::vector<std::vector<ExpertKey>> plan{
        {{0, 2}, {0, 1}}, {{1, 0}, {1, 3}}, {{2, 3}, {2, 0}}, {{3, 0}, {3, 1}}};
    for (std::uint32_t l = 0; l < 4; ++l) {
      Route big(4, {{plan[l][0].expert, plan[l][1].expert}});
      OwnedList out;
      p.observe(ctx(l, 4, 7), big.view());
      p.predict(ctx(l, 4, 7), big.view(), none.view(), out.list);
      std::vector<ExpertKey> keys;
      for (auto& pf : out.items()) {
        keys.push_back(pf.key);
        CHECK(pf.distance == d);
      }
      CHECK(keys == (l + d < 4 ? plan[l + d] : std::vector<ExpertKey>{}));
    }
  }
  CHECK_THROWS_WITH(RouterReplayPredictor({.top_k = 2, .lookahead = 0}),
                    Catch::Contains("lookahead"));
  CHECK_THROWS_WITH(RouterReplayPredictor({.top_k = 2, .lookahead = 4}),
                    Catch::Contains("lookahead"));
}

TEST_CASE("RouterReplay: the paper's big pass runs the little pass's plan", "[predict][mobile]") {
  RouterReplayPredictor p({.top_k = 2});  // default: BigPass::little_plan
  CHECK(p.config().big_pass == RouterReplayPredictor::BigPass::little_plan);
  CHECK(p.planned_experts(0).empty());  // no fallback yet: the engine routes as usual
  (void)little_pass_then_fallback(p);
  const std::vector<std::vector<std::uint32_t>> plan{{2, 1}, {0, 3}, {3, 0}, {0, 1}};
  for (std::uint32_t l = 0; l < 4; ++l) {
    const auto got = p.planned_experts(l);
    CHECK(std::vector<std::uint32_t>(got.begin(), got.end()) == plan[l]);
  }
  // The big pass's own logits at layer 1 would pick {0, 2}: the agreement is measured from its
  // logits, since what it runs is the plan.
  const std::vector<std::vector<float>> own{{0.1f, 0.5f, 0.9f, 0.2f},
                                            {0.8f, 0.0f, 0.7f, 0.1f},
                                            {0.3f, 0.3f, 0.2f, 0.9f},
                                            {0.9f, 0.8f, 0.0f, 0.0f}};
  for (std::uint32_t l = 0; l < 4; ++l) {
    Route r(4, {{plan[l][0], plan[l][1]}});
    r.logits = own[l];
    p.observe(ctx(l, 4, 7), r.view());
  }
  CHECK(p.stats().planned == 8);
  CHECK(p.stats().matched == 7);
  CHECK(p.planned_experts(0).empty());  // the big pass is over
  // recompute mode never imposes a plan
  RouterReplayPredictor exact({.top_k = 2, .big_pass = RouterReplayPredictor::BigPass::recompute});
  (void)little_pass_then_fallback(exact);
  CHECK(exact.planned_experts(0).empty());
}

TEST_CASE("RouterReplay: a prefill's fallback replays nothing", "[predict][mobile]") {
  // MoBiLE's little prefill (big_prefill = false) can fall back: there is no one-token trace to
  // replay, and an earlier decode token's must not be taken for it.
  RouterReplayPredictor p({.top_k = 2});
  (void)little_pass_then_fallback(p);  // a decode token's fallback and big pass
  for (std::uint32_t l = 0; l < 4; ++l) p.observe(ctx(l, 4, 7), Route(4, {{0, 1}}).view());
  Route prompt(4, {{0, 1}, {2, 3}});
  for (std::uint32_t l = 0; l < 4; ++l) p.observe(ctx(l, 4, 0, Phase::prefill, 2), prompt.view());
  OwnedList out;
  p.on_verdict(TokenVerdict::fallback, out.list);
  CHECK(out.items().empty());
  CHECK(p.planned_experts(0).empty());
  CHECK(p.stats().fallbacks == 1);
}
