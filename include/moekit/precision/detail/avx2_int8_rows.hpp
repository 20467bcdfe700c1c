#pragma once
/// \file AVX2 row kernel with int8 activations: `KernelOptions::int8_activations` on x86 CPUs
/// without AVX-512 VNNI (AVX2 only, or AVX-512 without VNNI), with AVX-VNNI's 256-bit
/// `vpdpbusd` where the CPU has it (Intel since Alder Lake, AMD since Zen 5).
///
/// Same activation as the AVX-512 path (avx512_int8_rows.hpp: int8 per 32-value chunk, dx =
/// max|x|/127, laid out per 64-byte block by plane), so both round x identically; the row is read
/// 32 code bytes at a time (half a block: 1, 2 or 4 chunks of q8, q4, q2), each plane one
/// unsigned × signed byte product into int32 lanes that belong to one chunk each; eight chunks'
/// lanes are reduced to one int32 per chunk, then one conversion and one FMA with the chunks'
/// s·dx cover the eight (chunk_sums8; after the last eight, per half block). Without VNNI the
/// products go
/// through `vpmaddubsw` (int16 pairs) and `vpmaddwd`: q4/q2 codes (≤ 15) cannot saturate the
/// int16 pairs, q8 codes (≤ 255) can, so q8 rows are read as signed q − 128 with ggml's
/// sign trick (|w| · sign(x, w)), and the zero-point term subtracts (z − 128)·Σx instead of z·Σx.
/// One row at a time; a matrix in panels (panels.hpp) is read as it lies, one stream per thread,
/// the four rows of a panel sharing each activation load (panels_dots).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "moekit/precision/detail/avx2_rows.hpp"
#include "moekit/precision/detail/avx512_int8_rows.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/panels.hpp"
#include "moekit/precision/quantize.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moekit::detail::avx2_int8 {

using avx2::hsum;
using avx512_int8::block_chunks;
using avx512_int8::codes32;

#define MOEKIT_TARGET_AVX2_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

/// As avx512_int8::prepare_into (the same layout and the same rounding), with 8-lane vectors.
MOEKIT_TARGET_AVX2 inline Int8Activation prepare_into(const float* x, std::size_t cols,
                                                      unsigned bits, std::int8_t* xq,
                                                      float* dx) noexcept {
  const std::size_t chunks = cols / 32;
  const std::size_t blocked = chunks / block_chunks(bits) * block_chunks(bits);
  float* dxs = dx + chunks;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  // packs_epi32 then packs_epi16 leave 4-byte groups in the order 0 2 4 6 1 3 5 7 of the wanted.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (std::size_t c = 0; c < chunks; ++c) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + 32 * c + 8 * i);
    const __m256 m =
        _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                      _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    const float d = amax / 127.f, inv = amax > 0 ? 127.f / amax : 0.f;
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
    const __m256i sum =
        _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
    dx[c] = d;
    dxs[c] = d * static_cast<float>(_mm_cvtsi128_si32(t));
    const __m256i b = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])), order);
    avx512_int8::store_chunk_planes(xq, c, blocked, bits, _mm256_castsi256_si128(b),
                                    _mm256_extracti128_si256(b, 1));
  }
  return {xq, dx, dxs, x};
}

/// prepare_into storage that is grown, never shrunk.
MOEKIT_TARGET_AVX2 inline Int8Activation prepare(const float* x, std::size_t cols, unsigned bits,
                                                 std::vector<std::int8_t>& q_storage,
                                                 std::vector<float>& f_storage) {
  const std::size_t chunks = cols / 32;
  if (q_storage.size() < chunks * 32) q_storage.resize(chunks * 32);
  if (f_storage.size() < 2 * chunks) f_storage.resize(2 * chunks);
  return prepare_into(x, cols, bits, q_storage.data(), f_storage.data());
}

