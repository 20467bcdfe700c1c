#pragma once
/// \file AVX-512 VNNI row dots of the GGUF K-quant formats (q4_k, q6_k) with int8 activations
/// (kquant_activation.hpp), N rows side by side sharing the activation's loads.
///
/// Per super-block, the codes are unpacked 64 at a time into unsigned bytes (q4_k: the low or
/// high nibbles of 64 bytes of qs; q6_k: a nibble of 64 bytes of ql or'ed with two bits of qh
/// shifted to bits 4-5) and dotted with 64 int8 activations by one `vpdpbusd`: int32 lane L sums
/// 4 neighbouring codes, so each lane lies in one sub-block (q4_k: lanes 0-7 and 8-15 are two
/// sub-blocks; q6_k: four lanes per sub-block). The lanes are converted to float and multiplied,
/// in one FMA, by their sub-block's d·scale·dx, spread to the lanes by one permute of the block's
/// per-sub-block factors; the minimums (q4_k) and the code offset 32 (q6_k) are one FMA per block
/// with the activation's per-sub-block dx·Σxq.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/precision/detail/avx512_int8_rows.hpp"
#include "moekit/precision/detail/kquant_activation.hpp"
#include "moekit/precision/gguf_q4_k.hpp"
#include "moekit/precision/gguf_q6_k.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moekit::detail::avx512_kquant {

/// Prefetches the `bytes` at p into L2 (rows further down a stream).
MOEKIT_TARGET_AVX512_VNNI inline void prefetch_l2(const std::byte* p, std::size_t bytes) noexcept {
  for (std::size_t o = 0; o < bytes; o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T1);
}

/// The two f16 values at p as floats (d and dmin of a q4_k block).
MOEKIT_TARGET_AVX512_VNNI inline __m128 two_halves(const std::byte* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(v)));
}

/// Eight unsigned bytes of a 64-bit word as eight floats.
MOEKIT_TARGET_AVX512_VNNI inline __m256 bytes_to_floats(std::uint64_t w) noexcept {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(w))));
}

/// The sum of the eight lanes of v.
MOEKIT_TARGET_AVX512_VNNI inline float sum8(__m256 v) noexcept {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/// rows[n] · x for n < N: `blocks` q4_k super-blocks per row.
template <std::size_t N>
MOEKIT_TARGET_AVX512_VNNI inline void q4_k_row_dots(const std::byte* const* rows,
                                                    std::size_t blocks, const KQuantActivation& a,
                                                    float* out,
                                                    const std::byte* const* next) noexcept {
  const __m512i nib = _mm512_set1_epi8(15), zero = _mm512_setzero_si512();
  // Lane L of the four unpacked vectors (low/high nibbles of qs[0..63], then of qs[64..127])
  // belongs to sub-block: 0|2, 1|3, 4|6, 5|7 (lanes 0-7 | lanes 8-15).
  const __m512i spread[4] = {
      _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0),
      _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
      _mm512_set_epi32(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4),
      _mm512_set_epi32(7, 7, 7, 7, 7, 7, 7, 7, 5, 5, 5, 5, 5, 5, 5, 5)};
  __m512 acc[N];
  __m256 mins[N];
  for (std::size_t n = 0; n < N; ++n) acc[n] = _mm512_setzero_ps(), mins[n] = _mm256_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t off = b * q4_k::block_bytes;
    const std::int8_t* xq = a.xq + 256 * b;
    __m512i x[4];
    for (int k = 0; k < 4; ++k) x[k] = _mm512_loadu_si512(xq + 64 * k);
    const __m256 dx = _mm256_loadu_ps(a.dx + 8 * b), dxs = _mm256_loadu_ps(a.dx_sum + 8 * b);
    for (std::size_t n = 0; n < N; ++n) {
      const std::byte* block = rows[n] + off;
      if (next) prefetch_l2(next[n] + off, q4_k::block_bytes);
      const __m128 dd = two_halves(block);
      std::uint64_t sc, m;
      q4_k::scales_mins_words(block, sc, m);
      const __m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_broadcastss_ps(dd), bytes_to_floats(sc)),
                                     dx);
      const __m256 dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dd));
      mins[n] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, bytes_to_floats(m)), dxs, mins[n]);
      const __m512 fz = _mm512_castps256_ps512(f);
      for (int h = 0; h < 2; ++h) {
        const __m512i q = _mm512_loadu_si512(block + q4_k::codes_offset + 64 * h);
        const __m512i lo = _mm512_and_si512(q, nib);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
        const __m512i plo = _mm512_dpbusd_epi32(zero, lo, x[2 * h]);
        const __m512i phi = _mm512_dpbusd_epi32(zero, hi, x[2 * h + 1]);
        acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(plo),
                                 _mm512_permutexvar_ps(spread[2 * h], fz), acc[n]);
        acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(phi),
                                 _mm512_permutexvar_ps(spread[2 * h + 1], fz), acc[n]);
      }
    }
  }
  for (std::size_t n = 0; n < N; ++n) out[n] = _mm512_reduce_add_ps(acc[n]) - sum8(mins[n]);
}

