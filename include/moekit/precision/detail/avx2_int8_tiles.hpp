#pragma once
/// \file AVX2 tile kernel of the int8-activation GEMM (prefill), `vpmaddubsw` or AVX-VNNI's
/// 256-bit `vpdpbusd`: R quantized rows × T tokens at a time, so each block of codes is unpacked
/// once for T tokens, half a block (32 code bytes) per step. The activation is the GEMV's
/// (avx2_int8_rows.hpp `prepare`, the same layout and rounding as the AVX-512 one). Without VNNI
/// q8 codes are read as q − 128 (avx2_int8_rows.hpp: no int16 pair can saturate) and the
/// zero points shift by 128 to match. Each (row, token) pair has its own accumulator and the same
/// instruction sequence wherever it sits in the tile: a token's result never depends on the batch.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "moekit/precision/detail/avx2_int8_rows.hpp"
#include "moekit/precision/detail/avx512_int8_tiles.hpp"
#include "moekit/precision/detail/prepared_activation.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/quantize.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moekit::detail::avx2_int8 {

/// Per chunk of a row: s and s·(z − shift) (zero_shift: q8 without VNNI), as the AVX-512
/// chunk_scales; 8 chunks per conversion, the last < 8 one by one (exact-size loads).
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2 inline void chunk_scales(const std::byte* row, const RowLayout& l, float* s,
                                            float* sz) noexcept {
  const std::size_t chunks = l.cols / 32;
  const int shift = l.group_size == 32 ? 0 : l.group_size == 64 ? 1 : 2;
  const __m256i lane_group = _mm256_srli_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), shift);
  const __m256 zshift = _mm256_set1_ps(zero_shift<Bits, Vnni>);
  std::size_t c = 0;
  for (; c + 8 <= chunks; c += 8) {
    const std::size_t g = c >> shift;
    const __m256 sc = chunk_values(row + l.scales_offset + 2 * g, shift, lane_group);
    const __m256 z = l.affine ? chunk_values(row + l.zeros_offset + 2 * g, shift, lane_group)
                              : _mm256_set1_ps(l.symmetric_zero);
    _mm256_storeu_ps(s + c, sc);
    _mm256_storeu_ps(sz + c, _mm256_mul_ps(sc, _mm256_sub_ps(z, zshift)));
  }
  for (; c < chunks; ++c) {
    const std::size_t g = c * 32 / l.group_size;
    s[c] = group_scale(row, l, g);
    sz[c] = s[c] * (group_zero(row, l, g) - zero_shift<Bits, Vnni>);
  }
}

/// The planes of 32 code bytes `v` as the products take them: q4/q2 split by plane; q8 as is
/// (VNNI) or as |q − 128| (vpmaddubsw; the sign goes onto the activation in plane_dot).
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2 inline void code_planes(__m256i v, __m256i* out) noexcept {
  if constexpr (Bits == 8) {
    out[0] =
        Vnni ? v : _mm256_abs_epi8(_mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))));
  } else {
    const __m256i m = _mm256_set1_epi8(static_cast<char>((1u << Bits) - 1u));
    for (unsigned k = 0; k < 8 / Bits; ++k)
      out[k] = _mm256_and_si256(_mm256_srli_epi16(v, static_cast<int>(k * Bits)), m);
  }
}

/// Σ code·xq per int32 lane of half a block: planes from code_planes, `v` the raw codes (q8
/// without VNNI: the sign of q − 128), `x` the activation planes.
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline __m256i plane_dot(const __m256i* code, __m256i v,
                                                 const __m256i* x) noexcept {
  if constexpr (Bits == 8) {
    if constexpr (Vnni) return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), code[0], x[0]);
    const __m256i w = _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80)));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(code[0], _mm256_sign_epi8(x[0], w)),
                             _mm256_set1_epi16(1));
  } else if constexpr (Vnni) {
    __m256i d = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), code[0], x[0]);
    for (unsigned k = 1; k < 8 / Bits; ++k) d = _mm256_dpbusd_avx_epi32(d, code[k], x[k]);
    return d;
  } else {  // int16 sums of all planes first (fit: see half_dot)
    __m256i s16 = _mm256_maddubs_epi16(code[0], x[0]);
    for (unsigned k = 1; k < 8 / Bits; ++k)
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(code[k], x[k]));
    return _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
  }
}

