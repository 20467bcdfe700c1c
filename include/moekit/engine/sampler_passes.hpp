#pragma once
/// \file The sampler's passes over the whole vocabulary (sampler.hpp): checking the logits and
/// finding the largest, softmax weights with a fast exp and their sum (collecting the logits above
/// a floor on the way), and collecting the logits above a floor. Each pass has an AVX-512, an AVX2
/// and a portable version, chosen at run time (isa.hpp); the SIMD ones are compiled with function
/// target attributes, so the header needs no global -m flags. The versions agree exactly except for
/// the fast exp, which each computes to within `sampler_exp_approx_error` (the sampler's margins
/// allow for any of them).

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "moekit/precision/isa.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MOEKIT_SAMPLER_X86 1
#define MOEKIT_SAMPLER_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define MOEKIT_SAMPLER_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace moekit::engine {

namespace detail {
inline constexpr std::size_t kGroup = 256;  ///< logits per group of `scan`
inline constexpr std::size_t kLanes = 16;   ///< lanes per group (each lane a disjoint set)
}  // namespace detail

/// Bound on |exp_approx(x) - e^x| / e^x for x in [-87, 0], every version (the tests measure it).
inline constexpr double sampler_exp_approx_error = 0x1p-22;
/// Bound on the relative error of the total of `exp_weights` beyond its double sums: the AVX-512
/// version adds four vectors of weights in float, in a tree, before converting (two roundings of
/// at most 2^-24 each).
inline constexpr double sampler_exp_sum_error = 0x1.0001p-23;

/// Sets of logits whose maxima `scan` reports (the size of its `lane_max`): lane j of each whole
/// group, then each tail logit.
inline std::size_t sampler_scan_lanes(std::size_t n) noexcept {
  return n / detail::kGroup * detail::kLanes + n % detail::kGroup;
}

/// What `scan` found: the order keys of the largest and smallest logit.
struct SamplerScan {
  std::int32_t max_key;
  std::int32_t min_key;
};

/// What `top` found: the largest logit (+0 for a zero), meaningful only when every logit is
/// finite (`finite`; a NaN or an infinity of either sign clears it).
struct SamplerTop {
  float top;
  bool finite;
};

/// What `exp_weights` found: the sum of all weights, and how many logits reached the floor.
struct SamplerExpSums {
  double total = 0;
  std::size_t collected = 0;
};

