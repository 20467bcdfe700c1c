#pragma once
/// \file AVX-512 row kernels: one stored row · prepared activation (GEMV), and one stored row
/// dequantized into floats in decode order (GEMM). Compiled with function target attributes, so
/// the header needs no global -m flags; callers check the CPU first (see isa.hpp).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/core/precision.hpp"
#include "moekit/precision/detail/prepared_activation.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/quantize.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MOEKIT_HAS_X86_KERNELS 1
#define MOEKIT_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

// GCC 12 warns about the deliberately undefined pass-through operand inside its own AVX-512
// intrinsics (_mm512_undefined_*) once they are inlined here; the warning is a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moekit::detail::avx512 {

/// 32 codes of one chunk, multiplied with the 32 prepared activations, added to a0/a1.
template <unsigned Bits>
MOEKIT_TARGET_AVX512 inline void chunk_fma(const std::byte* p, const float* xp, __m512& a0,
                                           __m512& a1) noexcept {
  if constexpr (Bits == 8) {
    const __m512i q0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i q1 =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q0), _mm512_loadu_ps(xp), a0);
    a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q1), _mm512_loadu_ps(xp + 16), a1);
  } else if constexpr (Bits == 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(v, m);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), _mm512_loadu_ps(xp), a0);
    a1 =
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), _mm512_loadu_ps(xp + 16), a1);
  } else {
    static_assert(Bits == 2);
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(0x03);
    const __m128i p01 = _mm_and_si128(_mm_unpacklo_epi64(b, _mm_srli_epi16(b, 2)), m);
    const __m128i p23 =
        _mm_and_si128(_mm_unpacklo_epi64(_mm_srli_epi16(b, 4), _mm_srli_epi16(b, 6)), m);
    a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(p01)), _mm512_loadu_ps(xp), a0);
    a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(p23)), _mm512_loadu_ps(xp + 16),
                         a1);
  }
}

