// End-to-end: predictors and token policies inside OffloadPipeline with the ManualLoader, and the
// property that every prediction names a valid expert of a later layer.
#include <catch2/catch.hpp>

#include <memory>
#include <random>
#include <vector>

#include "moekit/cache/lru.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/activation_path.hpp"
#include "moekit/predict/cross_layer_gate.hpp"
#include "moekit/predict/oracle.hpp"
#include "moekit/predict/router_replay.hpp"
#include "moekit/predict/stacked_gate.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/big_little.hpp"
#include "moekit/score/uniform.hpp"
#include "predict/predict_test_support.hpp"
#include "support/manual_loader.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::ManualLoader;
using test::OwnedList;
using test::ResidentSet;
using test::Route;

namespace {
constexpr ModelShape shape{.n_layers = 4, .n_experts = 8, .top_k = 2, .hidden = 64, .ffn = 64};
const std::size_t f16 = shape.expert_bytes(Precision::f16);

std::vector<std::vector<std::uint32_t>> random_routing(std::size_t tokens, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<std::vector<std::uint32_t>> r;
  for (std::size_t i = 0; i < tokens * shape.n_layers; ++i) {
    const std::uint32_t a = g() % 8;
    std::uint32_t b = g() % 7;
    if (b >= a) ++b;
    r.push_back({a, b});
  }
  return r;
}
}  // namespace

TEST_CASE("Oracle predictor through the pipeline: precision and recall 1 at distances 1 and 2",
          "[predict][pipeline]") {
  const std::uint32_t seed = 31337;
  INFO("seed " << seed);
  const auto routing = random_routing(25, seed);
  OraclePredictor::Config oc{.calls = {}, .distance = 2};
  for (std::size_t i = 0; i < routing.size(); ++i)
    oc.calls.push_back({static_cast<std::uint32_t>(i % shape.n_layers), routing[i]});
  OffloadPipeline<UniformScorer, OraclePredictor, LruPolicy, ManualLoader, OnDemandScheduler> p(
      shape, {.expert_budget_bytes = 12 * f16}, ManualLoader{}, UniformScorer{},
      OraclePredictor(oc));
  p.begin_sequence();
  for (std::size_t i = 0; i < routing.size(); ++i) {
    const auto l = static_cast<std::uint32_t>(i % shape.n_layers);
    const auto c = ctx(l, shape.n_layers, i / shape.n_layers);
    const Route r(8, {{routing[i][0], routing[i][1]}}, {{0.6f, 0.4f}});
    const auto& plan = p.route(c, r.view());
    p.resolve(plan);
    p.end_layer(c);
    if (l + 1 == shape.n_layers) CHECK(p.end_token({}) == TokenVerdict::accept);
  }
  const auto s = p.stats();
  CHECK(s.prediction[1].recall() == 1.0);
  CHECK(s.prediction[1].precision() == 1.0);
  CHECK(s.prediction[2].recall() == 1.0);
  CHECK(s.prediction[2].precision() == 1.0);
  CHECK(s.prediction[1].true_positive == 25 * 3 * 2);  // layers 1..3 of every token
  CHECK(s.prediction[3].true_positive == 0);
  // every demand after layer 0 was predicted and prefetched (or already resident): no misses there
  CHECK(s.misses <= 25 * 2);
  p.cache().check_invariants();
  // drifting from the script is an error, not a silently wrong bound
  CHECK_THROWS_WITH(p.route(ctx(0, 4, 99), Route(8, {{0, 1}}).view()),
                    Catch::Contains("beyond the script"));
}

