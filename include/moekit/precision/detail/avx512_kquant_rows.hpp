#pragma once
/// \file AVX-512 VNNI row dots of the GGUF K-quant formats (q2_k .. q6_k) with int8 activations
/// (kquant_activation.hpp), N rows side by side sharing the activation's loads.
///
/// Per super-block, the codes are unpacked 64 at a time into unsigned bytes (q4_k: the low or
/// high nibbles of 64 bytes of qs; q6_k: a nibble of 64 bytes of ql or'ed with two bits of qh
/// shifted to bits 4-5) and dotted with 64 int8 activations by one `vpdpbusd`: int32 lane L sums
/// 4 neighbouring codes, so each lane lies in one sub-block (q4_k: lanes 0-7 and 8-15 are two
/// sub-blocks; q6_k: four lanes per sub-block). q6_k (activation scale per 32): the lanes are
/// converted to float and multiplied, in one FMA, by their sub-block's d·scale·dx, spread to the
/// lanes by one permute; the code offset 32 is one FMA per block with dx·Σxq per sub-block. q4_k
/// (one activation scale per block): the lanes are weighted by the 6-bit scales in integers and
/// converted once per block (q4_k_row_dots), which keeps its kernel up with the memory. q2_k and
/// q3_k (16-weight sub-blocks, one activation scale per block) as q4_k, four lanes per
/// sub-block, their codes unpacked by GFNI and their scales spread by VBMI (low2_dots).

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "moekit/precision/detail/avx512_int8_rows.hpp"
#include "moekit/precision/gguf_q2_k.hpp"
#include "moekit/precision/gguf_q3_k.hpp"
#include "moekit/precision/gguf_q4_k.hpp"
#include "moekit/precision/gguf_q5_k.hpp"
#include "moekit/precision/gguf_q6_k.hpp"
#include "moekit/precision/kquant_activation.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)

/// The q2_k / q3_k kernels' target: AVX-512 VNNI with GFNI and VBMI (has_avx512_kq2).
#define MOEKIT_TARGET_AVX512_KQ2                                                   \
  __attribute__((                                                                  \
      target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,gfni,avx2," \
             "fma,f16c")))

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moekit::detail::avx512_kquant {

/// Prefetches into L2 the cache lines of `row` (further down a stream) that start in
/// [off, off + bytes): each line once as the blocks go by, however blocks straddle lines.
MOEKIT_TARGET_AVX512_VNNI inline void prefetch_l2(const std::byte* row, std::size_t off,
                                                  std::size_t bytes) noexcept {
  for (std::size_t o = (off + 63) / 64 * 64; o < off + bytes; o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(row + o), _MM_HINT_T1);
}

/// The two f16 values at p as floats (d and dmin of a q4_k block) in lanes 0 and 1.
MOEKIT_TARGET_AVX512_VNNI inline __m128 two_halves(const std::byte* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(v)));
}

/// 32 values rounded to int8 with the multiplier `inv` (to nearest even, as prepare_kquant),
/// stored at q; returns the sums of the two halves' codes.
MOEKIT_TARGET_AVX512_VNNI inline std::pair<int, int> round_chunk(const float* x, float inv,
                                                                 std::int8_t* q) noexcept {
  const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(inv)));
  const __m512i q1 =
      _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16), _mm512_set1_ps(inv)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(q1));
  return {_mm512_reduce_add_epi32(q0), _mm512_reduce_add_epi32(q1)};
}

/// max |x[i]| for i < n (a multiple of 16).
MOEKIT_TARGET_AVX512_VNNI inline float max_abs(const float* x, std::size_t n) noexcept {
  __m512 m = _mm512_setzero_ps();
  for (std::size_t i = 0; i < n; i += 16)
    m = _mm512_max_ps(m, _mm512_andnot_ps(_mm512_set1_ps(-0.f), _mm512_loadu_ps(x + i)));
  return _mm512_reduce_max_ps(m);
}

/// prepare_kquant (kquant_activation.hpp) vectorised, with the same values (the same products and
/// rounding to nearest even): it runs once per GEMV (its scalar cost: bench/RESULTS.md, "GGUF
/// K-quants read in place").
inline KQuantActivation prepare(const float* x, std::size_t cols, Precision p, KQuantStorage& st) {
  return prepare_kquant_with<&max_abs, &round_chunk>(x, cols, p, st);
}

