#pragma once
/// \file AVX-512 VNNI row kernel with int8 activations (opt-in: `KernelOptions::int8_activations`).
///
/// The activation is quantized once per call to int8 per 32-weight chunk (scale dx = max|x|/127,
/// as ggml's q8_0). The row is then read 64 bytes at a time (a block: 2 chunks of q8, 4 of q4,
/// 8 of q2); q4/q2 blocks are split into their bit planes with one shift and mask each, and the
/// activation is stored per block in that plane order, so every plane is one `vpdpbusd` of 64
/// unsigned codes by 64 int8 activations and all planes of a block add into one int32 vector
/// whose lanes each belong to one chunk. Per chunk c: Σ s·(q − z)·x ≈ s·dx·(Σ q·xq − z·Σ xq).
/// With groups of 32/64/128 a row goes 16 chunks a step: the step's block products are reduced to
/// one int32 per chunk by unpack-and-add steps, then one conversion, one s·dx product and one FMA
/// cover the 16 chunks (no per-block scale permutes, no pass over the scales before the codes).
/// Rows go several at a time (gemv and the fused FFN: 1, 2 or 4, as row_streaming.hpp says for the
/// core) sharing the activation's loads, which bound the loop on Zen 4 (one 64-byte load a cycle),
/// each prefetching its stream into L2 when the streaming prefetches.
/// Chunks after the last step go block by block, chunks after the last whole block one by one
/// (plain decode order), columns after the last chunk in floats.
/// Against the per-block version it replaced and against ggml: bench/RESULTS.md, "Zen 4".

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "moekit/precision/detail/avx2_rows.hpp"
#include "moekit/precision/detail/avx512_rows.hpp"
#include "moekit/precision/detail/prepared_activation.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/panels.hpp"
#include "moekit/precision/quantize.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)
#define MOEKIT_TARGET_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moekit::detail::avx512_int8 {

/// Chunks per 64-byte block of `bits`-bit codes.
constexpr std::size_t block_chunks(unsigned bits) noexcept { return 16 / bits; }

/// Byte position, within the activation of a block (32·block_chunks bytes), of weight `i`
/// (0..31, column order) of the block's chunk `j`: plane i mod (8/bits) (low bits first), then
/// the code's byte in the block. Matches the chunk layout: byte k of a q4 chunk holds weights 2k
/// (low nibble) and 2k+1; byte k of a q2 chunk holds weights 4k..4k+3 from the low bits up.
constexpr std::size_t block_position(unsigned bits, std::size_t j, std::size_t i) noexcept {
  const std::size_t planes = 8 / bits;
  return (i % planes) * 64 + j * 4 * bits + i / planes;
}

/// Stores chunk `c`'s 32 int8 activations (b0: columns 0-15, b1: 16-31) where the kernels for
/// `bits`-bit rows read them: split by plane within the chunk's block (block_position) or, after
/// the last whole block (`blocked` chunks), in the chunk's own 32 bytes in chunk_slot order.
/// Shared by the AVX-512 and the AVX2 prepare, so both give the same layout.
__attribute__((target("ssse3"))) inline void store_chunk_planes(std::int8_t* xq, std::size_t c,
                                                                std::size_t blocked, unsigned bits,
                                                                __m128i b0, __m128i b1) noexcept {
  // Byte shuffles that split 16 activations by plane (q4: evens | odds; q2: i mod 4 = 0..3).
  const __m128i split4 = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m128i split2 = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const bool in_block = c < blocked;
  const std::size_t j = c % block_chunks(bits);
  std::int8_t* base = in_block ? xq + 32 * (c - j) + j * 4 * bits : xq + 32 * c;
  const std::size_t plane_stride = in_block ? 64 : 32 / (8 / bits);
  if (bits == 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(base), b0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(base + 16), b1);
  } else if (bits == 4) {
    const __m128i s0 = _mm_shuffle_epi8(b0, split4), s1 = _mm_shuffle_epi8(b1, split4);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(base), _mm_unpacklo_epi64(s0, s1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(base + plane_stride), _mm_unpackhi_epi64(s0, s1));
  } else {
    const __m128i s0 = _mm_shuffle_epi8(b0, split2), s1 = _mm_shuffle_epi8(b1, split2);
    const __m128i p01 = _mm_unpacklo_epi32(s0, s1), p23 = _mm_unpackhi_epi32(s0, s1);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(base), p01);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(base + plane_stride), _mm_unpackhi_epi64(p01, p01));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(base + 2 * plane_stride), p23);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(base + 3 * plane_stride),
                     _mm_unpackhi_epi64(p23, p23));
  }
}

