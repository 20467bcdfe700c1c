// The oracle's script from a trace, checked against sim::demand_sequence, and replayed through
// sim::replay: the upper bound of prediction is exactly precision = recall = 1.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "moekit/cache/lru.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/uniform.hpp"
#include "moekit/sim/replay.hpp"
#include "moekit/sim/sim_loader.hpp"
#include "moekit/tools/oracle_script.hpp"

using namespace moekit;
using sim::RoutingTrace;

namespace {
RoutingTrace random_trace(std::uint32_t seed) {
  const sim::TraceDims d{.n_layers = 4, .n_experts = 8, .top_k = 2};
  RoutingTrace t(d, "random");
  std::mt19937 g(seed);
  const float w[2] = {0.625f, 0.375f};
  for (int s = 0; s < 2; ++s) {
    t.begin_sequence("s" + std::to_string(s));
    for (int i = 0; i < 12; ++i) {
      const std::size_t tok = t.append_token(i < 5 ? Phase::prefill : Phase::decode);
      for (std::uint32_t l = 0; l < d.n_layers; ++l) {
        if (s == 1 && i == 7 && l == 1) continue;  // a decode token without layer 1: unrouted
        const std::uint32_t a = g() % 8;
        std::uint32_t b = g() % 7;
        if (b >= a) ++b;
        const std::uint32_t ids[2] = {a, b};
        t.set_route(tok, l, ids, w);
      }
    }
  }
  return t;
}
}  // namespace

TEST_CASE("Oracle script of a trace matches the replay's demand sequence, and predicts it exactly",
          "[predict][oracle][sim]") {
  const std::uint32_t seed = 5150;
  INFO("seed " << seed);
  const RoutingTrace tr = random_trace(seed);
  const auto calls = tools::oracle_calls(tr);
  const auto demand = sim::demand_sequence(tr);
  REQUIRE(calls.size() == demand.call_end.size());
  std::size_t begin = 0;
  for (std::size_t c = 0; c < calls.size(); ++c) {
    std::vector<std::uint32_t> want;
    for (std::size_t i = begin; i < demand.call_end[c]; ++i) {
      CHECK(demand.keys[i].layer == calls[c].layer);
      want.push_back(demand.keys[i].expert);
    }
    std::sort(want.begin(), want.end());
    CHECK(calls[c].experts == want);
    begin = demand.call_end[c];
  }

  const ModelShape s{.n_layers = 4, .n_experts = 8, .top_k = 2, .hidden = 32, .ffn = 32};
  OffloadPipeline<UniformScorer, OraclePredictor, LruPolicy, sim::SimLoader, OnDemandScheduler> p(
      s, {.expert_budget_bytes = 12 * s.expert_bytes(Precision::f16)},
      sim::SimLoader(s, sim::LinkModel{}), UniformScorer{},
      OraclePredictor({.calls = calls, .distance = 2}));
  (void)sim::replay(p, tr, sim::ComputeModel{});
  const auto st = p.stats();
  CHECK(st.prediction[1].precision() == 1.0);
  CHECK(st.prediction[2].precision() == 1.0);
  // the token without layer 1: its layer 2 is predicted only two layers ahead (from layer 0),
  // its layer 3 only one layer ahead (from layer 2); everything else at both distances
  CHECK(st.prediction[1].false_negative == 2);
  CHECK(st.prediction[2].false_negative == 2);
  CHECK(st.prediction[1].true_positive > 0);
  CHECK(p.predictor().position() == calls.size());
}
