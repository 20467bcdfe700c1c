// NoisyOraclePredictor: recall 1 is the oracle, recall 0 is never right, a seed is reproducible,
// the realised recall matches the configured one, and replayed through sim::replay the pipeline
// measures that recall.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "moekit/cache/lru.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/noisy_oracle.hpp"
#include "moekit/predict/oracle.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/uniform.hpp"
#include "moekit/sim/replay.hpp"
#include "moekit/sim/sim_loader.hpp"
#include "moekit/tools/oracle_script.hpp"
#include "predict_test_support.hpp"

using namespace moekit;

namespace {
constexpr std::uint32_t E = 8;

// 600 calls over 4 layers, 2 random distinct experts each (one forward per 4 calls).
std::vector<OracleCall> random_calls(std::uint32_t seed, std::size_t n = 600) {
  std::mt19937 g(seed);
  std::vector<OracleCall> calls;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t a = g() % E;
    std::uint32_t b = g() % (E - 1);
    if (b >= a) ++b;
    calls.push_back({static_cast<std::uint32_t>(i % 4), {a, b}});
  }
  return calls;
}

std::set<std::uint32_t> ids(const std::vector<std::pair<std::uint32_t, Precision>>& v) {
  std::set<std::uint32_t> s;
  for (auto& [e, p] : v) s.insert(e);
  return s;
}

NoisyOraclePredictor make(double recall, std::uint64_t seed, std::vector<OracleCall> calls) {
  return NoisyOraclePredictor(
      {.calls = std::move(calls), .recall = recall, .seed = seed, .n_experts = E});
}
}  // namespace

TEST_CASE("noisy oracle: recall 1 predicts exactly the true experts", "[predict][noisy]") {
  const auto calls = random_calls(1);
  auto p = make(1.0, 5, calls);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const auto got = ids(p.predictions(i));
    CHECK(got == std::set<std::uint32_t>(calls[i].experts.begin(), calls[i].experts.end()));
  }
}

TEST_CASE("noisy oracle: recall 1 pushes what OraclePredictor pushes", "[predict][noisy]") {
  const auto calls = random_calls(2, 40);
  OraclePredictor oracle({.calls = calls, .distance = 1, .precision = Precision::f16});
  auto noisy = make(1.0, 9, calls);
  test::ResidentSet none;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const OracleCall& c = calls[i];
    const GateView g{.n_tokens = 1, .k = 2, .n_experts = E, .experts = c.experts};
    std::vector<float> w{0.5f, 0.5f};
    GateView gw = g;
    gw.weights = w;
    const LayerContext ctx{c.layer, 4, i / 4, Phase::decode, 0, 1};
    oracle.observe(ctx, gw);
    noisy.observe(ctx, gw);
    test::OwnedList a, b;
    oracle.predict(ctx, gw, none.view(), a.list);
    noisy.predict(ctx, gw, none.view(), b.list);
    auto key_set = [](const std::vector<Prefetch>& v) {
      std::set<std::pair<std::uint32_t, std::uint32_t>> s;
      for (const Prefetch& p : v) s.insert({p.key.layer, p.key.expert});
      return s;
    };
    CHECK(key_set(a.items()) == key_set(b.items()));
  }
}

TEST_CASE("noisy oracle: recall 0 never predicts a used expert", "[predict][noisy]") {
  const auto calls = random_calls(3);
  auto p = make(0.0, 11, calls);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const auto got = p.predictions(i);
    CHECK(got.size() == calls[i].experts.size());  // every true expert replaced by a wrong one
    for (auto [e, prec] : got)
      CHECK(std::find(calls[i].experts.begin(), calls[i].experts.end(), e) ==
            calls[i].experts.end());
  }
}

TEST_CASE("noisy oracle: deterministic per seed, realised recall near the configured one",
          "[predict][noisy]") {
  const auto calls = random_calls(4, 5000);
  auto a = make(0.9, 42, calls), b = make(0.9, 42, calls), c = make(0.9, 43, calls);
  std::size_t right = 0, total = 0, differ = 0;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const auto pa = a.predictions(i);
    CHECK(pa == b.predictions(i));
    differ += pa != c.predictions(i);
    for (std::uint32_t e : calls[i].experts) right += ids(pa).count(e);
    total += calls[i].experts.size();
  }
  CHECK(differ > 0);
  // 10,000 Bernoulli(0.9) trials: sd 0.003, so ±0.015 is five sd.
  CHECK(double(right) / double(total) == Approx(0.9).margin(0.015));
  // Asking twice gives the same answer (no hidden stream state).
  CHECK(a.predictions(7) == a.predictions(7));
}

