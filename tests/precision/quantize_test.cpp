// Encoders/decoders: sizes equal row_bytes(), round-trip error within the stated bound against a
// float64 reference on fresh random data, the documented byte layout, and rejected input.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "moekit/precision/format.hpp"
#include "moekit/precision/half.hpp"
#include "moekit/precision/quantize.hpp"
#include "test_support.hpp"

using namespace moekit;

namespace {
const QuantScheme quant_schemes[] = {{32, false}, {64, false}, {128, false}, {0, false},
                                     {32, true},  {64, true},  {128, true},  {0, true}};

// Error bound of one weight, stated per format (derivations in docs/formats.md §Error bounds):
//  f32: exact. bf16: |w|·2^-8 (unit roundoff, 8-bit significand). f16: |w|·2^-11 + 2^-25 (subnormal
//  spacing / 2). symmetric q_b: |extreme|/2^(b-1) · (1 + 2^(b-10)) · (1 + 2^-10): half a step
//  inside the range,
//    at most one step for the clamped end opposite the extreme (code 2^(b-1) does not exist).
//  affine q_b: step · (0.5 + 2^(b-10)) · (1 + 2^-10), step = (max − min)/(2^b − 1): half a step
//    plus the f16 rounding of zero point and scale at the clamped ends.
double bound(Precision p, QuantScheme s, const float* group, std::size_t n, float w) {
  switch (p) {
    case Precision::f32:
      return 0;
    case Precision::bf16:
      return std::fabs(w) * std::ldexp(1.0, -8);
    case Precision::f16:
      return std::fabs(w) * std::ldexp(1.0, -11) + std::ldexp(1.0, -25);
    default:
      break;
  }
  const int b = static_cast<int>(bits(p));
  double lo = group[0], hi = group[0], amax = 0;
  for (std::size_t i = 0; i < n; ++i) {
    lo = std::min<double>(lo, group[i]);
    hi = std::max<double>(hi, group[i]);
    amax = std::max<double>(amax, std::fabs(group[i]));
  }
  const double slack = 1 + std::ldexp(1.0, -10);
  if (!s.zero_point) return amax / std::ldexp(1.0, b - 1) * (1 + std::ldexp(1.0, b - 10)) * slack;
  return (hi - lo) / (std::ldexp(1.0, b) - 1) * (0.5 + std::ldexp(1.0, b - 10)) * slack;
}
}  // namespace

TEST_CASE("encoded rows have exactly row_bytes() bytes", "[precision][quantize]") {
  for (Precision p : all_precisions)
    for (QuantScheme s : quant_schemes)
      for (std::size_t cols : {1u, 31u, 32u, 33u, 100u, 4096u, 14336u}) {
        const auto v = test::random_normal(cols, cols);
        const auto bytes = encode_matrix<float>(v, 1, cols, p, s);
        INFO(name(p) << " g" << s.group_size << " z" << s.zero_point << " cols " << cols);
        REQUIRE(bytes.size() == row_bytes(cols, p, s));
        REQUIRE(RowLayout::of(cols, p, s).bytes == row_bytes(cols, p, s));
      }
}

