// LookaheadOraclePredictor (the oracle stand-in moe-run runs under --routing-trace): it predicts
// what its RoutingLookahead says at each distance with the recall of that distance, the precision
// of the run's scorer, set padding and the decode cap; it is the same model as moe-sim's
// NoisyOraclePredictor (same predictions for the same calls and seed), and with a recall per rank
// the same as moe-sim's RankedNoisyOraclePredictor (hobbit-oracle: precisions from the predicted
// gate weights); it refuses a missing source.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "moekit/predict/lookahead_oracle.hpp"
#include "moekit/predict/noisy_oracle.hpp"
#include "moekit/predict/ranked_noisy_oracle.hpp"
#include "moekit/presets/hobbit_oracle.hpp"
#include "moekit/score/hobbit_threshold.hpp"
#include "moekit/score/uniform.hpp"
#include "predict_test_support.hpp"

using namespace moekit;

namespace lookahead_oracle_test {
constexpr std::uint32_t L = 4, E = 8;

// Forwards of one decode token over L layers, two random distinct experts per layer, weights
// 0.7 / 0.3.
struct ScriptSource final : RoutingLookahead {
  std::vector<OracleCall> calls;  // forward f, layer l is calls[f * L + l]
  std::size_t forward = 0;        // set by the driver
  std::vector<std::uint32_t> ids;
  std::vector<float> w;

  explicit ScriptSource(std::uint32_t seed, std::size_t forwards = 150) {
    std::mt19937 g(seed);
    for (std::size_t i = 0; i < forwards * L; ++i) {
      const std::uint32_t a = g() % E;
      std::uint32_t b = g() % (E - 1);
      if (b >= a) ++b;
      calls.push_back({static_cast<std::uint32_t>(i % L), {a, b}});
    }
  }
  std::optional<GateView> routing_at(std::uint32_t layer) override {
    const OracleCall& c = calls[forward * L + layer];
    ids = c.experts;
    w = {0.7f, 0.3f};
    return GateView{.n_tokens = 1, .k = 2, .n_experts = E, .experts = ids, .weights = w};
  }
};

// Drives `p` over every call of `src` (observe, then predict) and returns each call's prefetches.
template <class P>
std::vector<std::vector<Prefetch>> drive(P& p, ScriptSource& src, bool set_forward = true) {
  std::vector<std::vector<Prefetch>> out;
  test::ResidentSet none;
  for (std::size_t i = 0; i < src.calls.size(); ++i) {
    if (set_forward) src.forward = i / L;
    const std::uint32_t l = src.calls[i].layer;
    const LayerContext ctx{l, L, 0, Phase::decode, 0, 1};
    std::vector<std::uint32_t> ids = src.calls[i].experts;
    std::vector<float> w{0.7f, 0.3f};
    const GateView gate{.n_tokens = 1, .k = 2, .n_experts = E, .experts = ids, .weights = w};
    test::OwnedList list;
    p.observe(ctx, gate);
    p.predict(ctx, gate, none.view(), list.list);
    out.push_back(list.items());
  }
  return out;
}

std::shared_ptr<ScriptSource> source(std::uint32_t seed) {
  return std::make_shared<ScriptSource>(seed);
}

using Oracle = LookaheadOraclePredictor<UniformScorer>;
Oracle::Config config(std::vector<double> recall, std::uint32_t distance) {
  return {.recall_by_distance = std::move(recall),
          .seed = 7,
          .distance = distance,
          .n_layers = L,
          .n_experts = E};
}
}  // namespace lookahead_oracle_test