/// Quantizes x for rows of `bits`-bit codes into xq (cols/32·32 bytes) and dx (2·cols/32
/// floats: dx, then dx·Σxq). Vectorised: it runs once per GEMV, and for small matrices (the tiny
/// model's 256 × 512 experts) a scalar version cost about as much as the rows themselves
/// (bench/RESULTS.md, "Dequant-GEMV kernels against ggml and the memory bound").
MOEKIT_TARGET_AVX512_VNNI inline Int8Activation prepare_into(const float* x, std::size_t cols,
                                                             unsigned bits, std::int8_t* xq,
                                                             float* dx) noexcept {
  const std::size_t chunks = cols / 32;
  const std::size_t per_block = block_chunks(bits);
  const std::size_t blocked = chunks / per_block * per_block;
  float* dxs = dx + chunks;
  for (std::size_t c = 0; c < chunks; ++c) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * c), v1 = _mm512_loadu_ps(x + 32 * c + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.f, inv = amax > 0 ? 127.f / amax : 0.f;
    // Round to nearest even (the default rounding mode, as std::nearbyint).
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inv)));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inv)));
    dx[c] = d;
    dxs[c] = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
    store_chunk_planes(xq, c, blocked, bits, _mm512_cvtepi32_epi8(q0), _mm512_cvtepi32_epi8(q1));
  }
  return {xq, dx, dxs, x};
}

/// prepare_into storage that is grown, never shrunk.
MOEKIT_TARGET_AVX512_VNNI inline Int8Activation prepare(const float* x, std::size_t cols,
                                                        unsigned bits,
                                                        std::vector<std::int8_t>& q_storage,
                                                        std::vector<float>& f_storage) {
  const std::size_t chunks = cols / 32;
  if (q_storage.size() < chunks * 32) q_storage.resize(chunks * 32);
  if (f_storage.size() < 2 * chunks) f_storage.resize(2 * chunks);
  return prepare_into(x, cols, bits, q_storage.data(), f_storage.data());
}

/// 32 codes of chunk `p` (decode order) as unsigned bytes in a 256-bit register (AVX2 only, so
/// the AVX2 int8 kernel reads its chunks through it too).
template <unsigned Bits>
MOEKIT_TARGET_AVX2 inline __m256i codes32(const std::byte* p) noexcept {
  if constexpr (Bits == 8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else if constexpr (Bits == 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
  } else {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(0x03);
    const __m128i p01 = _mm_and_si128(_mm_unpacklo_epi64(b, _mm_srli_epi16(b, 2)), m);
    const __m128i p23 =
        _mm_and_si128(_mm_unpacklo_epi64(_mm_srli_epi16(b, 4), _mm_srli_epi16(b, 6)), m);
    return _mm256_set_m128i(p23, p01);
  }
}

/// Σ code·xq of one block for each of N rows (64 bytes of codes at p[n] + off, the activation at
/// `xq`, loaded once for all rows), per 32-bit lane; lane L belongs to the block's chunk L / Bits.
template <unsigned Bits, std::size_t N>
MOEKIT_TARGET_AVX512_VNNI inline void block_dots(const std::byte* const* p, std::size_t off,
                                                 const std::int8_t* xq, __m512i* d) noexcept {
  const __m512i z = _mm512_setzero_si512();
  if constexpr (Bits == 8) {
    const __m512i x = _mm512_loadu_si512(xq);
    for (std::size_t n = 0; n < N; ++n)
      d[n] = _mm512_dpbusd_epi32(z, _mm512_loadu_si512(p[n] + off), x);
  } else if constexpr (Bits == 4) {
    const __m512i m = _mm512_set1_epi8(0x0f);
    const __m512i x0 = _mm512_loadu_si512(xq), x1 = _mm512_loadu_si512(xq + 64);
    for (std::size_t n = 0; n < N; ++n) {
      const __m512i v = _mm512_loadu_si512(p[n] + off);
      d[n] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, _mm512_and_si512(v, m), x0),
                                 _mm512_and_si512(_mm512_srli_epi16(v, 4), m), x1);
    }
  } else {
    const __m512i m = _mm512_set1_epi8(0x03);
    const __m512i x0 = _mm512_loadu_si512(xq), x1 = _mm512_loadu_si512(xq + 64);
    const __m512i x2 = _mm512_loadu_si512(xq + 128), x3 = _mm512_loadu_si512(xq + 192);
    for (std::size_t n = 0; n < N; ++n) {
      const __m512i v = _mm512_loadu_si512(p[n] + off);
      const __m512i d0 = _mm512_dpbusd_epi32(z, _mm512_and_si512(v, m), x0);
      const __m512i d1 = _mm512_dpbusd_epi32(z, _mm512_and_si512(_mm512_srli_epi16(v, 2), m), x1);
      const __m512i d2 = _mm512_dpbusd_epi32(d0, _mm512_and_si512(_mm512_srli_epi16(v, 4), m), x2);
      const __m512i d3 = _mm512_dpbusd_epi32(d1, _mm512_and_si512(_mm512_srli_epi16(v, 6), m), x3);
      d[n] = _mm512_add_epi32(d2, d3);
    }
  }
}

