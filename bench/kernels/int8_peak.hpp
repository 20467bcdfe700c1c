#pragma once
// The int8 peak of this core: a tight loop of independent vpdpbusd chains, timed beside the
// kernels in the same run (moekit_bench_gemm and ggml/gemm_vs_ggml.cpp share it).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "moekit/precision/gemv.hpp"  // MOEKIT_HAS_X86_KERNELS, has_avx512_vnni
#include "moekit/precision/thread_pool.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)
#include <immintrin.h>
#endif

namespace moekit_bench {
using namespace moekit;
using Clock = std::chrono::steady_clock;

#if defined(MOEKIT_HAS_X86_KERNELS)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12 on _mm512_setzero_si512
/// Multiply-adds per second of 12 independent vpdpbusd chains (512-bit: 64 each), issued as a
/// panel tile issues them: the unsigned operand loaded from 4 KiB in L1, the signed one a dword
/// broadcast from memory. (12 chains on two constant registers with a barrier on every chain, the
/// loop before, ran at about two thirds of this on Zen 5, below what the K-quant panel tile
/// reached: bench/RESULTS.md, "Prefill GEMM on GGUF K-quants: the AVX-512 panel tile".)
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) inline double vnni512_peak_loop(
    std::size_t iters) {
  alignas(64) std::int8_t w[4096];
  std::int8_t a[64];
  for (std::size_t i = 0; i < sizeof w; ++i) w[i] = static_cast<std::int8_t>(i % 7 + 1);
  for (std::size_t i = 0; i < sizeof a; ++i) a[i] = static_cast<std::int8_t>(i % 5) - 2;
  __m512i acc[12];
  for (auto& x : acc) x = _mm512_setzero_si512();
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < iters; ++i) {
    const __m512i u = _mm512_load_si512(w + 64 * (i % 64));
    for (std::size_t c = 0; c < 12; ++c) {
      std::int32_t v;
      std::memcpy(&v, a + 4 * c + i % 8, 4);  // the offset keeps the broadcast in the loop
      acc[c] = _mm512_dpbusd_epi32(acc[c], u, _mm512_set1_epi32(v));
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  __m512i sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  volatile int sink = _mm512_reduce_add_epi32(sum);
  (void)sink;
  return static_cast<double>(iters) * 12 * 64 / secs;
}
/// The same with AVX-VNNI (256-bit, 32 multiply-adds each).
__attribute__((target("avx2,avxvnni"), noinline)) inline double vnni256_peak_loop(
    std::size_t iters) {
  __m256i acc[12];
  for (auto& a : acc) a = _mm256_setzero_si256();
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2);
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < iters; ++i)
    for (auto& a : acc) {
      a = _mm256_dpbusd_avx_epi32(a, u, s);
      __asm__ volatile("" : "+v"(a));
    }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  __m256i sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm256_add_epi32(sum, acc[i]);
  volatile int sink = _mm256_extract_epi32(sum, 0);
  (void)sink;
  return static_cast<double>(iters) * 12 * 32 / secs;
}
#pragma GCC diagnostic pop
#endif

/// The int8 peak (multiply-adds per second) of the pool's threads, one ~2 ms run: 512-bit or
/// 256-bit VNNI; 0 if the CPU has neither. Timed in every round beside the kernels, so the
/// load of the shared machine hits both alike.
inline double int8_peak(bool wide, ThreadPool& pool) {
#if defined(MOEKIT_HAS_X86_KERNELS)
  if (wide ? !has_avx512_vnni() : !has_avx_vnni()) return 0;
  std::vector<double> per(pool.size());
  pool.parallel_for(0, pool.size(), 1, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i)
      per[i] = wide ? vnni512_peak_loop(1 << 19) : vnni256_peak_loop(1 << 20);
  });
  double total = 0;
  for (double p : per) total += p;
  return total;
#else
  (void)wide, (void)pool;
  return 0;
#endif
}

}  // namespace moekit_bench
