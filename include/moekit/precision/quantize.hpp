#pragma once
/// \file Encoders (f32/bf16/f16 input → any stored format) and decoders (stored row → float).
///
/// Symmetric group quantization (ggml q4_0 style, extended to 8 and 2 bits): per group the value
/// `e` of largest magnitude sets `scale = e / −2^(b−1)`, so `e` maps exactly to code 0 and the
/// codes span the full range [−2^(b−1), 2^(b−1)−1] around an exact zero. Affine (min/max, as HQQ's
/// initialisation, Badri & Shaji 2023): `scale = (max − min)/(2^b − 1)`, `zero = −min/scale`.
/// Scale and zero are rounded to f16 first and the codes computed with the rounded values, so the
/// rounding error stays within half a step. EdgeMoE's channel-wise variant is `group_size = 0`.
/// Non-finite input is rejected with an error naming the row and column.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/gguf_q2_k.hpp"
#include "moekit/precision/gguf_q3_k.hpp"
#include "moekit/precision/gguf_q4_k.hpp"
#include "moekit/precision/gguf_q5_k.hpp"
#include "moekit/precision/gguf_q6_k.hpp"
#include "moekit/precision/half.hpp"
#include "moekit/precision/panels.hpp"

namespace moekit {

/// Element types the encoders accept.
template <class T>
concept WeightElement =
    std::same_as<T, float> || std::same_as<T, Float16> || std::same_as<T, BFloat16>;

/// Optional quantizer refinements.
struct QuantizeOptions {
  /// HQQ zero-point refinement for affine schemes (Badri & Shaji 2023; Fate §4 uses it): after the
  /// min/max initialisation, half-quadratic proximal iterations move each group's zero point to
  /// minimise the l_p norm (p = 0.7) of the error, stopping when the mean |error| stops falling.
  /// Ignored by symmetric schemes and float formats.
  bool hqq = false;
  int hqq_iterations = 20;  ///< HQQ's default
};

namespace detail {

/// HQQ: refines zero `z` for codes with step `step` (scale fixed), per Fate §4 / HQQ reference
/// defaults (p = 0.7, β₀ = 10, κ = 1.01); returns the best zero found.
inline double hqq_zero(const float* v, std::size_t n, double step, double z, unsigned qmax,
                       int iterations) {
  const double p = 0.7, kappa = 1.01;
  double beta = 10.0, best_z = z, best_err = -1;
  std::vector<double> q(n);
  for (int it = 0; it < iterations; ++it) {
    double err = 0, znew = 0;
    for (std::size_t i = 0; i < n; ++i) {
      q[i] = std::clamp(std::nearbyint(v[i] / step + z), 0.0, static_cast<double>(qmax));
      const double r = v[i] - (q[i] - z) * step;  // W − Ŵ
      err += std::fabs(r);
      // shrink_p(r, β) = sign(r)·max(|r| − |r|^(p−1)/β, 0)
      const double a = std::fabs(r);
      const double we = a > 0 ? std::copysign(std::max(a - std::pow(a, p - 1) / beta, 0.0), r) : 0;
      znew += q[i] - (v[i] - we) / step;
    }
    err /= static_cast<double>(n);
    if (best_err >= 0 && err >= best_err) break;
    best_err = err;
    best_z = z;
    z = znew / static_cast<double>(n);
    beta *= kappa;
  }
  return best_z;
}

inline void store_u16(std::byte* p, std::uint16_t v) noexcept { std::memcpy(p, &v, 2); }
inline std::uint16_t load_u16(const std::byte* p) noexcept {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline void write_code(std::byte* payload, std::size_t c, unsigned bits, unsigned q) noexcept {
  const std::size_t bit = c * bits;
  payload[bit / 8] |= static_cast<std::byte>(q << (bit % 8));
}

[[noreturn]] inline void fail_value(std::size_t row, std::size_t col, float v, const char* why) {
  fail(ErrorKind::invalid_argument, "quantize: row " + std::to_string(row) + ", column " +
                                        std::to_string(col) + ": value " + std::to_string(v) + " " +
                                        why);
}

/// Codes + f16 scale (+ f16 zero) of one group `v[0..n)` into the row.
inline void quantize_group(const float* v, std::size_t n, std::size_t first_col, const RowLayout& l,
                           std::size_t group, std::byte* row, std::size_t row_index,
                           const QuantizeOptions& opts) {
  const unsigned qmax = (1u << l.bits) - 1u;
  float scale = 0.f, zero = l.symmetric_zero;
  if (!l.affine) {
    float extreme = 0.f;
    for (std::size_t i = 0; i < n; ++i)
      if (std::fabs(v[i]) > std::fabs(extreme)) extreme = v[i];
    scale = half_bits_to_float(float_to_half_bits(extreme / -l.symmetric_zero));
  } else {
    float lo = v[0], hi = v[0];
    for (std::size_t i = 1; i < n; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]);
    float step = (hi - lo) / static_cast<float>(qmax);
    // A zero point must fit f16; only groups with a tiny range far from 0 need the wider step.
    step = std::max(step, std::max(std::fabs(lo), std::fabs(hi)) / 32768.f);
    scale = half_bits_to_float(float_to_half_bits(step));
    if (scale == 0.f) {  // all zero (or denormal): exact
      zero = 0.f;
    } else {
      double z = -lo / scale;
      if (opts.hqq && lo != hi) z = hqq_zero(v, n, scale, z, qmax, opts.hqq_iterations);
      zero = half_bits_to_float(float_to_half_bits(static_cast<float>(z)));
    }
  }
  if (!std::isfinite(scale))
    fail_value(row_index, first_col, v[0], "gives a group scale beyond the f16 range");
  store_u16(row + l.scales_offset + 2 * group, float_to_half_bits(scale));
  if (l.affine) store_u16(row + l.zeros_offset + 2 * group, float_to_half_bits(zero));
  const float inv = scale == 0.f ? 0.f : 1.f / scale;
  for (std::size_t i = 0; i < n; ++i) {
    const float q = std::nearbyint(v[i] * inv + zero);
    const unsigned code = static_cast<unsigned>(std::clamp(q, 0.f, static_cast<float>(qmax)));
    write_code(row, first_col + i, l.bits, code);
  }
}

}  // namespace detail

/// Encodes one row of `src.size()` weights into `dst` (exactly `row_bytes(src.size(), p,
/// scheme)` bytes). `row_index` only names the row in errors. Throws `Error(invalid_argument)` on
/// NaN/Inf input, on values outside the f16 range (f16 output) and on a bad scheme or size.
template <WeightElement T>
void encode_row(std::span<const T> src, Precision p, QuantScheme scheme, std::span<std::byte> dst,
                std::size_t row_index = 0, const QuantizeOptions& opts = {}) {
  validate_scheme(p, scheme, "encode_row");
  if (is_gguf_kquant(p))
    detail::fail(ErrorKind::invalid_argument,
                 "encode_row: " + std::string(name(p)) +
                     " is GGUF's format, read from GGUF files as it lies; moekit does not " +
                     "quantize into it");
  const RowLayout l = RowLayout::of(src.size(), p, scheme);
  MOEKIT_EXPECTS(dst.size() == l.bytes, "encode_row: row " + std::to_string(row_index) + ": " +
                                            std::to_string(dst.size()) + " bytes given, " +
                                            std::to_string(l.bytes) + " needed");
  std::vector<float> v(src.size());
  for (std::size_t c = 0; c < src.size(); ++c) {
    v[c] = to_float(src[c]);
    if (!std::isfinite(v[c])) detail::fail_value(row_index, c, v[c], "is not finite");
  }
  std::byte* out = dst.data();
  switch (p) {
    case Precision::f32:
      std::memcpy(out, v.data(), 4 * v.size());
      return;
    case Precision::bf16:
      for (std::size_t c = 0; c < v.size(); ++c) {
        const std::uint16_t b = float_to_bf16_bits(v[c]);
        if ((b & 0x7f80u) == 0x7f80u) detail::fail_value(row_index, c, v[c], "overflows bf16");
        detail::store_u16(out + 2 * c, b);
      }
      return;
    case Precision::f16:
      for (std::size_t c = 0; c < v.size(); ++c) {
        const std::uint16_t h = float_to_half_bits(v[c]);
        if ((h & 0x7c00u) == 0x7c00u) detail::fail_value(row_index, c, v[c], "overflows f16");
        detail::store_u16(out + 2 * c, h);
      }
      return;
    default:
      break;
  }
  std::memset(out, 0, l.bytes);
  for (std::size_t g = 0; g < l.groups; ++g) {
    const std::size_t first = g * l.group_size;
    const std::size_t n = std::min(l.group_size, l.cols - first);
    detail::quantize_group(v.data() + first, n, first, l, g, out, row_index, opts);
  }
}

/// Encodes a row-major `rows × cols` matrix; returns `matrix_bytes(rows, cols, p, scheme)` bytes.
template <WeightElement T>
std::vector<std::byte> encode_matrix(std::span<const T> src, std::size_t rows, std::size_t cols,
                                     Precision p, QuantScheme scheme = {},
                                     const QuantizeOptions& opts = {}) {
  validate_scheme(p, scheme, "encode_matrix");
  MOEKIT_EXPECTS(rows > 0 && cols > 0 && src.size() == rows * cols,
                 "encode_matrix: " + std::to_string(src.size()) + " values given for a " +
                     std::to_string(rows) + "x" + std::to_string(cols) + " matrix");
  const std::size_t stride = row_bytes(cols, p, scheme);
  std::vector<std::byte> out(rows * stride);
  for (std::size_t r = 0; r < rows; ++r)
    encode_row(src.subspan(r * cols, cols), p, scheme,
               std::span<std::byte>(out.data() + r * stride, stride), r, opts);
  return out;
}

/// Scale of group `g` of a quantized row.
inline float group_scale(const std::byte* row, const RowLayout& l, std::size_t g) noexcept {
  return half_bits_to_float(detail::load_u16(row + l.scales_offset + 2 * g));
}
/// Zero point of group `g` (the implicit 2^(bits−1) for symmetric rows).
inline float group_zero(const std::byte* row, const RowLayout& l, std::size_t g) noexcept {
  return l.affine ? half_bits_to_float(detail::load_u16(row + l.zeros_offset + 2 * g))
                  : l.symmetric_zero;
}

/// Value of weight `c` of a stored row (any format), exactly as the format defines it.
inline float weight_at(const std::byte* row, const RowLayout& l, Precision p,
                       std::size_t c) noexcept {
  switch (p) {
    case Precision::f32: {
      float f;
      std::memcpy(&f, row + 4 * c, 4);
      return f;
    }
    case Precision::bf16:
      return bf16_bits_to_float(detail::load_u16(row + 2 * c));
    case Precision::f16:
      return half_bits_to_float(detail::load_u16(row + 2 * c));
    case Precision::skip:
      return 0.f;
    case Precision::q4_k:
      return q4_k::weight(row + c / q4_k::block_weights * q4_k::block_bytes,
                          c % q4_k::block_weights);
    case Precision::q5_k:
      return q5_k::weight(row + c / q5_k::block_weights * q5_k::block_bytes,
                          c % q5_k::block_weights);
    case Precision::q6_k:
      return q6_k::weight(row + c / q6_k::block_weights * q6_k::block_bytes,
                          c % q6_k::block_weights);
    case Precision::q2_k:
      return q2_k::weight(row + c / q2_k::block_weights * q2_k::block_bytes,
                          c % q2_k::block_weights);
    case Precision::q3_k:
      return q3_k::weight(row + c / q3_k::block_weights * q3_k::block_bytes,
                          c % q3_k::block_weights);
    default:
      break;
  }
  const std::size_t g = c / l.group_size;
  return group_scale(row, l, g) *
         (static_cast<float>(read_code(row, c, l.bits)) - group_zero(row, l, g));
}

/// Decodes one stored row into `dst[0..cols)`.
inline void decode_row(const std::byte* row, std::size_t cols, Precision p, QuantScheme scheme,
                       float* dst) noexcept {
  const RowLayout l = RowLayout::of(cols, p, scheme);
  for (std::size_t c = 0; c < cols; ++c) dst[c] = weight_at(row, l, p, c);
}

/// Decodes a whole matrix to row-major floats.
inline std::vector<float> decode_matrix(const MatrixView& m) {
  std::vector<float> out(m.rows * m.cols);
  std::vector<std::byte> row(m.row_stride());
  for (std::size_t r = 0; r < m.rows; ++r)
    decode_row(stored_row(m, r, row.data()), m.cols, m.precision, m.scheme,
               out.data() + r * m.cols);
  return out;
}

}  // namespace moekit
