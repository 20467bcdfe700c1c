// One typed conformance suite run against every Scorer of moekit (like the cache policies'
// property suite): on the same routing stream each scorer is called directly and inside an
// OffloadPipeline. Adding a scorer to AllScorers (with a ScorerSetup when it needs construction
// data) enrols it.

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include "moekit/cache/lru.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/hobbit_threshold.hpp"
#include "moekit/score/popularity.hpp"
#include "moekit/score/static_bitwidth.hpp"
#include "moekit/score/uniform.hpp"
#include "support/conformance_stream.hpp"
#include "support/manual_loader.hpp"
#include "support/named_component.hpp"

using namespace moekit;

namespace {

using AllScorers =
    std::tuple<UniformScorer, HobbitThresholdScorer, StaticBitwidthScorer, PopularityScorer>;

constexpr ModelShape scorer_shape{
    .n_layers = 4, .n_experts = 8, .top_k = 2, .hidden = 64, .ffn = 128};

/// How the suite constructs scorer `S` (default: default-constructed).
template <class S>
struct ScorerSetup {
  static S make(const ModelShape&) { return S{}; }
};
template <>
struct ScorerSetup<StaticBitwidthScorer> {
  // A bit-width table of f16, q8 and q4 experts, fixed by a seed.
  static StaticBitwidthScorer make(const ModelShape& shape) {
    PrecisionTable table(shape.n_layers, shape.n_experts);
    std::mt19937 rng(11);
    const Precision choices[] = {Precision::f16, Precision::q8, Precision::q4};
    for (std::uint32_t l = 0; l < shape.n_layers; ++l)
      for (std::uint32_t e = 0; e < shape.n_experts; ++e) table.set({l, e}, choices[rng() % 3]);
    return StaticBitwidthScorer({.table = table});
  }
};

/// A value no Precision has: what `score` left unwritten still holds it.
const Precision unwritten = static_cast<Precision>(0xEE);

/// Scores every call of the stream directly; one vector of precisions per call.
template <class S>
std::vector<std::vector<Precision>> run_direct(S& scorer, const test::ConformanceStream& s) {
  std::vector<std::vector<Precision>> out;
  for (const test::StreamCall& c : s.calls) {
    if (c.ctx.layer == 0 && c.ctx.token_index == 0) {
      if constexpr (declares<S>(Hook::begin_sequence)) scorer.begin_sequence();
    }
    const std::vector<ExpertDemand> demands = test::demands_of(c);
    std::vector<Precision> buf(demands.size() + 2, unwritten);  // two guards past the end
    scorer.score(c.ctx, c.gate(), std::span<const ExpertDemand>(demands),
                 std::span<Precision>(buf).first(demands.size()));
    out.push_back(std::move(buf));
  }
  return out;
}

template <class S>
using ConformancePipeline =
    OffloadPipeline<S, NoPredictor, LruPolicy, test::ManualLoader, OnDemandScheduler>;

template <class S>
PipelineStats run_pipeline(const test::ConformanceStream& s) {
  const std::size_t budget = 6 * s.shape.expert_bytes(Precision::f16);
  ConformancePipeline<S> pipe(s.shape, {.expert_budget_bytes = budget}, test::ManualLoader(true),
                              ScorerSetup<S>::make(s.shape));
  std::uint64_t seq = ~std::uint64_t{0};
  for (const test::StreamCall& c : s.calls) {
    if (c.ctx.sequence_id != seq) {
      seq = c.ctx.sequence_id;
      pipe.begin_sequence();
    }
    const LayerPlan& plan = pipe.route(c.ctx, c.gate());
    for (const WeightView& w : pipe.resolve(plan))
      if (w.placement == Placement::device)
        REQUIRE(w.bytes.size() == s.shape.expert_bytes(w.precision));
    pipe.end_layer(c.ctx);
    if (c.ctx.is_last_layer()) (void)pipe.end_token({});
  }
  return pipe.stats();
}

}  // namespace

TEST_CASE("every scorer says its own name, each a different one", "[score][conformance]") {
  const auto names = test::names_of<AllScorers>();
  CAPTURE(names);
  CHECK(test::names_distinct(names));
}

TEMPLATE_LIST_TEST_CASE("scorers write one precision or skip per demand and nothing beyond",
                        "[score][conformance]", AllScorers) {
  const std::uint32_t seed = GENERATE(1u, 2u, 3u);
  CAPTURE(TestType::name, seed);
  const auto s = test::conformance_stream(scorer_shape, seed);
  TestType scorer = ScorerSetup<TestType>::make(scorer_shape);
  const auto out = run_direct(scorer, s);
  REQUIRE(out.size() == s.calls.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    CAPTURE(i);
    const std::size_t n = out[i].size() - 2;
    for (std::size_t j = 0; j < n; ++j)
      REQUIRE(static_cast<unsigned>(out[i][j]) <= static_cast<unsigned>(Precision::skip));
    REQUIRE(out[i][n] == unwritten);
    REQUIRE(out[i][n + 1] == unwritten);
  }
}

TEMPLATE_LIST_TEST_CASE("scorers are deterministic: the same stream, the same precisions",
                        "[score][conformance]", AllScorers) {
  const std::uint32_t seed = GENERATE(4u, 5u);
  CAPTURE(TestType::name, seed);
  const auto s = test::conformance_stream(scorer_shape, seed);
  TestType a = ScorerSetup<TestType>::make(scorer_shape);
  TestType b = ScorerSetup<TestType>::make(scorer_shape);
  CHECK(run_direct(a, s) == run_direct(b, s));
}

TEMPLATE_LIST_TEST_CASE("scorers run inside an OffloadPipeline, repeatably", "[score][conformance]",
                        AllScorers) {
  const std::uint32_t seed = GENERATE(6u, 7u);
  CAPTURE(TestType::name, seed);
  const auto s = test::conformance_stream(scorer_shape, seed);
  PipelineStats a, b;
  REQUIRE_NOTHROW(a = run_pipeline<TestType>(s));
  REQUIRE_NOTHROW(b = run_pipeline<TestType>(s));
  CHECK(a.hits + a.misses + a.skipped == a.demands);
  CHECK(a.hits == b.hits);
  CHECK(a.skipped == b.skipped);
  CHECK(a.misses_by_precision == b.misses_by_precision);
  CHECK(a.bytes_loaded() == b.bytes_loaded());
}
