#pragma once
// What the kernel benchmarks share: the size of the rotating set of weight copies that keeps them
// cold, and the streaming read that measures the bandwidth bound they are compared with (over
// rotating buffers of the weights' size, on the benchmark's threads).
#include <algorithm>
#include <cstddef>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "moekit/precision/isa.hpp"
#include "moekit/precision/thread_pool.hpp"

namespace moekit::bench {

/// Total bytes of the rotating copies: > 4× the 35.8 MiB LLC of this machine.
inline constexpr std::size_t rotation_bytes = 160u << 20;

#if defined(__x86_64__)
// GCC 12 false positive inside its own _mm512_reduce_add_ps (see detail/avx512_rows.hpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) inline float stream_sum_avx512(const float* p, std::size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t i = 0; i + 64 <= n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/// The same sum read as the int8 GEMV reads its rows: four quarters side by side, each prefetched
/// into L2 12 KiB ahead. It can read faster than one stream, so the kernel benchmarks take the
/// faster of the two as their bound (bench/RESULTS.md, "Dequant-GEMV kernels against ggml and the
/// memory bound").
__attribute__((target("avx512f"))) inline float stream_sum4_avx512(const float* p, std::size_t n) {
  constexpr std::size_t ahead = 12 * 1024 / sizeof(float);
  const std::size_t part = n / 4 / 16 * 16;
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                 _mm512_setzero_ps()};
  for (std::size_t i = 0; i < part; i += 16)
    for (std::size_t s = 0; s < 4; ++s) {
      const float* q = p + s * part + i;
      if (i + ahead < part) _mm_prefetch(reinterpret_cast<const char*>(q + ahead), _MM_HINT_T1);
      a[s] = _mm512_add_ps(a[s], _mm512_loadu_ps(q));
    }
  float tail = 0;
  for (std::size_t i = 4 * part; i < n; ++i) tail += p[i];
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]))) +
         tail;
}
#pragma GCC diagnostic pop

__attribute__((target("avx2"))) inline float hsum256(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
/// The AVX2 sums, as the AVX-512 ones: without them an AVX2 core summed one float at a time, a
/// chain of dependent adds that reads at a fraction of the memory's rate (the bound of every
/// kernel benchmark on such a core was too low).
__attribute__((target("avx2"))) inline float stream_sum_avx2(const float* p, std::size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  float tail = 0;
  for (; i < n; ++i) tail += p[i];
  return hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) + tail;
}
__attribute__((target("avx2"))) inline float stream_sum4_avx2(const float* p, std::size_t n) {
  constexpr std::size_t ahead = 12 * 1024 / sizeof(float);
  const std::size_t part = n / 4 / 16 * 16;
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
  for (std::size_t i = 0; i < part; i += 16)
    for (std::size_t s = 0; s < 4; ++s) {
      const float* q = p + s * part + i;
      if (i + ahead < part) _mm_prefetch(reinterpret_cast<const char*>(q + ahead), _MM_HINT_T1);
      a[s] = _mm256_add_ps(a[s], _mm256_add_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(q + 8)));
    }
  float tail = 0;
  for (std::size_t i = 4 * part; i < n; ++i) tail += p[i];
  return hsum256(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]))) + tail;
}
#endif

/// The streaming read: a vectorised sum of `n` floats (AVX-512 or AVX2, as the CPU has), as one
/// stream or (`quarters`) as four prefetched ones.
inline float stream_sum(const float* p, std::size_t n, bool quarters = false) {
#if defined(__x86_64__)
  if (detect_isa() == Isa::avx512)
    return quarters ? stream_sum4_avx512(p, n) : stream_sum_avx512(p, n);
  if (detect_isa() == Isa::avx2) return quarters ? stream_sum4_avx2(p, n) : stream_sum_avx2(p, n);
#endif
  (void)quarters;
  float a[8] = {};  // eight independent sums: not one chain of dependent adds
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t j = 0; j < 8; ++j) a[j] += p[i + j];
  float s = 0;
  for (; i < n; ++i) s += p[i];
  for (float x : a) s += x;
  return s;
}

/// Rotating float buffers of `bytes` each and the streaming read over them on every thread of
/// `pool`: one stream per thread, or four prefetched ones (`quarters`; see stream_sum).
class ColdRead {
 public:
  ColdRead(ThreadPool& pool, std::size_t bytes, std::size_t copies)
      : pool_(pool),
        n_(bytes / 4),
        bufs_(copies, std::vector<float>(n_, 1.f)),
        part_(pool.size()) {}
  void operator()(std::size_t c, bool quarters) {
    const float* p = bufs_[c % bufs_.size()].data();
    const std::size_t per = (n_ / pool_.size() + 63) / 64 * 64;
    pool_.parallel_for(0, pool_.size(), 1, [&](std::size_t b, std::size_t) {
      const std::size_t lo = b * per, hi = std::min(n_, lo + per);
      part_[b] = lo < hi ? stream_sum(p + lo, hi - lo, quarters) : 0.f;
    });
    for (float v : part_) sink_ = sink_ + v;
  }

 private:
  ThreadPool& pool_;
  std::size_t n_;
  std::vector<std::vector<float>> bufs_;
  std::vector<float> part_;
  volatile float sink_ = 0;
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace moekit::bench
