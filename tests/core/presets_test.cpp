// Scripted scenarios per preset: a short hand-written routing sequence with the exact expected
// plans — which experts load at which precision, which are evicted, which are prefetched.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "moekit/presets.hpp"
#include "support/manual_loader.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::ManualLoader;
using test::Route;

namespace {
constexpr ModelShape shape{.n_layers = 3, .n_experts = 4, .top_k = 2, .hidden = 4, .ffn = 32};
const std::size_t f16 = shape.expert_bytes(Precision::f16);
const std::size_t q4 = shape.expert_bytes(Precision::q4);

// Router of every layer = identity (hidden 4 = experts 4): the logits of a layer are the gate
// input itself, so predictions are read straight off the hidden state.
const std::vector<float> identity_routers = [] {
  std::vector<float> w(shape.n_layers * shape.n_experts * shape.hidden, 0.0f);
  for (std::uint32_t l = 0; l < shape.n_layers; ++l)
    for (std::uint32_t e = 0; e < shape.n_experts; ++e)
      w[(l * shape.n_experts + e) * shape.hidden + e] = 1.0f;
  return w;
}();

// Route with a gate input; the view points into `keep`, which the caller keeps alive.
GateView with_hidden(Route& keep, Route r, std::vector<float> hidden) {
  keep = std::move(r);
  keep.hidden = std::move(hidden);
  return keep.view();
}
Route with_logits(Route r, std::vector<float> logits) {
  r.logits = std::move(logits);
  return r;
}
struct Load {
  ExpertKey key;
  Precision precision;
  LoadPriority priority;
  friend bool operator==(const Load&, const Load&) = default;
};
std::vector<Load> loads(const ManualLoader& l) {
  std::vector<Load> out;
  for (const auto& r : l.records())
    out.push_back({r.request.key, r.request.precision, r.request.priority});
  return out;
}
constexpr auto OD = LoadPriority::on_demand;
constexpr auto PF = LoadPriority::prefetch;
}  // namespace

TEST_CASE("presets::Hobbit: T1/T2 precisions, stacked-gate prefetch, skip", "[preset][hobbit]") {
  StackedGatePredictor pred({.router_weights = identity_routers,
                             .n_layers = 3,
                             .n_experts = 4,
                             .hidden = 4,
                             .top_k = 2,
                             .lookahead = 2});
  presets::Hobbit<ManualLoader> p(shape, {.expert_budget_bytes = 4 * f16}, ManualLoader{},
                                  HobbitThresholdScorer{}, std::move(pred),
                                  MultiDimPolicy({.high_slot_fraction = 0.5}));
  p.begin_sequence();
  Route keep(4, {{0}});
  // Layer 0: expert 2 (0.8) is top-1 → f16; expert 0: cumulative 0.8 in (0.6, 0.9] → q4.
  // Gate input [0.1, 3, 0.2, 2] predicts layer 1 = {1, 3}, weights 0.73/0.27 → f16 / q4.
  const auto& a =
      p.route(ctx(0, 3), with_hidden(keep, Route(4, {{2, 0}}, {{0.8f, 0.2f}}), {0.1f, 3, 0.2f, 2}));
  REQUIRE(a.experts.size() == 2);
  CHECK(a.experts[0].precision == Precision::f16);
  CHECK(a.experts[1].precision == Precision::q4);
  p.resolve(a);
  p.end_layer(ctx(0, 3));
  // Layer 1 routes to the predicted {1, 3}: both hit. Its gate input predicts layer 2 = {0, 3}
  // (weights 0.62/0.38 → f16 / q4).
  const auto& b =
      p.route(ctx(1, 3), with_hidden(keep, Route(4, {{1, 3}}, {{0.75f, 0.25f}}), {3, 0, 0, 2.5f}));
  CHECK(b.experts[0].hit);
  CHECK(b.experts[1].hit);
  CHECK(b.experts[1].precision == Precision::q4);
  p.resolve(b);
  p.end_layer(ctx(1, 3));
  // Layer 2: expert 0 at 0.95 → the second expert's cumulative weight 0.95 > T2: skip. Expert 2
  // is not resident: skipped. Expert 3, prefetched at q4, would run anyway (free compute).
  const auto& c =
      p.route(ctx(2, 3), with_hidden(keep, Route(4, {{0, 2}}, {{0.95f, 0.05f}}), {1, 0, 0, 0}));
  CHECK(c.experts[0].hit);
  CHECK(c.experts[0].precision == Precision::f16);
  CHECK(c.experts[1].placement == Placement::skipped);
  p.resolve(c);
  p.end_layer(ctx(2, 3));

  const std::vector<Load> expected{{{0, 2}, Precision::f16, OD}, {{0, 0}, Precision::q4, OD},
                                   {{1, 1}, Precision::f16, PF}, {{1, 3}, Precision::q4, PF},
                                   {{2, 0}, Precision::f16, PF}, {{2, 3}, Precision::q4, PF}};
  CHECK(loads(p.loader()) == expected);
  const auto s = p.stats();
  CHECK(s.misses == 2);
  CHECK(s.miss_penalty == Approx(1.0 + 4.0 / 16.0));  // HOBBIT: a q4 miss costs 4/16
  CHECK(s.skipped == 1);
  // Distance 1: layer 1 predicted {1, 3} (both right), layer 2 predicted {0, 3}, needed {0, 2}.
  CHECK(s.prediction[1].true_positive == 3);
  CHECK(s.prediction[1].false_positive == 1);
  CHECK(s.prediction[1].false_negative == 1);
  CHECK(p.cache().pools().size() == 2);  // high and low pools
}