/// Bytes 1 << a in the lower 256 bits, 1 << b in the upper.
MOEKIT_TARGET_AVX512_VNNI inline __m512i halves_of_bits(int a, int b) noexcept {
  return _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << a)),
                            _mm256_set1_epi8(static_cast<char>(1 << b)), 1);
}

/// rows[n] · x for n < N: `blocks` q4_k super-blocks per row. Per block the four 64-code dots
/// (lane L of the low/high nibbles of qs[0..63], then of qs[64..127], in sub-block 0|2, 1|3, 4|6,
/// 5|7 for lanes 0-7|8-15) are packed to int16 in pairs and weighted by their sub-blocks' scales
/// with `vpdpwssd`, then converted once; the minimums are one `vpmaddwd` of m_j by Σ xq_j.
/// Q5: q5_k rows, whose codes take bit j of qh[l] as bit 4 (one test and one masked add per 64).
template <std::size_t N, bool Q5 = false>
MOEKIT_TARGET_AVX512_VNNI inline void q4_k_row_dots(const std::byte* const* rows,
                                                    std::size_t blocks, const KQuantActivation& a,
                                                    float* out,
                                                    const std::byte* const* next) noexcept {
  const __m512i nib = _mm512_set1_epi8(15), zero = _mm512_setzero_si512();
  // Packing P0 and P1 gives, per 128-bit group g, P0's lanes 4g..4g+3 then P1's as int16: the
  // scale of 16-bit lane i is sc_k, k = 2·(i / 16) + (i / 4) % 2 (+ 4 for P2, P3).
  const __m512i spread_a = _mm512_set_epi16(3, 3, 3, 3, 2, 2, 2, 2, 3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1,
                                            1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i spread_b = _mm512_add_epi16(spread_a, _mm512_set1_epi16(4));
  constexpr std::size_t block_bytes = Q5 ? q5_k::block_bytes : q4_k::block_bytes;
  constexpr std::size_t codes_offset = Q5 ? q5_k::codes_offset : q4_k::codes_offset;
  // q5_k: the qh bit of the four unpacked vectors' sub-blocks (0|2, 1|3, 4|6, 5|7), per half.
  const __m512i high[4] = {halves_of_bits(0, 2), halves_of_bits(1, 3), halves_of_bits(4, 6),
                           halves_of_bits(5, 7)};
  const __m512i sixteen = _mm512_set1_epi8(16);
  __m512 acc[N];
  __m128 mins[N];
  for (std::size_t n = 0; n < N; ++n) acc[n] = _mm512_setzero_ps(), mins[n] = _mm_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t off = b * block_bytes;
    const std::int8_t* xq = a.xq + 256 * b;
    __m512i x[4];
    for (int k = 0; k < 4; ++k) x[k] = _mm512_loadu_si512(xq + 64 * k);
    const __m128 dx = _mm_set1_ps(a.dx[b]);
    const __m128i sums = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.sums + 8 * b));
    for (std::size_t n = 0; n < N; ++n) {
      const std::byte* block = rows[n] + off;
      if (next) prefetch_l2(next[n], off, block_bytes);
      const __m128 dd = _mm_mul_ps(two_halves(block), dx);  // d·dx, dmin·dx
      std::uint64_t sc, m;
      q4_k::scales_mins_words(block, sc, m);
      const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(m)));
      mins[n] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(m16, sums)), _mm_permute_ps(dd, 0x55),
                             mins[n]);
      const __m512i sc16 =
          _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
      const __m512i q0 = _mm512_loadu_si512(block + codes_offset);
      const __m512i q1 = _mm512_loadu_si512(block + codes_offset + 64);
      __m512i u[4] = {_mm512_and_si512(q0, nib), _mm512_and_si512(_mm512_srli_epi16(q0, 4), nib),
                      _mm512_and_si512(q1, nib), _mm512_and_si512(_mm512_srli_epi16(q1, 4), nib)};
      if constexpr (Q5) {
        const __m512i qh = _mm512_broadcast_i64x4(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + q5_k::high_offset)));
        for (int k = 0; k < 4; ++k)
          u[k] = _mm512_mask_add_epi8(u[k], _mm512_test_epi8_mask(qh, high[k]), u[k], sixteen);
      }
      const __m512i p0 = _mm512_dpbusd_epi32(zero, u[0], x[0]);
      const __m512i p1 = _mm512_dpbusd_epi32(zero, u[1], x[1]);
      const __m512i p2 = _mm512_dpbusd_epi32(zero, u[2], x[2]);
      const __m512i p3 = _mm512_dpbusd_epi32(zero, u[3], x[3]);
      __m512i t = _mm512_dpwssd_epi32(zero, _mm512_packs_epi32(p0, p1),
                                      _mm512_permutexvar_epi16(spread_a, sc16));
      t = _mm512_dpwssd_epi32(t, _mm512_packs_epi32(p2, p3),
                              _mm512_permutexvar_epi16(spread_b, sc16));
      acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_broadcastss_ps(dd), acc[n]);
    }
  }
  for (std::size_t n = 0; n < N; ++n) {
    __m128 s = _mm_add_ps(mins[n], _mm_movehl_ps(mins[n], mins[n]));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    out[n] = _mm512_reduce_add_ps(acc[n]) - _mm_cvtss_f32(s);
  }
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
      if (next) prefetch_l2(next[n], off, q6_k::block_bytes);
      std::uint16_t dh;
      std::memcpy(&dh, block + q6_k::d_offset, 2);
      const __m128i s8 =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + q6_k::scales_offset));
      const __m512 g = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s8)),
                                     _mm512_set1_ps(_cvtsh_ss(dh)));
      offset[n] = _mm512_fmadd_ps(g, dxs, offset[n]);
      const __m512 f = _mm512_mul_ps(g, dx);
      for (int h = 0; h < 2; ++h) {
        const __m512i low = _mm512_loadu_si512(block + 64 * h);
        const __m256i high = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(block + q6_k::high_offset + 32 * h));
        // Bytes 0-31: qh; bytes 32-63: qh >> 2 (the bits of weights 32-63 of the half).
        const __m512i hz =
            _mm512_inserti64x4(_mm512_castsi256_si512(high), _mm256_srli_epi16(high, 2), 1);
        const __m512i qa = _mm512_or_si512(_mm512_and_si512(low, nib),
                                           _mm512_slli_epi16(_mm512_and_si512(hz, two), 4));
        const __m512i qb =
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 4), nib),
                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hz, 4), two), 4));
        const __m512i pa = _mm512_dpbusd_epi32(zero, qa, x[2 * h]);
        const __m512i pb = _mm512_dpbusd_epi32(zero, qb, x[2 * h + 1]);
        acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pa), _mm512_permutexvar_ps(spread[2 * h], f),
                                 acc[n]);
        acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pb),
                                 _mm512_permutexvar_ps(spread[2 * h + 1], f), acc[n]);
      }
    }
  }
  for (std::size_t n = 0; n < N; ++n)
    out[n] = _mm512_reduce_add_ps(acc[n]) - 32.f * _mm512_reduce_add_ps(offset[n]);
}