namespace detail {

/// An integer that orders as the logit does, -0 with +0; NaN lands above +inf or below -inf.
inline std::int32_t order_key(float v) noexcept {
  const auto b = std::bit_cast<std::int32_t>(v + 0.0f);  // + 0.0f turns -0 into +0
  return b ^ ((b >> 31) & 0x7fffffff);
}
inline float from_key(std::int32_t k) noexcept {
  return std::bit_cast<float>(k ^ ((k >> 31) & 0x7fffffff));
}

/// e^x for x <= 0 (x >= -87; smaller x give e^-87): Cephes' expf polynomial, no table.
inline float exp_approx(float x) noexcept {
  // Clamped in integers (for x <= 0 a larger pattern is a larger magnitude): a float compare
  // here keeps GCC from vectorizing the loops that call this.
  x = std::bit_cast<float>(
      std::min(std::bit_cast<std::uint32_t>(x), std::bit_cast<std::uint32_t>(-87.0f)));
  const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;  // round(x log2 e)
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  return p * std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
}

namespace generic {

inline SamplerScan scan(const float* l, std::size_t n, std::int32_t* lane_max) noexcept {
  std::int32_t mx = std::numeric_limits<std::int32_t>::min();
  std::int32_t mn = std::numeric_limits<std::int32_t>::max();
  const std::size_t whole = n / kGroup * kGroup;
  std::int32_t low[kLanes];  // lane by lane, in locals, so that the compiler vectorizes
  std::fill(low, low + kLanes, mn);
  for (std::size_t g = 0; g < whole; g += kGroup) {
    std::int32_t high[kLanes];
    std::fill(high, high + kLanes, mx);
    for (std::size_t v = 0; v < kGroup; v += kLanes)
      for (std::size_t j = 0; j < kLanes; ++j) {
        const std::int32_t k = order_key(l[g + v + j]);
        high[j] = std::max(high[j], k);
        low[j] = std::min(low[j], k);
      }
    std::copy(high, high + kLanes, lane_max + g / kGroup * kLanes);
  }
  mn = *std::min_element(low, low + kLanes);
  std::int32_t* tail = lane_max + whole / kGroup * kLanes;
  for (std::size_t j = 0; j < n - whole; ++j) mn = std::min(mn, tail[j] = order_key(l[whole + j]));
  for (std::size_t j = 0; j < sampler_scan_lanes(n); ++j) mx = std::max(mx, lane_max[j]);
  return {mx, mn};
}

/// On order keys, as `scan`, without its lane maxima (the vector versions use float maxima):
/// every logit is finite when every key lies strictly between -inf's and +inf's.
inline SamplerTop top(const float* l, std::size_t n) noexcept {
  constexpr float inf = std::numeric_limits<float>::infinity();
  std::int32_t high[kLanes],
      low[kLanes];  // lane by lane, in locals, so that the compiler vectorizes
  std::fill(high, high + kLanes, std::numeric_limits<std::int32_t>::min());
  std::fill(low, low + kLanes, std::numeric_limits<std::int32_t>::max());
  const std::size_t whole = n / kGroup * kGroup;
  for (std::size_t g = 0; g < whole; g += kGroup)  // in groups, as scan: GCC vectorizes this form
    for (std::size_t v = 0; v < kGroup; v += kLanes)
      for (std::size_t j = 0; j < kLanes; ++j) {
        const std::int32_t k = order_key(l[g + v + j]);
        high[j] = std::max(high[j], k);
        low[j] = std::min(low[j], k);
      }
  std::int32_t hi = *std::max_element(high, high + kLanes);
  std::int32_t lo = *std::min_element(low, low + kLanes);
  const float* tail = l + whole;  // counted from 0 (GCC then sees no wrap-around)
  for (std::size_t j = 0; j < n - whole; ++j) {
    hi = std::max(hi, order_key(tail[j]));
    lo = std::min(lo, order_key(tail[j]));
  }
  return {from_key(hi), lo > order_key(-inf) && hi < order_key(inf)};
}

inline std::size_t collect(const float* l, std::size_t n, float floor, std::uint32_t* idx,
                           std::uint32_t first = 0) noexcept {
  std::size_t c = 0;
  for (std::size_t i = 0; i < n; ++i) {
    idx[c] = first + static_cast<std::uint32_t>(i);
    c += l[i] >= floor;
  }
  return c;
}

inline SamplerExpSums exp_weights(const float* l, std::size_t n, float top, float temp, float floor,
                                  float* w, std::uint32_t* idx, std::uint32_t first = 0) noexcept {
  double total[kLanes] = {};  // sums by lane, in blocks the compiler can vectorize
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (std::size_t j = 0; j < kLanes; ++j) w[i + j] = exp_approx((l[i + j] - top) / temp);
    for (std::size_t j = 0; j < kLanes; ++j) total[j] += w[i + j];
  }
  SamplerExpSums s;
  const float* lt = l + i;  // the tail, counted from 0 (GCC then sees no wrap-around)
  float* wt = w + i;
  for (std::size_t j = 0; j < n - i; ++j) s.total += wt[j] = exp_approx((lt[j] - top) / temp);
  for (std::size_t j = 0; j < kLanes; ++j) s.total += total[j];
  s.collected = collect(l, n, floor, idx, first);
  return s;
}

/// Combines a vector pass's top and finiteness with the tail's.
inline SamplerTop merge_top(float top, bool finite, SamplerTop tail) noexcept {
  return {std::max(top, tail.top) + 0.0f, finite && tail.finite};
}

}  // namespace generic

#if defined(MOEKIT_SAMPLER_X86)
// GCC 12 warns about the deliberately undefined pass-through operand inside its own AVX-512
// intrinsics (_mm512_undefined_*) once they are inlined here; the warning is a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace avx512 {

MOEKIT_SAMPLER_AVX512 inline __m512i keys(__m512 v) noexcept {
  const __m512i b = _mm512_castps_si512(_mm512_add_ps(v, _mm512_setzero_ps()));
  return _mm512_xor_si512(
      b, _mm512_and_si512(_mm512_srai_epi32(b, 31), _mm512_set1_epi32(0x7fffffff)));
}

