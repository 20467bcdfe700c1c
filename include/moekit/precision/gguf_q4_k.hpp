#pragma once
/// \file GGUF's Q4_K block format (`Precision::q4_k`), byte for byte as ggml stores it, so a
/// GGUF tensor's rows are used as they lie in the file.
///
/// Super-block of 256 weights, 144 bytes (ggml's block_q4_K, read from ggml-common.h and
/// reimplemented; layout notes in io/dequantize.hpp):
///   [f16 d][f16 dmin][12 bytes: eight 6-bit scales sc_j and eight 6-bit mins m_j][128 bytes qs]
/// Sub-block j (weights 32j .. 32j+31) takes nibble j % 2 of qs[32·(j/2) .. 32·(j/2)+31] (low
/// nibble for even j); w = (d·sc_j)·q − dmin·m_j, each product rounded to f32 as gguf-py's
/// `dequantize` rounds it (so no fused multiply-add here): the values are gguf-py's bit for bit
/// (tests/precision/gguf_kquant_test.cpp against tests/io/data/gguf_kquants.gguf).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/precision/half.hpp"

namespace moekit::q4_k {

inline constexpr std::size_t block_weights = 256;
inline constexpr std::size_t block_bytes = 144;
inline constexpr std::size_t scales_offset = 4;  ///< the 12 packed scale/min bytes
inline constexpr std::size_t codes_offset = 16;  ///< qs[128]

/// The block's f16 super-scales d and dmin.
inline float d_of(const std::byte* block) noexcept {
  std::uint16_t h;
  std::memcpy(&h, block, 2);
  return half_bits_to_float(h);
}
inline float dmin_of(const std::byte* block) noexcept {
  std::uint16_t h;
  std::memcpy(&h, block + 2, 2);
  return half_bits_to_float(h);
}

/// The eight 6-bit scales (sc_j: byte j of `sc`) and mins (m_j: byte j of `m`) of a block, as
/// two 64-bit words. Bytes 0-3 hold sc_0..3 and bytes 4-7 m_0..3 in their low 6 bits; byte 8+k
/// holds sc_{4+k} (low nibble) and m_{4+k} (high nibble), whose top 2 bits are the top 2 bits of
/// bytes k (sc) and 4+k (m). Done four sub-blocks at a time on 32-bit words, in every kernel.
inline void scales_mins_words(const std::byte* block, std::uint64_t& sc,
                              std::uint64_t& m) noexcept {
  std::uint32_t w[3];
  std::memcpy(w, block + scales_offset, 12);
  const std::uint32_t low6 = 0x3f3f3f3fu, nib = 0x0f0f0f0fu, top2 = 0x30303030u;
  sc = (w[0] & low6) | std::uint64_t((w[2] & nib) | ((w[0] >> 2) & top2)) << 32;
  m = (w[1] & low6) | std::uint64_t(((w[2] >> 4) & nib) | ((w[1] >> 2) & top2)) << 32;
}

/// scales_mins_words as bytes: sc[j], m[j] for sub-block j (little-endian words).
inline void scales_mins(const std::byte* block, std::uint8_t sc[8], std::uint8_t m[8]) noexcept {
  std::uint64_t s, n;
  scales_mins_words(block, s, n);
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<std::uint8_t>(s >> (8 * j));
    m[j] = static_cast<std::uint8_t>(n >> (8 * j));
  }
}

// gguf-py rounds d·sc and dmin·m to f32, then d·sc·q, then subtracts: no contraction.
#if defined(__clang__)
#define MOEKIT_Q4_K_NO_CONTRACT _Pragma("clang fp contract(off)")
#else
#define MOEKIT_Q4_K_NO_CONTRACT
#if defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
#endif

/// The 256 values of one block into y.
inline void decode_block(const std::byte* block, float* y) noexcept {
  MOEKIT_Q4_K_NO_CONTRACT
  const float d = d_of(block), dmin = dmin_of(block);
  std::uint8_t sc[8], m[8];
  scales_mins(block, sc, m);
  const auto* qs = reinterpret_cast<const std::uint8_t*>(block + codes_offset);
  for (int j = 0; j < 8; ++j) {
    const float dj = d * static_cast<float>(sc[j]), mj = dmin * static_cast<float>(m[j]);
    const std::uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) y[32 * j + l] = dj * static_cast<float>((q[l] >> shift) & 15) - mj;
  }
}

/// Weight i (0..255) of one block, the value decode_block gives it.
inline float weight(const std::byte* block, std::size_t i) noexcept {
  MOEKIT_Q4_K_NO_CONTRACT
  std::uint8_t sc[8], m[8];
  scales_mins(block, sc, m);
  const std::size_t j = i / 32;
  const float dj = d_of(block) * static_cast<float>(sc[j]);
  const float mj = dmin_of(block) * static_cast<float>(m[j]);
  const auto q = std::to_integer<unsigned>(block[codes_offset + 32 * (j / 2) + i % 32]);
  return dj * static_cast<float>((q >> (4 * (j % 2))) & 15) - mj;
}

#if !defined(__clang__) && defined(__GNUC__)
#pragma GCC pop_options
#endif
#undef MOEKIT_Q4_K_NO_CONTRACT

}  // namespace moekit::q4_k