/// block_dots of one row.
template <unsigned Bits>
MOEKIT_TARGET_AVX512_VNNI inline __m512i block_dot(const std::byte* p,
                                                   const std::int8_t* xq) noexcept {
  __m512i d;
  block_dots<Bits, 1>(&p, 0, xq, &d);
  return d;
}

/// The block's per-chunk scales (block_chunks floats at `sdx`), spread to the lanes block_dot
/// gives each chunk.
template <unsigned Bits>
MOEKIT_TARGET_AVX512_VNNI inline __m512 block_scales(const float* sdx) noexcept {
  const __m512i lane_chunk = _mm512_srli_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), Bits == 8   ? 3
                                                                              : Bits == 4 ? 2
                                                                                          : 1);
  constexpr auto mask = static_cast<__mmask16>((1u << (16 / Bits)) - 1u);
  return _mm512_permutexvar_ps(lane_chunk, _mm512_maskz_loadu_ps(mask, sdx));
}

/// Unpack-and-add steps of the chunk reduction below.
MOEKIT_TARGET_AVX512_VNNI inline __m512i add_pairs(__m512i a, __m512i b) noexcept {
  // per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3)
  return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
MOEKIT_TARGET_AVX512_VNNI inline __m512i add_halves(__m512i a, __m512i b) noexcept {
  // per 128-bit lane: (a0+a2, a1+a3, b0+b2, b1+b3) read as 64-bit halves
  return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}
/// The int32 sum of each of 16 chunks of N rows (codes at p[n] + off, activation at `xq`), in
/// chunk order into out[n]: the 16·Bits/8 block products reduced within each chunk, per 128-bit
/// lane, then across lanes.
template <unsigned Bits, std::size_t N>
MOEKIT_TARGET_AVX512_VNNI inline void chunk_sums16(const std::byte* const* p, std::size_t off,
                                                   const std::int8_t* xq, __m512i* out) noexcept {
  constexpr std::size_t block_bytes = 64, block_act = 64 * 8 / Bits;
  if constexpr (Bits == 8) {
    // Block k: lanes 0-7 chunk 2k, lanes 8-15 chunk 2k+1.
    __m512i d[8][N];
    for (std::size_t k = 0; k < 8; ++k)
      block_dots<8, N>(p, off + k * block_bytes, xq + k * block_act, d[k]);
    for (std::size_t n = 0; n < N; ++n) {
      const __m512i u0 = add_halves(add_pairs(d[0][n], d[1][n]), add_pairs(d[2][n], d[3][n]));
      const __m512i u1 = add_halves(add_pairs(d[4][n], d[5][n]), add_pairs(d[6][n], d[7][n]));
      // 128-bit lanes: chunks 0,2,4,6 | 1,3,5,7 | 8,10,12,14 | 9,11,13,15
      const __m512i s = _mm512_add_epi32(_mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                                         _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
      out[n] = _mm512_permutexvar_epi32(
          _mm512_set_epi32(15, 11, 14, 10, 13, 9, 12, 8, 7, 3, 6, 2, 5, 1, 4, 0), s);
    }
  } else if constexpr (Bits == 4) {
    // Block k: 128-bit lane j is chunk 4k+j.
    __m512i e[4][N];
    for (std::size_t k = 0; k < 4; ++k)
      block_dots<4, N>(p, off + k * block_bytes, xq + k * block_act, e[k]);
    for (std::size_t n = 0; n < N; ++n) {
      // 128-bit lane j: chunks j, 4+j, 8+j, 12+j
      const __m512i s = add_halves(add_pairs(e[0][n], e[1][n]), add_pairs(e[2][n], e[3][n]));
      out[n] = _mm512_permutexvar_epi32(
          _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), s);
    }
  } else {
    // Block k: lanes 2i, 2i+1 are chunk 8k+i.
    __m512i f[2][N];
    for (std::size_t k = 0; k < 2; ++k)
      block_dots<2, N>(p, off + k * block_bytes, xq + k * block_act, f[k]);
    for (std::size_t n = 0; n < N; ++n) {
      const __m512 f0 = _mm512_castsi512_ps(f[0][n]), f1 = _mm512_castsi512_ps(f[1][n]);
      // 128-bit lane j: chunks 2j, 2j+1, 8+2j, 9+2j
      const __m512i s =
          _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(f0, f1, _MM_SHUFFLE(2, 0, 2, 0))),
                           _mm512_castps_si512(_mm512_shuffle_ps(f0, f1, _MM_SHUFFLE(3, 1, 3, 1))));
      out[n] = _mm512_permutexvar_epi32(
          _mm512_set_epi32(15, 14, 11, 10, 7, 6, 3, 2, 13, 12, 9, 8, 5, 4, 1, 0), s);
    }
  }
}