MOEKIT_SAMPLER_AVX512 inline SamplerScan scan(const float* l, std::size_t n,
                                              std::int32_t* lane_max) noexcept {
  __m512i mn = _mm512_set1_epi32(std::numeric_limits<std::int32_t>::max());
  __m512i all = _mm512_set1_epi32(std::numeric_limits<std::int32_t>::min());
  std::size_t i = 0, out = 0;
  for (; i + kGroup <= n; i += kGroup, out += kLanes) {
    __m512i mx = _mm512_set1_epi32(std::numeric_limits<std::int32_t>::min());
    for (std::size_t j = 0; j < kGroup; j += 16) {
      const __m512i k = keys(_mm512_loadu_ps(l + i + j));
      mx = _mm512_max_epi32(mx, k);
      mn = _mm512_min_epi32(mn, k);
    }
    _mm512_storeu_si512(lane_max + out, mx);
    all = _mm512_max_epi32(all, mx);
  }
  std::int32_t mxs = _mm512_reduce_max_epi32(all), mns = _mm512_reduce_min_epi32(mn);
  for (std::size_t j = 0; j < n - i; ++j) {
    const std::int32_t k = lane_max[out + j] = order_key(l[i + j]);
    mxs = std::max(mxs, k);
    mns = std::min(mns, k);
  }
  return {mxs, mns};
}

/// generic::top's result from float maxima, 64 logits a step in four chains: fma(v, 0, z) turns
/// z into NaN for a NaN or an infinite v (the maxima are read only when every z stays 0).
MOEKIT_SAMPLER_AVX512 inline SamplerTop top(const float* l, std::size_t n) noexcept {
  const __m512 zero = _mm512_setzero_ps();
  __m512 m[4], z[4];
  for (std::size_t k = 0; k < 4; ++k) {
    m[k] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    z[k] = zero;
  }
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (std::size_t k = 0; k < 4; ++k) {
      const __m512 v = _mm512_loadu_ps(l + i + 16 * k);
      m[k] = _mm512_max_ps(v, m[k]);
      z[k] = _mm512_fmadd_ps(v, zero, z[k]);
    }
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(l + i);
    m[0] = _mm512_max_ps(v, m[0]);
    z[0] = _mm512_fmadd_ps(v, zero, z[0]);
  }
  const __m512 mm = _mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3]));
  const __m512 zz = _mm512_add_ps(_mm512_add_ps(z[0], z[1]), _mm512_add_ps(z[2], z[3]));
  const bool finite = _mm512_cmp_ps_mask(zz, zero, _CMP_EQ_OQ) == 0xffff;
  return generic::merge_top(_mm512_reduce_max_ps(mm), finite, generic::top(l + i, n - i));
}

/// exp_approx on 16 lanes (with FMA, and scalef for the power of two).
MOEKIT_SAMPLER_AVX512 inline __m512 exp16(__m512 x) noexcept {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

/// exp_weights' work on 16 logits at i: stores the weights, collects those >= f into idx + c
/// (whose count it adds to c) and returns the weights.
MOEKIT_SAMPLER_AVX512 inline __m512 exp_weights16(const float* l, std::size_t i, __m512 t, __m512 d,
                                                  __m512 f, float* w, std::uint32_t* idx,
                                                  std::size_t& c) noexcept {
  const __m512 v = _mm512_loadu_ps(l + i);
  const __m512 a = exp16(_mm512_div_ps(_mm512_sub_ps(v, t), d));
  _mm512_storeu_ps(w + i, a);
  // collect's loop, fused: the logits are in registers already.
  const __m512i at =
      _mm512_add_epi32(_mm512_set1_epi32(static_cast<std::int32_t>(i)),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __mmask16 m = _mm512_cmp_ps_mask(v, f, _CMP_GE_OQ);
  _mm512_storeu_si512(idx + c, _mm512_maskz_compress_epi32(m, at));
  c += static_cast<std::size_t>(__builtin_popcount(m));
  return a;
}

/// Adds the 16 floats of a to the doubles of lo (first 8) and hi (last 8).
MOEKIT_SAMPLER_AVX512 inline void add_pd16(__m512d& lo, __m512d& hi, __m512 a) noexcept {
  lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(a)));
  hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(a, 1)));
}

