#include <catch2/catch.hpp>

#include <stdexcept>
#include <vector>

#include "moekit/presets.hpp"
#include "support/manual_loader.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::ManualLoader;
using test::Route;

namespace {
constexpr ModelShape pipeline_shape{
    .n_layers = 2, .n_experts = 4, .top_k = 2, .hidden = 64, .ffn = 128};
const std::size_t pipeline_f16 = pipeline_shape.expert_bytes(Precision::f16);

std::vector<ExpertKey> loaded_keys(const ManualLoader& l) {
  std::vector<ExpertKey> out;
  for (const auto& r : l.records()) out.push_back(r.request.key);
  return out;
}
}  // namespace

TEST_CASE("Baseline: LRU over a scripted routing sequence, exact loads and evictions",
          "[core][pipeline][preset]") {
  presets::Baseline<ManualLoader> p(pipeline_shape, {.expert_budget_bytes = 3 * pipeline_f16},
                                    ManualLoader{});
  p.begin_sequence();
  // token 0: layer 0 -> {0,1}, layer 1 -> {2,3}
  const auto& a = p.route(ctx(0, 2), Route(4, {{0, 1}}).view());
  REQUIRE(a.experts.size() == 2);
  CHECK_FALSE(a.experts[0].hit);
  CHECK(a.experts[0].placement == Placement::device);
  auto views = p.resolve(a);
  REQUIRE(views.size() == 2);
  CHECK(views[0].bytes.size() == pipeline_f16);
  CHECK(static_cast<int>(views[0].bytes[0]) == ManualLoader::pattern({0, 0}));
  CHECK(static_cast<int>(views[1].bytes[pipeline_f16 - 1]) == ManualLoader::pattern({0, 1}));
  p.end_layer(ctx(0, 2));
  const auto& b = p.route(ctx(1, 2), Route(4, {{2, 3}}).view());  // evicts (0,0): LRU
  p.resolve(b);
  p.end_layer(ctx(1, 2));
  CHECK(p.end_token({}) == TokenVerdict::accept);
  CHECK_FALSE(p.cache().resident({0, 0}));
  CHECK(p.cache().resident({0, 1}));
  // token 1: layer 0 -> {1,0}: (0,1) hits, (0,0) misses and evicts (1,2)
  const auto& c = p.route(ctx(0, 2, 1), Route(4, {{1, 0}}).view());
  CHECK(c.experts[0].hit);
  CHECK_FALSE(c.experts[1].hit);
  p.resolve(c);
  p.end_layer(ctx(0, 2, 1));
  CHECK_FALSE(p.cache().resident({1, 2}));
  CHECK(p.cache().resident({1, 3}));

  const std::vector<ExpertKey> expected{{0, 0}, {0, 1}, {1, 2}, {1, 3}, {0, 0}};
  CHECK(loaded_keys(p.loader()) == expected);
  const auto s = p.stats();
  CHECK(s.hits == 1);
  CHECK(s.misses == 5);
  CHECK(s.cache.evictions == 2);
  CHECK(s.miss_penalty == Approx(5.0));
  CHECK(s.bytes_demand_loaded == 5 * pipeline_f16);
  CHECK(s.tokens_accepted == 1);
  p.cache().check_invariants();
}

namespace {
/// A ManualLoader whose quantized blobs are in panels, as it declares.
struct PanelsLoader : ManualLoader {
  static constexpr Hooks hooks = Hook::matrix_order;
  PanelsLoader() = default;  // not an aggregate: ManualLoader's default constructor is explicit
  [[nodiscard]] MatrixOrder matrix_order(Precision p) const noexcept {
    return is_quantized(p) ? MatrixOrder::panels4 : MatrixOrder::rows;
  }
};
static_assert(assert_loader<PanelsLoader>());
}  // namespace

