#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/predict/router_stack.hpp"

using namespace moekit;

namespace {
std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::generic, Isa::avx2, Isa::avx512})
    if (isa_supported(i)) out.push_back(i);
  return out;
}
}  // namespace

TEST_CASE("RouterStack: every kernel path equals the double-precision product, odd shapes",
          "[predict][router_stack]") {
  const std::uint32_t seed = 7;
  INFO("seed " << seed);
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  // E below, at and above one 8-row panel; d with and without a 16-column tail.
  for (std::uint32_t E : {3u, 8u, 12u, 60u})
    for (std::uint32_t d : {1u, 17u, 64u, 100u}) {
      const std::uint32_t L = 4, T = 3;
      std::vector<float> w(std::size_t{L} * E * d), x(std::size_t{T} * d);
      for (auto& v : w) v = n(g);
      for (auto& v : x) v = n(g);
      for (Isa isa : supported_isas()) {
        INFO("E " << E << " d " << d << " isa " << name(isa));
        const RouterStack rs(w, L, E, d, "test", isa);
        REQUIRE(rs.isa() == isa);
        for (std::uint32_t first = 0; first < L; ++first)
          for (std::uint32_t count = 0; first + count <= L; ++count) {
            std::vector<float> out;
            rs.logits(first, count, x, T, out);
            REQUIRE(out.size() == std::size_t{T} * count * E);
            for (std::uint32_t t = 0; t < T; ++t)
              for (std::uint32_t j = 0; j < count; ++j)
                for (std::uint32_t e = 0; e < E; ++e) {
                  double ref = 0;
                  for (std::uint32_t c = 0; c < d; ++c)
                    ref += double(w[(std::size_t{first + j} * E + e) * d + c]) *
                           x[std::size_t{t} * d + c];
                  const float got = out[(std::size_t{t} * count + j) * E + e];
                  CHECK(got == Approx(ref).margin(1e-4 * (1 + d)));
                  // the same layer alone, the same token alone: bit-identical
                  std::vector<float> one;
                  rs.logits(first + j, 1, std::span<const float>(x).subspan(t * d, d), 1, one);
                  CHECK(got == one[e]);
                }
          }
      }
    }
}

TEST_CASE("RouterStack: owns its packed copy; bad input names the field",
          "[predict][router_stack]") {
  const std::uint32_t L = 2, E = 8, d = 16;
  std::vector<float> w(std::size_t{L} * E * d, 0.0f);
  w[(std::size_t{1} * E + 3) * d + 5] = 2.0f;  // layer 1, expert 3, column 5
  const RouterStack rs(w, L, E, d, "Thing");
  std::fill(w.begin(), w.end(), 9.0f);  // the source may change or die after construction
  std::vector<float> x(d, 0.0f), out;
  x[5] = 1.5f;
  rs.logits(1, 1, x, 1, out);
  REQUIRE(out.size() == E);
  for (std::uint32_t e = 0; e < E; ++e) CHECK(out[e] == (e == 3 ? 3.0f : 0.0f));

  CHECK_THROWS_WITH(RouterStack(std::span<const float>(w).first(5), L, E, d, "Thing"),
                    Catch::Contains("Thing: Config.router_weights must hold"));
  CHECK_THROWS_WITH(RouterStack(w, 0, E, d, "Thing"), Catch::Contains("Config.n_layers"));
  CHECK_THROWS_WITH(rs.logits(1, 2, x, 1, out), Catch::Contains("router layers out of range"));
  CHECK_THROWS_WITH(rs.logits(0, 1, x, 2, out), Catch::Contains("fewer than n_tokens x hidden"));
  const std::uint32_t ids[2] = {0, 1};
  const float wts[2] = {0.5f, 0.5f};
  GateView no_hidden{1, 2, E, {}, ids, wts, {}};
  CHECK_THROWS_WITH(rs.check_gate_input(no_hidden),
                    Catch::Contains("Thing: GateView.hidden must hold the gate input (16"));
  GateView ok{1, 2, E, {}, ids, wts, x};
  CHECK_NOTHROW(rs.check_gate_input(ok));
}