TEST_CASE("lookahead oracle: recall 1 predicts the source, recall 0 never does, per distance",
          "[predict][lookahead-oracle]") {
  using namespace lookahead_oracle_test;  // function scope: the unity build shares the file
  auto src = source(1);
  Oracle p(config({1.0, 0.0}, 2), src, UniformScorer({Precision::q4}));
  const auto got = drive(p, *src);
  std::size_t right = 0, wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    for (const Prefetch& f : got[i]) {
      const std::size_t target = (i / L) * L + f.key.layer;
      REQUIRE(f.key.layer > src->calls[i].layer);
      REQUIRE(f.key.layer - src->calls[i].layer == f.distance);
      CHECK(f.precision == Precision::q4);  // the scorer's precision
      const auto& truth = src->calls[target].experts;
      const bool hit = std::find(truth.begin(), truth.end(), f.key.expert) != truth.end();
      if (f.distance == 1) CHECK(hit);
      if (f.distance == 2) CHECK_FALSE(hit);
      (hit ? right : wrong)++;
    }
    // Nothing beyond the last layer, two experts per predicted layer.
    const std::uint32_t l = src->calls[i].layer;
    CHECK(got[i].size() == 2 * std::min<std::uint32_t>(2, L - 1 - l));
  }
  CHECK(right > 0);
  CHECK(wrong > 0);
}

TEST_CASE("lookahead oracle: the same model as moe-sim's NoisyOraclePredictor",
          "[predict][lookahead-oracle]") {
  using namespace lookahead_oracle_test;  // function scope: the unity build shares the file
  auto src = source(2);
  for (const std::vector<double>& recall : {std::vector<double>{0.6}, {0.9, 0.5, 0.3}}) {
    Oracle a(config(recall, 3), src, UniformScorer({Precision::f16}));
    NoisyOraclePredictor b({.calls = src->calls,
                            .recall_by_distance = recall,
                            .seed = 7,
                            .distance = 3,
                            .n_experts = E,
                            .precision = Precision::f16});
    const auto pa = drive(a, *src), pb = drive(b, *src);
    REQUIRE(pa.size() == pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      REQUIRE(pa[i].size() == pb[i].size());
      for (std::size_t j = 0; j < pa[i].size(); ++j) {
        CHECK(pa[i][j].key == pb[i][j].key);
        CHECK(pa[i][j].precision == pb[i][j].precision);
        CHECK(pa[i][j].distance == pb[i][j].distance);
      }
    }
  }
}

TEST_CASE("lookahead oracle: realised recall matches the configured one",
          "[predict][lookahead-oracle]") {
  using namespace lookahead_oracle_test;  // function scope: the unity build shares the file
  auto src = std::make_shared<ScriptSource>(3, 2000);
  Oracle p(config({0.8}, 1), src, UniformScorer{});
  const auto got = drive(p, *src);
  std::size_t hits = 0, truths = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (src->calls[i].layer + 1 >= L) continue;
    const auto& truth = src->calls[i + 1].experts;
    truths += truth.size();
    for (const Prefetch& f : got[i])
      hits += std::find(truth.begin(), truth.end(), f.key.expert) != truth.end();
  }
  // 12 000 Bernoulli(0.8) draws: 5 sigma is 0.018.
  CHECK(double(hits) / double(truths) == Approx(0.8).margin(0.02));
}

TEST_CASE("lookahead oracle: precisions from the scorer, padding, decode cap",
          "[predict][lookahead-oracle]") {
  using namespace lookahead_oracle_test;  // function scope: the unity build shares the file
  auto src = source(4);
  // HOBBIT's rule on weights 0.7 / 0.3 with t1 = 0.6, t2 = 0.9: top-1 high, top-2 low.
  using Hobbit = LookaheadOraclePredictor<HobbitThresholdScorer>;
  const HobbitRule rule{.t1 = 0.6f, .t2 = 0.9f, .high = Precision::q8, .low = Precision::q2};
  Hobbit h({.recall_by_distance = {1.0}, .distance = 1, .n_layers = L, .n_experts = E}, src,
           HobbitThresholdScorer({rule}));
  const auto got = drive(h, *src);
  for (std::size_t i = 0; i + 1 < got.size(); ++i) {
    if (src->calls[i].layer + 1 >= L) continue;
    REQUIRE(got[i].size() == 2);
    std::set<Precision> ps{got[i][0].precision, got[i][1].precision};
    CHECK(ps == std::set<Precision>{Precision::q8, Precision::q2});
  }
  Oracle padded(
      {.recall_by_distance = {1.0}, .distance = 1, .set_size = 5, .n_layers = L, .n_experts = E},
      src, UniformScorer{});
  for (const auto& v : drive(padded, *src)) CHECK((v.empty() || v.size() == 5));
  Oracle capped({.recall_by_distance = {1.0},
                 .distance = 2,
                 .set_size = 5,
                 .n_layers = L,
                 .n_experts = E,
                 .max_nonresident = 3},
                src, UniformScorer{});
  for (const auto& v : drive(capped, *src)) {
    std::size_t per_layer[L] = {};
    for (const Prefetch& f : v) ++per_layer[f.key.layer];
    for (std::size_t n : per_layer) CHECK(n <= 3);
  }
}

