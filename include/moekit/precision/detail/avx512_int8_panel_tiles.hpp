#pragma once
/// \file AVX-512 VNNI panel tile of the int8-activation GEMM (prefill): 16 rows repacked once per
/// call into a panel where each 64-byte vector holds 4 codes (one dword) of every row, so the
/// 32-bit lanes are the 16 rows. A token's 4 activation bytes are broadcast to all lanes
/// (`vpdpbusd` with a {1to16} operand), a chunk's 8 dwords accumulate in int32 in the same lane,
/// and one conversion, one multiply and two FMAs then scale 16 (row, token) pairs per chunk: the
/// R × T row tile this replaced spent those on every (row, token) pair and 64-byte block
/// (bench/RESULTS.md, "Prefill GEMM: the AVX-512 panel tile").
///
/// Panel layout (pack_panel): chunk c of the blocked part, k-step ks = plane·Bits + i (0..7) at
/// byte 64·(8c + ks): lane r = the dword of row r at lane Bits·j + i of plane `plane` of block
/// c / block_chunks, j = c mod block_chunks (avx512_int8_rows.hpp block_dots: lane L of a block
/// belongs to chunk L / Bits), the codes unpacked to bytes; the activation bytes that dword
/// meets are at the same place of the token's planes (prepare_into). Scales per chunk as 16
/// floats, one per row. Every (row, token) pair runs the same instructions whatever its lane or
/// its place in the token tile, so a token's result does not depend on the batch.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/precision/detail/avx512_int8_rows.hpp"
#include "moekit/precision/detail/prepared_activation.hpp"
#include "moekit/precision/format.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moekit::detail::avx512_int8 {

/// Rows per panel: one per 32-bit lane.
inline constexpr std::size_t panel_height = 16;

/// Rows repacked at a time for rows of `cols` weights: about `bytes` of unpacked codes (a byte
/// per weight), 16 to `most`, whole panels; fixed by the row's length alone.
inline std::size_t panel_group_rows(std::size_t cols, std::size_t bytes,
                                    std::size_t most) noexcept {
  const std::size_t g = std::clamp<std::size_t>(bytes / std::max<std::size_t>(cols, 1), 16, most);
  return g / panel_height * panel_height;
}

/// v[L] lane r = v[r] lane L before (a 16 × 16 transpose of 32-bit elements): unpacks within
/// 128-bit lanes, then a 4 × 4 transpose of the 128-bit lanes.
MOEKIT_TARGET_AVX512_VNNI inline void transpose16(__m512i* v) noexcept {
  __m512i t[16], u[16];
  for (std::size_t a = 0; a < 8; ++a) {
    t[2 * a] = _mm512_unpacklo_epi32(v[2 * a], v[2 * a + 1]);
    t[2 * a + 1] = _mm512_unpackhi_epi32(v[2 * a], v[2 * a + 1]);
  }
  for (std::size_t g = 0; g < 4; ++g) {  // u[4g + e], 128-bit lane q: rows 4g.. at column 4q + e
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (std::size_t e = 0; e < 4; ++e) {
    const __m512i p0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x44);
    const __m512i p1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xEE);
    const __m512i p2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x44);
    const __m512i p3 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xEE);
    v[e] = _mm512_shuffle_i32x4(p0, p2, 0x88);
    v[4 + e] = _mm512_shuffle_i32x4(p0, p2, 0xDD);
    v[8 + e] = _mm512_shuffle_i32x4(p1, p3, 0x88);
    v[12 + e] = _mm512_shuffle_i32x4(p1, p3, 0xDD);
  }
}

