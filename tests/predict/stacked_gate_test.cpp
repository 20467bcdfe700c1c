#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "moekit/precision/gemv.hpp"
#include "moekit/predict/router_stack.hpp"
#include "moekit/predict/routing.hpp"
#include "moekit/predict/stacked_gate.hpp"
#include "predict/predict_test_support.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::DesignedRouters;
using test::OwnedList;
using test::ResidentSet;
using test::Route;

namespace {
StackedGatePredictor make(const DesignedRouters& r, std::uint32_t p) {
  return StackedGatePredictor({.router_weights = r.w,
                               .n_layers = r.L,
                               .n_experts = r.E,
                               .hidden = r.d,
                               .top_k = 2,
                               .lookahead = p});
}
Route with_hidden(Route r, std::vector<float> h) {
  r.hidden = std::move(h);
  return r;
}
std::vector<std::uint32_t> layers_of(const std::vector<Prefetch>& v) {
  std::vector<std::uint32_t> out;
  for (auto& p : v) out.push_back(p.key.layer);
  return out;
}
}  // namespace

TEST_CASE("StackedGate: stacking p gates equals p sequential products (random property)",
          "[predict][hobbit]") {
  const std::uint32_t L = 6, E = 8, d = 96, seed = 2024;
  INFO("seed " << seed);
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> w(std::size_t{L} * E * d);
  for (auto& v : w) v = n(g);
  for (std::uint32_t p = 1; p <= 3; ++p) {
    StackedGatePredictor pred({.router_weights = w,
                               .n_layers = L,
                               .n_experts = E,
                               .hidden = d,
                               .top_k = 2,
                               .lookahead = p});
    const RouterStack bank(w, L, E, d, "test");
    for (int trial = 0; trial < 10; ++trial) {
      const std::uint32_t T = trial % 2 ? 3 : 1;  // one token (GEMV) and three (small GEMM)
      std::vector<float> x(std::size_t{T} * d);
      for (auto& v : x) v = n(g);
      for (std::uint32_t l = 0; l + 1 < L; ++l) {
        Route r(E, {{0, 1}});
        r.experts.assign(2 * T, 0);
        r.experts[1] = 1;
        for (std::uint32_t t = 1; t < T; ++t) r.experts[2 * t + 1] = 1;
        r.weights.assign(2 * T, 0.5f);
        r.n_tokens = T;
        r.hidden = x;
        std::vector<float> stacked;
        pred.stacked_logits(l, r.view(), stacked);
        const std::uint32_t count = std::min(p, L - 1 - l);
        REQUIRE(stacked.size() == std::size_t{T} * count * E);
        for (std::uint32_t j = 1; j <= count; ++j) {
          // the same tokens through layer l+j's router alone, with the same kernel
          std::vector<float> one;
          bank.logits(l + j, 1, x, T, one);
          for (std::uint32_t t = 0; t < T; ++t) {
            for (std::uint32_t e = 0; e < E; ++e) {
              const float s = stacked[(std::size_t{t} * count + (j - 1)) * E + e];
              CHECK(s == one[std::size_t{t} * E + e]);  // same rows, same kernel: bit-identical
              double ref = 0;
              for (std::uint32_t c = 0; c < d; ++c)
                ref += double(w[(std::size_t{l + j} * E + e) * d + c]) * x[std::size_t{t} * d + c];
              CHECK(s == Approx(ref).margin(1e-3));
            }
            std::vector<std::uint32_t> a(2), b(2);
            top_k_experts(
                std::span<const float>(stacked).subspan((std::size_t{t} * count + (j - 1)) * E, E),
                a);
            top_k_experts(std::span<const float>(one).subspan(std::size_t{t} * E, E), b);
            CHECK(a == b);
          }
        }
      }
    }
  }
}

TEST_CASE("StackedGate: Fig. 8 adaptive walk (spec §7 16)", "[predict][hobbit]") {
  DesignedRouters r(6, 8, 16);
  r.route(1, {{1, 0.5f}, {2, 0.5f}});
  r.route(2, {{3, 0.5f}, {4, 0.5f}});
  r.route(3, {{5, 0.5f}, {6, 0.5f}});
  r.route(4, {{0, 0.5f}, {7, 0.5f}});
  auto pred = make(r, 3);
  const Route call = with_hidden(Route(8, {{0, 1}}), r.x());

  // At layer 0, layer 1 has misses: prefetch layer 1 only.
  ResidentSet none;
  OwnedList a;
  pred.predict(ctx(0, 6), call.view(), none.view(), a.list);
  CHECK(layers_of(a.items()) == std::vector<std::uint32_t>{1, 1});
  CHECK(a.items()[0].key == ExpertKey{1, 1});
  CHECK(a.items()[1].key == ExpertKey{1, 2});
  CHECK(a.items()[0].distance == 1);

  // At layer 1, layer 2 is fully resident: it is pushed (pinned), layer 3 prefetched, not 4.
  ResidentSet res;
  res.keys = {{2, 3}, {2, 4}};
  OwnedList b;
  pred.predict(ctx(1, 6), call.view(), res.view(), b.list);
  CHECK(layers_of(b.items()) == std::vector<std::uint32_t>{2, 2, 3, 3});
  CHECK(b.items()[2].key == ExpertKey{3, 5});
  CHECK(b.items()[2].distance == 2);

  // Everything resident: all examined layers pinned, the walk ends after p layers.
  res.keys.insert({{3, 5}, {3, 6}, {4, 0}, {4, 7}});
  OwnedList c;
  pred.predict(ctx(1, 6), call.view(), res.view(), c.list);
  CHECK(layers_of(c.items()) == std::vector<std::uint32_t>{2, 2, 3, 3, 4, 4});

  // Last layer predicts nothing; layer L-2 with p = 3 examines only L-1.
  OwnedList d, e;
  pred.predict(ctx(5, 6), call.view(), none.view(), d.list);
  CHECK(d.items().empty());
  pred.predict(ctx(4, 6), call.view(), none.view(), e.list);
  CHECK(layers_of(e.items()) == std::vector<std::uint32_t>{5, 5});
  // p = 0 disables it
  OwnedList f;
  make(r, 0).predict(ctx(0, 6), call.view(), none.view(), f.list);
  CHECK(f.items().empty());
}