TEST_CASE("round trip error stays within the stated bound (float64 reference)",
          "[precision][quantize]") {
  INFO("seed " << test::test_seed());
  const std::size_t rows = 24;
  for (std::size_t cols : {4096u, 200u}) {
    // Rows with different spreads, and one with a large common offset (affine zero point > 0).
    std::vector<float> w = test::random_normal(rows * cols, cols);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) {
        w[r * cols + c] *= std::ldexp(1.0f, static_cast<int>(r % 8) - 4);
        if (r == 5) w[r * cols + c] += 3.f;
      }
    for (Precision p : all_precisions)
      for (QuantScheme s : quant_schemes) {
        if (!is_quantized(p) && s != QuantScheme{}) continue;
        const auto bytes = encode_matrix<float>(w, rows, cols, p, s);
        const MatrixView m = make_matrix_view(bytes, rows, cols, p, s);
        const auto back = decode_matrix(m);
        const RowLayout l = m.layout();
        double worst_ratio = 0, group_lim = 0;
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t c = 0; c < cols; ++c) {
            const std::size_t g0 = is_quantized(p) ? c / l.group_size * l.group_size : c;
            const std::size_t gn = is_quantized(p) ? std::min(l.group_size, cols - g0) : 1;
            const double want = w[r * cols + c];
            const double err = std::fabs(static_cast<double>(back[r * cols + c]) - want);
            // The group statistics change only at a group start (bound() scans the group).
            if (is_quantized(p) && (c == g0 || c == 0))
              group_lim = bound(p, s, &w[r * cols + g0], gn, w[r * cols + c]);
            const double lim =
                is_quantized(p) ? group_lim : bound(p, s, &w[r * cols + g0], gn, w[r * cols + c]);
            if (lim > 0) worst_ratio = std::max(worst_ratio, err / lim);
            if (err > lim)  // (checked by hand: a Catch assertion per weight is too slow)
              FAIL(name(p) << " g" << s.group_size << " z" << s.zero_point << " row " << r
                           << " col " << c << " value " << want << " decoded " << back[r * cols + c]
                           << " error " << err << " > bound " << lim);
          }
        // The bound must not be vacuous: errors reach a good part of it.
        if (is_quantized(p) || p == Precision::bf16 || p == Precision::f16) {
          INFO(name(p) << " g" << s.group_size << " z" << s.zero_point);
          CHECK(worst_ratio > 0.3);
        }
      }
  }
}

TEST_CASE("bf16 and f16 inputs encode like the same values given as f32", "[precision][quantize]") {
  INFO("seed " << test::test_seed());
  const std::size_t cols = 300;
  auto w = test::random_normal(cols, 11);
  std::vector<Float16> h(cols);
  std::vector<BFloat16> b(cols);
  for (std::size_t c = 0; c < cols; ++c) {
    h[c] = to_f16(w[c]);
    b[c] = to_bf16(w[c]);
  }
  std::vector<float> hf(cols), bf(cols);
  for (std::size_t c = 0; c < cols; ++c) hf[c] = to_float(h[c]), bf[c] = to_float(b[c]);
  for (Precision p : all_precisions)
    for (QuantScheme s : {QuantScheme{32, false}, QuantScheme{64, true}}) {
      CHECK(encode_matrix<Float16>(h, 1, cols, p, s) == encode_matrix<float>(hf, 1, cols, p, s));
      CHECK(encode_matrix<BFloat16>(b, 1, cols, p, s) == encode_matrix<float>(bf, 1, cols, p, s));
    }
}

