#pragma once
// A random RoutingTrace with every optional array the caller asks for and some missing records:
// for tests of the trace's layout, readers and transformations (fill_missing_records).

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "moekit/sim/trace.hpp"

namespace moekit::test {

/// Its shape: layers, experts (top-2), sequences of `tokens` tokens whose first `prefill` are
/// prefill, and one record in `gap` missing on average (gap 1: every record).
struct RandomTraceShape {
  std::uint32_t n_layers = 3, n_experts = 6;
  int sequences = 2, tokens = 5, prefill = 2;
  unsigned gap = 7;
};

/// Records drawn from `seed`: two distinct experts, random normalised weights, logits when
/// `logits`, a hidden state of `hidden` values.
inline sim::RoutingTrace random_trace(std::uint64_t seed, bool logits, std::uint32_t hidden,
                                      const RandomTraceShape& shape = {}) {
  std::mt19937_64 rng(seed);
  const std::uint32_t E = shape.n_experts;
  const sim::TraceDims d{.n_layers = shape.n_layers,
                         .n_experts = E,
                         .top_k = 2,
                         .hidden = hidden,
                         .has_logits = logits};
  sim::RoutingTrace t(d, "random-" + std::to_string(seed), seed % 2 == 0);
  std::uniform_real_distribution<float> u(0.01f, 1.0f);
  for (int s = 0; s < shape.sequences; ++s) {
    t.begin_sequence("seq" + std::to_string(s));
    for (int i = 0; i < shape.tokens; ++i) {
      const auto g = t.append_token(i < shape.prefill ? Phase::prefill : Phase::decode);
      for (std::uint32_t l = 0; l < d.n_layers; ++l) {
        if (rng() % shape.gap == 0) continue;  // missing record
        const auto a = static_cast<std::uint32_t>(rng() % E);
        const auto b = static_cast<std::uint32_t>((a + 1 + rng() % (E - 1)) % E);
        std::vector<std::uint32_t> ids{a, b};
        std::vector<float> w{u(rng), u(rng)};
        sim::normalize_route(ids, w);
        std::vector<float> lg(logits ? E : 0), hd(hidden);
        for (auto& x : lg) x = u(rng) * 4 - 2;
        for (auto& x : hd) x = u(rng) - 0.5f;
        t.set_route(g, l, ids, w, lg, hd);
      }
    }
  }
  return t;
}

}  // namespace moekit::test