TEST_CASE("StackedGate: prefetch precision by the T1/T2 rule (spec §7 17)", "[predict][hobbit]") {
  DesignedRouters r(3, 8, 16);
  r.route(1, {{4, 0.8f}, {6, 0.2f}});
  r.route(2, {{4, 0.95f}, {6, 0.05f}});
  auto pred = make(r, 1);
  const Route call = with_hidden(Route(8, {{0, 1}}), r.x());
  ResidentSet none;
  OwnedList a;
  pred.predict(ctx(0, 3), call.view(), none.view(), a.list);
  REQUIRE(a.items().size() == 2);
  CHECK(a.items()[0].key == ExpertKey{1, 4});
  CHECK(a.items()[0].precision == Precision::f16);
  CHECK(a.items()[1].key == ExpertKey{1, 6});
  CHECK(a.items()[1].precision == Precision::q4);  // score 0.8 in (0.6, 0.9]: low
  CHECK(a.items()[1].confidence == Approx(0.2f).epsilon(1e-4));
  OwnedList b;
  pred.predict(ctx(1, 3), call.view(), none.view(), b.list);
  REQUIRE(b.items().size() == 1);  // e6 scores 0.95 > T2: skipped, not prefetched
  CHECK(b.items()[0].key == ExpertKey{2, 4});
}

TEST_CASE("StackedGate: prefill takes the union with the most demanding decision",
          "[predict][hobbit]") {
  // token 0 routes layer 1 to {4 (0.95), 6 (0.05)}; token 1 to {6 (0.7), 2 (0.3)}
  const std::uint32_t L = 2, E = 8, d = 2;
  std::vector<float> w(std::size_t{L} * E * d, -30.0f);
  auto set = [&](std::uint32_t e, float c0, float c1) {
    w[(std::size_t{1} * E + e) * d] = c0;
    w[(std::size_t{1} * E + e) * d + 1] = c1;
  };
  set(4, std::log(0.95f), -30.0f);
  set(6, std::log(0.05f), std::log(0.7f));
  set(2, -30.0f, std::log(0.3f));
  StackedGatePredictor pred({.router_weights = w, .n_layers = L, .n_experts = E, .hidden = d});
  Route call(E, {{0, 1}, {0, 1}});
  call.hidden = {1, 0, 0, 1};
  ResidentSet none;
  OwnedList a;
  pred.predict(ctx(0, 2, 0, Phase::prefill, 2), call.view(), none.view(), a.list);
  REQUIRE(a.items().size() == 3);
  CHECK(a.items()[0].key == ExpertKey{1, 2});
  CHECK(a.items()[0].precision == Precision::q4);
  CHECK(a.items()[1].key == ExpertKey{1, 4});
  CHECK(a.items()[1].precision == Precision::f16);
  CHECK(a.items()[2].key == ExpertKey{1, 6});
  CHECK(a.items()[2].precision == Precision::f16);  // skip for token 0, top-1 for token 1
}

TEST_CASE("StackedGate: configuration and input errors name the field", "[predict][hobbit]") {
  std::vector<float> w(2 * 8 * 4);
  CHECK_THROWS_WITH(
      StackedGatePredictor({.router_weights = w, .n_layers = 2, .n_experts = 8, .hidden = 5}),
      Catch::Contains("Config.router_weights"));
  CHECK_THROWS_WITH(
      StackedGatePredictor(
          {.router_weights = w, .n_layers = 2, .n_experts = 8, .hidden = 4, .lookahead = 4}),
      Catch::Contains("Config.lookahead"));
  StackedGatePredictor p({.router_weights = w, .n_layers = 2, .n_experts = 8, .hidden = 4});
  ResidentSet none;
  OwnedList a;
  CHECK_THROWS_WITH(p.predict(ctx(0, 2), Route(8, {{0, 1}}).view(), none.view(), a.list),
                    Catch::Contains("GateView.hidden"));
}