TEST_CASE(
    "presets::Fiddler: popular experts placed, misses on the CPU in decode, copied in a "
    "busy prefill",
    "[preset][fiddler]") {
  // Popularity: layer 0 experts 1 and 3, layer 2 expert 0 are the three most popular.
  std::vector<double> counts{1, 9, 2, 8, 0, 1, 0, 0, 7, 3, 0, 0};
  presets::Fiddler<ManualLoader> p(
      shape, {.expert_budget_bytes = 3 * f16}, ManualLoader{}, UniformScorer{}, NoPredictor{},
      StaticPopularityPolicy({.counts = counts}),
      FiddlerScheduler({.cpu_seconds_per_token = 7, .copy_seconds = 70}));
  for (ExpertKey k : {ExpertKey{0, 1}, ExpertKey{0, 3}, ExpertKey{2, 0}})
    CHECK(p.preload(k, Precision::f16));
  CHECK_FALSE(p.preload({1, 1}, Precision::f16));  // not placed: never admitted
  // Decode: (0,1) resident runs on the device, (0,2) runs on the CPU — no weights move.
  const auto& a = p.route(ctx(0, 3), Route(4, {{1, 2}}).view());
  REQUIRE(a.experts.size() == 2);
  CHECK(a.experts[0].placement == Placement::device);
  CHECK(a.experts[0].hit);
  CHECK(a.experts[1].placement == Placement::host_cpu);
  p.resolve(a);
  p.end_layer(ctx(0, 3));
  // Prefill, 12 tokens: experts 1 and 2 of layer 1 get 11 tokens each, 0 and 3 one each; none is
  // placed. Cost max(cpu, copies) over g copied (busiest first): g=0: 168, g=1: max(91, 70) = 91,
  // g=2: max(14, 140) = 140 → copy one (expert 1: ties go to the smaller id), the rest on the CPU.
  Route busy(4, {{2, 0},
                 {2, 1},
                 {2, 1},
                 {2, 1},
                 {2, 1},
                 {2, 1},
                 {2, 1},
                 {2, 1},
                 {2, 1},
                 {2, 1},
                 {2, 1},
                 {3, 1}});
  const auto& b = p.route(ctx(1, 3, 1, Phase::prefill, 12), busy.view());
  std::size_t copied = 0, cpu = 0;
  for (const auto& e : b.experts) {
    if (e.placement == Placement::device) ++copied;
    if (e.placement == Placement::host_cpu) ++cpu;
  }
  CHECK(copied == 1);
  CHECK(b.experts[0].key == ExpertKey{1, 1});
  CHECK(b.experts[0].placement == Placement::device);
  CHECK(cpu == 3);
  CHECK(p.stats().staged == 1);  // copied experts are transient: never admitted
  p.resolve(b);
  p.end_layer(ctx(1, 3));
  CHECK(p.cache().resident_count() == 3);  // the placement is unchanged
  CHECK(p.stats().host_cpu_runs == 4);
  const std::vector<Load> expected{{{0, 1}, Precision::f16, PF},
                                   {{0, 3}, Precision::f16, PF},
                                   {{2, 0}, Precision::f16, PF},
                                   {{1, 1}, Precision::f16, OD}};
  CHECK(loads(p.loader()) == expected);
}

