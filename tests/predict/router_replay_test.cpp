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

TEST_CASE("RouterReplay: a fallback pushes the top-K of every recorded layer",
          "[predict][mobile]") {
  RouterReplayPredictor p({.top_k = 2});
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