TEST_CASE("noisy oracle: padding, precisions, skip and the non-resident cap", "[predict][noisy]") {
  std::vector<OracleCall> calls{{0, {3, 1}}, {1, {5, 2}}};
  NoisyOraclePredictor p(
      {.calls = calls,
       .precisions = {{Precision::q4, Precision::f16}, {Precision::skip, Precision::q4}},
       .recall = 1.0,
       .set_size = 4,
       .n_experts = E,
       .max_nonresident = 2,
       .precision = Precision::q2});
  // Call 0 sorted: experts {1, 3} with precisions {f16, q4}; padded with two wrong q2 experts.
  const auto c0 = p.predictions(0);
  REQUIRE(c0.size() == 4);
  CHECK(c0[0] == std::pair{1u, Precision::f16});
  CHECK(c0[1] == std::pair{3u, Precision::q4});
  CHECK(c0[2].second == Precision::q2);
  CHECK(c0[2].first != 1u);
  CHECK(c0[2].first != 3u);
  CHECK(c0[2].first != c0[3].first);
  // From layer 0: call 1 = {2 at q4, 5 at skip} + 2 pads; skip is not pushed; expert 2 resident;
  // of the 2 non-resident pads at most 2 are pushed.
  test::ResidentSet res;
  res.keys.insert({1, 2});
  std::vector<std::uint32_t> seen{1, 3};
  std::vector<float> w{0.5f, 0.5f};
  GateView g{.n_tokens = 1, .k = 2, .n_experts = E, .experts = seen, .weights = w};
  const LayerContext ctx{0, 2, 0, Phase::decode, 0, 1};
  p.observe(ctx, g);
  test::OwnedList out;
  p.predict(ctx, g, res.view(), out.list);
  const auto items = out.items();
  CHECK(items.size() == 3);
  for (const Prefetch& f : items) {
    CHECK(f.key.layer == 1);
    CHECK(f.key.expert != 5u);
    CHECK(f.distance == 1u);
  }
  CHECK_THROWS_AS(NoisyOraclePredictor({.calls = calls, .recall = 1.5, .n_experts = E}),
                  moekit::Error);
  CHECK_THROWS_AS(NoisyOraclePredictor({.calls = {{0, {9}}}, .n_experts = E}), moekit::Error);
}

TEST_CASE("noisy oracle in a replay: the pipeline measures the configured recall",
          "[predict][noisy][replay]") {
  const sim::TraceDims d{.n_layers = 4, .n_experts = E, .top_k = 2};
  sim::RoutingTrace t(d, "random");
  std::mt19937 g(17);
  const float w[2] = {0.625f, 0.375f};
  t.begin_sequence("s");
  for (int i = 0; i < 400; ++i) {
    const std::size_t tok = t.append_token(Phase::decode);
    for (std::uint32_t l = 0; l < d.n_layers; ++l) {
      const std::uint32_t a = g() % E;
      std::uint32_t b = g() % (E - 1);
      if (b >= a) ++b;
      const std::uint32_t id[2] = {a, b};
      t.set_route(tok, l, id, w);
    }
  }
  const ModelShape shape{.n_layers = 4, .n_experts = E, .top_k = 2, .hidden = 8, .ffn = 16};
  for (double r : {1.0, 0.75, 0.0}) {
    OffloadPipeline<UniformScorer, NoisyOraclePredictor, LruPolicy, sim::SimLoader,
                    OnDemandScheduler>
        p(shape, {.expert_budget_bytes = 16 * shape.expert_bytes(Precision::f16)},
          sim::SimLoader(shape, {.bandwidth_bytes_per_s = 1e9}), UniformScorer{},
          NoisyOraclePredictor(
              {.calls = tools::oracle_calls(t), .recall = r, .seed = 3, .n_experts = E}));
    sim::ComputeModel cm;
    cm.device_expert_s.fill(1e-6);
    const auto rep = sim::replay(p, t, cm);
    const auto& s = rep.pipeline.prediction[1];
    CHECK(s.recall() == Approx(r).margin(0.05));
    if (r == 1.0) CHECK(s.precision() == 1.0);
    if (r == 0.0) CHECK(s.true_positive == 0);
  }
}