TEST_CASE("A resolved expert carries the order its loader declares", "[core][pipeline][hooks]") {
  const std::size_t q4 = pipeline_shape.expert_bytes(Precision::q4);
  for (Precision base : {Precision::q4, Precision::f16}) {
    INFO(name(base));
    presets::Baseline<PanelsLoader> p(
        pipeline_shape,
        {.expert_budget_bytes = 4 * pipeline_shape.expert_bytes(base), .base_precision = base},
        PanelsLoader{}, UniformScorer({.precision = base}));
    presets::Baseline<ManualLoader> rows(
        pipeline_shape, {.expert_budget_bytes = 4 * q4, .base_precision = Precision::q4},
        ManualLoader{}, UniformScorer({.precision = Precision::q4}));
    p.begin_sequence();
    rows.begin_sequence();
    const auto views = p.resolve(p.route(ctx(0, 2), Route(4, {{0, 1}}).view()));
    const auto undeclared = rows.resolve(rows.route(ctx(0, 2), Route(4, {{0, 1}}).view()));
    REQUIRE(views.size() == 2);
    REQUIRE(undeclared.size() == 2);
    for (const WeightView& v : views) {
      CHECK(v.precision == base);
      CHECK(v.order == (base == Precision::q4 ? MatrixOrder::panels4 : MatrixOrder::rows));
    }
    for (const WeightView& v : undeclared) {
      CHECK(v.precision == Precision::q4);
      CHECK(v.order == MatrixOrder::rows);
    }
  }
}

TEST_CASE("Pipeline plans one entry per distinct expert of a prefill batch", "[core][pipeline]") {
  presets::Baseline<ManualLoader> p(pipeline_shape, {.expert_budget_bytes = 4 * pipeline_f16},
                                    ManualLoader{});
  const auto& plan =
      p.route(ctx(0, 2, 0, Phase::prefill, 3), Route(4, {{0, 1}, {1, 2}, {1, 0}}).view());
  REQUIRE(plan.experts.size() == 3);
  CHECK(plan.experts[0].key.expert == 0);
  CHECK(plan.experts[0].n_tokens == 2);
  CHECK(plan.experts[1].key.expert == 1);
  CHECK(plan.experts[1].n_tokens == 3);
  CHECK(plan.experts[2].n_tokens == 1);
  CHECK(p.loader().records().size() == 3);
}

TEST_CASE("Pipeline stages demands the cache cannot admit, and refuses impossible budgets",
          "[core][pipeline]") {
  CHECK_THROWS_WITH((presets::Baseline<ManualLoader>(
                        pipeline_shape, {.expert_budget_bytes = pipeline_f16}, ManualLoader{})),
                    Catch::Contains("minimum budget is"));
  presets::Baseline<ManualLoader> p(pipeline_shape, {.expert_budget_bytes = 2 * pipeline_f16},
                                    ManualLoader{});
  // A prefill layer needing all 4 experts: 2 fit in the cache, 2 go to staging slots.
  const auto& plan = p.route(ctx(0, 2, 0, Phase::prefill, 2), Route(4, {{0, 1}, {2, 3}}).view());
  auto views = p.resolve(plan);
  REQUIRE(views.size() == 4);
  for (std::size_t i = 0; i < 4; ++i)
    CHECK(static_cast<int>(views[i].bytes[0]) == ManualLoader::pattern(views[i].key));
  CHECK(p.stats().staged == 2);
  p.end_layer(ctx(0, 2));
  CHECK(p.cache().resident_count() == 2);
  p.cache().check_invariants();
}

TEST_CASE("Pipeline rejects a GateView inconsistent with the model", "[core][pipeline]") {
  presets::Baseline<ManualLoader> p(pipeline_shape, {.expert_budget_bytes = 4 * pipeline_f16},
                                    ManualLoader{});
  CHECK_THROWS_WITH(p.route(ctx(0, 2), Route(4, {{0, 7}}).view()),
                    Catch::Contains("GateView.experts holds an id >= n_experts"));
  CHECK_THROWS_WITH(p.route(ctx(5, 2), Route(4, {{0, 1}}).view()),
                    Catch::Contains("LayerContext.layer >= n_layers"));
  CHECK_THROWS_WITH(p.route(ctx(0, 2), Route(8, {{0, 1}}).view()),
                    Catch::Contains("GateView.n_experts"));
}