TEST_CASE("lookahead oracle: an unknown routing predicts nothing; no source is refused",
          "[predict][lookahead-oracle]") {
  using namespace lookahead_oracle_test;  // function scope: the unity build shares the file
  struct Unknown final : RoutingLookahead {
    std::optional<GateView> routing_at(std::uint32_t) override { return std::nullopt; }
  };
  auto src = source(5);
  Oracle p(config({1.0}, 3), std::make_shared<Unknown>(), UniformScorer{});
  for (const auto& v : drive(p, *src)) CHECK(v.empty());
  CHECK_THROWS_WITH(Oracle(config({1.0}, 1), nullptr, UniformScorer{}),
                    Catch::Contains("RoutingLookahead"));
  CHECK_THROWS_WITH(Oracle(config({1.5}, 1), src, UniformScorer{}), Catch::Contains("[0, 1]"));
  CHECK_THROWS_WITH(Oracle(config({}, 1), src, UniformScorer{}), Catch::Contains("empty"));
  CHECK_THROWS_WITH(Oracle(config({1.0}, 4), src, UniformScorer{}), Catch::Contains("distance"));
}

namespace lookahead_oracle_test {
// Forwards over L layers of 1 to 3 tokens (prefill-like forwards too), each token two distinct
// random experts with random weights (descending): the calls as moe-sim's script holds them.
struct RankedSource final : RoutingLookahead {
  std::vector<RoutedCall> calls;  // forward f, layer l is calls[f * L + l]
  std::size_t forward = 0;

  explicit RankedSource(std::uint32_t seed, std::size_t forwards = 200) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(0.5f, 1.0f);
    for (std::size_t f = 0; f < forwards; ++f) {
      const std::uint32_t n = 1 + g() % 3;
      for (std::uint32_t l = 0; l < L; ++l) {
        RoutedCall c{l, n, 2, {}, {}};
        for (std::uint32_t t = 0; t < n; ++t) {
          const std::uint32_t a = g() % E;
          std::uint32_t b = g() % (E - 1);
          b += b >= a;
          const float w = u(g);
          c.experts.insert(c.experts.end(), {a, b});
          c.weights.insert(c.weights.end(), {w, 1.0f - w});
        }
        calls.push_back(std::move(c));
      }
    }
  }
  [[nodiscard]] GateView view(std::size_t i) const {
    const RoutedCall& c = calls[i];
    return {.n_tokens = c.n_tokens,
            .k = c.k,
            .n_experts = E,
            .experts = c.experts,
            .weights = c.weights};
  }
  std::optional<GateView> routing_at(std::uint32_t layer) override {
    return view(forward * L + layer);
  }
};

// Drives `p` over every call of `src` (observe, then predict); each call's prefetches.
template <class P>
std::vector<std::vector<Prefetch>> drive_ranked(P& p, RankedSource& src) {
  std::vector<std::vector<Prefetch>> out;
  test::ResidentSet none;
  for (std::size_t i = 0; i < src.calls.size(); ++i) {
    src.forward = i / L;
    const RoutedCall& c = src.calls[i];
    const LayerContext ctx{c.layer, L,         0, c.n_tokens > 1 ? Phase::prefill : Phase::decode,
                           0,       c.n_tokens};
    test::OwnedList list;
    p.observe(ctx, src.view(i));
    p.predict(ctx, src.view(i), none.view(), list.list);
    out.push_back(list.items());
  }
  return out;
}
}  // namespace lookahead_oracle_test

