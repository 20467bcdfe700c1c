#pragma once
/// \file AVX-512 VNNI panel tiles of the K-quant int8 GEMM (prefill) for q4_k, q5_k, q6_k, q2_k
/// and q3_k rows: 16 rows repacked once per call into a panel where each 64-byte vector holds 4
/// codes (one dword) of every row, so the 32-bit lanes are the 16 rows, as
/// avx512_int8_panel_tiles.hpp does for q8/q4/q2. The row tile it replaces (avx512_kquant_rows.hpp
/// run per (4 rows, 1 token) pair) decoded every super-block's scales and reduced across lanes per
/// pair; here they are decoded once per call and applied once per (16 rows, token, sub-block).
///
/// Panel layout (pack_q4_k_panel), per super-block b: codes at 4096·b + 512·j + 64·ks, lane r =
/// the codes of row r at columns 32j + 4ks .. 32j + 4ks + 3 of the block, unsigned bytes (q5_k:
/// bit 4 from qh); the token's 4 activation bytes of those columns (kquant_activation.hpp, chunk
/// order) are broadcast as the signed operand of `vpdpbusd`, as in the row kernels. Per block,
/// the integers (`ints`, 192 per block): the 6-bit scales sc_j as 16 int32 per sub-block j, then
/// the mins as int16 pairs (m_2i, m_2i+1) per row in 4 vectors; the floats (`reals`, 32 per
/// block): d, then dmin, 16 of each.
///
/// Per block and token: dot_j = Σ code·xq over sub-block j in int32 (8 `vpdpbusd`), then
/// Σ_j sc_j·dot_j in int32 (`vpmulld`, as ggml sums its scales in integers), exact: |dot_j| ≤
/// 32·31·127 = 125984 (q5_k's 5-bit codes), so |Σ| ≤ 8·63·125984 < 2^26; the minimums
/// Σ_j m_j·Σxq_j by 4 `vpdpwssd` (|·| ≤ 8·63·32·127 < 2^21). Then d·dx and dmin·dx once per block,
/// one conversion each. Every (row, token) pair runs the same instructions whatever its lane or
/// its place in the token tile, so a token's result does not depend on the batch.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/precision/detail/avx512_int8_panel_tiles.hpp"
#include "moekit/precision/detail/avx512_kquant_rows.hpp"
#include "moekit/precision/gguf_q2_k.hpp"
#include "moekit/precision/gguf_q3_k.hpp"
#include "moekit/precision/gguf_q4_k.hpp"
#include "moekit/precision/gguf_q5_k.hpp"
#include "moekit/precision/gguf_q6_k.hpp"
#include "moekit/precision/kquant_activation.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moekit::detail::avx512_kquant {

/// Bytes of unpacked codes per super-block of a 16-row panel.
inline constexpr std::size_t panel_block_codes = 4096;
/// int32 values (scales, then mins) and floats (d, dmin) per super-block of a panel.
inline constexpr std::size_t panel_block_ints = 192, panel_block_reals = 32;

/// The four 64-code vectors of a q4_k / q5_k block as unsigned bytes: vector k holds sub-blocks
/// panel_sub(k, 0) in its lower 32 bytes and panel_sub(k, 1) in its upper, in column order.
template <bool Q5>
MOEKIT_TARGET_AVX512_VNNI inline void unpack_q4_k(const std::byte* block, __m512i u[4]) noexcept {
  const __m512i nib = _mm512_set1_epi8(15);
  const std::byte* qs = block + (Q5 ? q5_k::codes_offset : q4_k::codes_offset);
  const __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
  u[0] = _mm512_and_si512(q0, nib), u[1] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), nib);
  u[2] = _mm512_and_si512(q1, nib), u[3] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), nib);
  if constexpr (Q5) {  // bit j of qh[l] is bit 4 of weight l of sub-block j
    const __m512i qh = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + q5_k::high_offset)));
    const __m512i high[4] = {halves_of_bits(0, 2), halves_of_bits(1, 3), halves_of_bits(4, 6),
                             halves_of_bits(5, 7)};
    for (int k = 0; k < 4; ++k)
      u[k] = _mm512_mask_add_epi8(u[k], _mm512_test_epi8_mask(qh, high[k]), u[k],
                                  _mm512_set1_epi8(16));
  }
}