TEST_CASE("presets::Mobile: little pass with K/2; a fallback's plan is prefetched one layer ahead",
          "[preset][mobile]") {
  presets::Mobile<ManualLoader> p(shape, {.expert_budget_bytes = 6 * f16}, ManualLoader{},
                                  UniformScorer{},
                                  RouterReplayPredictor({.top_k = 2, .lookahead = 1}));
  p.begin_sequence();
  const LayerContext c0 = ctx(0, 3, 5);
  REQUIRE(p.active_top_k(c0) == 1);  // little: K/2
  const std::vector<std::vector<float>> logits{{4, 3, 0, 0}, {0, 0, 5, 4.5f}, {1, 0, 2, 0}};
  const std::uint32_t little[] = {0, 2, 2};
  for (std::uint32_t l = 0; l < 3; ++l) {
    Route r = with_logits(Route(4, {{little[l]}}, {{1.0f}}), logits[l]);
    p.resolve(p.route(ctx(l, 3, 5), r.view()));
    p.end_layer(ctx(l, 3, 5));
  }
  // The output distribution is flat (max prob 0.25 < γ = 0.7): fall back.
  const std::vector<float> flat(8, 0.0f);
  CHECK(p.end_token(flat) == TokenVerdict::fallback);
  CHECK(p.active_top_k(c0) == 2);  // the recomputation uses the full K
  // At the fallback only layer 0's plan (top-2 of its recorded logits, less the resident little
  // expert) is loaded; the others follow one layer ahead of the big pass.
  const std::vector<Load> at_fallback{{{0, 0}, Precision::f16, OD},
                                      {{1, 2}, Precision::f16, OD},
                                      {{2, 2}, Precision::f16, OD},
                                      {{0, 1}, Precision::f16, PF}};
  CHECK(loads(p.loader()) == at_fallback);
  // The big pass runs the plan (paper: the little pass's experts, no re-routing).
  const std::vector<std::vector<std::uint32_t>> plan{{0, 1}, {2, 3}, {2, 0}};
  for (std::uint32_t l = 0; l < 3; ++l) {
    const auto planned = p.planned_experts(ctx(l, 3, 5));
    CHECK(std::vector<std::uint32_t>(planned.begin(), planned.end()) == plan[l]);
    Route r = with_logits(Route(4, {{plan[l][0], plan[l][1]}}, {{0.5f, 0.5f}}), logits[l]);
    p.resolve(p.route(ctx(l, 3, 5), r.view()));
    p.end_layer(ctx(l, 3, 5));
  }
  const std::vector<Load> after{{{0, 0}, Precision::f16, OD}, {{1, 2}, Precision::f16, OD},
                                {{2, 2}, Precision::f16, OD}, {{0, 1}, Precision::f16, PF},
                                {{1, 3}, Precision::f16, PF}, {{2, 0}, Precision::f16, PF}};
  CHECK(loads(p.loader()) == after);
  CHECK(p.stats().misses == 3);          // the little pass's only: the big pass waited for no load
  CHECK(p.planned_experts(c0).empty());  // after the big pass: route as usual
  // A confident output is accepted.
  std::vector<float> peaked(8, 0.0f);
  peaked[3] = 10.0f;
  CHECK(p.end_token(flat) == TokenVerdict::accept);  // the recomputation is never judged
  CHECK(p.end_token(peaked) == TokenVerdict::accept);
  CHECK(p.stats().fallbacks == 1);
}

TEST_CASE(
    "presets::Fate: q4 decode transfers, per-layer shallow-favoring pools, cross-layer "
    "gate prefetch",
    "[preset][fate]") {
  CrossLayerGatePredictor pred(
      {.router_weights = identity_routers, .n_layers = 3, .n_experts = 4, .hidden = 4, .top_k = 2});
  // Budget of 6 q4 experts over 3 layers of 4: shallow layer 0 gets all 4, the rest 1 each.
  presets::Fate<ManualLoader> p(
      shape, {.expert_budget_bytes = 6 * q4, .sizing_precision = Precision::q4}, ManualLoader{},
      PopularityScorer{}, std::move(pred), ShallowFavoring<ArcPolicy>({.shallow_layers = 1}));
  Route keep(4, {{0}});
  const auto& slots = p.cache().policy().layer_slots();
  CHECK(slots == std::vector<std::uint32_t>{4, 1, 1});
  // Decode at layer 0: experts {1, 2} at q4. Gate input [0, 5, 0, 4] → layer 1 predicted scores
  // softmax ≈ [.005, .73, .005, .26]: above the 75th percentile only expert 1.
  const auto& a = p.route(ctx(0, 3), with_hidden(keep, Route(4, {{1, 2}}), {0, 5, 0, 4}));
  CHECK(a.experts[0].precision == Precision::q4);
  CHECK(a.experts[1].precision == Precision::q4);
  REQUIRE(a.prefetches.size() == 1);
  CHECK(a.prefetches[0].key == ExpertKey{1, 1});
  CHECK(a.prefetches[0].precision == Precision::q4);
  p.resolve(a);
  p.end_layer(ctx(0, 3));
  // Layer 1 needs {1, 0}: its pool holds one expert, so the prefetched 1 hits and 0 is staged.
  const auto& b = p.route(ctx(1, 3), with_hidden(keep, Route(4, {{1, 0}}), {0, 0, 0, 0}));
  CHECK(b.experts[0].hit);  // ready first
  CHECK_FALSE(b.experts[1].hit);
  p.resolve(b);
  p.end_layer(ctx(1, 3));
  CHECK(p.stats().staged == 1);
  p.cache().check_invariants();
}

