#pragma once
/// \file GateView: the router's output for one layer call (one or more tokens), non-owning.

#include <cstdint>
#include <span>

#include "moekit/error.hpp"

namespace moekit {

/// The router's decision for one token at one layer.
struct TokenRoute {
  std::span<const float> logits{};           ///< all router logits [n_experts] (may be empty)
  std::span<const std::uint32_t> experts{};  ///< selected experts, by descending weight
  std::span<const float> weights{};          ///< their normalised weights (same order)
  std::span<const float> hidden{};           ///< gate input hidden state [hidden] (may be empty)
};

/// Router output for the `n_tokens` tokens of one forward at one layer, row-major per token:
/// `logits` is [n_tokens × n_experts] (optional), `experts` and `weights` are [n_tokens × k]
/// (k may be below the model's top-k when a token policy narrows it), `hidden` is
/// [n_tokens × hidden] (optional). The engine owns the memory; a view lives for one `route` call.
struct GateView {
  std::uint32_t n_tokens = 1;
  std::uint32_t k = 0;          ///< experts selected per token in this call
  std::uint32_t n_experts = 0;  ///< routed experts of the layer (width of a logits row)
  std::span<const float> logits{};
  std::span<const std::uint32_t> experts{};
  std::span<const float> weights{};
  std::span<const float> hidden{};

  [[nodiscard]] bool has_logits() const noexcept { return !logits.empty(); }
  [[nodiscard]] bool has_hidden() const noexcept { return !hidden.empty(); }
  [[nodiscard]] std::size_t hidden_size() const noexcept {
    return n_tokens == 0 ? 0 : hidden.size() / n_tokens;
  }

  /// The decision for token `t` of this forward.
  [[nodiscard]] TokenRoute token(std::uint32_t t) const noexcept {
    TokenRoute r;
    r.experts = experts.subspan(std::size_t{t} * k, k);
    r.weights = weights.subspan(std::size_t{t} * k, k);
    if (has_logits()) r.logits = logits.subspan(std::size_t{t} * n_experts, n_experts);
    if (has_hidden()) {
      const std::size_t h = hidden_size();
      r.hidden = hidden.subspan(std::size_t{t} * h, h);
    }
    return r;
  }

  /// Throws `moekit::Error` naming the first inconsistent field.
  void validate() const {
    MOEKIT_EXPECTS(n_tokens > 0, "GateView.n_tokens must be > 0");
    MOEKIT_EXPECTS(k > 0 && k <= n_experts, "GateView.k must be in [1, n_experts]");
    MOEKIT_EXPECTS(experts.size() == std::size_t{n_tokens} * k,
                   "GateView.experts must hold n_tokens × k ids");
    MOEKIT_EXPECTS(weights.size() == experts.size(),
                   "GateView.weights must match GateView.experts");
    MOEKIT_EXPECTS(logits.empty() || logits.size() == std::size_t{n_tokens} * n_experts,
                   "GateView.logits must be empty or hold n_tokens × n_experts values");
    MOEKIT_EXPECTS(hidden.empty() || hidden.size() % n_tokens == 0,
                   "GateView.hidden must be empty or hold n_tokens rows");
    for (std::uint32_t e : experts)
      MOEKIT_EXPECTS(e < n_experts, "GateView.experts holds an id >= n_experts");
  }
};

}  // namespace moekit
