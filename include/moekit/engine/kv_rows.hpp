#pragma once
/// \file The row kernels of attention over a KV cache of f32 or f16 rows (kv_cache.hpp): scores
/// q·k, the weighted sum Σ p·v, and the f32 → f16 conversion on write.
///
/// Every path sums in the order of ops.hpp's `dot` (16 interleaved partial sums, products rounded
/// to float before each add, no fused multiply-add) and adds p·v into the output in position
/// order, so an f32 cache gives the same bits on every CPU as the scalar loops did, and an f16
/// cache differs from it only by the rounding of the stored keys and values (each read widened
/// exactly). AVX2 + F16C where the CPU has them (detected at run time), portable C++ elsewhere.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "moekit/precision/half.hpp"
#include "moekit/precision/isa.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MOEKIT_KV_X86 1
// No "fma": a fused multiply-add would round differently from the scalar path.
#define MOEKIT_TARGET_KV_AVX2 __attribute__((target("avx2,f16c")))
#endif

namespace moekit::engine::kv_rows {

inline float widen(float x) noexcept { return x; }
inline float widen(moekit::Float16 x) noexcept { return moekit::half_bits_to_float(x.bits); }

/// q · k over n values, summed as ops.hpp's `dot`.
template <class T>
float dot_generic(const float* q, const T* k, std::size_t n) noexcept {
  float part[16] = {};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (std::size_t l = 0; l < 16; ++l) part[l] += q[i + l] * widen(k[i + l]);
  float s = 0.f;
  for (; i < n; ++i) s += q[i] * widen(k[i]);
  for (float p : part) s += p;
  return s;
}

#ifdef MOEKIT_KV_X86
MOEKIT_TARGET_KV_AVX2 inline __m256 load8(const float* p) noexcept { return _mm256_loadu_ps(p); }
MOEKIT_TARGET_KV_AVX2 inline __m256 load8(const moekit::Float16* p) noexcept {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <class T>
MOEKIT_TARGET_KV_AVX2 float dot_avx2(const float* q, const T* k, std::size_t n) noexcept {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();  // partial sums 0-7 and 8-15
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(q + i), load8(k + i)));
    hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(q + i + 8), load8(k + i + 8)));
  }
  alignas(32) float part[16];
  _mm256_store_ps(part, lo);
  _mm256_store_ps(part + 8, hi);
  float s = 0.f;
  for (; i < n; ++i) s += q[i] * widen(k[i]);
  for (float p : part) s += p;
  return s;
}

template <class T>
MOEKIT_TARGET_KV_AVX2 void scores_avx2(const float* q, std::uint32_t group, const T* k,
                                       std::size_t stride, std::size_t count, std::uint32_t d,
                                       float scale, float* s, std::size_t len) noexcept {
  for (std::size_t j = 0; j < count; ++j)
    for (std::uint32_t g = 0; g < group; ++g)
      s[g * len + j] = dot_avx2(q + std::size_t{g} * d, k + j * stride, d) * scale;
}

template <class T>
MOEKIT_TARGET_KV_AVX2 void accumulate_avx2(const float* p, std::size_t len, std::uint32_t group,
                                           const T* v, std::size_t stride, std::size_t count,
                                           std::uint32_t d, float* o) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    const T* vj = v + j * stride;
    for (std::uint32_t g = 0; g < group; ++g) {
      const __m256 pj = _mm256_set1_ps(p[g * len + j]);
      float* og = o + std::size_t{g} * d;
      std::uint32_t i = 0;
      for (; i + 8 <= d; i += 8)
        _mm256_storeu_ps(og + i,
                         _mm256_add_ps(_mm256_loadu_ps(og + i), _mm256_mul_ps(pj, load8(vj + i))));
      for (; i < d; ++i) og[i] += p[g * len + j] * widen(vj[i]);
    }
  }
}

MOEKIT_TARGET_KV_AVX2 inline void to_f16_avx2(const float* x, moekit::Float16* y,
                                              std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) y[i] = moekit::to_f16(x[i]);
}

MOEKIT_TARGET_KV_AVX2 inline void round_to_f16_avx2(float* x, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(
        x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
  for (; i < n; ++i) x[i] = moekit::to_float(moekit::to_f16(x[i]));
}
#endif

/// True when the AVX2 + F16C paths run on this CPU.
inline bool use_avx2() noexcept {
#ifdef MOEKIT_KV_X86
  return moekit::isa_supported(moekit::Isa::avx2);
#else
  return false;
#endif
}

/// s[g·len + j] = (q_g · k_j) · scale for the `count` rows k_j = k + j·stride and the `group`
/// query heads q_g = q + g·d.
template <class T>
void scores(const float* q, std::uint32_t group, const T* k, std::size_t stride, std::size_t count,
            std::uint32_t d, float scale, float* s, std::size_t len) noexcept {
#ifdef MOEKIT_KV_X86
  if (use_avx2()) return scores_avx2(q, group, k, stride, count, d, scale, s, len);
#endif
  for (std::size_t j = 0; j < count; ++j)
    for (std::uint32_t g = 0; g < group; ++g)
      s[g * len + j] = dot_generic(q + std::size_t{g} * d, k + j * stride, d) * scale;
}

/// o_g += Σ_j p[g·len + j] · v_j over the `count` rows v_j = v + j·stride, in order of j, for the
/// `group` outputs o_g = o + g·d.
template <class T>
void accumulate(const float* p, std::size_t len, std::uint32_t group, const T* v,
                std::size_t stride, std::size_t count, std::uint32_t d, float* o) noexcept {
#ifdef MOEKIT_KV_X86
  if (use_avx2()) return accumulate_avx2(p, len, group, v, stride, count, d, o);
#endif
  for (std::size_t j = 0; j < count; ++j)
    for (std::uint32_t g = 0; g < group; ++g) {
      const float pj = p[g * len + j];
      float* og = o + std::size_t{g} * d;
      for (std::uint32_t i = 0; i < d; ++i) og[i] += pj * widen(v[j * stride + i]);
    }
}

/// y = x rounded to f16 (nearest even), n values.
inline void to_f16(const float* x, moekit::Float16* y, std::size_t n) noexcept {
#ifdef MOEKIT_KV_X86
  if (use_avx2()) return to_f16_avx2(x, y, n);
#endif
  for (std::size_t i = 0; i < n; ++i) y[i] = moekit::to_f16(x[i]);
}

/// x = x rounded to f16 and widened back (what an f16 cache returns for it), n values.
inline void round_to_f16(float* x, std::size_t n) noexcept {
#ifdef MOEKIT_KV_X86
  if (use_avx2()) return round_to_f16_avx2(x, n);
#endif
  for (std::size_t i = 0; i < n; ++i) x[i] = moekit::to_float(moekit::to_f16(x[i]));
}

}  // namespace moekit::engine::kv_rows