/// The sub-block in half h (0: lower 32 bytes) of unpacked vector k (unpack_q4_k).
constexpr std::size_t panel_sub(std::size_t k, std::size_t h) noexcept {
  return 4 * (k / 2) + k % 2 + 2 * h;
}

/// Row r's 32-bit values in v[r] to 16 lanes each: out + 16·L, lane r = v[r]'s value L, L < count.
MOEKIT_TARGET_AVX512_VNNI inline void store_lanes(__m512i* v, std::size_t count,
                                                  std::int32_t* out) noexcept {
  avx512_int8::transpose16(v);
  for (std::size_t i = 0; i < count; ++i) _mm512_storeu_si512(out + 16 * i, v[i]);
}

/// One super-block's scales of 16 rows into the panel's integers and floats (file comment): per
/// row the scales as 8 int32 and the mins as 4 int16 pairs, then one transpose.
MOEKIT_TARGET_AVX512_VNNI inline void pack_q4_k_scales(const std::byte* const* blocks,
                                                       std::int32_t* ints, float* reals) noexcept {
  __m512i v[avx512_int8::panel_height];
  for (std::size_t r = 0; r < avx512_int8::panel_height; ++r) {
    std::uint64_t sc, m;
    q4_k::scales_mins_words(blocks[r], sc, m);
    const __m256i s32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(sc)));
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(m)));
    v[r] = _mm512_inserti32x4(_mm512_castsi256_si512(s32), m16, 2);  // lanes 12-15: unused
    reals[r] = q4_k::d_of(blocks[r]), reals[16 + r] = q4_k::dmin_of(blocks[r]);
  }
  store_lanes(v, 12, ints);
}

/// The sub-block in half h of vector k of a row unpacked in column order (q6_k's, q2_k's).
constexpr std::size_t in_order_sub(std::size_t k, std::size_t h) noexcept { return 2 * k + h; }

/// `blocks` super-blocks of 16 rows into a panel (file comment): each row's block unpacked by
/// `Unpack` into four 64-code vectors whose half h of vector k is sub-block `Sub(k, h)`, the
/// codes stored by sub-block (blocks · panel_block_codes bytes, 64-byte aligned), each block's
/// scales by `Scales` into `Ints` integers and `Reals` floats.
template <auto Unpack, auto Scales, auto Sub, std::size_t BlockBytes, std::size_t Ints,
          std::size_t Reals>
MOEKIT_TARGET_AVX512_VNNI inline void pack_panel(const std::byte* const* rows, std::size_t blocks,
                                                 std::byte* codes, std::int32_t* ints,
                                                 float* reals) noexcept {
  constexpr std::size_t H = avx512_int8::panel_height;
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* block[H];
    __m512i u[H][4];
    for (std::size_t r = 0; r < H; ++r) block[r] = rows[r] + b * BlockBytes;
    for (std::size_t r = 0; r < H; ++r) Unpack(block[r], u[r]);
    std::byte* out = codes + panel_block_codes * b;
    for (std::size_t k = 0; k < 4; ++k) {
      __m512i v[H];
      for (std::size_t r = 0; r < H; ++r) v[r] = u[r][k];
      avx512_int8::transpose16(v);  // v[L] lane r: row r's dword L
      for (std::size_t lane = 0; lane < 16; ++lane)
        _mm512_store_si512(out + 512 * Sub(k, lane / 8) + 64 * (lane % 8), v[lane]);
    }
    Scales(block, ints + Ints * b, reals + Reals * b);
  }
}