MOEKIT_SAMPLER_AVX512 inline SamplerExpSums exp_weights(const float* l, std::size_t n, float top,
                                                        float temp, float floor, float* w,
                                                        std::uint32_t* idx) noexcept {
  const __m512 t = _mm512_set1_ps(top), d = _mm512_set1_ps(temp), f = _mm512_set1_ps(floor);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  std::size_t i = 0, c = 0;
  // Four vectors added in float (sampler_exp_sum_error), then in double: the conversions and
  // double adds are much of this loop's work.
  for (; i + 64 <= n; i += 64) {
    const __m512 a0 = exp_weights16(l, i, t, d, f, w, idx, c);
    const __m512 a1 = exp_weights16(l, i + 16, t, d, f, w, idx, c);
    const __m512 a2 = exp_weights16(l, i + 32, t, d, f, w, idx, c);
    const __m512 a3 = exp_weights16(l, i + 48, t, d, f, w, idx, c);
    add_pd16(lo, hi, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  }
  for (; i + 16 <= n; i += 16) add_pd16(lo, hi, exp_weights16(l, i, t, d, f, w, idx, c));
  SamplerExpSums s = generic::exp_weights(l + i, n - i, top, temp, floor, w + i, idx + c,
                                          static_cast<std::uint32_t>(i));
  s.total += _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
  s.collected += c;
  return s;
}

MOEKIT_SAMPLER_AVX512 inline std::size_t collect(const float* l, std::size_t n, float floor,
                                                 std::uint32_t* idx) noexcept {
  const __m512 f = _mm512_set1_ps(floor);
  __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  std::size_t c = 0, i = 0;
  // Compressed in registers and stored whole: the compressing store is slow on AMD cores.
  for (; i + 16 <= n; i += 16, at = _mm512_add_epi32(at, _mm512_set1_epi32(16))) {
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(l + i), f, _CMP_GE_OQ);
    _mm512_storeu_si512(idx + c, _mm512_maskz_compress_epi32(m, at));
    c += static_cast<std::size_t>(__builtin_popcount(m));
  }
  return c + generic::collect(l + i, n - i, floor, idx + c, static_cast<std::uint32_t>(i));
}

}  // namespace avx512

namespace avx2 {

MOEKIT_SAMPLER_AVX2 inline __m256i keys(__m256 v) noexcept {
  const __m256i b = _mm256_castps_si256(_mm256_add_ps(v, _mm256_setzero_ps()));
  return _mm256_xor_si256(
      b, _mm256_and_si256(_mm256_srai_epi32(b, 31), _mm256_set1_epi32(0x7fffffff)));
}

MOEKIT_SAMPLER_AVX2 inline SamplerScan scan(const float* l, std::size_t n,
                                            std::int32_t* lane_max) noexcept {
  const __m256i lowest = _mm256_set1_epi32(std::numeric_limits<std::int32_t>::min());
  __m256i mn = _mm256_set1_epi32(std::numeric_limits<std::int32_t>::max()), all = lowest;
  std::size_t i = 0, out = 0;
  for (; i + kGroup <= n; i += kGroup, out += kLanes) {
    __m256i m0 = lowest, m1 = lowest;  // lanes 0-7 and 8-15
    for (std::size_t j = 0; j < kGroup; j += 16) {
      const __m256i k0 = keys(_mm256_loadu_ps(l + i + j));
      const __m256i k1 = keys(_mm256_loadu_ps(l + i + j + 8));
      m0 = _mm256_max_epi32(m0, k0);
      m1 = _mm256_max_epi32(m1, k1);
      mn = _mm256_min_epi32(mn, _mm256_min_epi32(k0, k1));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lane_max + out), m0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lane_max + out + 8), m1);
    all = _mm256_max_epi32(all, _mm256_max_epi32(m0, m1));
  }
  alignas(32) std::int32_t a[8], b[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), all);
  _mm256_store_si256(reinterpret_cast<__m256i*>(b), mn);
  std::int32_t mxs = *std::max_element(a, a + 8), mns = *std::min_element(b, b + 8);
  for (std::size_t j = 0; j < n - i; ++j) {
    const std::int32_t k = lane_max[out + j] = order_key(l[i + j]);
    mxs = std::max(mxs, k);
    mns = std::min(mns, k);
  }
  return {mxs, mns};
}

/// avx512::top on 8 lanes.
MOEKIT_SAMPLER_AVX2 inline SamplerTop top(const float* l, std::size_t n) noexcept {
  const __m256 zero = _mm256_setzero_ps();
  __m256 m[4], z[4];
  for (std::size_t k = 0; k < 4; ++k) {
    m[k] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    z[k] = zero;
  }
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (std::size_t k = 0; k < 4; ++k) {
      const __m256 v = _mm256_loadu_ps(l + i + 8 * k);
      m[k] = _mm256_max_ps(v, m[k]);
      z[k] = _mm256_fmadd_ps(v, zero, z[k]);
    }
  const __m256 mm = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
  const __m256 zz = _mm256_add_ps(_mm256_add_ps(z[0], z[1]), _mm256_add_ps(z[2], z[3]));
  alignas(32) float a[8];
  _mm256_store_ps(a, mm);
  const bool finite = _mm256_movemask_ps(_mm256_cmp_ps(zz, zero, _CMP_EQ_OQ)) == 0xff;
  return generic::merge_top(*std::max_element(a, a + 8), finite, generic::top(l + i, n - i));
}