/// The f16 values (scales or zero points) at `v` of the groups of the next `left` (<= 16) chunks,
/// one per chunk lane (groups of 2^shift chunks); masked loads never read past the row's values.
MOEKIT_TARGET_AVX512_VNNI inline __m512 per_chunk_values(const std::byte* v, unsigned shift,
                                                         unsigned left,
                                                         __m512i lane_group) noexcept {
  const auto groups_mask =
      static_cast<__mmask16>((1u << ((left + (1u << shift) - 1u) >> shift)) - 1u);
  return _mm512_permutexvar_ps(lane_group,
                               _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(groups_mask, v)));
}

/// The end of one row after the 16-chunk steps: chunks from `c` on (fewer than 16, or all of them
/// for group sizes other than 32/64/128) block by block with their sdx (`sdx`: per-thread scratch
/// of >= cols/32 floats), columns after the last chunk in floats; `acc`/`zt` carry the steps'
/// products and zero-point terms. They come by reference: GCC compiles a function with vector
/// parameters to return with the upper halves of the vector registers dirty, and its callers
/// assume every call returns them clean, so a kernel ending in this call returned to generic
/// (SSE-encoded) code dirty, where every SSE instruction then stalls on Intel cores
/// (bench/RESULTS.md, "The SSE/AVX transition"; scripts/check_vzeroupper.py checks the binaries).
template <unsigned Bits>
MOEKIT_TARGET_AVX512_VNNI inline float finish_row(const std::byte* row, const RowLayout& l,
                                                  const Int8Activation& a, float* sdx,
                                                  std::size_t c, const __m512& acc_steps,
                                                  const __m512& zt_steps) noexcept {
  __m512 acc0 = acc_steps, zt = zt_steps;
  constexpr std::size_t chunk_bytes = 4 * Bits;
  const std::size_t chunks = l.cols / 32;
  const std::size_t per_group = l.group_size / 32;
  const bool grouped = per_group == 1 || per_group == 2 || per_group == 4;
  if (grouped &&
      c < chunks) {  // masked, not scalar: the tiny model's 256-column rows have 8 chunks
    const unsigned shift = per_group == 1 ? 0 : per_group == 2 ? 1 : 2;
    const __m512i lane_group = _mm512_srli_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), shift);
    const auto left = static_cast<unsigned>(chunks - c);
    const auto lanes = static_cast<__mmask16>((1u << left) - 1u);
    const __m512 s =
        per_chunk_values(row + l.scales_offset + 2 * (c >> shift), shift, left, lane_group);
    const __m512 z = l.affine ? per_chunk_values(row + l.zeros_offset + 2 * (c >> shift), shift,
                                                 left, lane_group)
                              : _mm512_set1_ps(l.symmetric_zero);
    _mm512_mask_storeu_ps(sdx + c, lanes, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(lanes, a.dx + c)));
    zt = _mm512_fmadd_ps(_mm512_mul_ps(s, z), _mm512_maskz_loadu_ps(lanes, a.dx_sum + c), zt);
  }
  float zero_term = _mm512_reduce_add_ps(zt);
  if (!grouped) {  // group by group (no division per chunk: it costs more than the chunk itself)
    for (std::size_t g = 0, k = 0; k < chunks; ++g) {
      const float s = avx512::half_to_float(row + l.scales_offset + 2 * g);
      const float z =
          l.affine ? avx512::half_to_float(row + l.zeros_offset + 2 * g) : l.symmetric_zero;
      const std::size_t end = per_group ? std::min(chunks, (g + 1) * per_group) : chunks;
      for (; k < end; ++k) {
        sdx[k] = s * a.dx[k];
        zero_term += s * z * a.dx_sum[k];
      }
    }
  }
  constexpr std::size_t per_block = block_chunks(Bits);
  const std::size_t blocked = chunks / per_block * per_block;
  __m512 acc1 = _mm512_setzero_ps();
  for (; c + 2 * per_block <= blocked; c += 2 * per_block) {  // two blocks: independent chains
    const std::size_t c1 = c + per_block;
    acc0 =
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_dot<Bits>(row + c * chunk_bytes, a.xq + 32 * c)),
                        block_scales<Bits>(sdx + c), acc0);
    acc1 =
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_dot<Bits>(row + c1 * chunk_bytes, a.xq + 32 * c1)),
                        block_scales<Bits>(sdx + c1), acc1);
  }
  if (c < blocked) {
    acc0 =
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_dot<Bits>(row + c * chunk_bytes, a.xq + 32 * c)),
                        block_scales<Bits>(sdx + c), acc0);
    c += per_block;
  }
  float total = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  if (c < chunks) {  // chunks after the last whole block
    __m256 acc = _mm256_setzero_ps();
    for (; c < chunks; ++c) {
      const __m256i d =
          _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes32<Bits>(row + c * chunk_bytes),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + 32 * c)));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(sdx[c]), acc);
    }
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 t = _mm_add_ps(h, _mm_movehl_ps(h, h));
    total += _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
  float tail = 0.f;
  for (std::size_t col = chunks * 32; col < l.cols; ++col) {
    const std::size_t g = col / l.group_size;
    tail += avx512::half_to_float(row + l.scales_offset + 2 * g) *
            (static_cast<float>(read_code(row, col, Bits)) -
             (l.affine ? avx512::half_to_float(row + l.zeros_offset + 2 * g) : l.symmetric_zero)) *
            a.x[col];
  }
  return total - zero_term + tail;
}

