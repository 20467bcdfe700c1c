// The nextuse-fit preset (presets/nextuse_fit.hpp): registered, built through the registry with
// its fitted ExpectedNextUse statistics, and running the NextUse pipeline.

#include <catch2/catch.hpp>

#include <cstdint>
#include <string_view>

#include "moekit/presets.hpp"
#include "support/manual_loader.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::ManualLoader;
using test::Route;

namespace {
constexpr ModelShape fit_shape{.n_layers = 3, .n_experts = 4, .top_k = 2, .hidden = 4, .ffn = 32};
}  // namespace

TEST_CASE("nextuse-fit: registered after nextuse, configured with the fitted statistics",
          "[preset][nextuse-fit]") {
  const presets::PresetEntry* e = presets::find("nextuse-fit");
  REQUIRE(e != nullptr);
  CHECK(presets::is<presets::NextUseFitSpec>(*e));
  CHECK(presets::index_of<presets::NextUseFitSpec> == presets::index_of<presets::NextUseSpec> + 1);
  const auto c = presets::NextUseFitSpec::configure(fit_shape, Precision::f16, {});
  CHECK(c.cache.gamma == 0.5);  // bench/RESULTS.md, issue 25: GSM8K trace at 128 of 256 slots
  CHECK(c.cache.prior == 8.0);
  // Everything else is NextUse's: the same precisions rule.
  const auto n = presets::NextUseSpec::configure(fit_shape, Precision::f16, {});
  CHECK(c.rule.t1 == n.rule.t1);
  CHECK(c.rule.t2 == n.rule.t2);
  CHECK(c.rule.low == n.rule.low);
}

TEST_CASE("nextuse-fit: runs a stream with evictions within its budget", "[preset][nextuse-fit]") {
  const std::size_t f16 = fit_shape.expert_bytes(Precision::f16);
  auto p = presets::make_pipeline<presets::NextUseFitSpec>(
      fit_shape, {.expert_budget_bytes = 3 * f16}, {}, ManualLoader{}, {});
  p->begin_sequence();
  for (std::uint32_t t = 0; t < 20; ++t) {
    for (std::uint32_t l = 0; l < 3; ++l) {
      const auto& plan =
          p->route(ctx(l, 3, t), Route(4, {{t % 4, (t + l + 1) % 4}}, {{0.5f, 0.5f}}).view());
      p->resolve(plan);
      p->end_layer(ctx(l, 3, t));
      p->cache().check_invariants();
    }
  }
  CHECK(p->stats().cache.evictions > 0);
  CHECK(p->cache().used_bytes() <= 3 * f16);
}