/// exp_approx on 8 lanes (with FMA; the power of two built in the exponent bits).
MOEKIT_SAMPLER_AVX2 inline __m256 exp8(__m256 x) noexcept {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

MOEKIT_SAMPLER_AVX2 inline double sum_pd(__m256d v) noexcept {
  alignas(32) double a[4];
  _mm256_store_pd(a, v);
  return (a[0] + a[1]) + (a[2] + a[3]);
}
MOEKIT_SAMPLER_AVX2 inline SamplerExpSums exp_weights(const float* l, std::size_t n, float top,
                                                      float temp, float floor, float* w,
                                                      std::uint32_t* idx) noexcept {
  const __m256 t = _mm256_set1_ps(top), d = _mm256_set1_ps(temp), f = _mm256_set1_ps(floor);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  std::size_t i = 0, c = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(l + i);
    const __m256 a = exp8(_mm256_div_ps(_mm256_sub_ps(v, t), d));
    _mm256_storeu_ps(w + i, a);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
    auto m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, f, _CMP_GE_OQ)));
    for (; m; m &= m - 1) idx[c++] = static_cast<std::uint32_t>(i + std::size_t(__builtin_ctz(m)));
  }
  SamplerExpSums s = generic::exp_weights(l + i, n - i, top, temp, floor, w + i, idx + c,
                                          static_cast<std::uint32_t>(i));
  s.total += sum_pd(_mm256_add_pd(lo, hi));
  s.collected += c;
  return s;
}

MOEKIT_SAMPLER_AVX2 inline std::size_t collect(const float* l, std::size_t n, float floor,
                                               std::uint32_t* idx) noexcept {
  const __m256 f = _mm256_set1_ps(floor);
  std::size_t c = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    auto m = static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(l + i), f, _CMP_GE_OQ)));
    for (; m; m &= m - 1) idx[c++] = static_cast<std::uint32_t>(i + std::size_t(__builtin_ctz(m)));
  }
  return c + generic::collect(l + i, n - i, floor, idx + c, static_cast<std::uint32_t>(i));
}

}  // namespace avx2
#pragma GCC diagnostic pop
#endif  // MOEKIT_SAMPLER_X86

}  // namespace detail

/// The sampler's passes over the whole vocabulary, in the version this CPU runs (or `isa`, for
/// tests that compare the versions): AVX-512, AVX2 or portable.
struct SamplerVectorPasses {
  moekit::Isa isa = moekit::detect_isa();

  SamplerScan scan(const float* l, std::size_t n, std::int32_t* lane_max) const noexcept {
#if defined(MOEKIT_SAMPLER_X86)
    if (isa == moekit::Isa::avx512) return detail::avx512::scan(l, n, lane_max);
    if (isa == moekit::Isa::avx2) return detail::avx2::scan(l, n, lane_max);
#endif
    return detail::generic::scan(l, n, lane_max);
  }
  /// The largest logit, and whether every logit is finite (`scan` reports more, at more cost).
  SamplerTop top(const float* l, std::size_t n) const noexcept {
#if defined(MOEKIT_SAMPLER_X86)
    if (isa == moekit::Isa::avx512) return detail::avx512::top(l, n);
    if (isa == moekit::Isa::avx2) return detail::avx2::top(l, n);
#endif
    return detail::generic::top(l, n);
  }
  /// w[i] = exp_approx((l[i] - top) / temp) (n entries) and their sum; also collects, as
  /// `collect` does, the indices of the logits >= floor into `idx` (room for n + 16).
  SamplerExpSums exp_weights(const float* l, std::size_t n, float top, float temp, float floor,
                             float* w, std::uint32_t* idx) const noexcept {
#if defined(MOEKIT_SAMPLER_X86)
    if (isa == moekit::Isa::avx512)
      return detail::avx512::exp_weights(l, n, top, temp, floor, w, idx);
    if (isa == moekit::Isa::avx2) return detail::avx2::exp_weights(l, n, top, temp, floor, w, idx);
#endif
    return detail::generic::exp_weights(l, n, top, temp, floor, w, idx);
  }
  /// The indices i with l[i] >= floor, ascending; `idx` needs room for n + 16. Returns how many.
  std::size_t collect(const float* l, std::size_t n, float floor,
                      std::uint32_t* idx) const noexcept {
#if defined(MOEKIT_SAMPLER_X86)
    if (isa == moekit::Isa::avx512) return detail::avx512::collect(l, n, floor, idx);
    if (isa == moekit::Isa::avx2) return detail::avx2::collect(l, n, floor, idx);
#endif
    return detail::generic::collect(l, n, floor, idx);
  }
};

}  // namespace moekit::engine
