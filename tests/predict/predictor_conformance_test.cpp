// One typed conformance suite run against every Predictor of moekit (like the cache policies'
// property suite): on the same routing stream each predictor is driven directly and inside an
// OffloadPipeline. Adding a predictor to AllPredictors (with a PredictorSetup when it needs
// construction data) enrols it.

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "moekit/cache/lru.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/activation_path.hpp"
#include "moekit/predict/cross_layer_gate.hpp"
#include "moekit/predict/noisy_oracle.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/predict/oracle.hpp"
#include "moekit/predict/router_replay.hpp"
#include "moekit/predict/stacked_gate.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/uniform.hpp"
#include "predict/predict_test_support.hpp"
#include "support/conformance_stream.hpp"
#include "support/manual_loader.hpp"
#include "support/named_component.hpp"

using namespace moekit;

namespace {

using AllPredictors =
    std::tuple<NoPredictor, StackedGatePredictor, CrossLayerGatePredictor, ActivationPathPredictor,
               RouterReplayPredictor, OraclePredictor, NoisyOraclePredictor>;

constexpr ModelShape predictor_shape{
    .n_layers = 4, .n_experts = 8, .top_k = 2, .hidden = 64, .ffn = 128};

/// The stream's layer calls as an oracle's script.
std::vector<OracleCall> script_of(const test::ConformanceStream& s) {
  std::vector<OracleCall> calls;
  for (const test::StreamCall& c : s.calls) calls.push_back({c.ctx.layer, c.distinct_experts()});
  return calls;
}

/// How the suite constructs predictor `P` for a stream (default: default-constructed).
template <class P>
struct PredictorSetup {
  static P make(const test::ConformanceStream&) { return P{}; }
};
template <>
struct PredictorSetup<StackedGatePredictor> {
  static StackedGatePredictor make(const test::ConformanceStream& s) {
    return StackedGatePredictor({.router_weights = s.routers,
                                 .n_layers = s.shape.n_layers,
                                 .n_experts = s.shape.n_experts,
                                 .hidden = s.gate_hidden,
                                 .top_k = s.shape.top_k,
                                 .lookahead = 2});
  }
};
template <>
struct PredictorSetup<CrossLayerGatePredictor> {
  static CrossLayerGatePredictor make(const test::ConformanceStream& s) {
    return CrossLayerGatePredictor({.router_weights = s.routers,
                                    .n_layers = s.shape.n_layers,
                                    .n_experts = s.shape.n_experts,
                                    .hidden = s.gate_hidden,
                                    .top_k = s.shape.top_k});
  }
};
template <>
struct PredictorSetup<ActivationPathPredictor> {
  // The profile: every decode token's path through the layers of the stream itself.
  static ActivationPathPredictor make(const test::ConformanceStream& s) {
    auto profile =
        std::make_shared<ActivationPathProfile>(s.shape.n_layers, s.shape.n_experts, s.shape.top_k);
    std::vector<std::vector<std::uint32_t>> sets(s.shape.n_layers);
    for (const test::StreamCall& c : s.calls) {
      if (c.ctx.phase != Phase::decode) continue;
      sets[c.ctx.layer] = c.experts;
      if (!c.ctx.is_last_layer()) continue;
      std::vector<std::span<const std::uint32_t>> spans(sets.begin(), sets.end());
      profile->add_path(spans);
    }
    return ActivationPathPredictor({.profile = profile, .min_support = 1});
  }
};
template <>
struct PredictorSetup<RouterReplayPredictor> {
  static RouterReplayPredictor make(const test::ConformanceStream& s) {
    return RouterReplayPredictor({.top_k = s.shape.top_k});
  }
};
template <>
struct PredictorSetup<OraclePredictor> {
  static OraclePredictor make(const test::ConformanceStream& s) {
    return OraclePredictor({.calls = script_of(s), .distance = 2});
  }
};
template <>
struct PredictorSetup<NoisyOraclePredictor> {
  static NoisyOraclePredictor make(const test::ConformanceStream& s) {
    return NoisyOraclePredictor({.calls = script_of(s),
                                 .recall = 0.5,
                                 .seed = 3,
                                 .distance = 2,
                                 .set_size = 3,
                                 .n_experts = s.shape.n_experts});
  }
};

/// Every prediction of a direct run, in order: (call, prefetch).
struct Predicted {
  std::size_t call;
  Prefetch p;
  friend bool operator==(const Predicted& a, const Predicted& b) {
    return a.call == b.call && a.p.key == b.p.key && a.p.precision == b.p.precision &&
           a.p.confidence == b.p.confidence && a.p.distance == b.p.distance;
  }
};

/// Drives `p` over the stream as the pipeline does (observe, then predict; a fallback verdict
/// after every decode token for predictors that declare `on_verdict`); experts demanded so far
/// count as resident. `verdicts` receives the on_verdict prefetches.
template <class P>
std::vector<Predicted> run_direct(P& p, const test::ConformanceStream& s,
                                  std::vector<Prefetch>* verdicts = nullptr) {
  std::vector<Predicted> out;
  test::ResidentSet resident;
  test::OwnedList list;
  for (std::size_t i = 0; i < s.calls.size(); ++i) {
    const test::StreamCall& c = s.calls[i];
    if (c.ctx.layer == 0 && c.ctx.token_index == 0) {
      if constexpr (declares<P>(Hook::begin_sequence)) p.begin_sequence();
    }
    const GateView gate = c.gate();
    p.observe(c.ctx, gate);
    list.list.clear();
    p.predict(c.ctx, gate, resident.view(), list.list);
    for (const Prefetch& f : list.items()) out.push_back({i, f});
    for (std::uint32_t e : c.experts) resident.keys.insert({c.ctx.layer, e});
    if constexpr (declares<P>(Hook::on_verdict)) {
      if (c.ctx.is_last_layer() && c.ctx.phase == Phase::decode) {
        list.list.clear();
        p.on_verdict(TokenVerdict::fallback, list.list);
        if (verdicts)
          for (const Prefetch& f : list.items()) verdicts->push_back(f);
      }
    }
  }
  return out;
}

template <class P>
using ConformancePipeline =
    OffloadPipeline<UniformScorer, P, LruPolicy, test::ManualLoader, OnDemandScheduler>;

/// Runs the stream through an OffloadPipeline with `P` as its predictor.
template <class P>
PipelineStats run_pipeline(const test::ConformanceStream& s) {
  const std::size_t budget = 6 * s.shape.expert_bytes(Precision::f16);
  ConformancePipeline<P> pipe(s.shape, {.expert_budget_bytes = budget}, test::ManualLoader(true),
                              UniformScorer{}, PredictorSetup<P>::make(s));
  std::uint64_t seq = ~std::uint64_t{0};
  for (const test::StreamCall& c : s.calls) {
    if (c.ctx.sequence_id != seq) {
      seq = c.ctx.sequence_id;
      pipe.begin_sequence();
    }
    const LayerPlan& plan = pipe.route(c.ctx, c.gate());
    (void)pipe.resolve(plan);
    pipe.end_layer(c.ctx);
    if (c.ctx.is_last_layer()) (void)pipe.end_token({});
  }
  return pipe.stats();
}

}  // namespace

