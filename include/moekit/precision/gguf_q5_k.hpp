#pragma once
/// \file GGUF's Q5_K block format (`Precision::q5_k`), byte for byte as ggml stores it, so a
/// GGUF tensor's rows are used as they lie in the file.
///
/// Super-block of 256 weights, 176 bytes (ggml's block_q5_K, read from ggml-common.h and
/// reimplemented; layout notes in io/dequantize.hpp):
///   [f16 d][f16 dmin][12 bytes: sc_j, m_j as Q4_K's][32 bytes qh][128 bytes qs]
/// Sub-block j (weights 32j .. 32j+31) takes its low 4 bits as Q4_K does (nibble j % 2 of
/// qs[32·(j/2) + l]) and bit 4 from bit j of qh[l]; w = (d·sc_j)·q − dmin·m_j, each product rounded
/// to f32 as gguf-py's `dequantize` rounds it (no fused multiply-add): the values are gguf-py's bit
/// for bit (tests/precision/gguf_kquant_test.cpp).

#include <cstddef>
#include <cstdint>

#include "moekit/precision/gguf_q4_k.hpp"

namespace moekit::q5_k {

inline constexpr std::size_t block_weights = 256;
inline constexpr std::size_t block_bytes = 176;
inline constexpr std::size_t high_offset = 16;   ///< qh[32]
inline constexpr std::size_t codes_offset = 48;  ///< qs[128]

// d, dmin and the scales and mins are where Q4_K has them.
using q4_k::d_of;
using q4_k::dmin_of;
using q4_k::scales_mins;
using q4_k::scales_mins_words;

/// The 5-bit code (0..31) of weight i.
inline unsigned code(const std::byte* block, std::size_t i) noexcept {
  const std::size_t j = i / 32, l = i % 32;
  const auto low =
      std::to_integer<unsigned>(block[codes_offset + 32 * (j / 2) + l]) >> (4 * (j % 2));
  const auto high = std::to_integer<unsigned>(block[high_offset + l]) >> j;
  return (low & 15) | (high & 1) << 4;
}

// gguf-py rounds d·sc and dmin·m to f32, then d·sc·q, then subtracts: no contraction.
#if defined(__clang__)
#define MOEKIT_Q5_K_NO_CONTRACT _Pragma("clang fp contract(off)")
#else
#define MOEKIT_Q5_K_NO_CONTRACT
#if defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
#endif

/// The 256 values of one block into y.
inline void decode_block(const std::byte* block, float* y) noexcept {
  MOEKIT_Q5_K_NO_CONTRACT
  const float d = d_of(block), dmin = dmin_of(block);
  std::uint8_t sc[8], m[8];
  scales_mins(block, sc, m);
  for (std::size_t j = 0; j < 8; ++j) {
    const float dj = d * static_cast<float>(sc[j]), mj = dmin * static_cast<float>(m[j]);
    for (std::size_t l = 0; l < 32; ++l)
      y[32 * j + l] = dj * static_cast<float>(code(block, 32 * j + l)) - mj;
  }
}

/// Weight i (0..255) of one block, the value decode_block gives it.
inline float weight(const std::byte* block, std::size_t i) noexcept {
  MOEKIT_Q5_K_NO_CONTRACT
  std::uint8_t sc[8], m[8];
  scales_mins(block, sc, m);
  const std::size_t j = i / 32;
  const float dj = d_of(block) * static_cast<float>(sc[j]);
  const float mj = dmin_of(block) * static_cast<float>(m[j]);
  return dj * static_cast<float>(code(block, i)) - mj;
}

#if !defined(__clang__) && defined(__GNUC__)
#pragma GCC pop_options
#endif
#undef MOEKIT_Q5_K_NO_CONTRACT

}  // namespace moekit::q5_k
