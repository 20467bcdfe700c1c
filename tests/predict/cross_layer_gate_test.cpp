#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "moekit/predict/cross_layer_gate.hpp"
#include "moekit/predict/routing.hpp"
#include "predict/predict_test_support.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::DesignedRouters;
using test::OwnedList;
using test::ResidentSet;
using test::Route;

namespace {
CrossLayerGatePredictor::Config cfg(const DesignedRouters& r) {
  return {.router_weights = r.w, .n_layers = r.L, .n_experts = r.E, .hidden = r.d, .top_k = 2};
}
}  // namespace

TEST_CASE("CrossLayerGate: percentile candidate count and transfer cap", "[predict][fate]") {
  for (auto [E, m] : {std::pair{60u, 15u}, {64u, 16u}, {8u, 2u}}) {
    DesignedRouters r(2, E, 4);
    CHECK(CrossLayerGatePredictor(cfg(r)).candidate_count() == m);
  }
  DesignedRouters r(2, 8, 4);
  auto c = cfg(r);
  c.budget_time = 10 + 2 + 1;  // t_moe + t_attn + t_gate (ms)
  c.expert_time = 6;
  CHECK(CrossLayerGatePredictor(c).transfer_cap() == 2);
  c.expert_time = 1;
  CHECK(CrossLayerGatePredictor(c).transfer_cap() == 2);  // clamped to the candidates
  c.expert_time = 100;
  CHECK(CrossLayerGatePredictor(c).transfer_cap() == 0);
}

TEST_CASE("CrossLayerGate: decode prefetches the top candidates, resident ones are free",
          "[predict][fate]") {
  DesignedRouters r(3, 20, 8);  // m = ceil(0.25 · 20) = 5
  r.route(1, {{3, 0.30f}, {7, 0.25f}, {1, 0.15f}, {9, 0.1f}, {12, 0.08f}, {15, 0.07f}, {0, 0.05f}});
  auto c = cfg(r);
  c.budget_time = 13;
  c.expert_time = 6;  // n = 2
  CrossLayerGatePredictor p(c);
  Route call(20, {{0, 1}});
  call.hidden = r.x();
  ResidentSet none;
  OwnedList a;
  p.predict(ctx(0, 3), call.view(), none.view(), a.list);
  REQUIRE(a.items().size() == 2);
  CHECK(a.items()[0].key == ExpertKey{1, 3});
  CHECK(a.items()[1].key == ExpertKey{1, 7});
  CHECK(a.items()[0].precision == Precision::q4);
  CHECK(a.items()[0].confidence == Approx(0.30).epsilon(1e-3));
  // expert 3 resident: pushed for free, the two transfers go to 7 and 1
  ResidentSet res;
  res.keys = {{1, 3}};
  OwnedList b;
  p.predict(ctx(0, 3), call.view(), res.view(), b.list);
  REQUIRE(b.items().size() == 3);
  CHECK(b.items()[1].key == ExpertKey{1, 7});
  CHECK(b.items()[2].key == ExpertKey{1, 1});
  // the last layer predicts nothing
  OwnedList d;
  p.predict(ctx(2, 3), call.view(), none.view(), d.list);
  CHECK(d.items().empty());
}

TEST_CASE("CrossLayerGate: identical routers predict the true routing exactly (property)",
          "[predict][fate]") {
  const std::uint32_t L = 4, E = 16, d = 32, seed = 99;
  INFO("seed " << seed);
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> w(std::size_t{L} * E * d);
  for (std::size_t i = 0; i < std::size_t{E} * d; ++i) w[i] = n(g);
  for (std::uint32_t l = 1; l < L; ++l)
    std::copy(w.begin(), w.begin() + std::ptrdiff_t(E * d), w.begin() + std::ptrdiff_t(l * E * d));
  CrossLayerGatePredictor p(
      {.router_weights = w, .n_layers = L, .n_experts = E, .hidden = d, .top_k = 2});
  ResidentSet none;
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x(d);
    for (auto& v : x) v = n(g);
    // true routing of layer 1 for x (same router as layer 0)
    std::vector<float> logits(E);
    for (std::uint32_t e = 0; e < E; ++e)
      for (std::uint32_t c = 0; c < d; ++c) logits[e] += w[e * d + c] * x[c];
    std::vector<std::uint32_t> top(2);
    top_k_experts(logits, top);
    Route call(E, {{0, 1}});
    call.hidden = x;
    OwnedList a;
    p.predict(ctx(0, L), call.view(), none.view(), a.list);
    REQUIRE(a.items().size() == 4);  // m = 4, no cap
    CHECK(a.items()[0].key.expert == top[0]);
    CHECK(a.items()[1].key.expert == top[1]);
    for (auto& pf : a.items()) CHECK(pf.key.layer == 1);
    // probabilities equal softmax(W x) to 1e-6
    float mx = *std::max_element(logits.begin(), logits.end()), s = 0;
    for (auto v : logits) s += std::exp(v - mx);
    for (std::uint32_t e = 0; e < E; ++e)
      CHECK(p.last_probabilities()[e] == Approx(std::exp(logits[e] - mx) / s).margin(1e-6));
  }
}

TEST_CASE("CrossLayerGate: prefill popularity order and int2 split", "[predict][fate]") {
  // 8 tokens, one-hot inputs; token t's predicted top-2 at layer 1 is designed per column
  const std::uint32_t L = 2, E = 8, T = 8, d = T;
  std::vector<float> w(std::size_t{L} * E * d, -30.0f);
  auto set = [&](std::uint32_t t, std::uint32_t e, float logit) {
    w[(std::size_t{1} * E + e) * d + t] = logit;
  };
  // popularity: expert 5 → 8 tokens, 2 → 5, 6 → 2, 0 → 1 (tokens 0..7)
  for (std::uint32_t t = 0; t < T; ++t) {
    set(t, 5, 2.0f);
    const std::uint32_t second = t < 5 ? 2 : t < 7 ? 6 : 0;
    set(t, second, 1.0f);
  }
  CrossLayerGatePredictor p({.router_weights = w,
                             .n_layers = L,
                             .n_experts = E,
                             .hidden = d,
                             .top_k = 2,
                             .int2_fraction = 0.5});
  Route call(E, {{0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}});
  call.hidden.assign(std::size_t{T} * d, 0.0f);
  for (std::uint32_t t = 0; t < T; ++t) call.hidden[t * d + t] = 1.0f;
  ResidentSet none;
  OwnedList a;
  p.predict(ctx(0, L, 0, Phase::prefill, T), call.view(), none.view(), a.list);
  const auto it = a.items();
  REQUIRE(it.size() == 4);
  CHECK(it[0].key.expert == 5);
  CHECK(it[1].key.expert == 2);
  CHECK(it[2].key.expert == 6);
  CHECK(it[3].key.expert == 0);
  CHECK(it[0].precision == Precision::q4);
  CHECK(it[1].precision == Precision::q4);
  CHECK(it[2].precision == Precision::q2);  // floor(0.5 · 4) = 2 least popular at int2
  CHECK(it[3].precision == Precision::q2);
  CHECK(it[0].confidence == 1.0f);
  CHECK(it[1].confidence == Approx(5.0 / 8.0));
}