TEST_CASE("MoBiLE through the pipeline: little pass, fallback, replayed prefetch, big pass hits",
          "[predict][pipeline][mobile]") {
  constexpr ModelShape s3{.n_layers = 3, .n_experts = 4, .top_k = 2, .hidden = 64, .ffn = 64};
  const std::size_t b = s3.expert_bytes(Precision::f16);
  OffloadPipeline<UniformScorer, RouterReplayPredictor, LruPolicy, ManualLoader, OnDemandScheduler,
                  BigLittlePolicy>
      p(s3, {.expert_budget_bytes = 12 * b}, ManualLoader{}, UniformScorer{},
        RouterReplayPredictor({.top_k = 2, .big_pass = RouterReplayPredictor::BigPass::recompute}));
  p.begin_sequence();
  const std::vector<std::vector<float>> logits{
      {0.1f, 0.5f, 0.9f, 0.2f}, {0.8f, 0.0f, 0.1f, 0.7f}, {0.3f, 0.3f, 0.2f, 0.9f}};
  // little pass: K_s = 1
  for (std::uint32_t l = 0; l < 3; ++l) {
    const auto c = ctx(l, 3, 10);
    REQUIRE(p.active_top_k(c) == 1);
    std::uint32_t top = 0;
    for (std::uint32_t e = 1; e < 4; ++e)
      if (logits[l][e] > logits[l][top]) top = e;
    Route r(4, {{top}}, {{1.0f}});
    r.logits = logits[l];
    p.resolve(p.route(c, r.view()));
    p.end_layer(c);
  }
  const auto before = p.stats();
  CHECK(before.misses == 3);
  // the output distribution is flat: fallback, and the replay prefetches the other K - K_s
  CHECK(p.end_token(std::vector<float>{0, 0, 0}) == TokenVerdict::fallback);
  const auto after = p.stats();
  CHECK(after.fallbacks == 1);
  CHECK(after.prefetches_issued == 1);  // (0,1): layer 0's plan; the little expert is resident
  CHECK(after.prefetches_redundant == 1);
  // big pass: K = 2, routes exactly as replayed except layer 1 -> {0, 2}
  const std::vector<std::vector<std::uint32_t>> big{{2, 1}, {0, 2}, {3, 0}};
  for (std::uint32_t l = 0; l < 3; ++l) {
    const auto c = ctx(l, 3, 10);
    REQUIRE(p.active_top_k(c) == 2);
    Route r(4, {{big[l][0], big[l][1]}}, {{0.5f, 0.5f}});
    r.logits = logits[l];
    p.resolve(p.route(c, r.view()));
    p.end_layer(c);
  }
  CHECK(p.end_token(std::vector<float>{0, 0, 0}) == TokenVerdict::accept);  // never twice
  const auto done = p.stats();
  CHECK(done.hits - after.hits == 5);
  CHECK(done.misses - after.misses == 1);  // (1, 2) was not in the replayed plan
  CHECK(done.prefetches_issued == 3);      // (1,3) and (2,0) one layer ahead of the big pass
  CHECK(done.prefetches_redundant == 3);
  CHECK(p.predictor().stats().matched == 5);
  CHECK(p.token_policy().stats().fallback_ratio() == 1.0);
  p.cache().check_invariants();
}

TEST_CASE("Every predictor names valid experts of later layers only (random property)",
          "[predict][property]") {
  const std::uint32_t L = 5, E = 8, d = 16, seed = 777;
  INFO("seed " << seed);
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> w(std::size_t{L} * E * d);
  for (auto& v : w) v = n(g);
  StackedGatePredictor stacked(
      {.router_weights = w, .n_layers = L, .n_experts = E, .hidden = d, .lookahead = 3});
  CrossLayerGatePredictor cross({.router_weights = w, .n_layers = L, .n_experts = E, .hidden = d});
  auto prof = std::make_shared<ActivationPathProfile>(L, E, 2);
  ActivationPathPredictor path({.profile = prof, .min_support = 1});
  ResidentSet res;
  auto check = [&](auto& pred, const LayerContext& c, const GateView& gv, const char* who) {
    OwnedList out;
    pred.observe(c, gv);
    pred.predict(c, gv, res.view(), out.list);
    for (const Prefetch& pf : out.items()) {
      INFO(who << " at layer " << c.layer);
      CHECK(pf.key.layer > c.layer);
      CHECK(pf.key.layer < L);
      CHECK(pf.key.expert < E);
      CHECK(pf.distance == pf.key.layer - c.layer);
      CHECK(pf.precision != Precision::skip);
      CHECK(pf.confidence >= 0.0f);
      CHECK(pf.confidence <= 1.0f);
    }
  };
  for (std::uint64_t t = 0; t < 60; ++t) {
    std::vector<std::vector<std::uint32_t>> sets;
    const std::uint32_t tokens = t % 5 == 0 ? 3 : 1;
    for (std::uint32_t l = 0; l < L; ++l) {
      Route r(E, {{0, 1}});
      r.experts.clear();
      r.weights.clear();
      r.n_tokens = tokens;
      for (std::uint32_t k = 0; k < tokens; ++k) {
        const std::uint32_t a = g() % E;
        std::uint32_t b = g() % (E - 1);
        if (b >= a) ++b;
        r.experts.insert(r.experts.end(), {a, b});
        r.weights.insert(r.weights.end(), {0.7f, 0.3f});
        if (k == 0) sets.push_back({a, b});
      }
      r.hidden.resize(std::size_t{tokens} * d);
      for (auto& v : r.hidden) v = n(g);
      res.keys.clear();
      for (std::uint32_t e = 0; e < E; ++e)
        if (g() % 3 == 0) res.keys.insert({std::uint32_t(g() % L), e});
      const auto c = ctx(l, L, t, tokens > 1 ? Phase::prefill : Phase::decode, tokens);
      check(stacked, c, r.view(), "stacked");
      check(cross, c, r.view(), "cross");
      check(path, c, r.view(), "path");
    }
    std::vector<std::span<const std::uint32_t>> v(sets.begin(), sets.end());
    prof->add_path(v);  // the profile learns as the test goes (shared with the predictor)
  }
}