TEST_CASE("documented layout: payload, then f16 scales, then f16 zeros", "[precision][quantize]") {
  // 64 weights, q4 affine, groups of 32: weight c = c for group 0 and 31 - (c-32) for group 1.
  std::vector<float> w(64);
  for (int c = 0; c < 32; ++c) w[c] = static_cast<float>(c) * 0.5f;  // 0 .. 15.5
  for (int c = 32; c < 64; ++c) w[c] = -1.f - static_cast<float>(c - 32) / 31.f * 15.f;
  const auto bytes = encode_matrix<float>(w, 1, 64, Precision::q4, {32, true});
  REQUIRE(bytes.size() == 32 + 2 * 2 + 2 * 2);
  // Group 0: min 0, max 15.5 → step 15.5/15, zero 0; weight 0 → code 0, weight 1 (0.5) → 0.48 → 0,
  // weight 31 → code 15. Byte 0 holds weights 0 (low nibble) and 1 (high nibble).
  CHECK(static_cast<unsigned>(bytes[15]) >> 4 == 15u);
  CHECK((static_cast<unsigned>(bytes[0]) & 0xfu) == 0u);
  std::uint16_t s0, z0, z1;
  std::memcpy(&s0, &bytes[32], 2);
  std::memcpy(&z0, &bytes[36], 2);
  std::memcpy(&z1, &bytes[38], 2);
  CHECK(half_bits_to_float(s0) == half_bits_to_float(float_to_half_bits(15.5f / 15.f)));
  CHECK(half_bits_to_float(z0) == 0.f);
  CHECK(half_bits_to_float(z1) > 15.f);  // group 1 is all negative: min maps to code 0
  // Symmetric q8, one group per row: code = round(w / s) + 128, s = extreme / −128.
  const std::vector<float> v{1.f, -2.f, 0.5f};
  const auto q8 = encode_matrix<float>(v, 1, 3, Precision::q8, {0, false});
  REQUIRE(q8.size() == 3 + 2);
  std::uint16_t s8;
  std::memcpy(&s8, &q8[3], 2);
  CHECK(half_bits_to_float(s8) == 2.f / 128.f);
  CHECK(static_cast<unsigned>(q8[0]) == 128u + 64u);
  CHECK(static_cast<unsigned>(q8[1]) == 0u);
  CHECK(static_cast<unsigned>(q8[2]) == 128u + 32u);
  // q2 packing: weight c at bits 2c of byte 0.
  const std::vector<float> t{-2.f, -1.f, 0.f, 1.f};  // s = 1 → codes 0, 1, 2, 3
  const auto q2 = encode_matrix<float>(t, 1, 4, Precision::q2, {0, false});
  CHECK(static_cast<unsigned>(q2[0]) == (0u | 1u << 2 | 2u << 4 | 3u << 6));
}

TEST_CASE("NaN and Inf inputs are rejected naming the row", "[precision][quantize]") {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (Precision p : all_precisions)
    for (float x : bad) {
      std::vector<float> w(4 * 40, 0.5f);
      w[3 * 40 + 7] = x;
      try {
        (void)encode_matrix<float>(w, 4, 40, p, {32, true});
        FAIL("accepted a non-finite value for " << name(p));
      } catch (const Error& e) {
        CHECK(e.kind() == ErrorKind::invalid_argument);
        CHECK_THAT(e.message(), Catch::Contains("row 3") && Catch::Contains("column 7"));
      }
    }
  std::vector<Float16> h(32, to_f16(1.f));
  h[5] = Float16{0x7e00};
  CHECK_THROWS_AS(encode_matrix<Float16>(h, 1, 32, Precision::q4), Error);
}

TEST_CASE("values the format cannot hold and bad schemes are rejected", "[precision][quantize]") {
  std::vector<float> w(32, 1.f);
  w[2] = 70000.f;
  CHECK_THROWS_WITH(encode_matrix<float>(w, 1, 32, Precision::f16), Catch::Contains("f16"));
  w[2] = 3e38f;
  CHECK_THROWS_WITH(encode_matrix<float>(w, 1, 32, Precision::q4), Catch::Contains("scale"));
  w[2] = 1.f;
  CHECK_THROWS_WITH(encode_matrix<float>(w, 1, 32, Precision::q4, {48, false}),
                    Catch::Contains("group_size 48"));
  CHECK_THROWS_AS(encode_matrix<float>(w, 1, 32, Precision::skip), Error);
  CHECK_THROWS_AS(encode_matrix<float>(w, 2, 32, Precision::q8), Error);  // too few values
  std::vector<std::byte> short_buf(10);
  CHECK_THROWS_WITH(make_matrix_view(short_buf, 1, 32, Precision::q8, {}, "w1"),
                    Catch::Contains("w1"));
}

TEST_CASE("constant and all-zero groups decode exactly", "[precision][quantize]") {
  for (Precision p : {Precision::q8, Precision::q4, Precision::q2})
    for (bool affine : {false, true})
      for (float c : {0.f, 0.75f, -3.f}) {
        std::vector<float> w(64, c);
        const auto bytes = encode_matrix<float>(w, 1, 64, p, {32, affine});
        const auto back = decode_matrix(make_matrix_view(bytes, 1, 64, p, {32, affine}));
        for (float b : back) CHECK(b == Approx(c).margin(1e-6));
      }
}
