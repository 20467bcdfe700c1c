// ScoreRankedCap: moe-sim's Fate stand-in spends the decode cap in the order of a score blind to
// the truth. The noisy oracle lists its true picks first, so its own cap lands on a true expert
// every time; ranked by the blind score, the one expert the cap admits is a true one about as
// often as a uniform pick among the layer's predictions.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "moekit/predict/noisy_oracle.hpp"
#include "moekit/predict/score_ranked_cap.hpp"
#include "predict_test_support.hpp"

using namespace moekit;

namespace {
constexpr std::uint32_t ranked_E = 8;

// 800 calls over 2 layers, one true expert each; each call predicts its next call's layer.
std::vector<OracleCall> ranked_one_expert_calls() {
  std::mt19937 g(4);
  std::vector<OracleCall> calls;
  for (std::uint32_t i = 0; i < 800; ++i)
    calls.push_back({i % 2, {static_cast<std::uint32_t>(g() % ranked_E)}});
  return calls;
}

// Share of layer-0 calls whose single capped prefetch (a prediction for layer 1) is true.
template <class P>
double ranked_true_share(P& p, const std::vector<OracleCall>& calls) {
  test::ResidentSet none;
  std::size_t hits = 0, n = 0;
  for (std::size_t i = 0; i + 1 < calls.size(); ++i) {
    const std::vector<float> w{1.0f};
    GateView g{.n_tokens = 1, .k = 1, .n_experts = ranked_E, .experts = calls[i].experts};
    g.weights = w;
    const LayerContext ctx{calls[i].layer, 2, i / 2, Phase::decode, 0, 1};
    p.observe(ctx, g);
    test::OwnedList out;
    p.predict(ctx, g, none.view(), out.list);
    if (calls[i].layer != 0) continue;
    const auto items = out.items();
    REQUIRE(items.size() == 1);  // the cap: one non-resident prediction
    ++n;
    hits += items[0].key.expert == calls[i + 1].experts[0];
  }
  return double(hits) / double(n);
}

NoisyOraclePredictor ranked_oracle(std::vector<OracleCall> calls, std::uint32_t cap) {
  // Recall 1, padded to 4 predictions per layer (1 true + 3 wrong).
  return NoisyOraclePredictor({.calls = std::move(calls),
                               .recall = 1.0,
                               .seed = 3,
                               .set_size = 4,
                               .n_experts = ranked_E,
                               .max_nonresident = cap,
                               .precision = Precision::q4});
}
}  // namespace

TEST_CASE("score-ranked cap: the decode cap does not favour the true experts",
          "[predict][fate][stand-in]") {
  const auto calls = ranked_one_expert_calls();
  auto bare = ranked_oracle(calls, 1);  // the oracle's own cap: list order, true first
  CHECK(ranked_true_share(bare, calls) == 1.0);
  ScoreRankedCap<NoisyOraclePredictor> ranked(
      ranked_oracle(calls, 1000), {.max_nonresident = 1, .seed = 3, .n_experts = ranked_E});
  const double share = ranked_true_share(ranked, calls);
  CHECK(share > 0.15);  // 1 of 4 predictions is true: 0.25 expected, 400 draws
  CHECK(share < 0.35);
}

TEST_CASE("score-ranked cap: resident predictions pass, prefill is not capped",
          "[predict][fate][stand-in]") {
  const std::vector<OracleCall> calls{{0, {1}}, {1, {2}}};
  ScoreRankedCap<NoisyOraclePredictor> p(ranked_oracle(calls, 1000),
                                         {.max_nonresident = 0, .seed = 1, .n_experts = ranked_E});
  test::ResidentSet resident;
  resident.keys.insert({1, 2});
  const std::vector<float> w{1.0f};
  GateView g{.n_tokens = 1, .k = 1, .n_experts = ranked_E, .experts = calls[0].experts};
  g.weights = w;
  p.observe(LayerContext{0, 2, 0, Phase::decode, 0, 1}, g);
  test::OwnedList out;
  p.predict(LayerContext{0, 2, 0, Phase::decode, 0, 1}, g, resident.view(), out.list);
  REQUIRE(out.items().size() == 1);  // cap 0: only the resident (true) one
  CHECK(out.items()[0].key == ExpertKey{1, 2});

  ScoreRankedCap<NoisyOraclePredictor> q(ranked_oracle(calls, 1000),
                                         {.max_nonresident = 0, .seed = 1, .n_experts = ranked_E});
  q.observe(LayerContext{0, 2, 0, Phase::prefill, 0, 1}, g);
  test::OwnedList all;
  q.predict(LayerContext{0, 2, 0, Phase::prefill, 0, 1}, g, test::ResidentSet{}.view(), all.list);
  CHECK(all.items().size() == 4);
}
