#pragma once
/// \file GGUF's Q2_K block format (`Precision::q2_k`), byte for byte as ggml stores it, so a
/// GGUF tensor's rows are used as they lie in the file.
///
/// Super-block of 256 weights, 84 bytes (ggml's block_q2_K, read from ggml-common.h and
/// reimplemented; layout notes in io/dequantize.hpp):
///   [16 bytes scales: sc_s (low nibble) and m_s (high nibble) of sub-block s][64 bytes qs]
///   [f16 d][f16 dmin]
/// Weight i, in half h = i / 128 at run r = (i % 128) / 32 and l = i % 32, has the 2-bit code
/// (qs[32h + l] >> 2r) & 3, so the codes of a half's 32 bytes unpack in column order; sub-block
/// s = i / 16 (16 weights); w = (d·sc_s)·q − dmin·m_s, each product rounded to f32 as gguf-py's
/// `dequantize` rounds it (no fused multiply-add): the values are gguf-py's bit for bit
/// (tests/precision/gguf_kquant_test.cpp against tests/io/data/gguf_kquants.gguf).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/precision/half.hpp"

namespace moekit::q2_k {

inline constexpr std::size_t block_weights = 256;
inline constexpr std::size_t block_bytes = 84;
inline constexpr std::size_t codes_offset = 16;  ///< qs[64]
inline constexpr std::size_t d_offset = 80;      ///< f16 d, then f16 dmin

inline float d_of(const std::byte* block) noexcept {
  std::uint16_t h;
  std::memcpy(&h, block + d_offset, 2);
  return half_bits_to_float(h);
}
inline float dmin_of(const std::byte* block) noexcept {
  std::uint16_t h;
  std::memcpy(&h, block + d_offset + 2, 2);
  return half_bits_to_float(h);
}

/// The 4-bit scale and min of sub-block s (0..15).
inline unsigned scale(const std::byte* block, std::size_t s) noexcept {
  return std::to_integer<unsigned>(block[s]) & 15;
}
inline unsigned min(const std::byte* block, std::size_t s) noexcept {
  return std::to_integer<unsigned>(block[s]) >> 4;
}

/// The 2-bit code (0..3) of weight i.
inline unsigned code(const std::byte* block, std::size_t i) noexcept {
  const auto q = std::to_integer<unsigned>(block[codes_offset + 32 * (i / 128) + i % 32]);
  return q >> (2 * (i % 128 / 32)) & 3;
}

// gguf-py rounds d·sc and dmin·m to f32, then d·sc·q, then subtracts: no contraction.
#if defined(__clang__)
#define MOEKIT_Q2_K_NO_CONTRACT _Pragma("clang fp contract(off)")
#else
#define MOEKIT_Q2_K_NO_CONTRACT
#if defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
#endif

/// The 256 values of one block into y: per half, byte l of qs gives weights l, 32 + l, 64 + l and
/// 96 + l (run r: bits 2r); sub-block by sub-block.
inline void decode_block(const std::byte* block, float* y) noexcept {
  MOEKIT_Q2_K_NO_CONTRACT
  const float d = d_of(block), dmin = dmin_of(block);
  float ds[16], ms[16];
  for (std::size_t s = 0; s < 16; ++s) {
    ds[s] = d * static_cast<float>(scale(block, s));
    ms[s] = dmin * static_cast<float>(min(block, s));
  }
  const auto* qs = reinterpret_cast<const std::uint8_t*>(block + codes_offset);
  for (std::size_t s = 0; s < 16; ++s) {  // sub-block s: half s / 8, run s % 8 / 2
    const std::uint8_t* q = qs + 32 * (s / 8) + 16 * (s % 2);
    const int shift = static_cast<int>(2 * (s % 8 / 2));
    for (std::size_t l = 0; l < 16; ++l)
      y[16 * s + l] = ds[s] * static_cast<float>((q[l] >> shift) & 3) - ms[s];
  }
}

/// Weight i (0..255) of one block, the value decode_block gives it.
inline float weight(const std::byte* block, std::size_t i) noexcept {
  MOEKIT_Q2_K_NO_CONTRACT
  const float ds = d_of(block) * static_cast<float>(scale(block, i / 16));
  const float ms = dmin_of(block) * static_cast<float>(min(block, i / 16));
  return ds * static_cast<float>(code(block, i)) - ms;
}

#if !defined(__clang__) && defined(__GNUC__)
#pragma GCC pop_options
#endif
#undef MOEKIT_Q2_K_NO_CONTRACT

}  // namespace moekit::q2_k
