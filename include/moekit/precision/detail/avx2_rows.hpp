#pragma once
/// \file AVX2 row kernels, the same contract as avx512_rows.hpp with 8-lane vectors: one stored
/// row · prepared activation (GEMV) and one row dequantized in decode order (GEMM).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/core/precision.hpp"
#include "moekit/precision/detail/prepared_activation.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/quantize.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MOEKIT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

// GCC 12 warns about the deliberately undefined pass-through operand inside its own AVX-512
// intrinsics (_mm512_undefined_*) once they are inlined here; the warning is a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moekit::detail::avx2 {

MOEKIT_TARGET_AVX2 inline __m256 cvt8(__m128i bytes) noexcept {  // low 8 bytes → 8 floats
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

MOEKIT_TARGET_AVX2 inline float hsum(__m256 v) noexcept {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/// The 32 codes of one chunk as four 8-lane float vectors, in decode order.
template <unsigned Bits>
MOEKIT_TARGET_AVX2 inline void chunk_codes(const std::byte* p, __m256 q[4]) noexcept {
  if constexpr (Bits == 8) {
    const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
    q[0] = cvt8(v0), q[1] = cvt8(_mm_srli_si128(v0, 8));
    q[2] = cvt8(v1), q[3] = cvt8(_mm_srli_si128(v1, 8));
  } else if constexpr (Bits == 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    q[0] = cvt8(lo), q[1] = cvt8(_mm_srli_si128(lo, 8));
    q[2] = cvt8(hi), q[3] = cvt8(_mm_srli_si128(hi, 8));
  } else {
    static_assert(Bits == 2);
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(0x03);
    q[0] = cvt8(_mm_and_si128(b, m));
    q[1] = cvt8(_mm_and_si128(_mm_srli_epi16(b, 2), m));
    q[2] = cvt8(_mm_and_si128(_mm_srli_epi16(b, 4), m));
    q[3] = cvt8(_mm_and_si128(_mm_srli_epi16(b, 6), m));
  }
}

MOEKIT_TARGET_AVX2 inline float half_to_float(const std::byte* p) noexcept {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

/// Quantized row · x (see avx512::quant_row_dot).
template <unsigned Bits>
MOEKIT_TARGET_AVX2 inline float quant_row_dot(const std::byte* row, const RowLayout& l,
                                              const PreparedActivation& a) noexcept {
  constexpr std::size_t chunk_bytes = 4 * Bits;
  const std::size_t full = l.cols / 32;
  const std::size_t per_group = l.group_size / 32;
  __m256 total = _mm256_setzero_ps();
  float zero_term = 0.f, tail = 0.f;
  for (std::size_t g = 0; g < l.groups; ++g) {
    const float s = half_to_float(row + l.scales_offset + 2 * g);
    const float z = l.affine ? half_to_float(row + l.zeros_offset + 2 * g) : l.symmetric_zero;
    const std::size_t c0 = g * per_group;
    const std::size_t c1 = c0 + per_group < full ? c0 + per_group : full;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (std::size_t c = c0; c < c1; ++c) {
      __m256 q[4];
      chunk_codes<Bits>(row + c * chunk_bytes, q);
      const float* xp = a.xp + 32 * c;
      a0 = _mm256_fmadd_ps(q[0], _mm256_loadu_ps(xp), a0);
      a1 = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xp + 8), a1);
      a0 = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xp + 16), a0);
      a1 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xp + 24), a1);
    }
    total = _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_add_ps(a0, a1), total);
    zero_term += s * z * a.group_sums[g];
  }
  for (std::size_t c = full * 32; c < l.cols; ++c) {
    const std::size_t g = c / l.group_size;
    tail += half_to_float(row + l.scales_offset + 2 * g) *
            static_cast<float>(read_code(row, c, Bits)) * a.x[c];
  }
  return hsum(total) + tail - zero_term;
}

/// Loads 8 weights of a float-format row as floats.
template <Precision P>
MOEKIT_TARGET_AVX2 inline __m256 load8(const std::byte* p) noexcept {
  if constexpr (P == Precision::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (P == Precision::f16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    static_assert(P == Precision::bf16);
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
}

/// N float-format rows · x into out[0..N), each with float_row_dot's four accumulators and
/// order (the result does not depend on N), sharing the activation loads; `next` (optional): a
/// row further down each row's stream, prefetched into L2 as this call reads its own rows.
template <Precision P, std::size_t N>
MOEKIT_TARGET_AVX2 inline void float_row_dots(const std::byte* const* rows, std::size_t cols,
                                              const float* x, float* out,
                                              const std::byte* const* next) noexcept {
  constexpr std::size_t eb = moekit::bits(P) / 8;
  __m256 a[N][4];
  for (std::size_t n = 0; n < N; ++n)
    for (auto& v : a[n]) v = _mm256_setzero_ps();
  std::size_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    if (next)
      for (std::size_t n = 0; n < N; ++n)
        for (std::size_t o = eb * c; o < eb * (c + 32); o += 64)
          _mm_prefetch(reinterpret_cast<const char*>(next[n] + o), _MM_HINT_T1);
    const __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8),
                 x2 = _mm256_loadu_ps(x + c + 16), x3 = _mm256_loadu_ps(x + c + 24);
    for (std::size_t n = 0; n < N; ++n) {
      const std::byte* r = rows[n] + eb * c;
      a[n][0] = _mm256_fmadd_ps(load8<P>(r), x0, a[n][0]);
      a[n][1] = _mm256_fmadd_ps(load8<P>(r + eb * 8), x1, a[n][1]);
      a[n][2] = _mm256_fmadd_ps(load8<P>(r + eb * 16), x2, a[n][2]);
      a[n][3] = _mm256_fmadd_ps(load8<P>(r + eb * 24), x3, a[n][3]);
    }
  }
  const RowLayout l = RowLayout::of(cols, P, {});
  for (std::size_t n = 0; n < N; ++n) {
    std::size_t k = c;
    for (; k + 8 <= cols; k += 8)
      a[n][0] = _mm256_fmadd_ps(load8<P>(rows[n] + eb * k), _mm256_loadu_ps(x + k), a[n][0]);
    float tail = 0.f;
    for (; k < cols; ++k) tail += weight_at(rows[n], l, P, k) * x[k];
    out[n] = hsum(_mm256_add_ps(_mm256_add_ps(a[n][0], a[n][1]), _mm256_add_ps(a[n][2], a[n][3]))) +
             tail;
  }
}

