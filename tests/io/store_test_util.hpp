#pragma once
// A small model shape and a deterministic fake encoder for the expert-store and loader tests.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "moekit/core/expert_key.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"

namespace moekit::test {

/// 2 layers × 3 experts, hidden 64, ffn 32: f16 experts are 12288 bytes, q4 experts 3456.
inline constexpr ModelShape tiny_shape{
    .n_layers = 2, .n_experts = 3, .top_k = 1, .hidden = 64, .ffn = 32};

/// Deterministic stand-in for a quantizer: bytes depend on key, precision and position.
inline std::vector<std::byte> fake_expert(const ModelShape& s, ExpertKey k, Precision p) {
  std::vector<std::byte> out(s.expert_bytes(p));
  std::uint32_t x =
      2654435761u * (k.layer + 1) ^ 40503u * (k.expert + 7) ^ 977u * static_cast<std::uint32_t>(p);
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::byte>(x & 0xFF);
  }
  return out;
}

}  // namespace moekit::test