TEST_CASE("LayerCall: routed when created, resolves its own plan, ends the layer with its scope",
          "[core][pipeline]") {
  presets::Baseline<ManualLoader> p(pipeline_shape, {.expert_budget_bytes = 3 * pipeline_f16},
                                    ManualLoader{});
  p.begin_sequence();
  {
    auto call = p.layer(ctx(0, 2), Route(4, {{0, 1}}).view());
    REQUIRE(call.plan().experts.size() == 2);
    CHECK(call.plan().layer == 0);
    CHECK(p.cache().entry({0, 0}).hard_pins == 1);  // the layer's pin
    const auto views = call.resolve();
    REQUIRE(views.size() == 2);
    CHECK(static_cast<int>(views[1].bytes[0]) == ManualLoader::pattern({0, 1}));
  }
  CHECK(p.cache().entry({0, 0}).hard_pins == 0);  // released by the scope's end
  CHECK(p.cache().entry({0, 1}).hard_pins == 0);
  // The layer ends even when the experts' computation throws.
  try {
    auto call = p.layer(ctx(1, 2), Route(4, {{2, 3}}).view());
    (void)call.resolve();
    throw std::runtime_error("expert failed");
  } catch (const std::runtime_error&) {
  }
  CHECK(p.cache().entry({1, 2}).hard_pins == 0);
  CHECK(p.stats().layer_calls == 2);
}

TEST_CASE("Pipeline views come before their loads end; each missing expert is awaited alone",
          "[core][pipeline]") {
  presets::Baseline<ManualLoader> p(pipeline_shape, {.expert_budget_bytes = 4 * pipeline_f16},
                                    ManualLoader(/*instant=*/false));
  p.begin_sequence();
  {  // (0,0) becomes resident
    auto call = p.layer(ctx(0, 2), Route(4, {{0, 1}}).view());
    (void)call.resolve();
  }
  auto call = p.layer(ctx(0, 2, 1), Route(4, {{0, 2}}).view());  // (0,0) hit, (0,2) miss
  const auto views = call.views();
  REQUIRE(views.size() == 2);
  std::size_t hit = 0, miss = 1;
  if (views[0].key.expert == 2) std::swap(hit, miss);
  CHECK(views[miss].bytes.size() == pipeline_f16);  // where the load puts it, before it ends
  CHECK_FALSE(call.loading(hit));
  CHECK(call.loading(miss));
  const LoadTicket t = call.plan().experts[miss].ticket;
  CHECK_FALSE(p.loader().poll(t));  // nothing waited for it yet
  call.await(hit);                  // nothing to wait for
  CHECK_FALSE(p.loader().poll(t));
  call.await(miss);
  CHECK(p.loader().poll(t));
  CHECK_FALSE(call.loading(miss));
  CHECK(static_cast<int>(views[miss].bytes[0]) == ManualLoader::pattern({0, 2}));
  CHECK_FALSE(p.cache().entry({0, 2}).loading);  // seen complete: evictable after the layer
}

TEST_CASE("A loading expert is kept by the cache itself, without a pin", "[core][pipeline]") {
  // A gated loader: the demand load of (0,0) stays in flight across end_layer.
  presets::Baseline<ManualLoader> p(pipeline_shape, {.expert_budget_bytes = 2 * pipeline_f16},
                                    ManualLoader(/*instant=*/false));
  p.begin_sequence();
  (void)p.route(ctx(0, 2), Route(4, {{0, 1}}).view());
  p.end_layer(ctx(0, 2));  // not resolved: both loads are still in flight
  CHECK(p.cache().entry({0, 0}).loading);
  CHECK(p.cache().entry({0, 0}).hard_pins == 0);
  CHECK(p.cache().pinned({0, 0}));
  // Nothing is evictable: the next layer's experts go to staging slots.
  const auto& b = p.route(ctx(1, 2), Route(4, {{2, 3}}).view());
  CHECK(p.cache().resident({0, 0}));
  CHECK(p.cache().resident({0, 1}));
  CHECK(p.stats().staged == 2);
  p.loader().complete_all();
  (void)p.resolve(b);
  p.end_layer(ctx(1, 2));
  // Seen complete at the next route: evictable again.
  (void)p.route(ctx(0, 2, 1), Route(4, {{2, 3}}).view());
  CHECK_FALSE(p.cache().entry({0, 0}).loading);
  p.cache().check_invariants();
}
