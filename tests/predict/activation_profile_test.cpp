#include <catch2/catch.hpp>

#include <vector>

#include "moekit/tools/activation_profile.hpp"

using namespace moekit;
using sim::RoutingTrace;
using sim::TraceDims;

namespace {
// A top-2 trace over 4 layers where layer n's experts are a function of layer n-1's.
RoutingTrace chain_trace(std::size_t prefill, std::size_t decode) {
  RoutingTrace t(TraceDims{.n_layers = 4, .n_experts = 8, .top_k = 2}, "chain");
  t.begin_sequence("s0");
  const float w[2] = {0.75f, 0.25f};
  for (std::size_t i = 0; i < prefill + decode; ++i) {
    const std::size_t tok = t.append_token(i < prefill ? Phase::prefill : Phase::decode);
    std::uint32_t a = static_cast<std::uint32_t>(i % 8);
    for (std::uint32_t l = 0; l < 4; ++l) {
      const std::uint32_t ids[2] = {a, (a + 3) % 8};
      t.set_route(tok, l, ids, w);
      a = (a * 5 + 1) % 8;  // deterministic successor
    }
  }
  return t;
}
}  // namespace

TEST_CASE("Activation profile builder: counts from a trace, selection of tokens",
          "[tools][edgemoe]") {
  const RoutingTrace t = chain_trace(16, 24);
  const auto decode_only = tools::build_activation_profile(t);
  const auto* m = decode_only.find(0, {}, {});
  REQUIRE(m);
  CHECK(m->total == 24);
  tools::TraceSelection both{.prefill = true, .decode = true};
  CHECK(tools::build_activation_profile(t, both).find(0, {}, {})->total == 40);
  // a missing record contributes to no key that involves it
  RoutingTrace gap = chain_trace(0, 8);
  gap.clear_route(3, 1);
  const auto g = tools::build_activation_profile(gap);
  CHECK(g.find(1, {}, {})->total == 7);
  CHECK(g.find(2, {}, {})->total == 8);
  std::uint64_t path2_tokens = 0;
  for (std::uint32_t a = 0; a < 8; ++a) {
    const std::uint32_t s0[2] = {std::min(a, (a + 3) % 8), std::max(a, (a + 3) % 8)};
    const std::uint32_t b = (a * 5 + 1) % 8;
    const std::uint32_t s1[2] = {std::min(b, (b + 3) % 8), std::max(b, (b + 3) % 8)};
    if (const auto* c = g.find(2, s0, s1)) path2_tokens += c->total;
  }
  CHECK(path2_tokens == 7);
}

TEST_CASE("Activation profile: fit on prefill, measure on decode of a deterministic trace",
          "[tools][edgemoe]") {
  const RoutingTrace t = chain_trace(16, 24);
  const auto prof = tools::build_activation_profile(t, {.prefill = true, .decode = false});
  const auto acc =
      tools::evaluate_activation_path(prof, t, {.prefill = false, .decode = true}, 2, 1);
  CHECK(acc.queries == 24 * 3);
  CHECK(acc.truth == 24 * 3 * 2);
  CHECK(acc.recall() == 1.0);  // the path is a function of the previous layer
  CHECK(acc.top1_recall() == 1.0);
  CHECK(acc.by_source[0] == 24 * 2);  // layers 2, 3 from path2
  CHECK(acc.by_source[1] == 24);      // layer 1 from path1
  // with a budget of 1 only half the true experts can be covered
  const auto one =
      tools::evaluate_activation_path(prof, t, {.prefill = false, .decode = true}, 1, 1);
  CHECK(one.recall() == 0.5);
}