/// Σ over 4 bytes of u·s per int32 lane, added to `acc`: `vpdpbusd` (AVX-VNNI) or, without it,
/// `vpmaddubsw` + `vpmaddwd` (exact while no int16 pair sum passes 32767).
template <bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) noexcept {
  if constexpr (Vnni)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
  else
    return _mm256_add_epi32(acc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

/// Σ code·xq per int32 lane of 32 unsigned codes `u` by the int8 activation `s`: q8 codes without
/// VNNI as q − 128 (|q − 128| · sign(s, q − 128): no int16 pair can saturate).
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline __m256i codes_dot(__m256i u, __m256i s) noexcept {
  if constexpr (Bits == 8 && !Vnni) {
    const __m256i w = _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80)));
    return dot_u8s8<false>(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(s, w));
  } else {
    return dot_u8s8<Vnni>(_mm256_setzero_si256(), u, s);
  }
}

/// The activation of the 8/Bits planes of half a block, plane k at xq + k·plane_stride.
template <unsigned Bits>
MOEKIT_TARGET_AVX2 inline void half_activation(const std::int8_t* xq, std::size_t plane_stride,
                                               __m256i* act) noexcept {
  for (unsigned k = 0; k < 8 / Bits; ++k)
    act[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + k * plane_stride));
}

/// Σ code·xq per int32 lane of the 32 code bytes `v` (lane L: chunk L / (Bits) of the half
/// block) by the half block's activation planes `act`. Without VNNI, q8 codes are read as q − 128.
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline __m256i half_dot(__m256i v, const __m256i* act) noexcept {
  const __m256i z = _mm256_setzero_si256();
  if constexpr (Bits == 8) {
    return codes_dot<8, Vnni>(v, act[0]);
  } else {
    constexpr unsigned planes = 8 / Bits;
    const __m256i m = _mm256_set1_epi8(static_cast<char>((1u << Bits) - 1u));
    if constexpr (Vnni) {
      __m256i d = z;
      for (unsigned k = 0; k < planes; ++k)
        d = _mm256_dpbusd_avx_epi32(
            d, _mm256_and_si256(_mm256_srli_epi16(v, static_cast<int>(k * Bits)), m), act[k]);
      return d;
    } else {  // the int16 products of all planes first: 4 · 2 · 3 · 127 and 2 · 2 · 15 · 127 fit
      __m256i s16 = z;
      for (unsigned k = 0; k < planes; ++k)
        s16 = _mm256_add_epi16(
            s16,
            _mm256_maddubs_epi16(
                _mm256_and_si256(_mm256_srli_epi16(v, static_cast<int>(k * Bits)), m), act[k]));
      return _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    }
  }
}

/// The activation of the two halves of the block from the chunk at `xq`: half 0's planes, then
/// half 1's (2·8/Bits registers).
template <unsigned Bits>
MOEKIT_TARGET_AVX2 inline void block_activation(const std::int8_t* xq, __m256i* act) noexcept {
  half_activation<Bits>(xq, 64, act);
  half_activation<Bits>(xq + 32, 64, act + 8 / Bits);
}

/// How far ahead of its loads row_dot prefetches (as the AVX-512 panel kernel: one stream).
constexpr std::size_t prefetch_bytes = 8 * 1024;

/// The f16 values (scales or zero points) at `v` of the groups of 8 chunks (groups of 2^shift
/// chunks), one per chunk lane; exact-size loads never read past the row's values.
MOEKIT_TARGET_AVX2 inline __m256 chunk_values(const std::byte* v, int shift,
                                              __m256i lane_group) noexcept {
  const __m128i h = shift == 0   ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(v))
                    : shift == 1 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v))
                                 : _mm_loadu_si32(v);
  return _mm256_permutevar8x32_ps(_mm256_cvtph_ps(h), lane_group);
}

/// The chunks' s·dx of half a block, one per int32 lane as half_dot lays them out.
template <unsigned Bits>
MOEKIT_TARGET_AVX2 inline __m256 half_scales(const float* sdx) noexcept {
  if constexpr (Bits == 8)
    return _mm256_set1_ps(sdx[0]);
  else if constexpr (Bits == 4)
    return _mm256_set_m128(_mm_set1_ps(sdx[1]), _mm_set1_ps(sdx[0]));
  else
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sdx)),
                                    _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
}