// Fate's preset pipeline over `budget` bytes, shallow layers `L`, `staging` prefetch staging slots.
std::unique_ptr<presets::Fate<ManualLoader>> fate_pipeline(std::size_t budget, std::uint32_t L,
                                                           std::uint32_t staging) {
  presets::PresetParams q;
  q.shallow_layers = L;
  auto c = presets::FateSpec::configure(shape, Precision::q4, q);
  c.staging_slots = staging;
  presets::PresetInputs in;
  in.routers = identity_routers;
  return presets::FateSpec::build(shape,
                                  {.expert_budget_bytes = budget, .base_precision = Precision::q4},
                                  ManualLoader{}, c, in);
}

TEST_CASE("presets::Fate: a prefetch for a layer with no cache slot is served from staging",
          "[preset][fate][staging]") {
  // 6 q4 experts: 2 staging slots, the cache the other 4, all in shallow layer 0: layers 1 and 2
  // have no slot. (Before staging, a prefetch into such a layer was dropped.)
  auto p = fate_pipeline(6 * q4, 1, 2);
  CHECK(p->cache().policy().layer_slots() == std::vector<std::uint32_t>{4, 0, 0});
  Route keep(4, {{0}});
  // Layer 0's gate input [0, 5, 0, 4] predicts layer 1's expert 1 (above the 75th percentile).
  const auto& a = p->route(ctx(0, 3), with_hidden(keep, Route(4, {{1, 2}}), {0, 5, 0, 4}));
  REQUIRE(a.prefetches.size() == 1);
  CHECK(a.prefetches[0].key == ExpertKey{1, 1});
  CHECK_FALSE(p->cache().resident({1, 1}));  // it waits outside the cache
  p->resolve(a);
  p->end_layer(ctx(0, 3));
  const auto& b = p->route(ctx(1, 3), with_hidden(keep, Route(4, {{1, 0}}), {0, 0, 0, 0}));
  REQUIRE(b.experts.size() == 2);
  CHECK(b.experts[0].key == ExpertKey{1, 1});
  CHECK(b.experts[0].hit);  // served from staging
  CHECK_FALSE(b.experts[1].hit);
  const auto views = p->resolve(b);
  CHECK(std::to_integer<int>(views[0].bytes[0]) == ManualLoader::pattern({1, 1}));
  p->end_layer(ctx(1, 3));
  const auto st = p->stats();
  CHECK(st.prefetches_dropped == 0);
  CHECK(st.hits == 1);
  CHECK(st.staged_prefetch_hits == 1);
  // (1, 1) and layer 1's guess for layer 2, (2, 0): attributed to prefetching.
  CHECK(st.bytes_prefetched == 2 * q4);
  CHECK(st.bytes_demand_loaded == 3 * q4);  // layer 0's two and layer 1's expert 0
  CHECK_FALSE(p->cache().resident({1, 1}));
  p->cache().check_invariants();
}