/// `vpermb` indices of the scale bytes for packs(P_2j, P_2j+1) in `vpdpwssd` (j = 0, 1), the
/// scale in byte `at` (0: low, 1: high) of each 16-bit lane: vector v's int32 lanes 4g..4g+3 lie in
/// sub-block 4v + g (low2_dots), and the pack puts P_2j's four of group g, then P_2j+1's, in
/// 128-bit group g.
MOEKIT_TARGET_AVX512_KQ2 inline __m512i run_pair_spread(int j, int at) noexcept {
  static constexpr auto index = [] {
    std::array<std::int8_t, 128> v{};
    for (int i = 0; i < 64; ++i)
      v[static_cast<std::size_t>(2 * i)] =
          static_cast<std::int8_t>(4 * (2 * (i / 32) + i % 8 / 4) + i % 32 / 8);
    return v;
  }();
  const __m512i low = _mm512_loadu_si512(index.data() + 64 * j);
  return at ? _mm512_bslli_epi128(low, 1) : low;
}

/// The `vgf2p8affineqb` matrices that move bits j .. j + n − 1 of each byte to bits o .. o + n − 1
/// (the rest 0) in the lower 256 bits, and bits j + n .. j + 2n − 1 in the upper.
MOEKIT_TARGET_AVX512_KQ2 inline __m512i bit_pick(int j, int n, int o = 0) noexcept {
  auto matrix = [&](int from) {
    std::uint64_t m = 0;  // byte 7 − i of the matrix: the input bits of output bit i
    for (int i = 0; i < n; ++i) m |= std::uint64_t{1} << (from + i) << 8 * (7 - (o + i));
    return static_cast<long long>(m);
  };
  return _mm512_inserti64x4(_mm512_set1_epi64(matrix(j)), _mm256_set1_epi64x(matrix(j + n)), 1);
}