/// rows[n] · x for n < N: `blocks` q6_k super-blocks per row.
template <std::size_t N>
MOEKIT_TARGET_AVX512_VNNI inline void q6_k_row_dots(const std::byte* const* rows,
                                                    std::size_t blocks, const KQuantActivation& a,
                                                    float* out,
                                                    const std::byte* const* next) noexcept {
  const __m512i nib = _mm512_set1_epi8(15), two = _mm512_set1_epi8(3);
  const __m512i zero = _mm512_setzero_si512();
  // Vector v (weights 64v .. 64v+63 of the block): lane L belongs to sub-block 4v + L/4.
  __m512i spread[4];
  for (int v = 0; v < 4; ++v)
    spread[v] = _mm512_add_epi32(_mm512_set1_epi32(4 * v),
                                 _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
  __m512 acc[N], offset[N];
  for (std::size_t n = 0; n < N; ++n) acc[n] = offset[n] = _mm512_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t off = b * q6_k::block_bytes;
    const std::int8_t* xq = a.xq + 256 * b;
    __m512i x[4];
    for (int k = 0; k < 4; ++k) x[k] = _mm512_loadu_si512(xq + 64 * k);
    const __m512 dx = _mm512_loadu_ps(a.dx + 16 * b), dxs = _mm512_loadu_ps(a.dx_sum + 16 * b);
    for (std::size_t n = 0; n < N; ++n) {
      const std::byte* block = rows[n] + off;
      if (next) prefetch_l2(next[n] + off, q6_k::block_bytes);
      std::uint16_t dh;
      std::memcpy(&dh, block + q6_k::d_offset, 2);
      const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + q6_k::scales_offset));
      const __m512 g = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s8)),
                                     _mm512_set1_ps(_cvtsh_ss(dh)));
      offset[n] = _mm512_fmadd_ps(g, dxs, offset[n]);
      const __m512 f = _mm512_mul_ps(g, dx);
      for (int h = 0; h < 2; ++h) {
        const __m512i low = _mm512_loadu_si512(block + 64 * h);
        const __m256i high = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(block + q6_k::high_offset + 32 * h));
        // Bytes 0-31: qh; bytes 32-63: qh >> 2 (the bits of weights 32-63 of the half).
        const __m512i hz = _mm512_inserti64x4(_mm512_castsi256_si512(high),
                                              _mm256_srli_epi16(high, 2), 1);
        const __m512i qa = _mm512_or_si512(_mm512_and_si512(low, nib),
                                           _mm512_slli_epi16(_mm512_and_si512(hz, two), 4));
        const __m512i qb = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16(low, 4), nib),
            _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hz, 4), two), 4));
        const __m512i pa = _mm512_dpbusd_epi32(zero, qa, x[2 * h]);
        const __m512i pb = _mm512_dpbusd_epi32(zero, qb, x[2 * h + 1]);
        acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pa),
                                 _mm512_permutexvar_ps(spread[2 * h], f), acc[n]);
        acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pb),
                                 _mm512_permutexvar_ps(spread[2 * h + 1], f), acc[n]);
      }
    }
  }
  for (std::size_t n = 0; n < N; ++n)
    out[n] = _mm512_reduce_add_ps(acc[n]) - 32.f * _mm512_reduce_add_ps(offset[n]);
}

}  // namespace moekit::detail::avx512_kquant

#pragma GCC diagnostic pop

#endif