TEST_CASE("presets::Fate: prefetches do not churn the cache; ARC admits only used ones",
          "[preset][fate][staging]") {
  // 7 q4 experts, 2 staging slots, no shallow layer: 5 cache slots over 3 layers = 2, 2, 1 (the
  // floor remainder to the first layers), so layer 2 holds one expert.
  auto p = fate_pipeline(7 * q4, 0, 2);
  REQUIRE(p->cache().policy().layer_slots() == std::vector<std::uint32_t>{2, 2, 1});
  const ArcPolicy& arc = p->cache().policy().inner();
  Route keep(4, {{0}});
  auto layer = [&](std::uint32_t l, std::uint64_t t, Route r, std::vector<float> hidden) {
    const auto& plan = p->route(ctx(l, 3, t), with_hidden(keep, std::move(r), std::move(hidden)));
    p->resolve(plan);
    p->end_layer(ctx(l, 3, t));
  };
  // Token 0: layer 1 predicts layer 2's expert 2, which layer 2 uses with expert 1: 2 is served
  // from staging and takes the layer's one slot (1 runs from a transient slot).
  layer(0, 0, Route(4, {{0, 1}}), {0, 0, 0, 0});
  layer(1, 0, Route(4, {{0, 1}}), {0, 0, 5, 0});
  layer(2, 0, Route(4, {{2, 1}}), {0, 0, 0, 0});
  REQUIRE(p->cache().resident({2, 2}));
  CHECK(arc.list_of({2, 2}) == ArcList::t1);
  // Token 1: layer 1's gate input predicts layer 2's expert 3, which layer 2 does not use.
  layer(0, 1, Route(4, {{0, 1}}), {0, 0, 0, 0});
  layer(1, 1, Route(4, {{0, 1}}), {0, 0, 0, 5});
  CHECK(p->cache().resident({2, 2}));  // not evicted for a guess
  CHECK(arc.list_of({2, 3}) == ArcList::none);
  layer(2, 1, Route(4, {{2, 1}}), {0, 0, 0, 0});
  CHECK(p->cache().resident({2, 2}));
  CHECK(arc.list_of({2, 3}) == ArcList::none);  // ARC never saw the guess
  CHECK(p->stats().prefetches_unused == 1);     // freed (ManualLoader completes at once)
  CHECK(p->stats().cache.wasted_prefetches == 0);
  // Token 2: the same prediction, and now layer 2 uses expert 3: served from staging, then
  // admitted as a demand (ARC evicts expert 2 for it, as for any miss).
  layer(0, 2, Route(4, {{0, 1}}), {0, 0, 0, 0});
  layer(1, 2, Route(4, {{0, 1}}), {0, 0, 0, 5});
  const auto& c = p->route(ctx(2, 3, 2), with_hidden(keep, Route(4, {{3, 1}}), {0, 0, 0, 0}));
  REQUIRE(c.experts.size() == 2);
  CHECK(c.experts[0].key == ExpertKey{2, 3});
  CHECK(c.experts[0].hit);
  CHECK(p->cache().resident({2, 3}));
  CHECK(arc.list_of({2, 3}) == ArcList::t1);
  CHECK_FALSE(p->cache().resident({2, 2}));
  const auto views = p->resolve(c);
  CHECK(std::to_integer<int>(views[0].bytes[0]) == ManualLoader::pattern({2, 3}));
  p->end_layer(ctx(2, 3, 2));
  p->cache().check_invariants();
}

TEST_CASE("presets::Fate: a decode miss loads at int2, serves, and is upgraded to int4 when idle",
          "[preset][fate][upgrade]") {
  // The paper's precisions (q4 cache and prefetches, q2 on-demand loads), built as moe-sim builds
  // them; 6 q4 experts with 2 staging slots leave layer 0 four slots.
  presets::FateSpec::Config c;
  c.cache.shallow_layers = 1;
  c.staging_slots = 2;
  presets::PresetInputs in;
  in.routers = identity_routers;
  auto p = presets::FateSpec::build(
      shape, {.expert_budget_bytes = 6 * q4, .base_precision = Precision::q4}, ManualLoader{}, c,
      in);
  Route keep(4, {{0}});
  auto layer = [&](std::uint32_t l, std::uint64_t t, Route r) -> const LayerPlan& {
    const auto& plan = p->route(ctx(l, 3, t), with_hidden(keep, std::move(r), {0, 0, 0, 0}));
    p->resolve(plan);
    p->end_layer(ctx(l, 3, t));
    return plan;
  };
  // Layer 0 misses {1, 2}: on-demand loads at q2, which serve this request and enter layer 0's
  // pool as they are.
  const auto& a = p->route(ctx(0, 3), with_hidden(keep, Route(4, {{1, 2}}), {0, 0, 0, 0}));
  CHECK(a.experts[0].precision == Precision::q2);
  CHECK(p->resolve(a)[0].bytes.size() == shape.expert_bytes(Precision::q2));
  p->end_layer(ctx(0, 3));
  const std::vector<Load> first = loads(p->loader());
  REQUIRE(first.size() >= 2);
  CHECK(first[0] == Load{{0, 1}, Precision::q2, OD});
  CHECK(first[1] == Load{{0, 2}, Precision::q2, OD});
  CHECK(p->cache().entry({0, 1}).precision == Precision::q2);
  // The prediction for layer 1 moves at q4 (decode prefetches are int4).
  REQUIRE(first.size() == 3);
  CHECK(first[2].precision == Precision::q4);
  CHECK(first[2].priority == PF);
  // Nothing is pending when layer 1 routes: the first upgrade, q4 of (0, 1), starts.
  layer(1, 0, Route(4, {{0, 3}}));
  const auto after = loads(p->loader());
  CHECK(std::find(after.begin(), after.end(), Load{{0, 1}, Precision::q4, PF}) != after.end());
  layer(2, 0, Route(4, {{0, 3}}));  // it has completed: (0, 1) is q4 now; (0, 2)'s starts
  CHECK(p->cache().entry({0, 1}).precision == Precision::q4);
  CHECK(p->cache().entry({0, 2}).precision == Precision::q2);
  // Token 1, layer 0 uses {2, 1}: (0, 2)'s upgrade completed as the layer began routing, so both
  // are q4 hits now, served from the upgraded slots.
  const auto& b = p->route(ctx(0, 3, 1), with_hidden(keep, Route(4, {{2, 1}}), {0, 0, 0, 0}));
  CHECK(b.experts[0].hit);
  CHECK(b.experts[1].hit);
  CHECK(b.experts[0].precision == Precision::q4);
  CHECK(b.experts[1].precision == Precision::q4);
  for (const WeightView& v : p->resolve(b)) {
    CHECK(v.bytes.size() == q4);
    CHECK(std::to_integer<int>(v.bytes[0]) == ManualLoader::pattern(v.key));
  }
  p->end_layer(ctx(0, 3, 1));
  const auto st = p->stats();
  CHECK(st.upgrades == 2);
  CHECK(st.bytes_upgraded == 2 * q4);
  p->cache().check_invariants();
}