/// The codes of the first `blocked` chunks of 16 rows into `codes` (blocked · 512 bytes) in the
/// panel layout of the file comment.
template <unsigned Bits>
MOEKIT_TARGET_AVX512_VNNI inline void pack_panel(const std::byte* const* rows, std::size_t blocked,
                                                 std::byte* codes) noexcept {
  constexpr std::size_t planes = 8 / Bits, per_block = block_chunks(Bits);
  const __m512i mask = _mm512_set1_epi8(static_cast<char>((1u << Bits) - 1u));
  for (std::size_t b = 0; b < blocked / per_block; ++b)
    for (std::size_t k = 0; k < planes; ++k) {
      __m512i v[panel_height];
      for (std::size_t r = 0; r < panel_height; ++r) {
        const __m512i x = _mm512_loadu_si512(rows[r] + b * 64);
        v[r] = Bits == 8
                   ? x
                   : _mm512_and_si512(_mm512_srli_epi16(x, static_cast<unsigned>(k * Bits)), mask);
      }
      transpose16(v);
      for (std::size_t lane = 0; lane < 16; ++lane) {
        const std::size_t c = b * per_block + lane / Bits, ks = k * Bits + lane % Bits;
        _mm512_storeu_si512(codes + 64 * (8 * c + ks), v[lane]);
      }
    }
}

/// Per-row chunk values (row r's at rows[r]) into 16 floats per chunk (`out`, chunks · 16).
MOEKIT_TARGET_AVX512_VNNI inline void transpose_scales(const float* const* rows, std::size_t chunks,
                                                       float* out) noexcept {
  for (std::size_t c = 0; c < chunks; c += 16) {
    const std::size_t left = std::min<std::size_t>(16, chunks - c);
    const auto lanes = static_cast<__mmask16>((1u << left) - 1u);
    __m512i v[panel_height];
    for (std::size_t r = 0; r < panel_height; ++r)
      v[r] = _mm512_castps_si512(_mm512_maskz_loadu_ps(lanes, rows[r] + c));
    transpose16(v);
    for (std::size_t i = 0; i < left; ++i) _mm512_storeu_si512(out + 16 * (c + i), v[i]);
  }
}

/// The 4 activation bytes at p, in every lane.
MOEKIT_TARGET_AVX512_VNNI inline __m512i broadcast4(const std::int8_t* p) noexcept {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

/// out[16·t + r] = row r · token t over the first `blocked` chunks, for the T tokens `acts`
/// (a panel's codes, and its scales s and s·z per chunk, as pack_panel / transpose_scales).
template <unsigned Bits, std::size_t T>
MOEKIT_TARGET_AVX512_VNNI inline void panel_dots(const std::byte* codes, const float* s,
                                                 const float* sz, const Int8Activation* const* acts,
                                                 std::size_t blocked, float* out) noexcept {
  constexpr std::size_t planes = 8 / Bits, per_block = block_chunks(Bits);
  __m512 acc[T];
  for (std::size_t t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (std::size_t c = 0; c < blocked; ++c) {
    const std::size_t x0 = (c / per_block) * 64 * planes + 4 * Bits * (c % per_block);
    __m512i d[T];
    for (std::size_t t = 0; t < T; ++t) d[t] = _mm512_setzero_si512();
    for (std::size_t ks = 0; ks < 8; ++ks) {
      const __m512i w = _mm512_loadu_si512(codes + 64 * (8 * c + ks));
      const std::size_t at = x0 + 64 * (ks / Bits) + 4 * (ks % Bits);
      for (std::size_t t = 0; t < T; ++t)
        d[t] = _mm512_dpbusd_epi32(d[t], w, broadcast4(acts[t]->xq + at));
    }
    const __m512 sc = _mm512_loadu_ps(s + 16 * c), zc = _mm512_loadu_ps(sz + 16 * c);
    for (std::size_t t = 0; t < T; ++t) {
      const __m512 sdx = _mm512_mul_ps(sc, _mm512_set1_ps(acts[t]->dx[c]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[t]), sdx, acc[t]);
      acc[t] = _mm512_fnmadd_ps(zc, _mm512_set1_ps(acts[t]->dx_sum[c]), acc[t]);
    }
  }
  for (std::size_t t = 0; t < T; ++t) _mm512_storeu_ps(out + 16 * t, acc[t]);
}

}  // namespace moekit::detail::avx512_int8

#pragma GCC diagnostic pop

#endif
