#pragma once
/// \file FullTopK: the default token policy — every token uses the model's top-k, never falls back.

#include <cstdint>
#include <span>
#include <string_view>

#include "moekit/core/concepts.hpp"

namespace moekit {

/// Every token selects the model's `top_k` experts; every token is accepted.
struct FullTopK {
  static constexpr std::string_view name = "full-top-k";
  [[nodiscard]] std::uint32_t active_top_k(const LayerContext&, std::uint32_t k) const noexcept {
    return k;
  }
  [[nodiscard]] TokenVerdict end_token(std::span<const float>) const noexcept {
    return TokenVerdict::accept;
  }
};
static_assert(TokenPolicy<FullTopK>);

}  // namespace moekit
