// HOBBIT's cache as the paper keeps it (Tang et al., arXiv:2411.01433, §3.3): the LHU record
// counts high-precision uses only (in a prefill forward, the tokens that asked high), and the
// high-precision pool is the larger one. Scripted scenarios through the pipeline and the preset's
// spec.
#include <catch2/catch.hpp>

#include <vector>

#include "moekit/presets.hpp"
#include "support/manual_loader.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::ManualLoader;
using test::Route;

namespace hobbit_paper_test {
constexpr ModelShape tiny{.n_layers = 3, .n_experts = 4, .top_k = 2, .hidden = 4, .ffn = 32};
}  // namespace hobbit_paper_test

TEST_CASE("HOBBIT LHU: a skip or low request served by a resident high copy is not a high use",
          "[preset][hobbit][lhu]") {
  using Pipeline = OffloadPipeline<HobbitThresholdScorer, NoPredictor, MultiDimPolicy, ManualLoader,
                                   OnDemandScheduler>;
  using hobbit_paper_test::tiny;
  const std::size_t budget =
      4 * tiny.expert_bytes(Precision::f16) + 4 * tiny.expert_bytes(Precision::q4);
  Pipeline p(tiny, {.expert_budget_bytes = budget}, ManualLoader{}, HobbitThresholdScorer{},
             NoPredictor{}, MultiDimPolicy{});
  p.begin_sequence();
  auto run = [&](Route r) {
    const auto& plan = p.route(ctx(0, 3), r.view());
    p.resolve(plan);
    p.end_layer(ctx(0, 3));
    p.end_token({});
    return plan.experts;
  };
  // Token 1: weights 0.5/0.5, the second expert's cumulative weight 0.5 <= T1: both high (f16).
  run(Route(4, {{2, 0}}, {{0.5f, 0.5f}}));
  const ExpertKey e0{0, 0};
  CHECK(p.cache().resident_at(e0, Precision::f16));
  CHECK(p.cache().policy().record(e0).high_uses == 1);
  // Token 2: 0.95 > T2: expert 0 is skipped, but its resident f16 copy runs (free compute).
  auto two = run(Route(4, {{2, 0}}, {{0.95f, 0.05f}}));
  CHECK(two[1].hit);
  CHECK(two[1].precision == Precision::f16);
  CHECK(p.cache().policy().record(e0).uses == 2);
  CHECK(p.cache().policy().record(e0).high_uses == 1);  // was 2: the served copy was counted
  // Token 3: 0.8 in (T1, T2]: a low request, served by the f16 copy.
  auto three = run(Route(4, {{2, 0}}, {{0.8f, 0.2f}}));
  CHECK(three[1].hit);
  CHECK(p.cache().policy().record(e0).uses == 3);
  CHECK(p.cache().policy().record(e0).high_uses == 1);
  // The top-1 expert, high every time.
  CHECK(p.cache().policy().record({0, 2}).high_uses == 3);
  CHECK(p.stats().misses == 2);
}

TEST_CASE("HOBBIT LHU in prefill: only the tokens that asked high are high uses",
          "[preset][hobbit][lhu]") {
  using Pipeline = OffloadPipeline<HobbitThresholdScorer, NoPredictor, MultiDimPolicy, ManualLoader,
                                   OnDemandScheduler>;
  using hobbit_paper_test::tiny;
  const std::size_t budget = 16 * tiny.expert_bytes(Precision::f16);  // every expert fits
  Pipeline p(tiny, {.expert_budget_bytes = budget}, ManualLoader{}, HobbitThresholdScorer{},
             NoPredictor{}, MultiDimPolicy{});
  p.begin_sequence();
  // A prefill forward of 4 tokens: expert 0 is token 1's top-1 (high) and tokens 2-4's second
  // expert at cumulative weight 0.8 (low). The forward loads it high for token 1 and all four run
  // it; LHU's H counts the one use that asked high (was 4: every token of an expert any token
  // asked high for), F all four.
  const Route r(4, {{0, 1}, {2, 0}, {3, 0}, {1, 0}},
                {{0.8f, 0.2f}, {0.8f, 0.2f}, {0.8f, 0.2f}, {0.8f, 0.2f}});
  const auto& plan = p.route(ctx(0, 3, 0, Phase::prefill, 4), r.view());
  p.resolve(plan);
  p.end_layer(ctx(0, 3, 0, Phase::prefill, 4));
  const ExpertKey e0{0, 0};
  CHECK(p.cache().entry(e0).precision == Precision::f16);
  CHECK(p.cache().policy().record(e0).uses == 4);
  CHECK(p.cache().policy().record(e0).high_uses == 1);
  // Expert 1: token 1's low second (0.8) and token 4's high top-1: one high use of two.
  CHECK(p.cache().policy().record({0, 1}).uses == 2);
  CHECK(p.cache().policy().record({0, 1}).high_uses == 1);
  // The next forward, hits: the same count (2 tokens ask expert 0 low, 1 high).
  const Route hit(4, {{0, 2}, {2, 0}, {3, 0}}, {{0.9f, 0.1f}, {0.7f, 0.3f}, {0.7f, 0.3f}});
  const auto& again = p.route(ctx(0, 3, 4, Phase::prefill, 3), hit.view());
  CHECK(again.experts[0].hit);
  p.resolve(again);
  p.end_layer(ctx(0, 3, 4, Phase::prefill, 3));
  CHECK(p.cache().policy().record(e0).uses == 7);
  CHECK(p.cache().policy().record(e0).high_uses == 2);
}

TEST_CASE("HOBBIT's high-precision pool is larger by default and settable (--hobbit-high-pool)",
          "[preset][hobbit]") {
  using presets::HobbitSpec;
  const ModelShape mixtral{
      .n_layers = 32, .n_experts = 8, .top_k = 2, .hidden = 4096, .ffn = 14336};
  const std::size_t bh = mixtral.expert_bytes(Precision::f16);
  const std::size_t bl = mixtral.expert_bytes(Precision::q4);
  presets::PresetParams q;
  auto pools = [&](const presets::PresetParams& params, std::size_t budget) {
    const auto cfg = HobbitSpec::configure(mixtral, Precision::f16, params);
    return HobbitSpec::cache(cfg).pool_capacities(mixtral, budget, Precision::f16);
  };
  // 97 slots' worth of bytes (and half a low slot): the paper's 67 : 30 split of high and low
  // decisions gives 67 high slots and 30 low ones (was 50 : 50).
  const auto by_default = pools(q, 67 * bh + 30 * bl + bl / 2);
  CHECK(by_default[0] == 67 * bh);
  CHECK(by_default[1] == 30 * bl + bl / 2);
  q.high_slot_fraction = 0.5;
  const auto equal = pools(q, 10 * (bh + bl) + 5);
  CHECK(equal[0] == 10 * bh);
  CHECK(equal[1] == 10 * bl + 5);
  q.high_slot_fraction = 1.5;
  CHECK_THROWS_WITH(presets::check_params(q), Catch::Contains("--hobbit-high-pool"));
}