/// `blocks` super-blocks of 16 q4_k (Q5: q5_k) rows into a panel (pack_panel).
template <bool Q5>
MOEKIT_TARGET_AVX512_VNNI inline void pack_q4_k_panel(const std::byte* const* rows,
                                                      std::size_t blocks, std::byte* codes,
                                                      std::int32_t* ints, float* reals) noexcept {
  pack_panel<unpack_q4_k<Q5>, pack_q4_k_scales, panel_sub,
             Q5 ? q5_k::block_bytes : q4_k::block_bytes, panel_block_ints, panel_block_reals>(
      rows, blocks, codes, ints, reals);
}

/// out[16·t + r] = row r · token t for the T tokens `acts` over `blocks` super-blocks of a q4_k
/// or q5_k panel (pack_q4_k_panel).
template <std::size_t T>
MOEKIT_TARGET_AVX512_VNNI inline void q4_k_panel_dots(const std::byte* codes,
                                                      const std::int32_t* ints, const float* reals,
                                                      const KQuantActivation* const* acts,
                                                      std::size_t blocks, float* out) noexcept {
  using avx512_int8::broadcast4;
  __m512 acc[T];
  for (std::size_t t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* cb = codes + panel_block_codes * b;
    const std::int32_t* ib = ints + panel_block_ints * b;
    __m512i sum[T], d[T];
    for (std::size_t t = 0; t < T; ++t) sum[t] = _mm512_setzero_si512();
    for (std::size_t j = 0; j < 8; ++j) {
      const std::size_t at = 256 * b + 32 * q4_k_chunk_slot(j);
      for (std::size_t t = 0; t < T; ++t) d[t] = _mm512_setzero_si512();
      for (std::size_t ks = 0; ks < 8; ++ks) {
        const __m512i w = _mm512_load_si512(cb + 512 * j + 64 * ks);
        for (std::size_t t = 0; t < T; ++t)
          d[t] = _mm512_dpbusd_epi32(d[t], w, broadcast4(acts[t]->xq + at + 4 * ks));
      }
      const __m512i sc = _mm512_loadu_si512(ib + 16 * j);
      for (std::size_t t = 0; t < T; ++t)
        sum[t] = _mm512_add_epi32(sum[t], _mm512_mullo_epi32(d[t], sc));
    }
    for (std::size_t t = 0; t < T; ++t) d[t] = _mm512_setzero_si512();
    for (std::size_t i = 0; i < 4; ++i) {
      const __m512i m = _mm512_loadu_si512(ib + 128 + 16 * i);
      for (std::size_t t = 0; t < T; ++t)
        d[t] = _mm512_dpwssd_epi32(
            d[t], m,
            broadcast4(reinterpret_cast<const std::int8_t*>(acts[t]->sums + 8 * b + 2 * i)));
    }
    const float* rb = reals + panel_block_reals * b;
    const __m512 dv = _mm512_loadu_ps(rb), mv = _mm512_loadu_ps(rb + 16);
    for (std::size_t t = 0; t < T; ++t) {
      const __m512 dx = _mm512_set1_ps(acts[t]->dx[b]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), _mm512_mul_ps(dv, dx), acc[t]);
      acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(d[t]), _mm512_mul_ps(mv, dx), acc[t]);
    }
  }
  for (std::size_t t = 0; t < T; ++t) _mm512_storeu_ps(out + 16 * t, acc[t]);
}

/// q6_k panels: the codes as q4_k's with the 32-value chunk c of the activation's scale in place
/// of the sub-block j, so lanes ks 0-3 and 4-7 are the chunk's two 16-weight sub-blocks. Integers
/// per block (q6_k_panel_ints): the signed scales s_i as 16 int32 per sub-block i, then per chunk
/// c the int16 pairs (−32·s_2c, −32·s_2c+1) for the code offset 32; floats: d, 16.
inline constexpr std::size_t q6_k_panel_ints = 384, q6_k_panel_reals = 16;

