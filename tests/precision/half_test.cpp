// f16 / bf16 conversions: exact decode, round-to-nearest-even encode, overflow, NaN kept.
#include <cmath>
#include <cstdint>
#include <limits>

#include <catch2/catch.hpp>

#include "moekit/precision/half.hpp"
#include "test_support.hpp"

using namespace moekit;

namespace {
// True when `h` (finite) is a correctly rounded (RNE) f16 encoding of finite `f`.
bool is_rne(float f, std::uint16_t h, float (*dec)(std::uint16_t), std::uint16_t max_bits) {
  const double v = f, got = dec(h);
  const std::uint16_t mag = h & 0x7fffu;
  // Neighbours on the same side of zero (the encoding is sign-magnitude).
  auto err = [&](std::uint16_t m) {
    return std::fabs(v - dec(static_cast<std::uint16_t>((h & 0x8000u) | m)));
  };
  const double e = std::fabs(v - got);
  if (mag < max_bits && err(static_cast<std::uint16_t>(mag + 1)) < e) return false;
  if (mag > 0 && err(static_cast<std::uint16_t>(mag - 1)) < e) return false;
  if (mag < max_bits && err(static_cast<std::uint16_t>(mag + 1)) == e && (mag & 1u)) return false;
  if (mag > 0 && err(static_cast<std::uint16_t>(mag - 1)) == e && (mag & 1u)) return false;
  return true;
}
}  // namespace

TEST_CASE("f16: every bit pattern decodes and re-encodes to itself", "[precision][half]") {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = half_bits_to_float(h);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) {
      REQUIRE(std::isnan(f));
      REQUIRE(std::isnan(half_bits_to_float(float_to_half_bits(f))));
    } else {
      if (float_to_half_bits(f) != h)
        FAIL("bits " << b << " re-encode as " << float_to_half_bits(f));
    }
  }
  CHECK(half_bits_to_float(0x3c00) == 1.0f);
  CHECK(half_bits_to_float(0x7bff) == 65504.0f);
  CHECK(half_bits_to_float(0x0001) == std::ldexp(1.0f, -24));
}

TEST_CASE("f16: random floats round to nearest even, overflow to inf, NaN stays NaN",
          "[precision][half]") {
  INFO("seed " << test::test_seed());
  auto vals = test::random_normal(200000, 1, 1.f);
  auto wide = test::random_normal(20000, 2, 1.f);
  for (std::size_t i = 0; i < wide.size(); ++i)
    vals.push_back(std::ldexp(wide[i], int(i % 60) - 40));
  // Exact ties: halfway between 1 and 1 + 2^-10 rounds to 1 (even); next tie rounds up.
  vals.push_back(1.0f + std::ldexp(1.0f, -11));
  vals.push_back(1.0f + 3 * std::ldexp(1.0f, -11));
  vals.push_back(std::ldexp(1.0f, -25));  // tie to zero
  vals.push_back(std::ldexp(3.0f, -26));  // above the tie: smallest subnormal
  for (float f : vals) {
    const std::uint16_t h = float_to_half_bits(f);
    if (std::fabs(f) >= 65520.f) {
      REQUIRE((h & 0x7fffu) == 0x7c00u);
      continue;
    }
    if ((h & 0x7c00u) == 0x7c00u || !is_rne(f, h, half_bits_to_float, 0x7bff))
      FAIL("value " << f << " encoded as bits " << h);
  }
  CHECK(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  CHECK(float_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  CHECK(float_to_half_bits(65519.0f) == 0x7bff);
  CHECK(float_to_half_bits(65520.0f) == 0x7c00);
  CHECK(float_to_half_bits(-std::numeric_limits<float>::infinity()) == 0xfc00);
  const std::uint16_t n = float_to_half_bits(std::numeric_limits<float>::quiet_NaN());
  CHECK(((n & 0x7c00u) == 0x7c00u && (n & 0x3ffu) != 0));
  // A signalling NaN whose payload sits in the low bits must not become infinity.
  const std::uint16_t s = float_to_half_bits(std::bit_cast<float>(0x7f800001u));
  CHECK(((s & 0x7c00u) == 0x7c00u && (s & 0x3ffu) != 0));
}

TEST_CASE("bf16: round to nearest even, NaN stays NaN", "[precision][half]") {
  INFO("seed " << test::test_seed());
  for (float f : test::random_normal(100000, 3, 100.f)) {
    const std::uint16_t b = float_to_bf16_bits(f);
    if (!is_rne(f, b, bf16_bits_to_float, 0x7f7f)) FAIL("value " << f << " encoded as " << b);
  }
  CHECK(float_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(float_to_bf16_bits(std::bit_cast<float>(0x3f808000u)) == 0x3f80);  // tie → even
  CHECK(float_to_bf16_bits(std::bit_cast<float>(0x3f818000u)) == 0x3f82);  // tie → even (up)
  CHECK(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::bit_cast<float>(0x7f800001u)))));
  CHECK(bf16_bits_to_float(float_to_bf16_bits(3.0f)) == 3.0f);
}