MOEKIT_TARGET_AVX512 inline float half_to_float(const std::byte* p) noexcept {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

/// Quantized row · x. Groups are whole chunks (group sizes are multiples of 32, or the row);
/// the columns after the last whole chunk are done one by one.
template <unsigned Bits>
MOEKIT_TARGET_AVX512 inline float quant_row_dot(const std::byte* row, const RowLayout& l,
                                                const PreparedActivation& a) noexcept {
  constexpr std::size_t chunk_bytes = 4 * Bits;
  const std::size_t full = l.cols / 32;
  const std::size_t per_group = l.group_size / 32;
  __m512 total = _mm512_setzero_ps();
  float zero_term = 0.f, tail = 0.f;
  for (std::size_t g = 0; g < l.groups; ++g) {
    const float s = half_to_float(row + l.scales_offset + 2 * g);
    const float z = l.affine ? half_to_float(row + l.zeros_offset + 2 * g) : l.symmetric_zero;
    const std::size_t c0 = g * per_group;
    const std::size_t c1 = c0 + per_group < full ? c0 + per_group : full;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (std::size_t c = c0; c < c1; ++c)
      chunk_fma<Bits>(row + c * chunk_bytes, a.xp + 32 * c, a0, a1);
    total = _mm512_fmadd_ps(_mm512_set1_ps(s), _mm512_add_ps(a0, a1), total);
    zero_term += s * z * a.group_sums[g];
  }
  for (std::size_t c = full * 32; c < l.cols; ++c) {
    const std::size_t g = c / l.group_size;
    tail += half_to_float(row + l.scales_offset + 2 * g) *
            static_cast<float>(read_code(row, c, Bits)) * a.x[c];
  }
  return _mm512_reduce_add_ps(total) + tail - zero_term;
}

/// Loads 16 weights of a float-format row as floats.
template <Precision P>
MOEKIT_TARGET_AVX512 inline __m512 load16(const std::byte* p) noexcept {
  if constexpr (P == Precision::f32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (P == Precision::f16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    static_assert(P == Precision::bf16);
    const __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}

/// Prefetches bytes [lo, hi) of each of N rows into L2, a cache line at a time.
template <std::size_t N>
inline void prefetch_rows_l2(const std::byte* const* rows, std::size_t lo,
                             std::size_t hi) noexcept {
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t o = lo; o < hi; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(rows[n] + o), _MM_HINT_T1);
}

/// N float-format rows · x into out[0..N), each row with four independent accumulators. The rows
/// share every activation load (x of 14336 floats is 56 KiB, more than L1: each pass over it
/// comes from L2), and each row's sums are the ones float_row_dot makes, in the same order, so
/// the result does not depend on N. `next` (optional): for each row, a row further down its
/// stream, prefetched into L2 in step with this call's progress through its own row.
template <Precision P, std::size_t N>
MOEKIT_TARGET_AVX512 inline void float_row_dots(const std::byte* const* rows, std::size_t cols,
                                                const float* x, float* out,
                                                const std::byte* const* next) noexcept {
  constexpr std::size_t eb = moekit::bits(P) / 8;
  __m512 a[N][4];
  for (std::size_t n = 0; n < N; ++n)
    for (auto& v : a[n]) v = _mm512_setzero_ps();
  std::size_t c = 0;
  for (; c + 64 <= cols; c += 64) {
    if (next) prefetch_rows_l2<N>(next, eb * c, eb * (c + 64));
    const __m512 x0 = _mm512_loadu_ps(x + c), x1 = _mm512_loadu_ps(x + c + 16),
                 x2 = _mm512_loadu_ps(x + c + 32), x3 = _mm512_loadu_ps(x + c + 48);
    for (std::size_t n = 0; n < N; ++n) {
      const std::byte* r = rows[n] + eb * c;
      a[n][0] = _mm512_fmadd_ps(load16<P>(r), x0, a[n][0]);
      a[n][1] = _mm512_fmadd_ps(load16<P>(r + eb * 16), x1, a[n][1]);
      a[n][2] = _mm512_fmadd_ps(load16<P>(r + eb * 32), x2, a[n][2]);
      a[n][3] = _mm512_fmadd_ps(load16<P>(r + eb * 48), x3, a[n][3]);
    }
  }
  if (next) prefetch_rows_l2<N>(next, eb * c, eb * cols);
  const RowLayout l = RowLayout::of(cols, P, {});
  for (std::size_t n = 0; n < N; ++n) {
    std::size_t k = c;
    for (; k + 16 <= cols; k += 16)
      a[n][0] = _mm512_fmadd_ps(load16<P>(rows[n] + eb * k), _mm512_loadu_ps(x + k), a[n][0]);
    float tail = 0.f;
    for (; k < cols; ++k) tail += weight_at(rows[n], l, P, k) * x[k];
    out[n] = _mm512_reduce_add_ps(
                 _mm512_add_ps(_mm512_add_ps(a[n][0], a[n][1]), _mm512_add_ps(a[n][2], a[n][3]))) +
             tail;
  }
}

/// Float-format row · x (float_row_dots of one row).
template <Precision P>
MOEKIT_TARGET_AVX512 inline float float_row_dot(const std::byte* row, std::size_t cols,
                                                const float* x) noexcept {
  float out;
  float_row_dots<P, 1>(&row, cols, x, &out, nullptr);
  return out;
}

/// Dequantizes a quantized row into `out[0..cols)` in decode order (chunks permuted as
/// `chunk_slot` says, the tail in column order).
template <unsigned Bits>
MOEKIT_TARGET_AVX512 inline void dequant_row(const std::byte* row, const RowLayout& l,
                                             float* out) noexcept {
  constexpr std::size_t chunk_bytes = 4 * Bits;
  const std::size_t full = l.cols / 32;
  const std::size_t per_group = l.group_size / 32;
  const __m512i m4 = _mm512_set1_epi32(0x0f), m2 = _mm512_set1_epi32(0x03);
  for (std::size_t g = 0; g < l.groups; ++g) {
    const float sf = half_to_float(row + l.scales_offset + 2 * g);
    const __m512 s = _mm512_set1_ps(sf);
    const __m512 sz = _mm512_set1_ps(
        sf * (l.affine ? half_to_float(row + l.zeros_offset + 2 * g) : l.symmetric_zero));
    const std::size_t c0 = g * per_group;
    const std::size_t c1 = c0 + per_group < full ? c0 + per_group : full;
    for (std::size_t c = c0; c < c1; ++c) {
      const std::byte* p = row + c * chunk_bytes;
      __m512i q0, q1;
      if constexpr (Bits == 8) {
        q0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        q1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
      } else if constexpr (Bits == 4) {
        const __m512i v =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        q0 = _mm512_and_si512(v, m4);
        q1 = _mm512_srli_epi32(v, 4);
      } else {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
        const __m512i v = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(b, b));  // bytes 0..7 twice
        q0 = _mm512_and_si512(
            _mm512_srlv_epi32(v, _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0)),
            m2);
        q1 = _mm512_and_si512(
            _mm512_srlv_epi32(v, _mm512_set_epi32(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4)),
            m2);
      }
      _mm512_storeu_ps(out + 32 * c, _mm512_fmsub_ps(_mm512_cvtepi32_ps(q0), s, sz));
      _mm512_storeu_ps(out + 32 * c + 16, _mm512_fmsub_ps(_mm512_cvtepi32_ps(q1), s, sz));
    }
  }
  constexpr Precision P = Bits == 8 ? Precision::q8 : Bits == 4 ? Precision::q4 : Precision::q2;
  for (std::size_t c = full * 32; c < l.cols; ++c) out[c] = weight_at(row, l, P, c);
}

