#pragma once
// Shared helpers of the K-quant tests (gguf_kquant_test.cpp, kquant_gemm_test.cpp): random
// K-quant matrices and the derived bound of an int8-activation result.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "moekit/precision/format.hpp"
#include "moekit/precision/gemv.hpp"
#include "test_support.hpp"

namespace moekit::test {

inline void put_half(std::byte* p, float v) {
  const std::uint16_t h = float_to_half_bits(v);
  std::memcpy(p, &h, 2);
}

// A rows × cols K-quant matrix of random code and scale bytes and random f16 super-scales
// (every byte pattern is a valid block; the super-scales are kept finite and moderate).
inline std::vector<std::byte> random_kquant(std::size_t rows, std::size_t cols, Precision p,
                                            std::uint64_t salt) {
  std::mt19937_64 rng(test::test_seed() * 1000003u + salt);
  std::vector<std::byte> b(matrix_bytes(rows, cols, p));
  for (auto& x : b) x = static_cast<std::byte>(rng() & 0xff);
  std::uniform_real_distribution<float> scale(-0.004f, 0.004f);
  const std::size_t bb = kquant_block_bytes(p);
  for (std::size_t off = 0; off < b.size(); off += bb) {
    if (p == Precision::q6_k || p == Precision::q3_k) {  // d alone, signed scales
      put_half(b.data() + off + (p == Precision::q6_k ? q6_k::d_offset : q3_k::d_offset),
               scale(rng));
    } else {  // d and dmin
      const std::size_t at = p == Precision::q2_k ? q2_k::d_offset : 0;
      put_half(b.data() + off + at, std::fabs(scale(rng)));
      put_half(b.data() + off + at + 2, std::fabs(scale(rng)));
    }
  }
  return b;
}

// What the int8 kernels add up in floats for row r, per weight: the code's product and the
// minimum (q4_k, q5_k, q2_k) or the code offset (32 for q6_k, 4 for q3_k), by |x|.
inline double kquant_magnitude(const MatrixView& w, std::size_t r, const float* x) {
  double m = 0;
  for (std::size_t c = 0; c < w.cols; ++c) {
    const std::byte* block = w.row(r) + c / 256 * kquant_block_bytes(w.precision);
    const std::size_t i = c % 256;
    double term;
    if (w.precision == Precision::q2_k) {
      term = std::fabs(q2_k::d_of(block)) * q2_k::scale(block, i / 16) * q2_k::code(block, i) +
             std::fabs(q2_k::dmin_of(block)) * q2_k::min(block, i / 16);
    } else if (w.precision == Precision::q3_k) {
      term =
          std::fabs(q3_k::d_of(block) * q3_k::scale(block, i / 16)) * (q3_k::code(block, i) + 4.0);
    } else if (w.precision != Precision::q6_k) {
      std::uint8_t sc[8], mn[8];
      q4_k::scales_mins(block, sc, mn);
      const unsigned q = w.precision == Precision::q5_k
                             ? q5_k::code(block, i)
                             : std::to_integer<unsigned>(block[16 + 32 * (i / 64) + i % 32]) >>
                                       (4 * (i / 32 % 2)) &
                                   15;
      term = std::fabs(q4_k::d_of(block)) * sc[i / 32] * q +
             std::fabs(q4_k::dmin_of(block)) * mn[i / 32];
    } else {
      term =
          std::fabs(q6_k::d_of(block) * q6_k::scale(block, i / 16)) * (q6_k::code(block, i) + 32.0);
    }
    m += term * std::fabs(x[c]);
  }
  return m;
}

// Bound of an int8-activation result of row r: each activation moves by at most half its int8
// step, max|x|/254 over the values sharing its scale (32 for q6_k, the 256 of a super-block for
// the others; ×1.01 for the rounding of the step itself), plus float accumulation of the
// kernel's terms (kquant_magnitude) with a relative error far below 2^-16 (a few hundred roundings
// of 2^-24). A wrong code, scale or order moves the result by about one term.
inline double kquant_int8_bound(const MatrixView& w, std::size_t r, const float* x) {
  const RowLayout l = w.layout();
  const std::size_t span = kquant_block_scaled(w.precision) ? 256 : 32;
  double bound = 0;
  for (std::size_t col = 0; col < w.cols; ++col) {
    float amax = 0;
    for (std::size_t i = col / span * span; i < col / span * span + span; ++i)
      amax = std::max(amax, std::fabs(x[i]));
    bound += std::fabs(weight_at(w.row(r), l, w.precision, col)) * amax / 254.0;
  }
  return bound * 1.01 + kquant_magnitude(w, r, x) / 65536 + 1e-9;
}

}  // namespace moekit::test