/// q8 without VNNI computes Σ(q − 128)·x: the zero point is then z − 128.
template <unsigned Bits, bool Vnni>
constexpr float zero_shift = Bits == 8 && !Vnni ? 128.f : 0.f;

/// s·dx of eight chunks from chunk k into out[0..8), and their zero-point terms
/// s·(z − shift)·dx·Σxq added to `zt`; the f16 scales (zero points) of chunk k's group at
/// `scales` (`zeros`, affine only), groups of 2^shift chunks.
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2 inline void chunk_scales8(const std::byte* scales, const std::byte* zeros,
                                             const RowLayout& l, const Int8Activation& a,
                                             std::size_t k, int shift, __m256i lane_group,
                                             float* out, __m256& zt) noexcept {
  const __m256 s = chunk_values(scales, shift, lane_group);
  const __m256 z = l.affine ? _mm256_sub_ps(chunk_values(zeros, shift, lane_group),
                                            _mm256_set1_ps(zero_shift<Bits, Vnni>))
                            : _mm256_set1_ps(l.symmetric_zero - zero_shift<Bits, Vnni>);
  _mm256_storeu_ps(out, _mm256_mul_ps(s, _mm256_loadu_ps(a.dx + k)));
  zt = _mm256_fmadd_ps(_mm256_mul_ps(s, z), _mm256_loadu_ps(a.dx_sum + k), zt);
}

/// A row's running sums: the two chains of block products (scaled by s·dx) and the zero-point
/// terms. A row read in pieces (panels) carries them from piece to piece.
struct RowSums {
  __m256 acc0, acc1, zt;
};

/// One block of a row, codes at `p`, activation from block_activation, its chunks' s·dx at
/// `sdx`, into the two chains (half 0 into acc0, half 1 into acc1).
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline void block_into(const std::byte* p, const __m256i* act,
                                               const float* sdx, RowSums& st) noexcept {
  constexpr std::size_t per_block = block_chunks(Bits);
  const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
  st.acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(half_dot<Bits, Vnni>(v0, act)),
                            half_scales<Bits>(sdx), st.acc0);
  st.acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(half_dot<Bits, Vnni>(v1, act + 8 / Bits)),
                            half_scales<Bits>(sdx + per_block / 2), st.acc1);
}

/// Whether rows of `Bits`-bit codes go eight chunks at a time (chunk_sums8) or block by block
/// (block_into). q2: block by block, which measured faster on its rows (a block is eight chunks
/// there, and the reduction cost what it saved); q8 and q4: eight at a time, faster on rows and
/// panels (bench/RESULTS.md, "The AVX2 paths").
template <unsigned Bits>
constexpr bool grouped = Bits != 2;

