#pragma once
/// \file AVX2 row dots of the GGUF K-quant formats (q2_k .. q6_k) with int8 activations
/// (kquant_activation.hpp), through AVX-VNNI's `vpdpbusd` where the CPU has it, else
/// `vpmaddubsw` + `vpmaddwd` (codes ≤ 63 by |xq| ≤ 127: no int16 pair sum reaches 32767).
///
/// As the AVX-512 kernels (avx512_kquant_rows.hpp) at half the width: 32 codes per dot, whose
/// int32 lanes lie in one q4_k sub-block (lanes 0-7; weighted by the scales in integers) or two
/// q6_k sub-blocks (lanes 0-3, 4-7; converted and multiplied by d·scale·dx in one FMA).
/// q2_k and q3_k (16-weight sub-blocks, codes ≤ 7) take `vpmaddubsw` alone on every CPU, its
/// int16 pair sums weighted by the sub-blocks' scales in the `vpmaddwd` that sums them anyway
/// (AVX-512 VNNI CPUs with GFNI and VBMI run avx512_kquant's kernels instead).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "moekit/precision/detail/avx2_int8_rows.hpp"
#include "moekit/precision/gguf_q2_k.hpp"
#include "moekit/precision/gguf_q3_k.hpp"
#include "moekit/precision/gguf_q4_k.hpp"
#include "moekit/precision/gguf_q5_k.hpp"
#include "moekit/precision/gguf_q6_k.hpp"
#include "moekit/precision/kquant_activation.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)

namespace moekit::detail::avx2_kquant {

MOEKIT_TARGET_AVX2 inline float sum8(__m256 v) noexcept {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

MOEKIT_TARGET_AVX2 inline __m256i load32(const void* p) noexcept {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

/// max |x[i]| for i < n (a multiple of 8).
MOEKIT_TARGET_AVX2_VNNI inline float max_abs(const float* x, std::size_t n) noexcept {
  __m256 m = _mm256_setzero_ps();
  for (std::size_t i = 0; i < n; i += 8)
    m = _mm256_max_ps(m, _mm256_andnot_ps(_mm256_set1_ps(-0.f), _mm256_loadu_ps(x + i)));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/// The sum of the eight int32 lanes of v.
MOEKIT_TARGET_AVX2_VNNI inline int sum8i(__m256i v) noexcept {
  __m128i u = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 0, 3, 2)));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(u);
}

/// 32 values rounded to int8 with the multiplier `inv` (to nearest even, as prepare_kquant),
/// stored at q; returns the sums of the two halves' codes.
MOEKIT_TARGET_AVX2_VNNI inline std::pair<int, int> round_chunk(const float* x, float inv,
                                                               std::int8_t* q) noexcept {
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lanes
  __m256i qi[4];
  for (int i = 0; i < 4; ++i)
    qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), _mm256_set1_ps(inv)));
  const __m256i b = _mm256_permutevar8x32_epi32(
      _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3])),
      order);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), b);
  return {sum8i(_mm256_add_epi32(qi[0], qi[1])), sum8i(_mm256_add_epi32(qi[2], qi[3]))};
}

/// prepare_kquant (kquant_activation.hpp) vectorised, with the same values (the same products and
/// rounding to nearest even): it runs once per GEMV.
inline KQuantActivation prepare(const float* x, std::size_t cols, Precision p, KQuantStorage& st) {
  return prepare_kquant_with<&max_abs, &round_chunk>(x, cols, p, st);
}

/// Prefetches into L2 the cache lines of `row` that start in [off, off + bytes) (each line once).
MOEKIT_TARGET_AVX2 inline void prefetch_l2(const std::byte* row, std::size_t off,
                                           std::size_t bytes) noexcept {
  for (std::size_t o = (off + 63) / 64 * 64; o < off + bytes; o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(row + o), _MM_HINT_T1);
}

/// 16 in each byte of v whose bit j is set, else 0.
MOEKIT_TARGET_AVX2_VNNI inline __m256i bit_as_16(__m256i v, int j) noexcept {
  const __m256i m = _mm256_set1_epi8(static_cast<char>(1 << j));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, m), m), _mm256_set1_epi8(16));
}