/// Prefetches bytes [lo, hi) of each of N rows into L2, a cache line at a time.
template <std::size_t N>
inline void prefetch_l2(const std::byte* const* rows, std::size_t lo, std::size_t hi) noexcept {
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t o = lo; o < hi; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(rows[n] + o), _MM_HINT_T1);
}

/// N quantized rows (same layout) · x with int8 activations, into out[0..N). Groups of 32/64/128
/// go 16 chunks a step, the activation's loads shared by the N rows (2 rows: 12 instead of 16
/// 64-byte loads per 16 q8 chunks and row; the load ports bound this loop on Zen 4).
/// `sdx` is per-thread scratch of >= cols/32 floats.
///
/// `next` (optional): for each row, a row further down its stream. Its bytes are prefetched into
/// L2 in step with this call's progress through its own row (codes and scales alike), so every
/// stream is fetched a fixed distance ahead of its loads. The hardware prefetcher alone falls
/// behind once the loop does this much work per byte; into L2 rather than L1, which measured
/// slower (bench/RESULTS.md, "Dequant-GEMV kernels against ggml and the memory bound").
template <unsigned Bits, std::size_t N>
MOEKIT_TARGET_AVX512_VNNI inline void row_dots(const std::byte* const* rows, const RowLayout& l,
                                               const Int8Activation& a, float* sdx, float* out,
                                               const std::byte* const* next = nullptr) noexcept {
  constexpr std::size_t chunk_bytes = 4 * Bits;
  const std::size_t chunks = l.cols / 32;
  const std::size_t per_group = l.group_size / 32;
  // Bytes of `next` prefetched so far, and per 16-chunk step (whole lines, rounded up; the end
  // is clamped).
  std::size_t fetched = 0;
  const std::size_t fetch_step =
      next && chunks ? ((16 * l.bytes + chunks - 1) / chunks + 63) / 64 * 64 : 0;
  // Per chunk: the product scaled by s·dx; the zero-point term Σ s·z·dx·Σxq (subtracted at the
  // end).
  __m512 acc[N], zt[N];
  for (std::size_t n = 0; n < N; ++n) acc[n] = zt[n] = _mm512_setzero_ps();
  std::size_t c = 0;
  if (per_group == 1 || per_group == 2 || per_group == 4) {
    const unsigned shift = per_group == 1 ? 0 : per_group == 2 ? 1 : 2;
    const __m512i lane_group = _mm512_srli_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), shift);
    const __m512 zs = _mm512_set1_ps(l.symmetric_zero);
    for (; c + 16 <= chunks; c += 16) {
      if (next) {
        const std::size_t to = std::min(l.bytes, fetched + fetch_step);
        prefetch_l2<N>(next, fetched, to);
        fetched = to;
      }
      __m512i q[N];
      chunk_sums16<Bits, N>(rows, c * chunk_bytes, a.xq + 32 * c, q);
      const __m512 dx = _mm512_loadu_ps(a.dx + c), dxs = _mm512_loadu_ps(a.dx_sum + c);
      const std::size_t gs = 2 * (c >> shift);
      for (std::size_t n = 0; n < N; ++n) {
        const __m512 s = per_chunk_values(rows[n] + l.scales_offset + gs, shift, 16, lane_group);
        const __m512 z =
            l.affine ? per_chunk_values(rows[n] + l.zeros_offset + gs, shift, 16, lane_group) : zs;
        acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q[n]), _mm512_mul_ps(s, dx), acc[n]);
        zt[n] = _mm512_fmadd_ps(_mm512_mul_ps(s, z), dxs, zt[n]);
      }
    }
  }
  if (next) prefetch_l2<N>(next, fetched, l.bytes);  // the rest (all of it when no steps ran)
  for (std::size_t n = 0; n < N; ++n)
    out[n] = finish_row<Bits>(rows[n], l, a, sdx, c, acc[n], zt[n]);
}

