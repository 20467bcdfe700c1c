#pragma once
/// \file 16-bit float storage types (IEEE binary16 and bfloat16) and their conversions to and from
/// float: round-to-nearest-even, overflow to infinity, subnormals kept, NaN kept as a quiet NaN
/// (never turned into infinity). Host and device code share these functions.

#include <bit>
#include <cstdint>

#include "moekit/config.hpp"

namespace moekit {

/// IEEE 754 binary16, stored as its bit pattern (trivially copyable, 2 bytes).
struct Float16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(Float16, Float16) = default;
};

/// bfloat16 (the top half of an IEEE binary32), stored as its bit pattern.
struct BFloat16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(BFloat16, BFloat16) = default;
};

static_assert(sizeof(Float16) == 2 && sizeof(BFloat16) == 2);

namespace detail {
MOEKIT_HOST_DEVICE inline std::uint32_t float_to_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<std::uint32_t>(f);
#endif
}
MOEKIT_HOST_DEVICE inline float bits_to_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}
}  // namespace detail

/// binary16 bits → float (exact).
MOEKIT_HOST_DEVICE inline float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant · 2^-24, exact in float
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 31) return detail::bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  return detail::bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// float → binary16 bits, round to nearest even. |f| ≥ 65520 becomes ±inf; NaN stays NaN (quiet).
MOEKIT_HOST_DEVICE inline std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t x = detail::float_to_bits(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u)  // NaN: keep the top payload bits and force the quiet bit
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (a < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    const std::uint32_t e = a >> 23;
    if (e < 102) return sign;  // < 2^-25: rounds to zero
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // value·2^24 = m·2^-(shift)
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal: right
    return static_cast<std::uint16_t>(sign | r);
  }
  const std::uint32_t rebased = a - 0x38000000u;  // exponent bias 127 → 15
  return static_cast<std::uint16_t>(sign | ((rebased + 0x0fffu + ((rebased >> 13) & 1u)) >> 13));
}

/// bfloat16 bits → float (exact).
MOEKIT_HOST_DEVICE inline float bf16_bits_to_float(std::uint16_t b) noexcept {
  return detail::bits_to_float(static_cast<std::uint32_t>(b) << 16);
}

/// float → bfloat16 bits, round to nearest even (large finite values may round to ±inf, as IEEE
/// rounding requires); NaN stays NaN (quiet).
MOEKIT_HOST_DEVICE inline std::uint16_t float_to_bf16_bits(float f) noexcept {
  const std::uint32_t x = detail::float_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/// Element conversions used by generic code (quantizers, kernels over f32/f16/bf16 activations).
MOEKIT_HOST_DEVICE inline float to_float(float v) noexcept { return v; }
MOEKIT_HOST_DEVICE inline float to_float(Float16 v) noexcept { return half_bits_to_float(v.bits); }
MOEKIT_HOST_DEVICE inline float to_float(BFloat16 v) noexcept { return bf16_bits_to_float(v.bits); }
MOEKIT_HOST_DEVICE inline Float16 to_f16(float v) noexcept {
  return Float16{float_to_half_bits(v)};
}
MOEKIT_HOST_DEVICE inline BFloat16 to_bf16(float v) noexcept {
  return BFloat16{float_to_bf16_bits(v)};
}

}  // namespace moekit