TEST_CASE("every predictor says its own name, each a different one", "[predict][conformance]") {
  const auto names = test::names_of<AllPredictors>();
  CAPTURE(names);
  CHECK(test::names_distinct(names));
}

TEMPLATE_LIST_TEST_CASE("predictors push only experts of later layers inside the model",
                        "[predict][conformance]", AllPredictors) {
  const std::uint32_t seed = GENERATE(1u, 2u, 3u);
  CAPTURE(TestType::name, seed);
  const auto s = test::conformance_stream(predictor_shape, seed);
  TestType p = PredictorSetup<TestType>::make(s);
  std::vector<Prefetch> verdicts;
  std::vector<Predicted> out;
  REQUIRE_NOTHROW(out = run_direct(p, s, &verdicts));
  for (const Predicted& x : out) {
    const LayerContext& ctx = s.calls[x.call].ctx;
    CAPTURE(x.call, ctx.layer, x.p.key.layer, x.p.key.expert, x.p.distance);
    REQUIRE(predictor_shape.contains(x.p.key));
    REQUIRE(x.p.key.layer > ctx.layer);
    // Ahead by the distance the prefetch says, within what the pipeline admits.
    REQUIRE(x.p.distance == x.p.key.layer - ctx.layer);
    REQUIRE(x.p.distance <= PipelineConfig{}.max_prefetch_distance);
    REQUIRE(x.p.precision != Precision::skip);
    REQUIRE((x.p.confidence >= 0.0f && x.p.confidence <= 1.0f));
  }
  for (const Prefetch& f : verdicts) {  // a fallback's prefetches: any layer of the model
    REQUIRE(predictor_shape.contains(f.key));
    REQUIRE(f.precision != Precision::skip);
  }
}

TEMPLATE_LIST_TEST_CASE("predictors are deterministic: the same stream, the same predictions",
                        "[predict][conformance]", AllPredictors) {
  const std::uint32_t seed = GENERATE(4u, 5u);
  CAPTURE(TestType::name, seed);
  const auto s = test::conformance_stream(predictor_shape, seed);
  TestType a = PredictorSetup<TestType>::make(s);
  TestType b = PredictorSetup<TestType>::make(s);
  std::vector<Prefetch> va, vb;
  const auto pa = run_direct(a, s, &va);
  const auto pb = run_direct(b, s, &vb);
  CHECK(pa == pb);
  REQUIRE(va.size() == vb.size());
  for (std::size_t i = 0; i < va.size(); ++i) CHECK(va[i].key == vb[i].key);
}

TEMPLATE_LIST_TEST_CASE("predictors run inside an OffloadPipeline, repeatably",
                        "[predict][conformance]", AllPredictors) {
  const std::uint32_t seed = GENERATE(6u, 7u);
  CAPTURE(TestType::name, seed);
  const auto s = test::conformance_stream(predictor_shape, seed);
  PipelineStats a, b;
  REQUIRE_NOTHROW(a = run_pipeline<TestType>(s));
  REQUIRE_NOTHROW(b = run_pipeline<TestType>(s));
  CHECK(a.hits + a.misses + a.skipped == a.demands);
  CHECK(a.hits == b.hits);
  CHECK(a.misses == b.misses);
  CHECK(a.prefetches_issued == b.prefetches_issued);
  CHECK(a.bytes_loaded() == b.bytes_loaded());
  for (std::uint32_t d = 1; d <= 3; ++d) {
    CAPTURE(d);
    CHECK(a.prediction[d].true_positive == b.prediction[d].true_positive);
    CHECK(a.prediction[d].false_positive == b.prediction[d].false_positive);
  }
}