/// A q4_k row of `blocks` super-blocks · the prepared activation; `next` (optional) is
/// prefetched into L2 at the same offsets. Per 32 bytes of qs, the low- and high-nibble dots
/// (sub-blocks 2c and 2c+1) are packed to int16 and weighted by their scales with `vpmaddwd`.
/// Q5: q5_k rows, whose codes take bit j of qh[l] as bit 4.
template <bool Vnni, bool Q5 = false>
MOEKIT_TARGET_AVX2_VNNI inline float q4_k_row_dot(const std::byte* row, std::size_t blocks,
                                                  const KQuantActivation& a,
                                                  const std::byte* next) noexcept {
  const __m256i nib = _mm256_set1_epi8(15), zero = _mm256_setzero_si256();
  constexpr std::size_t block_bytes = Q5 ? q5_k::block_bytes : q4_k::block_bytes;
  constexpr std::size_t codes_offset = Q5 ? q5_k::codes_offset : q4_k::codes_offset;
  __m256 acc = _mm256_setzero_ps();
  __m128 mins = _mm_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* block = row + b * block_bytes;
    if (next) prefetch_l2(next, b * block_bytes, block_bytes);
    std::uint32_t dd;
    std::memcpy(&dd, block, 4);
    const __m128 ddx =  // d·dx, dmin·dx
        _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dd))), _mm_set1_ps(a.dx[b]));
    std::uint64_t sc, m;
    q4_k::scales_mins_words(block, sc, m);
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(m)));
    const __m128i sums = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.sums + 8 * b));
    mins =
        _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(m16, sums)), _mm_permute_ps(ddx, 0x55), mins);
    // 32-bit lane j of `pairs`: sc_j in both 16-bit halves.
    const __m128i sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc)));
    const __m256i pairs =
        _mm256_set_m128i(_mm_unpackhi_epi16(sc16, sc16), _mm_unpacklo_epi16(sc16, sc16));
    const std::int8_t* xq = a.xq + 256 * b;
    __m256i codes = zero;
    for (int c = 0; c < 4; ++c) {  // qs[32c ..]: sub-blocks 2c (low nibbles) and 2c+1 (high)
      const __m256i q = load32(block + codes_offset + 32 * c);
      __m256i lo = _mm256_and_si256(q, nib);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nib);
      if constexpr (Q5) {  // bit 2c (low nibbles) and 2c+1 (high) of qh[l] as bit 4
        const __m256i qh = load32(block + q5_k::high_offset);
        lo = _mm256_or_si256(lo, bit_as_16(qh, 2 * c));
        hi = _mm256_or_si256(hi, bit_as_16(qh, 2 * c + 1));
      }
      const __m256i plo =
          avx2_int8::dot_u8s8<Vnni>(zero, lo, load32(xq + 32 * q4_k_chunk_slot(2 * c)));
      const __m256i phi =
          avx2_int8::dot_u8s8<Vnni>(zero, hi, load32(xq + 32 * q4_k_chunk_slot(2 * c + 1)));
      // Packed per 128-bit half: 4 lanes of plo (sub-block 2c), then 4 of phi (2c+1).
      const __m256i spread =
          _mm256_setr_epi32(2 * c, 2 * c, 2 * c + 1, 2 * c + 1, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1);
      codes =
          _mm256_add_epi32(codes, _mm256_madd_epi16(_mm256_packs_epi32(plo, phi),
                                                    _mm256_permutevar8x32_epi32(pairs, spread)));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(codes), _mm256_broadcastss_ps(ddx), acc);
  }
  __m128 s = _mm_add_ps(mins, _mm_movehl_ps(mins, mins));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return sum8(acc) - _mm_cvtss_f32(s);
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
    if (next) prefetch_l2(next, b * q6_k::block_bytes, q6_k::block_bytes);
    std::uint16_t dh;
    std::memcpy(&dh, block + q6_k::d_offset, 2);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(dh));
    std::uint64_t s[2];
    std::memcpy(s, block + q6_k::scales_offset, 16);
    const std::int8_t* xq = a.xq + 256 * b;
    for (int h = 0; h < 2; ++h) {  // half h: sub-blocks 8h .. 8h+7
      const __m256 g = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                            _mm_cvtsi64_si128(static_cast<long long>(s[h])))));
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

/// The multipliers of run r (weights 32r .. 32r+31 of a half) for `vpmaddwd` after `vpmaddubsw`:
/// the int16 scale of the half's sub-block 2r in the lower 128 bits, of 2r + 1 in the upper.
/// `half` holds the half's eight int16 scales in both 128-bit lanes.
MOEKIT_TARGET_AVX2 inline __m256i run_scales(__m256i half, int r) noexcept {
  const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,  //
                                        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  return _mm256_shuffle_epi8(half,
                             _mm256_add_epi8(pick, _mm256_set1_epi8(static_cast<char>(4 * r))));
}

/// The low eight bytes of `bytes8` (unsigned or signed) as int16, in both 128-bit lanes.
template <bool Signed>
MOEKIT_TARGET_AVX2 inline __m256i half_scales(__m128i bytes8) noexcept {
  return _mm256_broadcastsi128_si256(Signed ? _mm_cvtepi8_epi16(bytes8)
                                            : _mm_cvtepu8_epi16(bytes8));
}

/// 4 in each byte of v whose bit k is set, else 0 (two operations: the 16-bit shift moves bit k of
/// each byte to its bit 2, and the mask drops what came from the neighbouring byte).
MOEKIT_TARGET_AVX2 inline __m256i mask_bit_as_4(__m256i v, int k) noexcept {
  const __m256i four = _mm256_set1_epi8(4);
  if (k >= 2) return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(k - 2)), four);
  return _mm256_and_si256(_mm256_sll_epi16(v, _mm_cvtsi32_si128(2 - k)), four);
}

