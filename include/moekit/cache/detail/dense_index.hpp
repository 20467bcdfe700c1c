#pragma once
/// \file Dense index <-> ExpertKey for a model with a fixed number of experts per layer.

#include <cstdint>

#include "moekit/core/expert_key.hpp"

namespace moekit::detail {

[[nodiscard]] constexpr std::uint32_t dense_index(ExpertKey k, std::uint32_t n_experts) noexcept {
  return k.layer * n_experts + k.expert;
}
[[nodiscard]] constexpr ExpertKey dense_key(std::uint32_t i, std::uint32_t n_experts) noexcept {
  return ExpertKey{i / n_experts, i % n_experts};
}

}  // namespace moekit::detail