/// Unpack-and-add steps of chunk_sums8, per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3) and, read
/// as 64-bit halves, (a0+a2, a1+a3, b0+b2, b1+b3).
MOEKIT_TARGET_AVX2 inline __m256i add_pairs(__m256i a, __m256i b) noexcept {
  return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
MOEKIT_TARGET_AVX2 inline __m256i add_halves(__m256i a, __m256i b) noexcept {
  return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

/// The activation of eight chunks from the one at `xq` (a whole number of blocks: the Bits halves'
/// planes, 8 registers whatever the width).
template <unsigned Bits>
MOEKIT_TARGET_AVX2 inline void group_activation(const std::int8_t* xq, __m256i* act) noexcept {
  for (unsigned b = 0; b < Bits / 2; ++b)
    block_activation<Bits>(xq + 32 * block_chunks(Bits) * b, act + b * 2 * (8 / Bits));
}

/// Σ code·xq of each of the eight chunks whose codes start at `p` (activation from
/// group_activation), one int32 per lane in chunk order: the Bits half-block products reduced
/// within each chunk, so one conversion and one FMA with the chunks' s·dx cover eight chunks
/// (as the AVX-512 kernel's chunk_sums16; per half block they were a conversion, a broadcast of
/// its scales and an FMA).
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline __m256i chunk_sums8(const std::byte* p,
                                                   const __m256i* act) noexcept {
  constexpr unsigned planes = 8 / Bits;
  __m256i d[Bits];
  for (unsigned h = 0; h < Bits; ++h)
    d[h] = half_dot<Bits, Vnni>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h)),
                                act + h * planes);
  if constexpr (Bits == 8) {  // half h: chunk h in all lanes
    const __m256i u = add_halves(add_pairs(d[0], d[1]), add_pairs(d[2], d[3]));
    const __m256i w = add_halves(add_pairs(d[4], d[5]), add_pairs(d[6], d[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(u, w, 0x20),
                            _mm256_permute2x128_si256(u, w, 0x31));
  } else if constexpr (Bits == 4) {  // half h: chunk 2h in lanes 0-3, 2h+1 in 4-7
    const __m256i s =
        add_halves(add_pairs(d[0], d[1]), add_pairs(d[2], d[3]));  // 0 2 4 6 | 1 3 5 7
    return _mm256_permutevar8x32_epi32(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  } else {  // half h: chunk 4h + L/2 in lane L
    const __m256 f0 = _mm256_castsi256_ps(d[0]), f1 = _mm256_castsi256_ps(d[1]);
    const __m256i s = _mm256_add_epi32(  // 0 1 4 5 | 2 3 6 7
        _mm256_castps_si256(_mm256_shuffle_ps(f0, f1, _MM_SHUFFLE(2, 0, 2, 0))),
        _mm256_castps_si256(_mm256_shuffle_ps(f0, f1, _MM_SHUFFLE(3, 1, 3, 1))));
    return _mm256_permutevar8x32_epi32(s, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
  }
}

/// One quantized row · x with int8 activations (row_dot), from the sums `st` of the columns
/// before it (a panel's tail: the activation `a` from the row's first column on). `sdx`:
/// per-thread scratch of >= cols/32 floats. The kernels without VNNI contain no VNNI instruction
/// (checked in the disassembly of the tests when this was written: GCC emits `vpdpbusd` only for
/// the intrinsic).
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline float row_dot_from(const std::byte* row, const RowLayout& l,
                                                  const Int8Activation& a, float* sdx,
                                                  RowSums st) noexcept {
  constexpr std::size_t per_block = block_chunks(Bits), chunk_bytes = 4 * Bits;
  constexpr float zero_shift = avx2_int8::zero_shift<Bits, Vnni>;
  const std::size_t chunks = l.cols / 32, blocked = chunks / per_block * per_block;
  const std::size_t per_group = l.group_size / 32;  // 0: one group per row
  // Per chunk s·dx into sdx, and the zero-point term Σ s·(z − shift)·dx·Σxq: eight chunks a step
  // for groups of 32/64/128 (a scalar pass cost more than the codes of a 4096-column row).
  std::size_t k = 0;
  __m256 zt = st.zt;
  if (per_group == 1 || per_group == 2 || per_group == 4) {
    const int shift = per_group == 1 ? 0 : per_group == 2 ? 1 : 2;
    const __m256i lane_group = _mm256_srli_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), shift);
    for (; k + 8 <= chunks; k += 8) {
      const std::size_t at = 2 * (k >> shift);
      chunk_scales8<Bits, Vnni>(row + l.scales_offset + at, row + l.zeros_offset + at, l, a, k,
                                shift, lane_group, sdx + k, zt);
    }
  }
  float zero_term = hsum(zt);
  for (; k < chunks; ++k) {  // the rest, and one group per row
    const std::size_t g = per_group ? k / per_group : 0;
    const float s = group_scale(row, l, g), z = group_zero(row, l, g) - zero_shift;
    sdx[k] = s * a.dx[k];
    zero_term += s * z * a.dx_sum[k];
  }
  // The rows are read one after another: the stream is prefetched into L1 prefetch_bytes ahead
  // of the share of the row consumed so far, codes and scales alike, on into the next rows (the
  // address is formed as an integer: it may pass the end of the matrix, where a prefetch does
  // not fault). Without it, rows of 14336 columns ran at half the speed of rows of 4096 here.
  const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(row) + prefetch_bytes;
  std::size_t fetched = 0;
  std::size_t c = 0;
  for (; grouped<Bits> && c + 8 <= blocked; c += 8) {  // eight chunks: acc0 and acc1 in turn
    for (const std::size_t to = (c + 8) * l.bytes / chunks; fetched < to; fetched += 64)
      _mm_prefetch(reinterpret_cast<const char*>(base + fetched), _MM_HINT_T0);
    __m256i act[8];
    group_activation<Bits>(a.xq + 32 * c, act);
    __m256& acc = c / 8 % 2 ? st.acc1 : st.acc0;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(chunk_sums8<Bits, Vnni>(row + c * chunk_bytes, act)),
                          _mm256_loadu_ps(sdx + c), acc);
  }
  for (; c < blocked; c += per_block) {  // a block: two halves, each its own chain
    for (const std::size_t to = (c + per_block) * l.bytes / chunks; fetched < to; fetched += 64)
      _mm_prefetch(reinterpret_cast<const char*>(base + fetched), _MM_HINT_T0);
    __m256i act[2 * 8 / Bits];
    block_activation<Bits>(a.xq + 32 * c, act);
    block_into<Bits, Vnni>(row + c * chunk_bytes, act, sdx + c, st);
  }
  float total = hsum(_mm256_add_ps(st.acc0, st.acc1));
  for (; c < chunks;
       ++c) {  // chunks after the last whole block: codes and activation in chunk order
    const __m256i d =
        codes_dot<Bits, Vnni>(codes32<Bits>(row + c * chunk_bytes),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + 32 * c)));
    total += sdx[c] * hsum(_mm256_cvtepi32_ps(d));
  }
  float tail = 0.f;  // columns after the last whole chunk, in floats
  for (std::size_t col = chunks * 32; col < l.cols; ++col) {
    const std::size_t g = col / l.group_size;
    tail += group_scale(row, l, g) *
            (static_cast<float>(read_code(row, col, Bits)) - group_zero(row, l, g)) * a.x[col];
  }
  return total - zero_term + tail;
}