/// How far ahead of its loads panel_dots prefetches its stream, in bytes, into L1 (one stream
/// 8 KiB ahead is a sixth of it). Tuned on Zen 5 by a sweep of 2-12 KiB on cold Mixtral shapes
/// at one thread, moekit_bench_gemv (bench/RESULTS.md, "Panels (`MatrixOrder::panels4`)").
constexpr std::size_t panel_prefetch_bytes = 8 * 1024;

/// The running sums of one panel's four rows (products scaled by s·dx, and the zero-point
/// terms), kept between the column blocks of panels_dots.
struct PanelSums {
  __m512 acc[PanelLayout::height];
  __m512 zt[PanelLayout::height];
};

/// Steps [s0, s1) of one panel, stored back to back from `first`, into `sums`: each 512-column
/// step is chunk_sums16 over the four rows' codes (activation loaded once for all four) and the
/// step's scales, read from the same stream, which is prefetched panel_prefetch_bytes ahead into
/// L1 (the address formed as an integer: it runs past the matrix at its end, and a prefetch
/// never faults).
template <unsigned Bits>
MOEKIT_TARGET_AVX512_VNNI inline void panel_steps(const std::byte* first, const PanelLayout& l,
                                                  const Int8Activation& a, std::size_t s0,
                                                  std::size_t s1, PanelSums& sums) noexcept {
  constexpr std::size_t H = PanelLayout::height;
  const unsigned shift = l.row.group_size == 32 ? 0 : l.row.group_size == 64 ? 1 : 2;
  const __m512i lane_group = _mm512_srli_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), shift);
  const __m512 zs = _mm512_set1_ps(l.row.symmetric_zero);
  __m512 acc[H], zt[H];
  for (std::size_t n = 0; n < H; ++n) acc[n] = sums.acc[n], zt[n] = sums.zt[n];
  const std::byte* step = first;
  for (std::size_t c = 16 * s0; c < 16 * s1; c += 16, step += l.step_bytes) {
    const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(step) + panel_prefetch_bytes;
    for (std::size_t o = 0; o < l.step_bytes; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + o), _MM_HINT_T0);
    const std::byte* codes[H];
    for (std::size_t n = 0; n < H; ++n) codes[n] = step + n * l.code_bytes;
    __m512i q[H];
    chunk_sums16<Bits, H>(codes, 0, a.xq + 32 * c, q);
    // The scaling of row_dots' step, with the panel's places for the f16 values. Written out
    // twice on purpose: one function for both, taking the places as pointers or as functions,
    // made the q8 row kernel measurably slower on cold 4096-column rows (moekit_bench_gemv).
    const __m512 dx = _mm512_loadu_ps(a.dx + c), dxs = _mm512_loadu_ps(a.dx_sum + c);
    const std::byte* values = step + H * l.code_bytes;
    for (std::size_t n = 0; n < H; ++n) {
      const __m512 sc = per_chunk_values(values + n * l.value_bytes, shift, 16, lane_group);
      const __m512 z =
          l.row.affine ? per_chunk_values(values + (H + n) * l.value_bytes, shift, 16, lane_group)
                       : zs;
      acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q[n]), _mm512_mul_ps(sc, dx), acc[n]);
      zt[n] = _mm512_fmadd_ps(_mm512_mul_ps(sc, z), dxs, zt[n]);
    }
  }
  for (std::size_t n = 0; n < H; ++n) sums.acc[n] = acc[n], sums.zt[n] = zt[n];
}