TEST_CASE("lookahead oracle per rank: the same model as moe-sim's RankedNoisyOraclePredictor",
          "[predict][lookahead-oracle][hobbit]") {
  using namespace lookahead_oracle_test;  // function scope: the unity build shares the file
  auto src = std::make_shared<RankedSource>(8);
  const HobbitRule rule{.t1 = 0.6f, .t2 = 0.9f, .high = Precision::q8, .low = Precision::q2};
  for (const RecallByRank& recall : {RecallByRank{{0.7}}, RecallByRank{{0.9, 0.6, 0.5}, {0.4}}}) {
    LookaheadOraclePredictor<HobbitThresholdScorer> a(
        {.recall_by_rank = recall, .seed = 11, .distance = 3, .n_layers = L, .n_experts = E}, src,
        HobbitThresholdScorer({rule}));
    RankedNoisyOraclePredictor<HobbitThresholdScorer> b(
        {.calls = src->calls, .recall_by_rank = recall, .seed = 11, .distance = 3, .n_experts = E},
        HobbitThresholdScorer({rule}));
    const auto pa = drive_ranked(a, *src), pb = drive_ranked(b, *src);
    REQUIRE(pa.size() == pb.size());
    std::size_t n = 0, wrong = 0, low = 0;
    for (std::size_t i = 0; i < pa.size(); ++i) {
      REQUIRE(pa[i].size() == pb[i].size());
      for (std::size_t j = 0; j < pa[i].size(); ++j) {
        CHECK(pa[i][j].key == pb[i][j].key);
        CHECK(pa[i][j].precision == pb[i][j].precision);
        CHECK(pa[i][j].distance == pb[i][j].distance);
        CHECK(pa[i][j].confidence == pb[i][j].confidence);
        const auto& truth = src->calls[(i / L) * L + pa[i][j].key.layer].experts;
        wrong += std::find(truth.begin(), truth.end(), pa[i][j].key.expert) == truth.end();
        low += pa[i][j].precision == Precision::q2;
        ++n;
      }
    }
    CHECK(n > 1000);  // the comparison covers wrong guesses and both precisions
    CHECK(wrong > 0);
    CHECK(low > 0);
  }
}

TEST_CASE("hobbit-oracle: each rank at its own recall, precisions from the predicted gate",
          "[predict][lookahead-oracle][hobbit]") {
  using namespace lookahead_oracle_test;  // function scope: the unity build shares the file
  // One decode token per forward, weights 0.8 / 0.2 (T1 = 0.6: the top-1 high, rank 2 low).
  // --hobbit-recall 0/1: the gate always misses the actual top-1 and keeps rank 2, which it
  // ranks first: prefetched high although its actual demand asks low (the true demand's
  // precision, the model before, would have asked low); the wrong guess ranks second: low.
  auto src = std::make_shared<RankedSource>(9);
  for (RoutedCall& c : src->calls) {
    c.experts.resize(2), c.weights = {0.8f, 0.2f};
    c.n_tokens = 1;
  }
  presets::PresetParams q;
  q.hobbit_recall = "0/1";
  const auto c = presets::HobbitOracleSpec::configure(
      {.n_layers = L, .n_experts = E, .top_k = 2, .hidden = 4, .ffn = 8}, Precision::f16, q);
  auto p = presets::HobbitOracleSpec::predictor(
      {.n_layers = L, .n_experts = E, .top_k = 2, .hidden = 4, .ffn = 8}, c, {.lookahead = src});
  const auto got = drive_ranked(p, *src);
  std::size_t checked = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    for (const Prefetch& f : got[i]) {
      const auto& truth = src->calls[(i / L) * L + f.key.layer].experts;
      CHECK(f.key.expert != truth[0]);  // the actual top-1: never predicted
      if (f.key.expert == truth[1]) CHECK(f.precision == Precision::f16);
      if (f.key.expert != truth[1]) CHECK(f.precision == q.low);
      ++checked;
    }
  CHECK(checked > 100);
}
