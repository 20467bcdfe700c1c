#pragma once
/// \file GGUF's Q3_K block format (`Precision::q3_k`), byte for byte as ggml stores it, so a
/// GGUF tensor's rows are used as they lie in the file.
///
/// Super-block of 256 weights, 110 bytes (ggml's block_q3_K, read from ggml-common.h and
/// reimplemented; layout notes in io/dequantize.hpp):
///   [32 bytes hmask][64 bytes qs][12 bytes packed 6-bit scales][f16 d]
/// Weight i, in half h = i / 128 at run r = (i % 128) / 32 and l = i % 32, has the low 2 bits
/// (qs[32h + l] >> 2r) & 3 (column order, as Q2_K) and bit 2 from bit i / 32 of hmask[l]: the
/// unsigned code u ∈ [0, 7], q = u − 4 (a clear mask bit subtracts 4). Sub-block s = i / 16 has
/// the 6-bit scale sc_s (low 4 bits: nibble s / 8 of byte s % 8; high 2 bits: bits 2·(s / 4) of
/// byte 8 + s % 4), stored offset by 32; w = (d·(sc_s − 32))·q, each product rounded to f32 as
/// gguf-py's `dequantize` rounds it: the values are gguf-py's bit for bit
/// (tests/precision/gguf_kquant_test.cpp against tests/io/data/gguf_kquants.gguf).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/precision/half.hpp"

namespace moekit::q3_k {

inline constexpr std::size_t block_weights = 256;
inline constexpr std::size_t block_bytes = 110;
inline constexpr std::size_t codes_offset = 32;   ///< qs[64] (hmask[32] is at 0)
inline constexpr std::size_t scales_offset = 96;  ///< the 12 packed scale bytes
inline constexpr std::size_t d_offset = 108;      ///< f16 d

inline float d_of(const std::byte* block) noexcept {
  std::uint16_t h;
  std::memcpy(&h, block + d_offset, 2);
  return half_bits_to_float(h);
}

/// The signed scale sc_s − 32 (−32..31) of sub-block s (0..15).
inline int scale(const std::byte* block, std::size_t s) noexcept {
  const std::byte* sc = block + scales_offset;
  const auto low = std::to_integer<unsigned>(sc[s % 8]) >> (4 * (s / 8)) & 15;
  const auto high = std::to_integer<unsigned>(sc[8 + s % 4]) >> (2 * (s / 4)) & 3;
  return static_cast<int>(low | high << 4) - 32;
}

/// The 16 stored scales sc_s (0..63, before the offset 32) of a block, four sub-blocks at a time
/// on 32-bit words: byte k of words[t] (t = 0..3) is sub-block 4t + k.
inline void scale_words(const std::byte* block, std::uint32_t words[4]) noexcept {
  std::uint32_t w[3];
  std::memcpy(w, block + scales_offset, 12);
  const std::uint32_t nib = 0x0f0f0f0fu, two = 0x03030303u;
  words[0] = (w[0] & nib) | (w[2] & two) << 4;
  words[1] = (w[1] & nib) | (w[2] >> 2 & two) << 4;
  words[2] = (w[0] >> 4 & nib) | (w[2] >> 4 & two) << 4;
  words[3] = (w[1] >> 4 & nib) | (w[2] >> 6 & two) << 4;
}

/// The 16 signed scales of a block (scale(block, s) for s = 0..15).
inline void scales(const std::byte* block, std::int8_t out[16]) noexcept {
  std::uint32_t words[4];
  scale_words(block, words);
  for (std::size_t s = 0; s < 16; ++s)
    out[s] = static_cast<std::int8_t>(static_cast<int>(words[s / 4] >> (8 * (s % 4)) & 63) - 32);
}

/// The unsigned code u (0..7) of weight i: q = u − 4.
inline unsigned code(const std::byte* block, std::size_t i) noexcept {
  const std::size_t l = i % 32;
  const auto low =
      std::to_integer<unsigned>(block[codes_offset + 32 * (i / 128) + l]) >> (2 * (i % 128 / 32)) &
      3;
  const auto high = std::to_integer<unsigned>(block[l]) >> (i / 32) & 1;
  return low | high << 2;
}

/// Weight i (0..255) of one block.
inline float weight(const std::byte* block, std::size_t i) noexcept {
  const float ds = d_of(block) * static_cast<float>(scale(block, i / 16));
  return ds * static_cast<float>(static_cast<int>(code(block, i)) - 4);
}

/// The 256 values of one block into y: per half h, byte l of qs (and of hmask) gives weights l,
/// 32 + l, 64 + l and 96 + l (run r: bits 2r of qs, bit 4h + r of hmask); sub-block by sub-block.
inline void decode_block(const std::byte* block, float* y) noexcept {
  const float d = d_of(block);
  std::int8_t sc[16];
  scales(block, sc);
  float ds[16];
  for (std::size_t s = 0; s < 16; ++s) ds[s] = d * static_cast<float>(sc[s]);
  const auto* u = reinterpret_cast<const std::uint8_t*>(block);
  for (std::size_t s = 0; s < 16; ++s) {  // sub-block s: half h = s / 8, run r = s % 8 / 2
    const std::size_t l0 = 16 * (s % 2);
    const std::uint8_t* q = u + codes_offset + 32 * (s / 8) + l0;
    const std::uint8_t* m = u + l0;
    const int shift = static_cast<int>(2 * (s % 8 / 2)), bit = static_cast<int>(s / 2);
    for (std::size_t l = 0; l < 16; ++l) {
      const int code = ((q[l] >> shift) & 3) | ((m[l] >> bit) & 1) << 2;
      y[16 * s + l] = ds[s] * static_cast<float>(code - 4);
    }
  }
}

}  // namespace moekit::q3_k