/// A q2_k row of `blocks` super-blocks · the prepared activation; `next` (optional) is
/// prefetched into L2 at the same offsets. Per half, run r's 2-bit codes (bits 2r of qs) by
/// 32 activations with `vpmaddubsw`, weighted by the scales of sub-blocks 2r, 2r + 1 in `vpmaddwd`;
/// the minimums Σ_s m_s·Σxq_s in one `vpmaddwd` per block.
MOEKIT_TARGET_AVX2 inline float q2_k_row_dot(const std::byte* row, std::size_t blocks,
                                             const KQuantActivation& a,
                                             const std::byte* next) noexcept {
  const __m256i three = _mm256_set1_epi8(3);
  const __m128i nib = _mm_set1_epi8(15);
  __m256 acc = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* block = row + b * q2_k::block_bytes;
    if (next) prefetch_l2(next, b * q2_k::block_bytes, q2_k::block_bytes);
    std::uint32_t dd;
    std::memcpy(&dd, block + q2_k::d_offset, 4);
    const __m128 ddx =  // d·dx, dmin·dx
        _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dd))), _mm_set1_ps(a.dx[b]));
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), nib));
    const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sums + 16 * b));
    mins = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(m16, sums)),
                           _mm256_broadcastss_ps(_mm_movehdup_ps(ddx)), mins);
    const __m128i sc = _mm_and_si128(sm, nib);
    const std::int8_t* xq = a.xq + 256 * b;
    __m256i codes = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i scales = half_scales<false>(h == 0 ? sc : _mm_srli_si128(sc, 8));
      const __m256i q = load32(block + q2_k::codes_offset + 32 * h);
      for (int r = 0; r < 4; ++r) {
        const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * r), three);
        const __m256i p = _mm256_maddubs_epi16(u, load32(xq + 128 * h + 32 * r));
        codes = _mm256_add_epi32(codes, _mm256_madd_epi16(p, run_scales(scales, r)));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(codes), _mm256_broadcastss_ps(ddx), acc);
  }
  return sum8(acc) - sum8(mins);
}

/// The signed scales sc_s − 32 of a q3_k block, sub-block s in byte s.
MOEKIT_TARGET_AVX2 inline __m128i q3_k_scales(const std::byte* block) noexcept {
  std::uint32_t w[4];
  q3_k::scale_words(block, w);
  return _mm_sub_epi8(_mm_setr_epi32(static_cast<int>(w[0]), static_cast<int>(w[1]),
                                     static_cast<int>(w[2]), static_cast<int>(w[3])),
                      _mm_set1_epi8(32));
}

/// A q3_k row of `blocks` super-blocks · the prepared activation; `next` as q2_k_row_dot. The
/// unsigned codes u = low 2 bits | mask bit << 2 as q2_k's, weighted by the signed scales; the
/// offset 4·Σ_s sc_s·Σxq_s subtracted in integers, one conversion per block.
MOEKIT_TARGET_AVX2 inline float q3_k_row_dot(const std::byte* row, std::size_t blocks,
                                             const KQuantActivation& a,
                                             const std::byte* next) noexcept {
  const __m256i three = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* block = row + b * q3_k::block_bytes;
    if (next) prefetch_l2(next, b * q3_k::block_bytes, q3_k::block_bytes);
    const __m128i sc = q3_k_scales(block);
    const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sums + 16 * b));
    // Σ_s sc_s·(Σ u·xq)_s − 4·Σ_s sc_s·Σxq_s, lane by lane (only the total matters).
    __m256i total =
        _mm256_sub_epi32(_mm256_setzero_si256(),
                         _mm256_slli_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(sc), sums), 2));
    const __m256i mask = load32(block);
    const std::int8_t* xq = a.xq + 256 * b;
    for (int h = 0; h < 2; ++h) {
      const __m256i scales = half_scales<true>(h == 0 ? sc : _mm_srli_si128(sc, 8));
      const __m256i q = load32(block + q3_k::codes_offset + 32 * h);
      for (int r = 0; r < 4; ++r) {
        const __m256i u = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * r), three),
                                          mask_bit_as_4(mask, 4 * h + r));
        const __m256i p = _mm256_maddubs_epi16(u, load32(xq + 128 * h + 32 * r));
        total = _mm256_add_epi32(total, _mm256_madd_epi16(p, run_scales(scales, r)));
      }
    }
    std::uint16_t dh;
    std::memcpy(&dh, block + q3_k::d_offset, 2);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(_cvtsh_ss(dh) * a.dx[b]), acc);
  }
  return sum8(acc);
}

}  // namespace moekit::detail::avx2_kquant

#endif