/// The four 64-code vectors of a q6_k block (weights 64v .. 64v+63 in vector v) as unsigned bytes,
/// as q6_k_row_dots unpacks them.
MOEKIT_TARGET_AVX512_VNNI inline void unpack_q6_k(const std::byte* block, __m512i u[4]) noexcept {
  const __m512i nib = _mm512_set1_epi8(15), two = _mm512_set1_epi8(3);
  for (int h = 0; h < 2; ++h) {
    const __m512i low = _mm512_loadu_si512(block + 64 * h);
    const __m256i high =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + q6_k::high_offset + 32 * h));
    const __m512i hz =
        _mm512_inserti64x4(_mm512_castsi256_si512(high), _mm256_srli_epi16(high, 2), 1);
    u[2 * h] = _mm512_or_si512(_mm512_and_si512(low, nib),
                               _mm512_slli_epi16(_mm512_and_si512(hz, two), 4));
    u[2 * h + 1] =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 4), nib),
                        _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hz, 4), two), 4));
  }
}

/// One super-block's scales of 16 q6_k rows into the panel's integers and floats: the scales
/// sign-extended to int32, and −32 times them as int16 pairs, each set by one transpose.
MOEKIT_TARGET_AVX512_VNNI inline void pack_q6_k_scales(const std::byte* const* blocks,
                                                       std::int32_t* ints, float* reals) noexcept {
  __m512i v[avx512_int8::panel_height], p[avx512_int8::panel_height];
  for (std::size_t r = 0; r < avx512_int8::panel_height; ++r) {
    const __m128i s8 =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[r] + q6_k::scales_offset));
    v[r] = _mm512_cvtepi8_epi32(s8);
    const __m256i s16 = _mm256_cvtepi8_epi16(s8);
    p[r] =
        _mm512_castsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 5)));
    reals[r] = q6_k::d_of(blocks[r]);
  }
  store_lanes(v, 16, ints);
  store_lanes(p, 8, ints + 256);
}

/// `blocks` super-blocks of 16 q6_k rows into a panel (pack_panel, in column order).
MOEKIT_TARGET_AVX512_VNNI inline void pack_q6_k_panel(const std::byte* const* rows,
                                                      std::size_t blocks, std::byte* codes,
                                                      std::int32_t* ints, float* reals) noexcept {
  pack_panel<unpack_q6_k, pack_q6_k_scales, in_order_sub, q6_k::block_bytes, q6_k_panel_ints,
             q6_k_panel_reals>(rows, blocks, codes, ints, reals);
}

