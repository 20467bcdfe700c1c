#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "moekit/presets.hpp"
#include "support/manual_loader.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::ManualLoader;
using test::Route;

namespace {
constexpr ModelShape prefetch_shape{
    .n_layers = 3, .n_experts = 4, .top_k = 2, .hidden = 32, .ffn = 64};
const std::size_t prefetch_f16 = prefetch_shape.expert_bytes(Precision::f16);

// Predicts a fixed list of keys at every layer call (a scripted predictor for exact scenarios).
struct ScriptedPredictor {
  std::vector<std::vector<Prefetch>> per_layer;  // prefetches issued when layer l routes
  std::vector<std::uint32_t> observed;
  void observe(const LayerContext& c, const GateView&) { observed.push_back(c.layer); }
  void predict(const LayerContext& c, const GateView&, const ResidencyView&, PrefetchList& out) {
    if (c.layer < per_layer.size())
      for (const Prefetch& p : per_layer[c.layer]) out.push(p);
  }
};
using Pipeline =
    OffloadPipeline<UniformScorer, ScriptedPredictor, LruPolicy, ManualLoader, OnDemandScheduler>;
}  // namespace

TEST_CASE("Prefetches load at prefetch priority, are soft-pinned, and score precision/recall",
          "[core][pipeline][prefetch]") {
  ScriptedPredictor pred;
  pred.per_layer = {{{{1, 2}, Precision::f16, 0.9f, 1}, {{1, 3}, Precision::f16, 0.5f, 1}},
                    {{{2, 0}, Precision::f16, 0.9f, 1}},
                    {}};
  Pipeline p(prefetch_shape, {.expert_budget_bytes = 4 * prefetch_f16},
             ManualLoader(/*instant=*/false), UniformScorer{}, pred);
  const auto& a = p.route(ctx(0, 3), Route(4, {{0, 1}}).view());
  REQUIRE(a.prefetches.size() == 2);
  const auto& recs = p.loader().records();
  REQUIRE(recs.size() == 4);
  CHECK(recs[0].request.priority == LoadPriority::on_demand);
  CHECK(recs[2].request.priority == LoadPriority::prefetch);
  CHECK(recs[2].request.key == ExpertKey{1, 2});
  CHECK(p.cache().entry({1, 2}).soft_pins == 1);
  p.resolve(a);
  p.end_layer(ctx(0, 3));

  // Layer 1 needs {2, 0}: (1,2) is a late prefetch (still loading), (1,3) was predicted but not
  // needed: still queued, so it is cancelled.
  const auto& b = p.route(ctx(1, 3), Route(4, {{2, 0}}).view());
  REQUIRE(b.experts.size() == 2);
  CHECK(b.experts[0].hit);
  CHECK(b.experts[0].in_flight);
  CHECK_FALSE(b.experts[1].hit);
  CHECK(p.stats().prefetches_cancelled == 1);
  CHECK_FALSE(p.cache().resident({1, 3}));
  p.loader().complete_all();
  p.resolve(b);
  p.end_layer(ctx(1, 3));
  CHECK(p.cache().entry({1, 2}).soft_pins == 0);
  CHECK(p.cache().entry({1, 2}).hard_pins == 0);

  const auto s = p.stats();
  CHECK(s.late_prefetches == 1);
  CHECK(s.prefetches_issued == 3);
  CHECK(s.prediction[1].true_positive == 1);   // (1,2)
  CHECK(s.prediction[1].false_positive == 1);  // (1,3)
  CHECK(s.prediction[1].false_negative == 1);  // (1,0)
  CHECK(s.prediction[1].precision() == Approx(0.5));
  CHECK(s.prediction[1].recall() == Approx(0.5));
  CHECK(s.bytes_prefetched == 2 * prefetch_f16);  // the cancelled one moved nothing
  p.cache().check_invariants();
}

TEST_CASE("Prefetches of resident experts are redundant; invalid ones are dropped",
          "[core][pipeline][prefetch]") {
  ScriptedPredictor pred;
  pred.per_layer = {{{{0, 1}, Precision::f16, 1.f, 0},    // same layer: dropped
                     {{7, 1}, Precision::f16, 1.f, 7},    // outside the model: dropped
                     {{1, 1}, Precision::skip, 1.f, 1}},  // skip is not a format: dropped
                    {{{2, 1}, Precision::f16, 1.f, 1}}};
  Pipeline p(prefetch_shape, {.expert_budget_bytes = 4 * prefetch_f16}, ManualLoader{},
             UniformScorer{}, pred);
  p.resolve(p.route(ctx(0, 3), Route(4, {{0, 1}}).view()));
  p.end_layer(ctx(0, 3));
  CHECK(p.stats().prefetches_dropped == 3);
  p.resolve(p.route(ctx(1, 3), Route(4, {{1, 2}}).view()));
  p.end_layer(ctx(1, 3));
  // (2,1) prefetched; asking again for it from the next token is redundant.
  p.end_token({});
  p.resolve(p.route(ctx(0, 3, 1), Route(4, {{0, 1}}).view()));
  p.end_layer(ctx(0, 3, 1));
  p.resolve(p.route(ctx(1, 3, 1), Route(4, {{1, 2}}).view()));
  CHECK(p.stats().prefetches_redundant == 1);
  CHECK(p.stats().prefetches_issued == 1);
}