TEST_CASE("presets::Fate: prefill misses load at int2 too, as decode misses do",
          "[preset][fate][upgrade]") {
  // The paper's precisions (q4 cache and decode prefetches, prefill's least popular quarter of the
  // predicted experts at q2, every on-demand load at q2: §5.3, both stages).
  presets::FateSpec::Config c;
  c.cache.shallow_layers = 1;
  c.staging_slots = 2;
  presets::PresetInputs in;
  in.routers = identity_routers;
  auto p = presets::FateSpec::build(
      shape, {.expert_budget_bytes = 6 * q4, .base_precision = Precision::q4}, ManualLoader{}, c,
      in);
  // Prefill of 4 tokens at layer 0: expert 1 is the most popular (4 tokens); before, the three
  // popular ones loaded at q4 and only the least popular at q2.
  Route keep(4, {{0}});
  Route r(4, {{1, 2}, {1, 3}, {1, 0}, {1, 2}});
  r.hidden.assign(4 * 4, 0.0f);
  keep = r;
  const LayerContext prefill = ctx(0, 3, 0, Phase::prefill, 4);
  const auto& a = p->route(prefill, keep.view());
  REQUIRE(a.experts.size() == 4);
  for (const ExpertPlan& e : a.experts) CHECK(e.precision == Precision::q2);
  p->resolve(a);
  p->end_layer(prefill);
  std::size_t on_demand = 0;
  for (const Load& l : loads(p->loader())) {
    if (l.priority != OD) continue;
    CHECK(l.precision == Precision::q2);
    ++on_demand;
  }
  CHECK(on_demand == 4);
  CHECK(p->stats().misses_by_precision[static_cast<std::size_t>(Precision::q2)] == 4);
  // ... and admitted as they are, each upgraded to q4 later (one at a time while the link idles).
  CHECK(p->cache().entry({0, 1}).precision == Precision::q2);
  p->cache().check_invariants();
}

