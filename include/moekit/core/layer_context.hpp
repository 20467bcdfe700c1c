#pragma once
/// \file LayerContext: where in the model and the sequence a routing decision is made.

#include <cstdint>

namespace moekit {

/// Prefill processes the prompt (many tokens per forward); decode generates one token per forward.
enum class Phase : std::uint8_t { prefill, decode };

/// Everything a component may need to know about the position of the current layer call.
struct LayerContext {
  std::uint32_t layer = 0;        ///< MoE layer index, from 0
  std::uint32_t n_layers = 0;     ///< MoE layers in the model
  std::uint64_t token_index = 0;  ///< position of the (first) token of this forward in the sequence
  Phase phase = Phase::decode;
  std::uint64_t sequence_id = 0;  ///< changes when a new sequence (request) begins
  std::uint32_t n_tokens = 1;     ///< tokens in this forward (1 in decode)

  [[nodiscard]] constexpr bool is_last_layer() const noexcept { return layer + 1 == n_layers; }
};

}  // namespace moekit