/// One quantized row · x with int8 activations. `sdx`: per-thread scratch of >= cols/32 floats.
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline float row_dot(const std::byte* row, const RowLayout& l,
                                             const Int8Activation& a, float* sdx) noexcept {
  const __m256 z = _mm256_setzero_ps();
  return row_dot_from<Bits, Vnni>(row, l, a, sdx, {z, z, z});
}

/// The four rows of one 512-column step of a panel (at `step`, laid out as `l` says) into their
/// sums; `c`: the step's first chunk. The rows share each load of the activation (AVX2 has no
/// spare load bandwidth: the q4 kernel is compute-bound at one thread). Per row the same
/// operations in the same order as row_dot's on those chunks, so a row read in panels gives
/// row_dot's result bit for bit.
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline void panel_step(const std::byte* step, const PanelLayout& l,
                                               const Int8Activation& a, std::size_t c,
                                               RowSums* st) noexcept {
  constexpr std::size_t H = PanelLayout::height, chunk_bytes = 4 * Bits;
  const int shift = l.row.group_size == 32 ? 0 : l.row.group_size == 64 ? 1 : 2;
  const __m256i lane_group = _mm256_srli_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), shift);
  const std::byte* values = step + H * l.code_bytes;
  const std::size_t half = 2 * (8u >> shift);  // bytes of the f16 values of eight chunks
  alignas(32) float sdx[H][16];                // per row: s·dx of the step's chunks
  for (std::size_t n = 0; n < H; ++n) {
    const std::byte* sc = values + n * l.value_bytes;
    const std::byte* zp = values + (H + n) * l.value_bytes;
    chunk_scales8<Bits, Vnni>(sc, zp, l.row, a, c, shift, lane_group, sdx[n], st[n].zt);
    chunk_scales8<Bits, Vnni>(sc + half, zp + half, l.row, a, c + 8, shift, lane_group, sdx[n] + 8,
                              st[n].zt);
  }
  if constexpr (!grouped<Bits>) {  // as row_dot_from: block by block, the four rows at once
    for (std::size_t b = 0; b < 16; b += block_chunks(Bits)) {
      __m256i act[2 * 8 / Bits];
      block_activation<Bits>(a.xq + 32 * (c + b), act);
      for (std::size_t n = 0; n < H; ++n)
        block_into<Bits, Vnni>(step + n * l.code_bytes + b * chunk_bytes, act, sdx[n] + b, st[n]);
    }
    return;
  }
  for (std::size_t g = 0; g < 16; g += 8) {  // as row_dot_from: eight chunks, the four rows at once
    __m256i act[8];
    group_activation<Bits>(a.xq + 32 * (c + g), act);
    for (std::size_t n = 0; n < H; ++n) {
      __m256& acc = g ? st[n].acc1 : st[n].acc0;
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(chunk_sums8<Bits, Vnni>(
                                step + n * l.code_bytes + g * chunk_bytes, act)),
                            _mm256_loadu_ps(sdx[n] + g), acc);
    }
  }
}