TEST_CASE("preload places experts before any demand", "[core][pipeline]") {
  presets::Baseline<ManualLoader> p(prefetch_shape, {.expert_budget_bytes = 2 * prefetch_f16},
                                    ManualLoader{});
  CHECK(p.preload({2, 3}, Precision::f16));
  CHECK(p.preload({2, 1}, Precision::f16));
  CHECK(p.stats().bytes_preloaded == 2 * prefetch_f16);
  const auto& plan = p.route(ctx(2, 3), Route(4, {{3, 1}}).view());
  CHECK(plan.experts[0].hit);
  CHECK(plan.experts[1].hit);
  p.resolve(plan);
  p.end_layer(ctx(2, 3));
  CHECK(p.stats().misses == 0);
  CHECK(p.stats().prefetches_issued == 0);
  p.cache().check_invariants();
}

namespace {
struct SkipSecond {  // skips every expert but the first demand
  void score(const LayerContext&, const GateView&, std::span<const ExpertDemand> d,
             std::span<Precision> out) const {
    for (std::size_t i = 0; i < d.size(); ++i) out[i] = i == 0 ? Precision::f16 : Precision::skip;
  }
};
}  // namespace

TEST_CASE("skip drops misses but runs resident experts, unless told otherwise",
          "[core][pipeline]") {
  for (bool always : {false, true}) {
    OffloadPipeline<SkipSecond, NoPredictor, LruPolicy, ManualLoader, OnDemandScheduler> p(
        prefetch_shape, {.expert_budget_bytes = 4 * prefetch_f16, .skip_even_if_resident = always},
        ManualLoader{});
    REQUIRE(p.preload({0, 3}, Precision::f16));
    const auto& plan = p.route(ctx(0, 3), Route(4, {{0, 3}}).view());
    const auto e3 = std::find_if(plan.experts.begin(), plan.experts.end(), [](const ExpertPlan& e) {
      return e.key == ExpertKey{0, 3};
    });
    REQUIRE(e3 != plan.experts.end());
    CHECK(e3->placement == (always ? Placement::skipped : Placement::device));
    CHECK(e3->hit == !always);
    p.resolve(plan);
    p.end_layer(ctx(0, 3));
    const auto& plan2 = p.route(ctx(0, 3, 1), Route(4, {{0, 2}}).view());
    CHECK(plan2.experts.back().key == ExpertKey{0, 2});
    CHECK(plan2.experts.back().placement == Placement::skipped);  // a miss: dropped either way
    p.cache().check_invariants();
  }
}

TEST_CASE("A prefetch lies the distance it states ahead, within the pipeline's limit",
          "[core][pipeline][prefetch]") {
  ScriptedPredictor pred;
  pred.per_layer = {{{{2, 0}, Precision::f16, 1.f, 1},    // says 1 layer ahead, is 2: dropped
                     {{2, 1}, Precision::f16, 1.f, 2},    // 2 ahead, as it says: issued
                     {{1, 3}, Precision::f16, 1.f, 0}}};  // says 0, is 1: dropped
  Pipeline p(prefetch_shape, {.expert_budget_bytes = 4 * prefetch_f16}, ManualLoader{},
             UniformScorer{}, pred);
  p.resolve(p.route(ctx(0, 3), Route(4, {{0, 1}}).view()));
  p.end_layer(ctx(0, 3));
  CHECK(p.stats().prefetches_dropped == 2);
  CHECK(p.stats().prefetches_issued == 1);
  CHECK(p.cache().resident({2, 1}));

  // A limit of one layer drops the distance-2 prefetch; the limit cannot exceed what is scored.
  Pipeline near(prefetch_shape,
                {.expert_budget_bytes = 4 * prefetch_f16, .max_prefetch_distance = 1},
                ManualLoader{}, UniformScorer{}, pred);
  near.resolve(near.route(ctx(0, 3), Route(4, {{0, 1}}).view()));
  near.end_layer(ctx(0, 3));
  CHECK(near.stats().prefetches_dropped == 3);
  CHECK_THROWS_WITH(Pipeline(prefetch_shape,
                             {.expert_budget_bytes = 4 * prefetch_f16,
                              .max_prefetch_distance = max_prediction_distance + 1},
                             ManualLoader{}, UniformScorer{}, pred),
                    Catch::Contains("PipelineConfig.max_prefetch_distance must be <= 3"));
}

TEST_CASE("A queued preload is never withdrawn as a stale prefetch; finish_loads completes it",
          "[core][pipeline][prefetch]") {
  Pipeline p(prefetch_shape, {.expert_budget_bytes = 4 * prefetch_f16},
             ManualLoader(/*instant=*/false), UniformScorer{}, ScriptedPredictor{});
  REQUIRE(p.preload({0, 3}, Precision::f16));  // queued, at prefetch priority
  // Layer 0 needs {0, 1}, not the preloaded (0,3): a prefetch would be cancelled here; a placement
  // stays, and its bytes are counted once, as preloaded (before: bytes_prefetched underflowed).
  const auto& a = p.route(ctx(0, 3), Route(4, {{0, 1}}).view());
  CHECK(p.stats().prefetches_cancelled == 0);
  CHECK(p.cache().resident({0, 3}));
  p.loader().complete_all();
  p.resolve(a);
  p.end_layer(ctx(0, 3));
  p.finish_loads();
  const auto s = p.stats();
  CHECK(s.bytes_preloaded == prefetch_f16);
  CHECK(s.bytes_prefetched == 0);
  CHECK_FALSE(p.cache().entry({0, 3}).loading);
  p.cache().check_invariants();
}