/// out[16·t + r] = row r · token t for the T tokens `acts` over `blocks` super-blocks of a q6_k
/// panel (pack_q6_k_panel); acts[t]->sums: the token's Σxq per 16-weight sub-block. Per chunk c:
/// s_2c·dot_2c + s_2c+1·dot_2c+1 − 32·(s_2c·Σxq_2c + s_2c+1·Σxq_2c+1) in int32 (`vpmulld`,
/// `vpdpwssd`; |·| ≤ 128·2·16·63·127 + 32·128·2·16·127 < 2^26), converted and times the chunk's
/// dx; times d once per block.
template <std::size_t T>
MOEKIT_TARGET_AVX512_VNNI inline void q6_k_panel_dots(const std::byte* codes,
                                                      const std::int32_t* ints, const float* reals,
                                                      const KQuantActivation* const* acts,
                                                      std::size_t blocks, float* out) noexcept {
  using avx512_int8::broadcast4;
  __m512 acc[T];
  for (std::size_t t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* cb = codes + panel_block_codes * b;
    const std::int32_t* ib = ints + q6_k_panel_ints * b;
    __m512 part[T];
    for (std::size_t t = 0; t < T; ++t) part[t] = _mm512_setzero_ps();
    for (std::size_t c = 0; c < 8; ++c) {
      __m512i da[T], db[T];
      for (std::size_t t = 0; t < T; ++t) da[t] = db[t] = _mm512_setzero_si512();
#pragma GCC unroll 4                            // the accumulators in registers, not on the stack
      for (std::size_t ks = 0; ks < 4; ++ks) {  // lanes ks: sub-block 2c; ks + 4: 2c + 1
        const __m512i wa = _mm512_load_si512(cb + 512 * c + 64 * ks);
        const __m512i wb = _mm512_load_si512(cb + 512 * c + 64 * (ks + 4));
        for (std::size_t t = 0; t < T; ++t) {
          const std::int8_t* x = acts[t]->xq + 256 * b + 32 * c + 4 * ks;
          da[t] = _mm512_dpbusd_epi32(da[t], wa, broadcast4(x));
          db[t] = _mm512_dpbusd_epi32(db[t], wb, broadcast4(x + 16));
        }
      }
      const __m512i sa = _mm512_loadu_si512(ib + 32 * c), sb = _mm512_loadu_si512(ib + 32 * c + 16);
      const __m512i sp = _mm512_loadu_si512(ib + 256 + 16 * c);
      for (std::size_t t = 0; t < T; ++t) {
        __m512i i = _mm512_add_epi32(_mm512_mullo_epi32(da[t], sa), _mm512_mullo_epi32(db[t], sb));
        i = _mm512_dpwssd_epi32(
            i, sp,
            broadcast4(reinterpret_cast<const std::int8_t*>(acts[t]->sums + 16 * b + 2 * c)));
        part[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i),
                                  _mm512_set1_ps(acts[t]->dx[16 * b + 2 * c]), part[t]);
      }
    }
    const __m512 d = _mm512_loadu_ps(reals + q6_k_panel_reals * b);
    for (std::size_t t = 0; t < T; ++t) acc[t] = _mm512_fmadd_ps(part[t], d, acc[t]);
  }
  for (std::size_t t = 0; t < T; ++t) _mm512_storeu_ps(out + 16 * t, acc[t]);
}

/// q2_k panels: the codes as q6_k's (column order, lanes ks 0-3 and 4-7 of chunk c the
/// sub-blocks 2c and 2c + 1). Integers per block (q2_k_panel_ints): per chunk c the int16 pairs
/// (sc_2c, sc_2c+1), then the pairs (m_2c, m_2c+1); floats: d, then dmin, 16 of each.
inline constexpr std::size_t q2_k_panel_ints = 256, q2_k_panel_reals = 32;

/// The four 64-code vectors of a q2_k block (weights 64v .. 64v+63 in vector v = 2h + k: runs 2k
/// and 2k + 1 of half h, bits 4k and 4k + 2 of its 32 bytes of qs) as unsigned bytes.
MOEKIT_TARGET_AVX512_VNNI inline void unpack_q2_k(const std::byte* block, __m512i u[4]) noexcept {
  const __m512i three = _mm512_set1_epi8(3);
  for (int h = 0; h < 2; ++h) {
    const __m512i q = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + q2_k::codes_offset + 32 * h)));
    for (int k = 0; k < 2; ++k) {
      const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(4 * k)),
                                               _mm256_set1_epi16(static_cast<short>(4 * k + 2)), 1);
      u[2 * h + k] = _mm512_and_si512(_mm512_srlv_epi16(q, shift), three);
    }
  }
}

/// One super-block's scales of 16 q2_k rows into the panel's integers and floats: per row the
/// 16 scale bytes as int16, their low nibbles (sc) in the lower 256 bits and high nibbles (m) in
/// the upper, so dword c holds the pair of chunk c; then one transpose.
MOEKIT_TARGET_AVX512_VNNI inline void pack_q2_k_scales(const std::byte* const* blocks,
                                                       std::int32_t* ints, float* reals) noexcept {
  __m512i v[avx512_int8::panel_height];
  for (std::size_t r = 0; r < avx512_int8::panel_height; ++r) {
    const __m256i b16 =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[r])));
    v[r] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b16, _mm256_set1_epi16(15))),
                              _mm256_srli_epi16(b16, 4), 1);
    reals[r] = q2_k::d_of(blocks[r]), reals[16 + r] = q2_k::dmin_of(blocks[r]);
  }
  store_lanes(v, 16, ints);
}