/// The panels of one group (`count` at `group`, laid out as `l` says: panels4 or
/// blocked_panels4) · x with int8 activations into out[0..4·count), read in the order they are
/// stored, as avx512_int8::panels_dots, and prefetched into L1 8 KiB ahead like the rows.
/// Bit-identical to row_dot on the same rows. `sdx`: scratch of >= cols/32 floats.
template <unsigned Bits, bool Vnni>
MOEKIT_TARGET_AVX2_VNNI inline void panels_dots(const std::byte* group, std::size_t count,
                                                const PanelLayout& l, const Int8Activation& a,
                                                float* sdx, float* out) noexcept {
  constexpr std::size_t H = PanelLayout::height;
  RowSums sums[PanelLayout::blocked_group][H];
  for (std::size_t k = 0; k < count; ++k)
    for (std::size_t n = 0; n < H; ++n)
      sums[k][n] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (std::size_t b = 0; b < l.blocks(); ++b) {
    const std::size_t s0 = b * l.block_steps, s1 = s0 + l.block_len(b);
    for (std::size_t k = 0; k < count; ++k) {
      const std::byte* step = group + l.step(k, s0, count);
      for (std::size_t s = s0; s < s1; ++s, step += l.step_bytes) {
        // On into the next panel, and past the matrix at its end: formed as an integer.
        const std::uintptr_t ahead = reinterpret_cast<std::uintptr_t>(step) + prefetch_bytes;
        for (std::size_t o = 0; o < l.step_bytes; o += 64)
          _mm_prefetch(reinterpret_cast<const char*>(ahead + o), _MM_HINT_T0);
        panel_step<Bits, Vnni>(step, l, a, 16 * s, sums[k]);
      }
    }
  }
  // The tails, each a row of its own from the sums of its steps.
  const std::size_t c0 = 16 * l.steps;
  const Int8Activation rest{a.xq + 32 * c0, a.dx + c0, a.dx_sum + c0, a.x + 32 * c0};
  for (std::size_t k = 0; k < count; ++k)
    for (std::size_t n = 0; n < H; ++n)
      out[H * k + n] =
          row_dot_from<Bits, Vnni>(group + l.tail_row(k, n, count), l.tail, rest, sdx, sums[k][n]);
}

}  // namespace moekit::detail::avx2_int8

#pragma GCC diagnostic pop

#endif
