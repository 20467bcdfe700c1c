// sim/route_logits.hpp: router logits made from a record's top-k, for traces that store none
// (MoBiLE's plan on the shared Mixtral traces, in moe-sim and moe-run's mobile-oracle).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "moekit/sim/route_logits.hpp"
#include "moekit/sim/trace.hpp"

using moekit::Phase;
using moekit::sim::RoutingTrace;
using moekit::sim::TraceDims;

namespace {
// Expert ids by descending logit, ties to the lower id (the router's order).
std::vector<std::uint32_t> by_logit(const std::vector<float>& l) {
  std::vector<std::uint32_t> o(l.size());
  std::iota(o.begin(), o.end(), 0u);
  std::stable_sort(o.begin(), o.end(), [&](auto a, auto b) { return l[a] > l[b]; });
  return o;
}
}  // namespace

TEST_CASE("route_logits: the record's experts on top in its order, its weights back by softmax",
          "[sim][mobile]") {
  const std::vector<std::uint32_t> experts{5, 1, 6};
  const std::vector<float> weights{0.5f, 0.3f, 0.2f};
  std::vector<float> logits(8);
  moekit::sim::route_logits(experts, weights, logits);
  const auto order = by_logit(logits);
  CHECK(std::vector<std::uint32_t>(order.begin(), order.begin() + 3) == experts);
  CHECK(std::vector<std::uint32_t>(order.begin() + 3, order.end()) ==
        std::vector<std::uint32_t>{0, 2, 3, 4, 7});  // the others by id
  double sum = 0;
  for (std::uint32_t e : experts) sum += std::exp(double(logits[e]));
  for (std::size_t j = 0; j < experts.size(); ++j)
    CHECK(std::exp(double(logits[experts[j]])) / sum == Approx(weights[j]).epsilon(1e-6));
  // Each unselected expert holds at most e^-gap of the smallest selected one's mass.
  CHECK(logits[0] <= logits[6] - moekit::sim::unselected_logit_gap);
  std::vector<float> short_out(2);
  CHECK_THROWS_WITH(moekit::sim::route_logits(experts, weights, short_out),
                    Catch::Contains("exceed n_experts"));
}

TEST_CASE("with_route_logits: the same trace with logits; missing records stay missing",
          "[sim][mobile]") {
  RoutingTrace t(TraceDims{.n_layers = 2, .n_experts = 4, .top_k = 2}, "t");
  t.begin_sequence("a");
  t.append_token(Phase::prefill);
  t.append_token(Phase::decode);
  t.set_route(0, 0, std::vector<std::uint32_t>{2, 0}, std::vector<float>{0.6f, 0.4f});
  t.set_route(0, 1, std::vector<std::uint32_t>{1, 3}, std::vector<float>{0.5f, 0.5f});
  t.set_route(1, 0, std::vector<std::uint32_t>{3, 2}, std::vector<float>{0.9f, 0.1f});
  const RoutingTrace w = moekit::sim::with_route_logits(t);
  REQUIRE(w.has_logits());
  CHECK(w.token_count() == 2);
  CHECK(w.phase(0) == Phase::prefill);
  CHECK(w.phase(1) == Phase::decode);
  CHECK_FALSE(w.valid(1, 1));
  for (auto [tok, layer] : {std::pair{0, 0}, std::pair{0, 1}, std::pair{1, 0}}) {
    CHECK(std::ranges::equal(w.experts(tok, layer), t.experts(tok, layer)));
    CHECK(std::ranges::equal(w.weights(tok, layer), t.weights(tok, layer)));
    const auto l = w.logits(tok, layer);
    const auto order = by_logit({l.begin(), l.end()});
    CHECK(std::ranges::equal(std::vector<std::uint32_t>(order.begin(), order.begin() + 2),
                             t.experts(tok, layer)));
  }
  CHECK(moekit::sim::with_route_logits(w) == w);  // logits already there: unchanged
}
