#pragma once
/// \file Portable int8-activation GEMM kernel (any CPU, and the check of the SIMD tiles): the
/// activation rounded as the SIMD paths round it (int8 per 32-value chunk, dx = max|x|/127,
/// nearest even) but kept in column order, and each (row, token) dot summed chunk by chunk in
/// int32, scaled in floats. Any group size (a chunk lies in one group: groups are 32, 64, 128 or
/// the whole row).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "moekit/precision/detail/prepared_activation.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/quantize.hpp"

namespace moekit::detail::scalar_int8 {

/// Quantizes x into xq (cols/32·32 bytes, column order) and dx (2·cols/32 floats: dx, dx·Σxq).
inline Int8Activation prepare_into(const float* x, std::size_t cols, std::int8_t* xq,
                                   float* dx) noexcept {
  const std::size_t chunks = cols / 32;
  float* dxs = dx + chunks;
  for (std::size_t c = 0; c < chunks; ++c) {
    float amax = 0.f;
    for (std::size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * c + i]));
    const float d = amax / 127.f, inv = amax > 0 ? 127.f / amax : 0.f;
    int sum = 0;
    for (std::size_t i = 0; i < 32; ++i) {
      const auto q = static_cast<int>(std::nearbyint(x[32 * c + i] * inv));
      xq[32 * c + i] = static_cast<std::int8_t>(q);
      sum += q;
    }
    dx[c] = d;
    dxs[c] = d * static_cast<float>(sum);
  }
  return {xq, dx, dxs, x};
}

/// Per chunk of a row: the scale s and s·z.
inline void chunk_scales(const std::byte* row, const RowLayout& l, float* s, float* sz) noexcept {
  for (std::size_t c = 0; c < l.cols / 32; ++c) {
    const std::size_t g = c * 32 / l.group_size;
    s[c] = group_scale(row, l, g);
    sz[c] = s[c] * group_zero(row, l, g);
  }
}

/// Row · token: Σ_c s·dx·Σ q·xq − Σ_c s·z·dx·Σxq, then the columns after the last chunk in floats.
inline float row_token_dot(const std::byte* row, const RowLayout& l, const float* s,
                           const float* sz, const Int8Activation& a) noexcept {
  const std::size_t chunks = l.cols / 32;
  float acc = 0.f, zero_term = 0.f;
  for (std::size_t c = 0; c < chunks; ++c) {
    std::int32_t d = 0;
    for (std::size_t i = 0; i < 32; ++i)
      d += static_cast<std::int32_t>(read_code(row, 32 * c + i, l.bits)) * a.xq[32 * c + i];
    acc += static_cast<float>(d) * (s[c] * a.dx[c]);
    zero_term += sz[c] * a.dx_sum[c];
  }
  float total = acc - zero_term;
  const Precision p = l.bits == 8 ? Precision::q8 : l.bits == 4 ? Precision::q4 : Precision::q2;
  for (std::size_t col = chunks * 32; col < l.cols; ++col)
    total += weight_at(row, l, p, col) * a.x[col];
  return total;
}

/// out[r·T + t] = row r · token t.
template <std::size_t R, std::size_t T>
inline void tile_dots(const TileInput<R, T>& in, const RowLayout& l, float* out) noexcept {
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < T; ++t)
      out[r * T + t] = row_token_dot(in.rows[r], l, in.s[r], in.sz[r], *in.acts[t]);
}

}  // namespace moekit::detail::scalar_int8