#include "moekit/score/hobbit_threshold.hpp"
#include "moekit/score/static_bitwidth.hpp"

TEST_CASE("HOBBIT components through the pipeline: stacked gate predicts the next layer exactly",
          "[predict][pipeline][hobbit]") {
  // Layer l routes every token to {l % 8, (l + 3) % 8}; routers are designed so that the gate
  // input e_0 predicts exactly that, with weights 0.7 / 0.3 (second expert low precision).
  test::DesignedRouters r(4, 8, 64);
  for (std::uint32_t l = 0; l < 4; ++l) r.route(l, {{l % 8, 0.7f}, {(l + 3) % 8, 0.3f}});
  StackedGatePredictor pred({.router_weights = r.w,
                             .n_layers = 4,
                             .n_experts = 8,
                             .hidden = 64,
                             .top_k = 2,
                             .lookahead = 2});
  OffloadPipeline<HobbitThresholdScorer, StackedGatePredictor, LruPolicy, ManualLoader,
                  OnDemandScheduler>
      p(shape, {.expert_budget_bytes = 16 * f16}, ManualLoader{}, HobbitThresholdScorer{},
        std::move(pred));
  p.begin_sequence();
  for (std::uint64_t tok = 0; tok < 3; ++tok)
    for (std::uint32_t l = 0; l < 4; ++l) {
      const auto c = ctx(l, 4, tok);
      Route route(8, {{l % 8, (l + 3) % 8}}, {{0.7f, 0.3f}});
      route.hidden = r.x();
      const auto& plan = p.route(c, route.view());
      REQUIRE(plan.experts.size() == 2);
      CHECK(plan.experts[0].precision == Precision::f16);
      CHECK(plan.experts[1].precision == Precision::q4);  // the T1/T2 rule on the true weights
      if (tok == 0 && l > 0) {
        CHECK(plan.experts[0].hit);  // prefetched by the previous layer
        CHECK(plan.experts[1].hit);
      }
      p.resolve(plan);
      p.end_layer(c);
    }
  const auto s = p.stats();
  CHECK(s.prediction[1].recall() == 1.0);
  CHECK(s.prediction[1].precision() == 1.0);
  CHECK(s.misses == 2);  // layer 0 of the first token only
  // prefetches carried the rule's precisions: one f16 and one q4 per predicted layer
  std::size_t q4 = 0, f16n = 0;
  for (const auto& rec : p.loader().records())
    if (rec.request.priority == LoadPriority::prefetch)
      (rec.request.precision == Precision::q4 ? q4 : f16n) += 1;
  CHECK(q4 == 3);
  CHECK(f16n == 3);
  p.cache().check_invariants();
}

