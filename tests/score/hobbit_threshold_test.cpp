#include <catch2/catch.hpp>

#include <array>
#include <vector>

#include "moekit/score/hobbit_threshold.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::Route;

namespace {
using D = HobbitDecision;

std::vector<D> decide(const HobbitRule& r, std::vector<std::uint32_t> ids, std::vector<float> w) {
  std::vector<D> out(ids.size());
  r.decide(ids, w, out);
  return out;
}
std::vector<Precision> score(HobbitThresholdScorer& s, const Route& route) {
  // demands in first-seen order, as the pipeline builds them
  std::vector<ExpertDemand> d;
  for (auto e : route.experts) {
    bool seen = false;
    for (auto& x : d) seen |= x.expert == e;
    if (!seen) d.push_back(ExpertDemand{e, 1, 0, 0, 0});
  }
  std::vector<Precision> out(d.size());
  s.score(ctx(0, 1, 0, route.n_tokens > 1 ? Phase::prefill : Phase::decode, route.n_tokens),
          route.view(), d, out);
  return out;
}
}  // namespace

TEST_CASE("HOBBIT rule: the spec's worked examples (§7 1-8)", "[score][hobbit]") {
  const HobbitRule r{};
  // 1. [0.7, 0.3]: rank 1 score 0.7 in (0.6, 0.9] -> low
  CHECK(decide(r, {0, 1}, {0.7f, 0.3f}) == std::vector<D>{D::high, D::low});
  // 2. [0.55, 0.45]: 0.55 <= 0.6 -> high
  CHECK(decide(r, {0, 1}, {0.55f, 0.45f}) == std::vector<D>{D::high, D::high});
  // 3. [0.95, 0.05]: 0.95 > 0.9 -> skip
  CHECK(decide(r, {0, 1}, {0.95f, 0.05f}) == std::vector<D>{D::high, D::skip});
  // 4. boundaries are inclusive
  CHECK(decide(HobbitRule{0.75f, 0.9f}, {0, 1}, {0.75f, 0.25f}) ==
        std::vector<D>{D::high, D::high});
  CHECK(decide(HobbitRule{0.5f, 0.75f}, {0, 1}, {0.75f, 0.25f}) == std::vector<D>{D::high, D::low});
  // 5. top-1 always high
  CHECK(decide(HobbitRule{0.0f, 0.0f}, {0, 1}, {0.5f, 0.5f}) == std::vector<D>{D::high, D::skip});
  // 6. normalisation and input order do not matter
  CHECK(decide(r, {0, 1}, {1.4f, 0.6f}) == decide(r, {0, 1}, {0.7f, 0.3f}));
  CHECK(decide(r, {3, 5}, {0.3f, 0.7f}) == std::vector<D>{D::low, D::high});
  // 7. K = 4 uniform: scores 0, .25, .5, .75
  CHECK(decide(r, {0, 1, 2, 3}, {0.25f, 0.25f, 0.25f, 0.25f}) ==
        std::vector<D>{D::high, D::high, D::high, D::low});
  // 8. T1 = 1: all high; T2 = 1: nothing skipped
  CHECK(decide(HobbitRule{1.0f, 1.0f}, {0, 1}, {0.99f, 0.01f}) == std::vector<D>{D::high, D::high});
  CHECK(decide(HobbitRule{0.0f, 1.0f}, {0, 1}, {0.99f, 0.01f}) == std::vector<D>{D::high, D::low});
  // ties: smaller id ranks first
  CHECK(decide(HobbitRule{0.0f, 0.0f}, {5, 2}, {0.5f, 0.5f}) == std::vector<D>{D::skip, D::high});
  // degenerate weights fall back to uniform
  CHECK(decide(r, {0, 1}, {0.0f, 0.0f}) == std::vector<D>{D::high, D::high});
}

TEST_CASE("HOBBIT rule: scores never decrease with rank (random property)", "[score][hobbit]") {
  const HobbitRule r{};
  std::uint32_t seed = 12345;
  INFO("seed " << seed);
  auto rnd = [&] { return (seed = seed * 1664525u + 1013904223u) >> 8; };
  for (int it = 0; it < 500; ++it) {
    const std::size_t k = 1 + rnd() % 6;
    std::vector<std::uint32_t> ids(k);
    std::vector<float> w(k);
    for (std::size_t i = 0; i < k; ++i) {
      ids[i] = static_cast<std::uint32_t>(i * 3 + rnd() % 3);
      w[i] = float(1 + rnd() % 1000);
    }
    const auto d = decide(r, ids, w);
    // sort by weight desc, id asc: decisions are non-increasing
    std::vector<std::size_t> o(k);
    for (std::size_t i = 0; i < k; ++i) o[i] = i;
    std::sort(o.begin(), o.end(),
              [&](auto a, auto b) { return w[a] != w[b] ? w[a] > w[b] : ids[a] < ids[b]; });
    CHECK(d[o[0]] == D::high);
    for (std::size_t i = 1; i < k; ++i) CHECK(d[o[i]] <= d[o[i - 1]]);
  }
}

TEST_CASE("HobbitThresholdScorer maps decisions to precisions, max over tokens",
          "[score][hobbit]") {
  HobbitThresholdScorer s;
  CHECK(score(s, Route(8, {{4, 6}}, {{0.7f, 0.3f}})) ==
        std::vector<Precision>{Precision::f16, Precision::q4});
  CHECK(score(s, Route(8, {{4, 6}}, {{0.95f, 0.05f}})) ==
        std::vector<Precision>{Precision::f16, Precision::skip});
  // prefill: expert 6 is skip for token 0 but top-1 (high) for tokens 1 and 2 -> high;
  // expert 1 is low for token 1 only -> low; expert 2 scores 0.55 <= T1 -> high
  const Route pre(8, {{4, 6}, {6, 1}, {6, 2}}, {{0.95f, 0.05f}, {0.7f, 0.3f}, {0.55f, 0.45f}});
  CHECK(score(s, pre) ==
        std::vector<Precision>{Precision::f16, Precision::f16, Precision::q4, Precision::f16});
  // q8 model: q8 / q2
  HobbitThresholdScorer q8({HobbitRule::for_q8_model()});
  CHECK(score(q8, Route(8, {{4, 6}}, {{0.7f, 0.3f}})) ==
        std::vector<Precision>{Precision::q8, Precision::q2});
  CHECK_THROWS_AS(HobbitThresholdScorer({HobbitRule{0.9f, 0.6f}}), Error);
  CHECK_THROWS_AS(HobbitThresholdScorer({HobbitRule{0.6f, 0.9f, Precision::q4, Precision::f16}}),
                  Error);
}