/// t + Σ_s sc_s·(Σ u·xq)_s over one q2_k / q3_k block, in int32 lanes (only their total
/// matters); Q3: times 256. Vector v = 2h + k holds the codes of half h's runs 2k (lower 256
/// bits) and 2k + 1 (upper), weights 64v .. 64v+63 in column order: one broadcast of the half's
/// 32 bytes of qs and one `vgf2p8affineqb` (Q3: or'ed with the hmask bit 4h + 2k, + 1 in the
/// upper half, moved to bit 2 by another). Dotted with 64 activations by `vpdpbusd` (each lane in
/// one sub-block, ≤ 4·7·127), packed in pairs to int16 and weighted in `vpdpwssd` by the scale
/// bytes `sc` (lanes 0-15), spread by `vpermb` into the low byte of each 16-bit lane (Q3, signed:
/// the high byte, so ×256).
template <bool Q3>
MOEKIT_TARGET_AVX512_KQ2 inline __m512i low2_dots(const std::byte* block, const std::int8_t* xq,
                                                  __m128i sc, const __m512i spread[2],
                                                  __m512i t) noexcept {
  const __m512i zero = _mm512_setzero_si512();
  const __mmask64 at = Q3 ? 0xaaaaaaaaaaaaaaaaull : 0x5555555555555555ull;
  const std::byte* qs = block + (Q3 ? q3_k::codes_offset : q2_k::codes_offset);
  __m512i hm = zero;
  if constexpr (Q3)
    hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
  __m512i p[4];
  for (int h = 0; h < 2; ++h) {
    const __m512i q =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * h)));
    for (int k = 0; k < 2; ++k) {
      __m512i u = _mm512_gf2p8affine_epi64_epi8(q, bit_pick(4 * k, 2), 0);
      if constexpr (Q3)
        u = _mm512_or_si512(u, _mm512_gf2p8affine_epi64_epi8(hm, bit_pick(4 * h + 2 * k, 1, 2), 0));
      p[2 * h + k] = _mm512_dpbusd_epi32(zero, u, _mm512_loadu_si512(xq + 64 * (2 * h + k)));
    }
  }
  const __m512i scz = _mm512_castsi128_si512(sc);
  t = _mm512_dpwssd_epi32(t, _mm512_packs_epi32(p[0], p[1]),
                          _mm512_maskz_permutexvar_epi8(at, spread[0], scz));
  return _mm512_dpwssd_epi32(t, _mm512_packs_epi32(p[2], p[3]),
                             _mm512_maskz_permutexvar_epi8(at, spread[1], scz));
}

/// rows[n] · x for n < N: `blocks` q2_k super-blocks per row; `next` as q4_k_row_dots. Per block
/// d·dx·Σ_s sc_s·(Σ q·xq)_s (low2_dots) − dmin·dx·Σ_s m_s·Σxq_s (one `vpmaddwd`).
template <std::size_t N>
MOEKIT_TARGET_AVX512_KQ2 inline void q2_k_row_dots(const std::byte* const* rows, std::size_t blocks,
                                                   const KQuantActivation& a, float* out,
                                                   const std::byte* const* next) noexcept {
  const __m512i spread[2] = {run_pair_spread(0, 0), run_pair_spread(1, 0)};
  __m512 acc[N];
  __m256 mins[N];
  for (std::size_t n = 0; n < N; ++n) acc[n] = _mm512_setzero_ps(), mins[n] = _mm256_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t off = b * q2_k::block_bytes;
    const __m128 dx = _mm_set1_ps(a.dx[b]);
    const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sums + 16 * b));
