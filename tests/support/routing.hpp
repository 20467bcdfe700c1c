#pragma once
// Helpers to hand-write routing for scenario tests: a Route owns the arrays a GateView points to.

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "moekit/core/gate_view.hpp"
#include "moekit/core/layer_context.hpp"

namespace moekit::test {

/// One layer call: per token, the selected experts with their weights (descending).
struct Route {
  std::uint32_t n_experts = 0;
  std::uint32_t k = 0;
  std::vector<std::uint32_t> experts;
  std::vector<float> weights;
  std::vector<float> logits;
  std::vector<float> hidden;
  std::uint32_t n_tokens = 0;

  Route(std::uint32_t n_experts_, std::initializer_list<std::initializer_list<std::uint32_t>> ids,
        std::initializer_list<std::initializer_list<float>> ws = {})
      : n_experts(n_experts_) {
    for (auto& t : ids) {
      k = static_cast<std::uint32_t>(t.size());
      for (auto e : t) experts.push_back(e);
      ++n_tokens;
    }
    if (ws.size() == 0) {
      for (std::uint32_t t = 0; t < n_tokens; ++t)
        for (std::uint32_t j = 0; j < k; ++j) weights.push_back(1.0f / float(k));
    } else {
      for (auto& t : ws)
        for (auto w : t) weights.push_back(w);
    }
  }
  [[nodiscard]] GateView view() const {
    GateView g;
    g.n_tokens = n_tokens;
    g.k = k;
    g.n_experts = n_experts;
    g.experts = experts;
    g.weights = weights;
    g.logits = logits;
    g.hidden = hidden;
    return g;
  }
};

inline LayerContext ctx(std::uint32_t layer, std::uint32_t n_layers, std::uint64_t token = 0,
                        Phase phase = Phase::decode, std::uint32_t n_tokens = 1) {
  return LayerContext{layer, n_layers, token, phase, 0, n_tokens};
}

}  // namespace moekit::test