/// `blocks` super-blocks of 16 q2_k rows into a panel (pack_panel, in column order).
MOEKIT_TARGET_AVX512_VNNI inline void pack_q2_k_panel(const std::byte* const* rows,
                                                      std::size_t blocks, std::byte* codes,
                                                      std::int32_t* ints, float* reals) noexcept {
  pack_panel<unpack_q2_k, pack_q2_k_scales, in_order_sub, q2_k::block_bytes, q2_k_panel_ints,
             q2_k_panel_reals>(rows, blocks, codes, ints, reals);
}

/// q3_k panels: q2_k's layout (the same dots serve both). The codes u = low 2 bits | hmask bit
/// << 2 (0..7, q = u − 4) in q2_k's column order; per chunk c the int16 pairs (s_2c, s_2c+1) of
/// the signed scales s = sc − 32, then the pairs (4·s_2c, 4·s_2c+1) in place of q2_k's mins; the
/// floats d twice (as d and as dmin), so that the dots' sum·d·dx − mins·dmin·dx is
/// d·dx·Σ_s s·(Σ u·xq − 4·Σxq) = d·dx·Σ_s s·Σ q·xq.
inline constexpr std::size_t q3_k_panel_ints = q2_k_panel_ints, q3_k_panel_reals = q2_k_panel_reals;

/// The four 64-code vectors of a q3_k block as unsigned bytes, in unpack_q2_k's order: vector
/// v = 2h + k holds runs 2k and 2k + 1 of half h, whose bit 2 is bit 4h + 2k (+ 1 in the upper
/// 256 bits) of the hmask byte of the weight's column l.
MOEKIT_TARGET_AVX512_VNNI inline void unpack_q3_k(const std::byte* block, __m512i u[4]) noexcept {
  const __m512i three = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1);
  const __m512i hm =
      _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
  for (int h = 0; h < 2; ++h) {
    const __m512i q = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + q3_k::codes_offset + 32 * h)));
    for (int k = 0; k < 2; ++k) {
      const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(4 * k)),
                                               _mm256_set1_epi16(static_cast<short>(4 * k + 2)), 1);
      const int bit = 4 * h + 2 * k;
      const __m512i hshift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(bit)),
                                                _mm256_set1_epi16(static_cast<short>(bit + 1)), 1);
      const __m512i high = _mm512_and_si512(_mm512_srlv_epi16(hm, hshift), one);
      u[2 * h + k] = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi16(q, shift), three),
                                     _mm512_slli_epi16(high, 2));
    }
  }
}

/// One super-block's scales of 16 q3_k rows into the panel's integers and floats: per row the
/// 16 signed scales as int16 in the lower 256 bits and four times them in the upper, so dword c
/// holds the pairs of chunk c; then one transpose.
MOEKIT_TARGET_AVX512_VNNI inline void pack_q3_k_scales(const std::byte* const* blocks,
                                                       std::int32_t* ints, float* reals) noexcept {
  __m512i v[avx512_int8::panel_height];
  for (std::size_t r = 0; r < avx512_int8::panel_height; ++r) {
    std::uint32_t words[4];  // byte k of words[t]: sub-block 4t + k's scale, 0..63
    q3_k::scale_words(blocks[r], words);
    const __m256i s16 = _mm256_sub_epi16(
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(words))),
        _mm256_set1_epi16(32));
    v[r] = _mm512_inserti64x4(_mm512_castsi256_si512(s16), _mm256_slli_epi16(s16, 2), 1);
    reals[r] = reals[16 + r] = q3_k::d_of(blocks[r]);
  }
  store_lanes(v, 16, ints);
}