/// The panels of one group (`count` of them at `group`, laid out as `l` says: MatrixOrder::
/// panels4 or blocked_panels4) · x with int8 activations, into out[0..4·count), read in the order
/// they are stored: block by block, every panel's steps of the block, then every panel's tails
/// (finish_row, each tail a row of its own). Blocked, a panel's running sums wait in `PanelSums`
/// between blocks while the activation of one block (<= 4 KiB of int8) stays in L1; read whole,
/// a 14336-column q4 panel streams 32 KiB between two uses of the same activation byte and
/// evicts the 17.5 KiB activation (bench/RESULTS.md, "Panels (`MatrixOrder::panels4`)").
/// Results are bit-identical to row_dots on the same rows (every row's operations in the same
/// order). `sdx`: scratch of >= 16 floats.
template <unsigned Bits>
MOEKIT_TARGET_AVX512_VNNI inline void panels_dots(const std::byte* group, std::size_t count,
                                                  const PanelLayout& l, const Int8Activation& a,
                                                  float* sdx, float* out) noexcept {
  PanelSums sums[PanelLayout::blocked_group];
  for (std::size_t k = 0; k < count; ++k)
    for (std::size_t n = 0; n < PanelLayout::height; ++n)
      sums[k].acc[n] = sums[k].zt[n] = _mm512_setzero_ps();
  for (std::size_t b = 0; b < l.blocks(); ++b) {
    const std::size_t s0 = b * l.block_steps, s1 = s0 + l.block_len(b);
    for (std::size_t k = 0; k < count; ++k)
      panel_steps<Bits>(group + l.step(k, s0, count), l, a, s0, s1, sums[k]);
  }
  // The tails: the activation from the first tail chunk on (a whole number of blocks in).
  const std::size_t c0 = 16 * l.steps;
  const Int8Activation rest{a.xq + 32 * c0, a.dx + c0, a.dx_sum + c0, a.x + 32 * c0};
  for (std::size_t k = 0; k < count; ++k)
    for (std::size_t n = 0; n < PanelLayout::height; ++n)
      out[PanelLayout::height * k + n] = finish_row<Bits>(
          group + l.tail_row(k, n, count), l.tail, rest, sdx, 0, sums[k].acc[n], sums[k].zt[n]);
}

}  // namespace moekit::detail::avx512_int8

#pragma GCC diagnostic pop

#endif
