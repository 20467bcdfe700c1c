#pragma once
/// \file AVX-512 VNNI tile kernel of the int8-activation GEMM (prefill): R quantized rows × T
/// tokens at a time, so each 64-byte block of codes is split into its planes once and dotted
/// with T activations, and each activation block is loaded once for R rows (prefill is
/// compute-bound: the unpack and the loads are what a one-row kernel repeats per token).
///
/// Activations are those of the GEMV (avx512_int8_rows.hpp `prepare`: int8 per 32-value chunk,
/// planes per block). Per (row, token) and block: one `vpdpbusd` per plane into int32 lanes that
/// each belong to one chunk, converted and scaled per lane by s·dx, added into one float
/// accumulator; per 16 chunks the zero-point term s·z·dx·Σxq goes into the same accumulator.
/// Every (row, token) pair has its own accumulator and the same instruction sequence whatever
/// R, T or the pair's place in the tile, so a token's result never depends on the batch.

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

/// out[r·T + t] = row r · token t for the first T tokens of the tile `in` (rows of layout `l`,
/// groups of 32/64/128; T < TMax for a batch's last tokens). Blocks go 16 chunks a step; per
/// block the R rows' planes are unpacked once and each token's activation planes loaded once.
template <unsigned Bits, std::size_t R, std::size_t T, std::size_t TMax = T>
MOEKIT_TARGET_AVX512_VNNI inline void tile_dots(const TileInput<R, TMax>& in, const RowLayout& l,
                                                float* out) noexcept {
  constexpr std::size_t planes = 8 / Bits, per_block = block_chunks(Bits);
  const std::size_t chunks = l.cols / 32, blocked = chunks / per_block * per_block;
  const __m512i mask = _mm512_set1_epi8(static_cast<char>((1u << Bits) - 1u));
  __m512 acc[R][T];
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  for (std::size_t c0 = 0; c0 < blocked; c0 += 16) {
    const std::size_t end = std::min(blocked, c0 + 16);
    for (std::size_t c = c0; c < end; c += per_block) {
      __m512i code[R][planes];
      __m512 sl[R];
      for (std::size_t r = 0; r < R; ++r) {
        const __m512i v = _mm512_loadu_si512(in.rows[r] + c * 4 * Bits);
        for (std::size_t k = 0; k < planes; ++k)
          code[r][k] = Bits == 8 ? v
                                 : _mm512_and_si512(
                                       _mm512_srli_epi16(v, static_cast<unsigned>(k * Bits)), mask);
        sl[r] = block_scales<Bits>(in.s[r] + c);
      }
      for (std::size_t t = 0; t < T; ++t) {
        const std::int8_t* xq = in.acts[t]->xq + 32 * c;
        __m512i x[planes];
        for (std::size_t k = 0; k < planes; ++k) x[k] = _mm512_loadu_si512(xq + 64 * k);
        const __m512 dl = block_scales<Bits>(in.acts[t]->dx + c);
        for (std::size_t r = 0; r < R; ++r) {
          __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), code[r][0], x[0]);
          for (std::size_t k = 1; k < planes; ++k) d = _mm512_dpbusd_epi32(d, code[r][k], x[k]);
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(sl[r], dl), acc[r][t]);
        }
      }
    }
    // The step's zero-point terms, into the same accumulators (their lanes are summed at the end).
    const auto lanes = static_cast<__mmask16>((1u << (end - c0)) - 1u);
    for (std::size_t t = 0; t < T; ++t) {
      const __m512 dxs = _mm512_maskz_loadu_ps(lanes, in.acts[t]->dx_sum + c0);
      for (std::size_t r = 0; r < R; ++r)
        acc[r][t] = _mm512_fnmadd_ps(_mm512_maskz_loadu_ps(lanes, in.sz[r] + c0), dxs, acc[r][t]);
    }
  }
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < T; ++t) {
      const float tail =
          blocked < chunks || chunks * 32 < l.cols
              ? tile_tail<Bits>(in.rows[r], l, in.s[r], in.sz[r], *in.acts[t], blocked)
              : 0.f;
      out[r * T + t] = _mm512_reduce_add_ps(acc[r][t]) + tail;
    }
}

}  // namespace moekit::detail::avx512_int8

#pragma GCC diagnostic pop

#endif