/// `blocks` super-blocks of 16 q3_k rows into a panel (pack_panel, in column order).
MOEKIT_TARGET_AVX512_VNNI inline void pack_q3_k_panel(const std::byte* const* rows,
                                                      std::size_t blocks, std::byte* codes,
                                                      std::int32_t* ints, float* reals) noexcept {
  pack_panel<unpack_q3_k, pack_q3_k_scales, in_order_sub, q3_k::block_bytes, q3_k_panel_ints,
             q3_k_panel_reals>(rows, blocks, codes, ints, reals);
}

/// out[16·t + r] = row r · token t for the T tokens `acts` over `blocks` super-blocks of a q2_k
/// or q3_k panel (pack_q2_k_panel, pack_q3_k_panel). Per chunk c the two sub-blocks' dots
/// (|·| ≤ 16·7·127, so int16) as one pair weighted by the chunk's scale pair in one `vpdpwssd`,
/// the mins (q3_k: four times the scales) likewise with the token's Σxq per sub-block; both exact
/// in int32 over the block (≤ 16·32·16·7·127 < 2^24), converted once and times d·dx, dmin·dx.
template <std::size_t T>
MOEKIT_TARGET_AVX512_VNNI inline void q2_k_panel_dots(const std::byte* codes,
                                                      const std::int32_t* ints, const float* reals,
                                                      const KQuantActivation* const* acts,
                                                      std::size_t blocks, float* out) noexcept {
  using avx512_int8::broadcast4;
  __m512 acc[T];
  for (std::size_t t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* cb = codes + panel_block_codes * b;
    const std::int32_t* ib = ints + q2_k_panel_ints * b;
    __m512i sum[T], mins[T];
    for (std::size_t t = 0; t < T; ++t) sum[t] = mins[t] = _mm512_setzero_si512();
    for (std::size_t c = 0; c < 8; ++c) {
      __m512i da[T], db[T];
      for (std::size_t t = 0; t < T; ++t) da[t] = db[t] = _mm512_setzero_si512();
#pragma GCC unroll 4                            // the accumulators in registers, not on the stack
      for (std::size_t ks = 0; ks < 4; ++ks) {  // lanes ks: sub-block 2c; ks + 4: 2c + 1
        const __m512i wa = _mm512_load_si512(cb + 512 * c + 64 * ks);
        const __m512i wb = _mm512_load_si512(cb + 512 * c + 64 * (ks + 4));
        for (std::size_t t = 0; t < T; ++t) {
          const std::int8_t* x = acts[t]->xq + 256 * b + 32 * c + 4 * ks;
          da[t] = _mm512_dpbusd_epi32(da[t], wa, broadcast4(x));
          db[t] = _mm512_dpbusd_epi32(db[t], wb, broadcast4(x + 16));
        }
      }
      const __m512i sc = _mm512_loadu_si512(ib + 16 * c), m = _mm512_loadu_si512(ib + 128 + 16 * c);
      for (std::size_t t = 0; t < T; ++t) {
        const __m512i pair =
            _mm512_mask_blend_epi16(0xaaaaaaaa, da[t], _mm512_slli_epi32(db[t], 16));
        sum[t] = _mm512_dpwssd_epi32(sum[t], pair, sc);
        mins[t] = _mm512_dpwssd_epi32(
            mins[t], m,
            broadcast4(reinterpret_cast<const std::int8_t*>(acts[t]->sums + 16 * b + 2 * c)));
      }
    }
    const float* rb = reals + q2_k_panel_reals * b;
    const __m512 dv = _mm512_loadu_ps(rb), mv = _mm512_loadu_ps(rb + 16);
    for (std::size_t t = 0; t < T; ++t) {
      const __m512 dx = _mm512_set1_ps(acts[t]->dx[b]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), _mm512_mul_ps(dv, dx), acc[t]);
      acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins[t]), _mm512_mul_ps(mv, dx), acc[t]);
    }
  }
  for (std::size_t t = 0; t < T; ++t) _mm512_storeu_ps(out + 16 * t, acc[t]);
}

}  // namespace moekit::detail::avx512_kquant

#pragma GCC diagnostic pop

#endif
