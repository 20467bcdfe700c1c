#pragma once
/// \file Per-row parts of the AVX-512 VNNI int8-activation GEMM (prefill) that the panel tile
/// (avx512_int8_panel_tiles.hpp) shares: each row's per-chunk scales, and the dot of the chunks
/// after the last whole 64-byte block (and the columns after the last chunk), one (row, token)
/// pair at a time. Activations are those of the GEMV (avx512_int8_rows.hpp `prepare`).

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "moekit/precision/detail/avx512_int8_rows.hpp"
#include "moekit/precision/detail/prepared_activation.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/quantize.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moekit::detail::avx512_int8 {

/// Per chunk of a row: the scale s and s·z (z: the zero point, or 2^(bits−1) when symmetric),
/// into s[0..chunks) and sz[0..chunks); groups of 32/64/128 (16 chunks per conversion).
MOEKIT_TARGET_AVX512_VNNI inline void chunk_scales(const std::byte* row, const RowLayout& l,
                                                   float* s, float* sz) noexcept {
  const std::size_t chunks = l.cols / 32;
  const unsigned shift = l.group_size == 32 ? 0 : l.group_size == 64 ? 1 : 2;
  const __m512i lane_group = _mm512_srli_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), shift);
  for (std::size_t c = 0; c < chunks; c += 16) {
    const auto left = static_cast<unsigned>(std::min<std::size_t>(16, chunks - c));
    const auto lanes = static_cast<__mmask16>((1u << left) - 1u);
    const std::size_t g = c >> shift;
    const __m512 sc = per_chunk_values(row + l.scales_offset + 2 * g, shift, left, lane_group);
    const __m512 z = l.affine
                         ? per_chunk_values(row + l.zeros_offset + 2 * g, shift, left, lane_group)
                         : _mm512_set1_ps(l.symmetric_zero);
    _mm512_mask_storeu_ps(s + c, lanes, sc);
    _mm512_mask_storeu_ps(sz + c, lanes, _mm512_mul_ps(sc, z));
  }
}

/// The part of one (row, token) dot after the last whole block: chunks one by one (256-bit
/// `vpdpbusd`, the activation in chunk_slot order there), then the columns after the last chunk
/// in floats.
template <unsigned Bits>
MOEKIT_TARGET_AVX512_VNNI inline float tile_tail(const std::byte* row, const RowLayout& l,
                                                 const float* s, const float* sz,
                                                 const Int8Activation& a, std::size_t c) noexcept {
  const std::size_t chunks = l.cols / 32;
  __m256 acc = _mm256_setzero_ps();
  float zero_term = 0.f;
  for (; c < chunks; ++c) {
    const __m256i d =
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes32<Bits>(row + c * 4 * Bits),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + 32 * c)));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(s[c] * a.dx[c]), acc);
    zero_term += sz[c] * a.dx_sum[c];
  }
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 t = _mm_add_ps(h, _mm_movehl_ps(h, h));
  float total = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t))) - zero_term;
  constexpr Precision p = Bits == 8 ? Precision::q8 : Bits == 4 ? Precision::q4 : Precision::q2;
  for (std::size_t col = chunks * 32; col < l.cols; ++col)
    total += weight_at(row, l, p, col) * a.x[col];
  return total;
}

}  // namespace moekit::detail::avx512_int8

#pragma GCC diagnostic pop

#endif
