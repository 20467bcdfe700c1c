#pragma once
/// \file GGUF's Q6_K block format (`Precision::q6_k`), byte for byte as ggml stores it, so a
/// GGUF tensor's rows are used as they lie in the file.
///
/// Super-block of 256 weights, 210 bytes (ggml's block_q6_K, read from ggml-common.h and
/// reimplemented; layout notes in io/dequantize.hpp):
///   [128 bytes ql: low 4 bits][64 bytes qh: high 2 bits][16 int8 scales][f16 d]
/// Weight i, in half h = i / 128 at k = i % 128: low bits are nibble k / 64 of ql[64h + k % 64],
/// high bits are bits 2·(k / 32) .. +1 of qh[32h + k % 32]; q ∈ [0, 63] and, with s = i / 16,
/// w = (d·scales[s])·(q − 32), each product rounded to f32 as gguf-py's `dequantize` rounds it:
/// the values are gguf-py's bit for bit (tests/precision/gguf_kquant_test.cpp).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/precision/half.hpp"

namespace moekit::q6_k {

inline constexpr std::size_t block_weights = 256;
inline constexpr std::size_t block_bytes = 210;
inline constexpr std::size_t high_offset = 128;    ///< qh[64]
inline constexpr std::size_t scales_offset = 192;  ///< int8 scales[16]
inline constexpr std::size_t d_offset = 208;       ///< f16 d

inline float d_of(const std::byte* block) noexcept {
  std::uint16_t h;
  std::memcpy(&h, block + d_offset, 2);
  return half_bits_to_float(h);
}

/// The int8 scale of sub-block s (0..15, weights 16s .. 16s+15).
inline int scale(const std::byte* block, std::size_t s) noexcept {
  return static_cast<std::int8_t>(std::to_integer<std::uint8_t>(block[scales_offset + s]));
}

/// The unsigned 6-bit code (0..63) of weight i.
inline unsigned code(const std::byte* block, std::size_t i) noexcept {
  const std::size_t h = i / 128, k = i % 128;
  const auto low = std::to_integer<unsigned>(block[64 * h + k % 64]) >> (4 * (k / 64)) & 15;
  const auto high =
      std::to_integer<unsigned>(block[high_offset + 32 * h + k % 32]) >> (2 * (k / 32)) & 3;
  return low | high << 4;
}

/// Weight i (0..255) of one block.
inline float weight(const std::byte* block, std::size_t i) noexcept {
  const float ds = d_of(block) * static_cast<float>(scale(block, i / 16));
  return ds * static_cast<float>(static_cast<int>(code(block, i)) - 32);
}

/// The 256 values of one block into y: per half, byte l of ql / qh gives the four weights l,
/// 32 + l, 64 + l and 96 + l (runs r = 0..3: nibble r / 2 of ql[l + 32·(r % 2)], bits 2r of qh).
inline void decode_block(const std::byte* block, float* y) noexcept {
  const float d = d_of(block);
  float ds[16];
  for (std::size_t s = 0; s < 16; ++s) ds[s] = d * static_cast<float>(scale(block, s));
  const auto* u = reinterpret_cast<const std::uint8_t*>(block);
  for (std::size_t h = 0; h < 2; ++h) {
    const std::uint8_t* ql = u + 64 * h;
    const std::uint8_t* qh = u + high_offset + 32 * h;
    for (std::size_t r = 0; r < 4; ++r)
      for (std::size_t l = 0; l < 32; ++l) {
        const int q = ((ql[l + 32 * (r % 2)] >> (4 * (r / 2))) & 15) | ((qh[l] >> (2 * r)) & 3)
                                                                           << 4;
        const std::size_t i = 128 * h + 32 * r + l;
        y[i] = ds[i / 16] * static_cast<float>(q - 32);
      }
  }
}

}  // namespace moekit::q6_k
