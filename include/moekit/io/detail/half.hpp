#pragma once
/// \file IEEE binary16 and bfloat16 <-> binary32 conversions used by the readers and writers.
///
/// Scalar and exact: f32 -> f16/bf16 rounds to nearest, ties to even; NaN stays NaN.

#include <bit>
#include <cstdint>

namespace moekit::io::detail {

/// binary16 bits -> float (exact; subnormals, infinities and NaN preserved).
constexpr float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  std::uint32_t bits = 0;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    std::uint32_t e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

/// float -> binary16 bits, round to nearest even; overflow gives infinity.
constexpr std::uint16_t f32_to_f16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t exp = (x >> 23) & 0xFFu;
  std::uint32_t mant = x & 0x7FFFFFu;
  if (exp == 0xFF) return static_cast<std::uint16_t>(sign | 0x7C00u | (mant ? 0x200u : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (e <= 0) {  // subnormal or zero in f16
    if (e < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    const unsigned shift = static_cast<unsigned>(14 - e);
    std::uint32_t half = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: ok
  return static_cast<std::uint16_t>(sign | half);
}

/// bfloat16 bits -> float (exact).
constexpr float bf16_to_f32(std::uint16_t b) noexcept {
  return std::bit_cast<float>(std::uint32_t{b} << 16);
}

/// float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
constexpr std::uint16_t f32_to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

}  // namespace moekit::io::detail
