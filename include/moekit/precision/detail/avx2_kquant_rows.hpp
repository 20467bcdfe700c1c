#pragma once
/// \file AVX2 row dots of the GGUF K-quant formats (q4_k, q6_k) with int8 activations
/// (kquant_activation.hpp), through AVX-VNNI's `vpdpbusd` where the CPU has it, else
/// `vpmaddubsw` + `vpmaddwd` (codes ≤ 63 by |xq| ≤ 127: no int16 pair sum reaches 32767).
///
/// As the AVX-512 kernels (avx512_kquant_rows.hpp) at half the width: 32 codes per dot, whose
/// int32 lanes lie in one q4_k sub-block (lanes 0-7) or two q6_k sub-blocks (lanes 0-3, 4-7),
/// converted to float and multiplied by their sub-block's d·scale·dx in one FMA.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/precision/detail/avx2_int8_rows.hpp"
#include "moekit/precision/detail/kquant_activation.hpp"
#include "moekit/precision/gguf_q4_k.hpp"
#include "moekit/precision/gguf_q6_k.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)

namespace moekit::detail::avx2_kquant {

MOEKIT_TARGET_AVX2_VNNI inline float sum8(__m256 v) noexcept {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

MOEKIT_TARGET_AVX2_VNNI inline __m256i load32(const void* p) noexcept {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

/// Eight unsigned bytes of a 64-bit word as eight floats.
MOEKIT_TARGET_AVX2_VNNI inline __m256 bytes_to_floats(std::uint64_t w) noexcept {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(w))));
}

/// A q4_k row of `blocks` super-blocks · the prepared activation; `next` (optional) is
/// prefetched into L2 at the same offsets.
template <bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline float q4_k_row_dot(const std::byte* row, std::size_t blocks,
                                                  const KQuantActivation& a,
                                                  const std::byte* next) noexcept {
  const __m256i nib = _mm256_set1_epi8(15), zero = _mm256_setzero_si256();
  __m256 acc = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* block = row + b * q4_k::block_bytes;
    if (next)
      for (std::size_t o = 0; o < q4_k::block_bytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + b * q4_k::block_bytes + o), _MM_HINT_T1);
    std::uint32_t dd;
    std::memcpy(&dd, block, 4);
    const __m128 d2 = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dd)));
    std::uint64_t sc, m;
    q4_k::scales_mins_words(block, sc, m);
    const __m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_broadcastss_ps(d2), bytes_to_floats(sc)),
                                   _mm256_loadu_ps(a.dx + 8 * b));
    const __m256 dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(d2));
    mins = _mm256_fmadd_ps(_mm256_mul_ps(dmin, bytes_to_floats(m)),
                           _mm256_loadu_ps(a.dx_sum + 8 * b), mins);
    const std::int8_t* xq = a.xq + 256 * b;
    for (int c = 0; c < 4; ++c) {  // qs[32c ..]: sub-blocks 2c (low nibbles) and 2c+1 (high)
      const __m256i q = load32(block + q4_k::codes_offset + 32 * c);
      const __m256i lo = _mm256_and_si256(q, nib);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nib);
      const __m256i plo =
          avx2_int8::dot_u8s8<Vnni>(zero, lo, load32(xq + 32 * q4_k_chunk_slot(2 * c)));
      const __m256i phi =
          avx2_int8::dot_u8s8<Vnni>(zero, hi, load32(xq + 32 * q4_k_chunk_slot(2 * c + 1)));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(plo),
                            _mm256_permutevar8x32_ps(f, _mm256_set1_epi32(2 * c)), acc);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(phi),
                            _mm256_permutevar8x32_ps(f, _mm256_set1_epi32(2 * c + 1)), acc);
    }
  }
  return sum8(acc) - sum8(mins);
}

/// A q6_k row of `blocks` super-blocks · the prepared activation.
template <bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline float q6_k_row_dot(const std::byte* row, std::size_t blocks,
                                                  const KQuantActivation& a,
                                                  const std::byte* next) noexcept {
  const __m256i nib = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
  const __m256i zero = _mm256_setzero_si256();
  __m256 acc = _mm256_setzero_ps(), offset = _mm256_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* block = row + b * q6_k::block_bytes;
    if (next)
      for (std::size_t o = 0; o < q6_k::block_bytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + b * q6_k::block_bytes + o), _MM_HINT_T1);
    std::uint16_t dh;
    std::memcpy(&dh, block + q6_k::d_offset, 2);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(dh));
    std::uint64_t s[2];
    std::memcpy(s, block + q6_k::scales_offset, 16);
    const std::int8_t* xq = a.xq + 256 * b;
    for (int h = 0; h < 2; ++h) {  // half h: sub-blocks 8h .. 8h+7
      const __m256 g = _mm256_mul_ps(
          d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(static_cast<long long>(s[h])))));
      offset = _mm256_fmadd_ps(g, _mm256_loadu_ps(a.dx_sum + 16 * b + 8 * h), offset);
      const __m256 f = _mm256_mul_ps(g, _mm256_loadu_ps(a.dx + 16 * b + 8 * h));
      const __m256i low[2] = {load32(block + 64 * h), load32(block + 64 * h + 32)};
      const __m256i high = load32(block + q6_k::high_offset + 32 * h);
      for (int r = 0; r < 4; ++r) {  // weights 32r .. 32r+31 of the half
        const __m256i nibble = r < 2 ? _mm256_and_si256(low[r], nib)
                                     : _mm256_and_si256(_mm256_srli_epi16(low[r - 2], 4), nib);
        const __m256i top = _mm256_and_si256(_mm256_srl_epi16(high, _mm_cvtsi32_si128(2 * r)), two);
        const __m256i q = _mm256_or_si256(nibble, _mm256_slli_epi16(top, 4));
        const __m256i p = avx2_int8::dot_u8s8<Vnni>(zero, q, load32(xq + 128 * h + 32 * r));
        const __m256i spread = _mm256_setr_epi32(2 * r, 2 * r, 2 * r, 2 * r, 2 * r + 1, 2 * r + 1,
                                                 2 * r + 1, 2 * r + 1);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_permutevar8x32_ps(f, spread), acc);
      }
    }
  }
  return sum8(acc) - 32.f * sum8(offset);
}

}  // namespace moekit::detail::avx2_kquant

#endif