#pragma GCC unroll 4  // the accumulators in registers, not on the stack
    for (std::size_t n = 0; n < N; ++n) {
      const std::byte* block = rows[n] + off;
      if (next) prefetch_l2(next[n], off, q2_k::block_bytes);
      const __m128 dd = _mm_mul_ps(two_halves(block + q2_k::d_offset), dx);  // d·dx, dmin·dx
      const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
      const __m256i m16 = _mm256_srli_epi16(_mm256_cvtepu8_epi16(sm), 4);
      mins[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(m16, sums)),
                                _mm256_broadcastss_ps(_mm_movehdup_ps(dd)), mins[n]);
      const __m512i t =
          low2_dots<false>(block, a.xq + 256 * b, _mm_and_si128(sm, _mm_set1_epi8(15)), spread,
                           _mm512_setzero_si512());
      acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_broadcastss_ps(dd), acc[n]);
    }
  }
  for (std::size_t n = 0; n < N; ++n)
    out[n] = _mm512_reduce_add_ps(acc[n]) - _mm512_reduce_add_ps(_mm512_zextps256_ps512(mins[n]));
}

/// The signed scales sc_s − 32 of a q3_k block, sub-block s in byte s: scale_words
/// (gguf_q3_k.hpp) on one vector of the 12 bytes.
MOEKIT_TARGET_AVX512_KQ2 inline __m128i q3_k_scales(const std::byte* block) noexcept {
  const __m128i w = _mm_maskz_loadu_epi8(0x0fff, block + q3_k::scales_offset);  // w0 w1 w2 0
  const __m128i low = _mm_and_si128(
      _mm_srlv_epi32(_mm_shuffle_epi32(w, 0x44), _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(15));
  const __m128i high = _mm_and_si128(
      _mm_srlv_epi32(_mm_shuffle_epi32(w, 0xaa), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
  return _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi32(high, 4)), _mm_set1_epi8(32));
}

/// rows[n] · x for n < N: `blocks` q3_k super-blocks per row; `next` as q4_k_row_dots. Per block
/// d·dx·(Σ_s sc_s·(Σ u·xq)_s − 4·Σ_s sc_s·Σxq_s), u the unsigned codes (q = u − 4), all in
/// integers times 256 (low2_dots; exact in the conversion: |sum| / 256 < 2^24): the offset is one
/// `vpmaddwd` of the signed scales by −4·Σxq, shifted by 8.
template <std::size_t N>
MOEKIT_TARGET_AVX512_KQ2 inline void q3_k_row_dots(const std::byte* const* rows, std::size_t blocks,
                                                   const KQuantActivation& a, float* out,
                                                   const std::byte* const* next) noexcept {
  const __m512i spread[2] = {run_pair_spread(0, 1), run_pair_spread(1, 1)};
  __m512 acc[N];
  for (std::size_t n = 0; n < N; ++n) acc[n] = _mm512_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t off = b * q3_k::block_bytes;
    const __m256i sums4 = _mm256_mullo_epi16(  // −4·Σxq: |·| ≤ 4·16·127
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sums + 16 * b)),
        _mm256_set1_epi16(-4));
    const float dx = a.dx[b] / 256;
#pragma GCC unroll 4  // the accumulators in registers, not on the stack
    for (std::size_t n = 0; n < N; ++n) {
      const std::byte* block = rows[n] + off;
      if (next) prefetch_l2(next[n], off, q3_k::block_bytes);
      const __m128i sc = q3_k_scales(block);
      const __m256i offset =
          _mm256_slli_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(sc), sums4), 8);
      const __m512i t =
          low2_dots<true>(block, a.xq + 256 * b, sc, spread, _mm512_zextsi256_si512(offset));
      std::uint16_t dh;
      std::memcpy(&dh, block + q3_k::d_offset, 2);
      acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_set1_ps(_cvtsh_ss(dh) * dx), acc[n]);
    }
  }
  for (std::size_t n = 0; n < N; ++n) out[n] = _mm512_reduce_add_ps(acc[n]);
}

}  // namespace moekit::detail::avx512_kquant

#pragma GCC diagnostic pop

#endif