TEST_CASE("presets::Fate: a prefetch that finds staging full waits for a slot, not dropped",
          "[preset][fate][staging]") {
  // 5 q4 experts: 1 staging slot (--fate-staging-slots 1), the cache the other 4, all in shallow
  // layer 0: layers 1 and 2 have no cache slot.
  auto p = fate_pipeline(5 * q4, 1, 1);
  REQUIRE(p->cache().policy().layer_slots() == std::vector<std::uint32_t>{4, 0, 0});
  Route keep(4, {{0}});
  // Layer 0 predicts layer 1's expert 1, staged in the one slot.
  const auto& a = p->route(ctx(0, 3), with_hidden(keep, Route(4, {{1, 2}}), {0, 5, 0, 0}));
  REQUIRE(a.prefetches.size() == 1);
  p->resolve(a);
  p->end_layer(ctx(0, 3));
  // Layer 1 uses it from staging (no cache slot: the slot serves until the layer ends) and
  // predicts layer 2's expert 2: staging is full, so the prefetch waits (before: dropped, and
  // layer 2's demand missed).
  const auto& b = p->route(ctx(1, 3), with_hidden(keep, Route(4, {{1, 0}}), {0, 0, 5, 0}));
  CHECK(b.experts[0].hit);
  CHECK(b.prefetches.empty());  // not issued yet
  CHECK(p->stats().prefetches_waited == 1);
  p->resolve(b);
  const auto before = loads(p->loader()).size();
  p->end_layer(ctx(1, 3));  // the slot is released: the waiting prefetch takes it
  const auto after = loads(p->loader());
  REQUIRE(after.size() == before + 1);
  CHECK(after.back() == Load{{2, 2}, Precision::q4, PF});
  const auto& c = p->route(ctx(2, 3), with_hidden(keep, Route(4, {{2, 3}}), {0, 0, 0, 0}));
  CHECK(c.experts[0].key == ExpertKey{2, 2});
  CHECK(c.experts[0].hit);  // served from staging
  p->resolve(c);
  p->end_layer(ctx(2, 3));
  const auto st = p->stats();
  CHECK(st.prefetches_dropped == 0);
  CHECK(st.staged_prefetch_hits == 2);
  CHECK(st.prefetches_issued == 2);
  p->cache().check_invariants();

  // A waiting prefetch whose layer routes before a slot frees is dropped: the layer loads it on
  // demand. The 50th percentile predicts two experts of layer 1: one takes the slot, one waits,
  // and the slot is still taken (by the first, waiting for its layer) when layer 1 routes.
  presets::PresetParams params;
  params.shallow_layers = 1;
  params.fate_percentile = 0.5;
  params.fate_staging_slots = 1;
  presets::PresetInputs in;
  in.routers = identity_routers;
  auto q = presets::FateSpec::build(
      shape, {.expert_budget_bytes = 5 * q4, .base_precision = Precision::q4}, ManualLoader{},
      presets::FateSpec::configure(shape, Precision::q4, params), in);
  const auto& d = q->route(ctx(0, 3), with_hidden(keep, Route(4, {{1, 2}}), {0, 5, 4, 0}));
  CHECK(d.prefetches.size() == 1);
  CHECK(q->stats().prefetches_waited == 1);
  q->resolve(d);
  q->end_layer(ctx(0, 3));
  const auto& e = q->route(ctx(1, 3), with_hidden(keep, Route(4, {{1, 2}}), {0, 0, 0, 0}));
  REQUIRE(e.experts.size() == 2);
  CHECK(e.experts[0].hit + e.experts[1].hit == 1);
  CHECK(q->stats().prefetches_dropped == 1);
  CHECK(q->stats().staged_prefetch_hits == 1);
  q->resolve(e);
  q->end_layer(ctx(1, 3));
  q->cache().check_invariants();
}

TEST_CASE("presets::EdgeMoe: per-expert bit widths and activation-path preloading",
          "[preset][edgemoe]") {
  PrecisionTable table(3, 4, Precision::q4);
  table.set({0, 1}, Precision::q8);
  table.set({1, 2}, Precision::q2);
  // Profile: after layer 0 → {1}, layer 1 → {2}, layer 2 always uses expert 3 (seen 10 times).
  auto profile = std::make_shared<ActivationPathProfile>(3, 4, 1);
  for (int i = 0; i < 10; ++i) {
    const std::uint32_t e1[] = {1}, e2[] = {2}, e3[] = {3};
    const std::span<const std::uint32_t> path[] = {e1, e2, e3};
    profile->add_path(path);
  }
  presets::EdgeMoe<ManualLoader> p(
      shape, {.expert_budget_bytes = 6 * q4, .base_precision = Precision::q8}, ManualLoader{},
      StaticBitwidthScorer({.table = table}),
      ActivationPathPredictor(
          {.profile = profile,
           .max_preload = 1,
           .min_support = 1,
           .precisions = std::vector<Precision>(table.all().begin(), table.all().end())}));
  const auto& a = p.route(ctx(0, 3), Route(4, {{1}}, {{1.0f}}).view());
  CHECK(a.experts[0].precision == Precision::q8);
  p.resolve(a);
  p.end_layer(ctx(0, 3));
  const auto& b = p.route(ctx(1, 3), Route(4, {{2}}, {{1.0f}}).view());
  CHECK(b.experts[0].precision == Precision::q2);
  REQUIRE_FALSE(b.prefetches.empty());
  CHECK(b.prefetches[0].key == ExpertKey{2, 3});  // P(E2 = 3 | E0 = 1, E1 = 2) = 1
  CHECK(b.prefetches[0].precision == Precision::q4);
}

