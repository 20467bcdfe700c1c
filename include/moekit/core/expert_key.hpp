#pragma once
/// \file ExpertKey: names one routed expert of one MoE layer.

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace moekit {

/// One expert of one MoE layer. Layers count MoE layers only, from 0.
struct ExpertKey {
  std::uint32_t layer = 0;
  std::uint32_t expert = 0;

  friend constexpr auto operator<=>(const ExpertKey&, const ExpertKey&) = default;
};

}  // namespace moekit

template <>
struct std::hash<moekit::ExpertKey> {
  std::size_t operator()(const moekit::ExpertKey& k) const noexcept {
    return std::hash<std::uint64_t>{}((std::uint64_t{k.layer} << 32) | k.expert);
  }
};
