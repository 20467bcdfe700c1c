// ModelShape (core/model_shape.hpp): expert sizes per precision and validation.

#include <catch2/catch.hpp>

#include "moekit/core/model_shape.hpp"

using namespace moekit;

TEST_CASE("ModelShape gives Mixtral's expert sizes", "[core]") {
  CHECK(mixtral_8x7b.expert_bytes(Precision::f16) == 352'321'536u);
  CHECK(mixtral_8x7b.expert_bytes(Precision::q8) == 187'170'816u);  // Q8_0-like, 8.5 bits
  CHECK(mixtral_8x7b.expert_bytes(Precision::q4) == 99'090'432u);   // Q4_0-like, 4.5 bits
  ModelShape bad{.n_layers = 2, .n_experts = 4, .top_k = 2, .hidden = 64, .ffn = 128};
  bad.top_k = 5;  // more than the 4 experts
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("top_k"));
}