TEST_CASE("presets::NextUse: T1/T2 precisions over the ExpectedNextUse cache",
          "[preset][nextuse]") {
  presets::NextUse<ManualLoader> p(shape, {.expert_budget_bytes = 3 * f16}, ManualLoader{});
  p.begin_sequence();
  const auto& a = p.route(ctx(0, 3), Route(4, {{2, 0}}, {{0.8f, 0.2f}}).view());
  CHECK(a.experts[0].precision == Precision::f16);
  CHECK(a.experts[1].precision == Precision::q4);
  p.resolve(a);
  p.end_layer(ctx(0, 3));
  for (std::uint32_t t = 1; t < 20; ++t) {  // a stream that forces evictions
    for (std::uint32_t l = 0; l < 3; ++l) {
      const auto& plan =
          p.route(ctx(l, 3, t), Route(4, {{t % 4, (t + l + 1) % 4}}, {{0.5f, 0.5f}}).view());
      p.resolve(plan);
      p.end_layer(ctx(l, 3, t));
      p.cache().check_invariants();
    }
  }
  CHECK(p.stats().cache.evictions > 0);
  CHECK(p.cache().used_bytes() <= 3 * f16);
}

namespace {
// EdgeMoE through its spec: a profile where every layer uses expert `e` of each token.
presets::PresetInputs edgemoe_inputs(std::vector<double> popularity,
                                     std::shared_ptr<const PrecisionTable> table = nullptr) {
  auto profile = std::make_shared<ActivationPathProfile>(3, 4, 2);
  for (int i = 0; i < 10; ++i) {
    const std::uint32_t e[] = {0, 1};
    const std::span<const std::uint32_t> path[] = {e, e, e};
    profile->add_path(path);
  }
  return {.popularity = std::move(popularity), .paths = profile, .bitwidths = std::move(table)};
}
}  // namespace

TEST_CASE("presets::EdgeMoe: the capacity guard lowers the preloads to what the buffer holds",
          "[preset][edgemoe]") {
  using S = presets::EdgeMoeSpec;
  const auto in = edgemoe_inputs({});
  const auto preloads = [&](std::size_t experts) {
    auto p = S::build(shape, {.expert_budget_bytes = experts * q4, .base_precision = Precision::q4},
                      ManualLoader{}, S::Config{}, in);
    return p->predictor().config().max_preload;
  };
  CHECK(preloads(2 + 3) == 3);  // k + max_preload experts: the paper's three preloads
  CHECK(preloads(2 + 1) == 1);  // room for one preload beside the k on-demand experts
  CHECK(preloads(2) == 0);
  // Fewer than k experts at the widest stored precision: refused, naming the preset and flag.
  auto table = std::make_shared<PrecisionTable>(3, 4, Precision::q4);
  table->set({2, 3}, Precision::q8);  // widest: q8, so 2 q8 experts need more than 3 q4 slots
  const std::size_t q8 = shape.expert_bytes(Precision::q8);
  CHECK_THROWS_WITH(
      S::build(shape, {.expert_budget_bytes = 2 * q8 - 1, .base_precision = Precision::q4},
               ManualLoader{}, S::Config{}, edgemoe_inputs({}, table)),
      Catch::Contains("capacity guard") && Catch::Contains("--expert-budget"));
}

TEST_CASE("presets::EdgeMoe: the buffer starts with the highest-prior experts at their widths",
          "[preset][edgemoe]") {
  using S = presets::EdgeMoeSpec;
  auto table = std::make_shared<PrecisionTable>(3, 4, Precision::q4);
  table->set({1, 2}, Precision::q2);
  // Shares of their layer: (1,2) 0.7, (0,0) 0.5, (0,1) 0.4 = (2,3), then (2,0) 0.2 ...
  std::vector<double> pop = {5, 4, 1, 0, /**/ 1, 1, 7, 1, /**/ 2, 2, 2, 4};
  const std::size_t q2 = shape.expert_bytes(Precision::q2);
  auto p = presets::make_pipeline<S>(
      shape, {.expert_budget_bytes = q2 + 3 * q4, .base_precision = Precision::q4}, {},
      ManualLoader{}, edgemoe_inputs(pop, table));
  CHECK(p->cache().resident_at({1, 2}, Precision::q2));
  CHECK_FALSE(p->cache().resident_at({1, 2}, Precision::q4));  // at its stored width
  CHECK(p->cache().resident({0, 0}));
  CHECK(p->cache().resident({0, 1}));  // share 0.4, tied with (2, 3): the smaller layer first
  CHECK(p->cache().resident({2, 3}));
  CHECK(p->cache().used_bytes() == q2 + 3 * q4);
  CHECK(p->stats().bytes_preloaded == q2 + 3 * q4);
  // The buffer is full: the next expert by prior, (0, 2) or (1, x), is not resident.
  CHECK_FALSE(p->cache().resident({2, 0}));
  // Without a prior nothing is placed.
  auto q = presets::make_pipeline<S>(
      shape, {.expert_budget_bytes = 8 * q4, .base_precision = Precision::q4}, {}, ManualLoader{},
      edgemoe_inputs({}));
  CHECK(q->cache().used_bytes() == 0);
}