/// The (row, token) dot after the last whole block, as the AVX-512 tile_tail.
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline float tile_tail(const std::byte* row, const RowLayout& l,
                                               const float* s, const float* sz,
                                               const Int8Activation& a, std::size_t c) noexcept {
  const std::size_t chunks = l.cols / 32;
  __m256 acc = _mm256_setzero_ps();
  float zero_term = 0.f;
  for (; c < chunks; ++c) {
    const __m256i d =
        codes_dot<Bits, Vnni>(codes32<Bits>(row + c * 4 * Bits),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + 32 * c)));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(s[c] * a.dx[c]), acc);
    zero_term += sz[c] * a.dx_sum[c];
  }
  float total = hsum(acc) - zero_term;
  constexpr Precision p = Bits == 8 ? Precision::q8 : Bits == 4 ? Precision::q4 : Precision::q2;
  for (std::size_t col = chunks * 32; col < l.cols; ++col)
    total += weight_at(row, l, p, col) * a.x[col];
  return total;
}

/// out[r·T + t] = row r · token t for the first T tokens of the tile `in` (groups of 32/64/128),
/// half a block a step.
template <unsigned Bits, bool Vnni, std::size_t R, std::size_t T, std::size_t TMax = T>
MOEKIT_TARGET_AVX2_VNNI inline void tile_dots(const TileInput<R, TMax>& in, const RowLayout& l,
                                              float* out) noexcept {
  constexpr std::size_t planes = 8 / Bits, per_block = block_chunks(Bits), per_half = per_block / 2;
  const std::size_t chunks = l.cols / 32, blocked = chunks / per_block * per_block;
  __m256 acc[R][T];
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  // Half blocks: the half's chunks from `c`, its activation planes at 32·(block start) + 32·half +
  // 64·k.
  for (std::size_t c0 = 0; c0 < blocked; c0 += 8) {
    const std::size_t end = std::min(blocked, c0 + 8);
    for (std::size_t c = c0; c < end; c += per_half) {
      const std::size_t xoff = 32 * (c / per_block * per_block) + 32 * (c % per_block / per_half);
      __m256i code[R][planes], raw[R];
      __m256 sl[R];
      for (std::size_t r = 0; r < R; ++r) {
        raw[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.rows[r] + c * 4 * Bits));
        code_planes<Bits, Vnni>(raw[r], code[r]);
        sl[r] = half_scales<Bits>(in.s[r] + c);
      }
      for (std::size_t t = 0; t < T; ++t) {
        __m256i x[planes];
        half_activation<Bits>(in.acts[t]->xq + xoff, 64, x);
        const __m256 dl = half_scales<Bits>(in.acts[t]->dx + c);
        for (std::size_t r = 0; r < R; ++r)
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(plane_dot<Bits, Vnni>(code[r], raw[r], x)),
                                      _mm256_mul_ps(sl[r], dl), acc[r][t]);
      }
    }
    // The step's zero-point terms (lanes past `end` masked off).
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(end - c0)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (std::size_t t = 0; t < T; ++t) {
      const __m256 dxs = _mm256_maskload_ps(in.acts[t]->dx_sum + c0, lanes);
      for (std::size_t r = 0; r < R; ++r)
        acc[r][t] = _mm256_fnmadd_ps(_mm256_maskload_ps(in.sz[r] + c0, lanes), dxs, acc[r][t]);
    }
  }
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < T; ++t) {
      const float tail =
          blocked < chunks || chunks * 32 < l.cols
              ? tile_tail<Bits, Vnni>(in.rows[r], l, in.s[r], in.sz[r], *in.acts[t], blocked)
              : 0.f;
      out[r * T + t] = hsum(acc[r][t]) + tail;
    }
}

}  // namespace moekit::detail::avx2_int8

#pragma GCC diagnostic pop

#endif