/// Float-format row · x (float_row_dots of one row).
template <Precision P>
MOEKIT_TARGET_AVX2 inline float float_row_dot(const std::byte* row, std::size_t cols,
                                              const float* x) noexcept {
  float out;
  float_row_dots<P, 1>(&row, cols, x, &out, nullptr);
  return out;
}

/// Quantized row dequantized into `out` in decode order.
template <unsigned Bits>
MOEKIT_TARGET_AVX2 inline void dequant_row(const std::byte* row, const RowLayout& l,
                                           float* out) noexcept {
  constexpr std::size_t chunk_bytes = 4 * Bits;
  constexpr Precision P = Bits == 8 ? Precision::q8 : Bits == 4 ? Precision::q4 : Precision::q2;
  const std::size_t full = l.cols / 32;
  const std::size_t per_group = l.group_size / 32;
  for (std::size_t g = 0; g < l.groups; ++g) {
    const float sf = half_to_float(row + l.scales_offset + 2 * g);
    const __m256 s = _mm256_set1_ps(sf);
    const __m256 sz = _mm256_set1_ps(
        sf * (l.affine ? half_to_float(row + l.zeros_offset + 2 * g) : l.symmetric_zero));
    const std::size_t c0 = g * per_group;
    const std::size_t c1 = c0 + per_group < full ? c0 + per_group : full;
    for (std::size_t c = c0; c < c1; ++c) {
      __m256 q[4];
      chunk_codes<Bits>(row + c * chunk_bytes, q);
      for (int k = 0; k < 4; ++k)
        _mm256_storeu_ps(out + 32 * c + 8 * k, _mm256_fmsub_ps(q[k], s, sz));
    }
  }
  for (std::size_t c = full * 32; c < l.cols; ++c) out[c] = weight_at(row, l, P, c);
}

/// Float-format row (f16/bf16) converted to floats.
template <Precision P>
MOEKIT_TARGET_AVX2 inline void convert_row(const std::byte* row, std::size_t cols,
                                           float* out) noexcept {
  constexpr std::size_t eb = moekit::bits(P) / 8;
  std::size_t c = 0;
  for (; c + 8 <= cols; c += 8) _mm256_storeu_ps(out + c, load8<P>(row + eb * c));
  const RowLayout l = RowLayout::of(cols, P, {});
  for (; c < cols; ++c) out[c] = weight_at(row, l, P, c);
}

/// y[b] = w · xs[b] for b < n, four activations per pass over w.
MOEKIT_TARGET_AVX2 inline void multi_dot(const float* w, std::size_t cols, const float* const* xs,
                                         std::size_t n, float* y) noexcept {
  std::size_t b = 0;
  for (; b + 4 <= n; b += 4) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    std::size_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      const __m256 v = _mm256_loadu_ps(w + c);
      a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(xs[b] + c), a0);
      a1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(xs[b + 1] + c), a1);
      a2 = _mm256_fmadd_ps(v, _mm256_loadu_ps(xs[b + 2] + c), a2);
      a3 = _mm256_fmadd_ps(v, _mm256_loadu_ps(xs[b + 3] + c), a3);
    }
    float t0 = 0, t1 = 0, t2 = 0, t3 = 0;
    for (; c < cols; ++c) {
      t0 += w[c] * xs[b][c], t1 += w[c] * xs[b + 1][c];
      t2 += w[c] * xs[b + 2][c], t3 += w[c] * xs[b + 3][c];
    }
    y[b] = hsum(a0) + t0, y[b + 1] = hsum(a1) + t1, y[b + 2] = hsum(a2) + t2,
    y[b + 3] = hsum(a3) + t3;
  }
  for (; b < n; ++b) {
    __m256 a0 = _mm256_setzero_ps();
    std::size_t c = 0;
    for (; c + 8 <= cols; c += 8)
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(xs[b] + c), a0);
    float t = 0;
    for (; c < cols; ++c) t += w[c] * xs[b][c];
    y[b] = hsum(a0) + t;
  }
}

}  // namespace moekit::detail::avx2

#pragma GCC diagnostic pop

#endif