TEST_CASE("EdgeMoE components through the pipeline: static bit widths and path preloading",
          "[predict][pipeline][edgemoe]") {
  PrecisionTable bits(4, 8, Precision::q4);
  bits.set({1, 5}, Precision::q2);
  auto prof = std::make_shared<ActivationPathProfile>(4, 8, 2);
  const std::vector<std::vector<std::uint32_t>> path{{0, 1}, {2, 5}, {3, 4}, {6, 7}};
  {
    std::vector<std::span<const std::uint32_t>> v(path.begin(), path.end());
    for (int i = 0; i < 10; ++i) prof->add_path(v);
  }
  ActivationPathPredictor pred(
      {.profile = prof, .max_preload = 2, .precisions = {bits.all().begin(), bits.all().end()}});
  OffloadPipeline<StaticBitwidthScorer, ActivationPathPredictor, LruPolicy, ManualLoader,
                  OnDemandScheduler>
      p(shape, {.expert_budget_bytes = 16 * f16, .base_precision = Precision::q4}, ManualLoader{},
        StaticBitwidthScorer({bits}), std::move(pred));
  p.begin_sequence();
  for (std::uint32_t l = 0; l < 4; ++l) {
    const auto c = ctx(l, 4, 0);
    const Route route(8, {{path[l][0], path[l][1]}}, {{0.6f, 0.4f}});
    const auto& plan = p.route(c, route.view());
    if (l == 1) {
      CHECK(plan.experts[1].key == ExpertKey{1, 5});
      CHECK(plan.experts[1].precision == Precision::q2);  // the table's, also for the preload
    }
    if (l > 0) CHECK(plan.experts[0].hit);
    p.resolve(plan);
    p.end_layer(c);
  }
  const auto s = p.stats();
  CHECK(s.prediction[1].recall() == 1.0);
  CHECK(s.misses == 2);
  CHECK(p.predictor().stats().by_source[0] == 2);  // layers 2, 3 from the two-layer table
}

TEST_CASE("MoBiLE: the little pass's experts stay resident for the fallback",
          "[predict][pipeline][mobile]") {
  // 4 layers, a cache of 6 experts: the little pass loads one expert per layer; the big pass needs
  // it plus one more per layer, each prefetched one layer ahead. Kept (soft-pinned) until the
  // verdict and then through the big pass's layer, the little experts are not evicted by the big
  // pass's prefetches: the fallback moves exactly L · (K − K_s) = 4 experts. Without retention,
  // LRU evicts layer 3's little expert (used before the big pass's layer 0) to make room for
  // layer 2's prefetch, and it is read again.
  constexpr ModelShape s3{.n_layers = 4, .n_experts = 4, .top_k = 2, .hidden = 64, .ffn = 64};
  const std::size_t b = s3.expert_bytes(Precision::f16);
  const std::vector<float> logits{0.9f, 0.5f, 0.1f, 0.0f};  // little {0}, plan {0, 1}
  auto fallback_loads = [&](bool retain) {
    OffloadPipeline<UniformScorer, RouterReplayPredictor, LruPolicy, ManualLoader,
                    OnDemandScheduler, BigLittlePolicy>
        p(s3, {.expert_budget_bytes = 6 * b, .retain_narrowed_experts = retain}, ManualLoader{},
          UniformScorer{}, RouterReplayPredictor({.top_k = 2}));
    p.begin_sequence();
    for (std::uint32_t l = 0; l < 4; ++l) {
      Route r(4, {{0}}, {{1.0f}});
      r.logits = logits;
      p.resolve(p.route(ctx(l, 4, 10), r.view()));
      p.end_layer(ctx(l, 4, 10));
    }
    const std::size_t before = p.loader().records().size();
    REQUIRE(p.end_token(std::vector<float>{0, 0, 0}) == TokenVerdict::fallback);
    for (std::uint32_t l = 0; l < 4; ++l) {
      const auto planned = p.planned_experts(ctx(l, 4, 10));
      REQUIRE(planned.size() == 2);
      Route r(4, {{planned[0], planned[1]}}, {{0.5f, 0.5f}});
      r.logits = logits;
      p.resolve(p.route(ctx(l, 4, 10), r.view()));
      p.end_layer(ctx(l, 4, 10));
    }
    REQUIRE(p.end_token(std::vector<float>{0, 0, 0}) == TokenVerdict::accept);
    p.cache().check_invariants();
    for (std::uint32_t l = 0; l < 4; ++l)  // every retention pin released
      for (std::uint32_t e = 0; e < 4; ++e)
        if (p.cache().resident({l, e})) CHECK(p.cache().entry({l, e}).soft_pins == 0);
    return p.loader().records().size() - before;
  };
  CHECK(fallback_loads(true) == 4);
  CHECK(fallback_loads(false) == 5);
}