/// Float-format row (f16/bf16) converted to floats.
template <Precision P>
MOEKIT_TARGET_AVX512 inline void convert_row(const std::byte* row, std::size_t cols,
                                             float* out) noexcept {
  constexpr std::size_t eb = moekit::bits(P) / 8;
  std::size_t c = 0;
  for (; c + 16 <= cols; c += 16) _mm512_storeu_ps(out + c, load16<P>(row + eb * c));
  const RowLayout l = RowLayout::of(cols, P, {});
  for (; c < cols; ++c) out[c] = weight_at(row, l, P, c);
}

/// y[b] = w · x[b] for the `n` activations `xs[b]` (all `cols` long), tiles of four activations
/// sharing each weight load.
MOEKIT_TARGET_AVX512 inline void multi_dot(const float* w, std::size_t cols, const float* const* xs,
                                           std::size_t n, float* y) noexcept {
  std::size_t b = 0;
  for (; b + 4 <= n; b += 4) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    std::size_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      const __m512 v = _mm512_loadu_ps(w + c);
      a0 = _mm512_fmadd_ps(v, _mm512_loadu_ps(xs[b] + c), a0);
      a1 = _mm512_fmadd_ps(v, _mm512_loadu_ps(xs[b + 1] + c), a1);
      a2 = _mm512_fmadd_ps(v, _mm512_loadu_ps(xs[b + 2] + c), a2);
      a3 = _mm512_fmadd_ps(v, _mm512_loadu_ps(xs[b + 3] + c), a3);
    }
    float t0 = 0, t1 = 0, t2 = 0, t3 = 0;
    for (; c < cols; ++c) {
      t0 += w[c] * xs[b][c], t1 += w[c] * xs[b + 1][c];
      t2 += w[c] * xs[b + 2][c], t3 += w[c] * xs[b + 3][c];
    }
    y[b] = _mm512_reduce_add_ps(a0) + t0;
    y[b + 1] = _mm512_reduce_add_ps(a1) + t1;
    y[b + 2] = _mm512_reduce_add_ps(a2) + t2;
    y[b + 3] = _mm512_reduce_add_ps(a3) + t3;
  }
  for (; b < n; ++b) {
    __m512 a0 = _mm512_setzero_ps();
    std::size_t c = 0;
    for (; c + 16 <= cols; c += 16)
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + c), _mm512_loadu_ps(xs[b] + c), a0);
    float t = 0;
    for (; c < cols; ++c) t += w[c] * xs[b][c];
    y[b] = _mm512_reduce_add_ps(a0) + t;
  }
}

}  // namespace moekit::detail::avx512

#pragma GCC diagnostic pop

#endif
