// EdgeMoePolicy (cache/edgemoe.hpp): EdgeMoE's frequency-over-distance eviction score.
// Exact worked examples through ExpertCache (helpers: cache_test_support.hpp).

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "cache/cache_test_support.hpp"
#include "moekit/cache/edgemoe.hpp"

using namespace moekit;
using namespace moekit::test;

// ---- EdgeMoE ------------------------------------------------------------------------------------

TEST_CASE("EdgeMoE eviction score: distance variants and i == I (edgemoe.md §7.9-10)",
          "[cache][edgemoe]") {
  const ModelShape six{.n_layers = 6, .n_experts = 4, .top_k = 1, .hidden = 64, .ffn = 128};
  const std::size_t b = six.expert_bytes(Precision::f16);
  for (auto variant : {EdgeMoeDistance::forward, EdgeMoeDistance::as_printed}) {
    ExpertCache<EdgeMoePolicy> c(six, 2 * b, Precision::f16, EdgeMoePolicy({.distance = variant}));
    use(c, {3, 0}, Precision::f16, 2);  // equal frequencies
    use(c, {1, 0}, Precision::f16, 2);
    const EdgeMoePolicy& p = c.policy();
    if (variant == EdgeMoeDistance::forward) {
      CHECK(p.distance(3, 2) == 1);
      CHECK(p.distance(1, 2) == 5);
      CHECK(p.score({3, 0}, 2) == Approx(-1.0));
      CHECK(p.score({1, 0}, 2) == Approx(-0.2));
    } else {
      CHECK(p.distance(3, 2) == 5);
      CHECK(p.distance(1, 2) == 1);
    }
    CHECK(p.distance(2, 2) == 6);  // i == I: next needed one full pass later
    use(c, {2, 1}, Precision::f16, 2);
    if (variant == EdgeMoeDistance::forward) {
      CHECK(c.resident({3, 0}));
      CHECK_FALSE(c.resident({1, 0}));
    } else {
      CHECK(c.resident({1, 0}));
      CHECK_FALSE(c.resident({3, 0}));
    }
  }
}

TEST_CASE("EdgeMoE: frequency dominates at equal distance; the prior seeds f", "[cache][edgemoe]") {
  const ModelShape six{.n_layers = 6, .n_experts = 4, .top_k = 1, .hidden = 64, .ffn = 128};
  const std::size_t b = six.expert_bytes(Precision::f16);
  // Score table while layer 0 runs (forward distance d = layer):
  //  (4,0): f = 3, d = 4 → −0.75     (4,1): f = 1, d = 4 → −0.25     (1,0): f = 1, d = 1 → −1
  ExpertCache<EdgeMoePolicy> c(six, 3 * b, Precision::f16);
  for (int i = 0; i < 3; ++i) use(c, {4, 0}, Precision::f16, 0);
  use(c, {4, 1}, Precision::f16, 0);
  use(c, {1, 0}, Precision::f16, 0);
  CHECK(c.policy().score({4, 0}, 0) == Approx(-0.75));
  CHECK(c.policy().score({4, 1}, 0) == Approx(-0.25));
  CHECK(c.policy().score({1, 0}, 0) == Approx(-1.0));
  use(c, {0, 2}, Precision::f16, 0);
  CHECK_FALSE(c.resident({4, 1}));  // the highest score
  CHECK(c.resident({4, 0}));

  std::vector<double> prior(24, 1.0);
  prior[5 * 4 + 2] = 5.0;  // layer 5: expert 2 has 5/8 of the layer's traffic
  EdgeMoePolicy p({.prior_counts = prior, .prior_weight = 100.0});
  p.bind(six);
  CHECK(p.frequency({5, 2}) == Approx(62.5));
  CHECK(p.frequency({5, 0}) == Approx(12.5));
  CHECK_THROWS_WITH(EdgeMoePolicy({.prior_counts = {1.0}}).bind(six),
                    Catch::Contains("prior_counts"));
}
