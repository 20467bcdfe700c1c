#pragma once
/// \file AVX512_BF16 row kernel: bf16 rows · an activation rounded to bf16, with `vdpbf16ps`
/// (each instruction: 32 bf16 products, summed pairwise into 16 float accumulators). Where the
/// widening kernel (avx512_rows.hpp) converts every weight to a float and needs the activation in
/// floats (x of 14336 values: 56 KiB, more than L1), this one takes the stored pairs as they lie
/// and an activation half the size. Callers check `has_avx512_bf16()` first.
///
/// Rounding: a bf16 × bf16 product is exact in float (8 + 8 significant bits); the instruction
/// adds the two products of a pair to the accumulator in float (denormal inputs and outputs read
/// and written as zero). So against the float path the one new error is the activation's
/// rounding to bf16, |x̃ − x| ≤ 2⁻⁸·|x| (round to nearest even), hence
/// |y − w·x| ≤ 2⁻⁸·Σ|w·x| + the float accumulation error of Σ w·x̃ (tests/precision).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "moekit/precision/detail/avx512_rows.hpp"
#include "moekit/precision/half.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)
#define MOEKIT_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moekit::detail::avx512_bf16 {

/// x rounded to bf16 (round to nearest even) into `storage`, which it returns.
inline const std::uint16_t* prepare(const float* x, std::size_t cols,
                                    std::vector<std::uint16_t>& storage) {
  if (storage.size() < cols) storage.resize(cols);
  for (std::size_t c = 0; c < cols; ++c) storage[c] = float_to_bf16_bits(x[c]);
  return storage.data();
}

MOEKIT_TARGET_AVX512_BF16 inline __m512bh load32(const void* p) noexcept {
  return (__m512bh)_mm512_loadu_si512(p);
}

/// N bf16 rows · the bf16 activation `xb` into out[0..N), four accumulators per row (128 columns
/// a step), sharing every activation load; `next` (optional): a row further down each row's
/// stream, prefetched into L2 in step with this call's progress through its own row. Columns
/// after the last 32 in floats (the same products).
template <std::size_t N>
MOEKIT_TARGET_AVX512_BF16 inline void row_dots(const std::byte* const* rows, std::size_t cols,
                                               const std::uint16_t* xb, float* out,
                                               const std::byte* const* next) noexcept {
  __m512 a[N][4];
  for (std::size_t n = 0; n < N; ++n)
    for (auto& v : a[n]) v = _mm512_setzero_ps();
  std::size_t c = 0;
  for (; c + 128 <= cols; c += 128) {
    if (next) avx512::prefetch_rows_l2<N>(next, 2 * c, 2 * (c + 128));
    const __m512bh x0 = load32(xb + c), x1 = load32(xb + c + 32), x2 = load32(xb + c + 64),
                   x3 = load32(xb + c + 96);
    for (std::size_t n = 0; n < N; ++n) {
      const std::byte* r = rows[n] + 2 * c;
      a[n][0] = _mm512_dpbf16_ps(a[n][0], load32(r), x0);
      a[n][1] = _mm512_dpbf16_ps(a[n][1], load32(r + 64), x1);
      a[n][2] = _mm512_dpbf16_ps(a[n][2], load32(r + 128), x2);
      a[n][3] = _mm512_dpbf16_ps(a[n][3], load32(r + 192), x3);
    }
  }
  if (next) avx512::prefetch_rows_l2<N>(next, 2 * c, 2 * cols);
  for (std::size_t n = 0; n < N; ++n) {
    std::size_t k = c;
    for (; k + 32 <= cols; k += 32)
      a[n][0] = _mm512_dpbf16_ps(a[n][0], load32(rows[n] + 2 * k), load32(xb + k));
    float tail = 0.f;
    for (; k < cols; ++k) {
      std::uint16_t w;
      std::memcpy(&w, rows[n] + 2 * k, 2);
      tail += bf16_bits_to_float(w) * bf16_bits_to_float(xb[k]);
    }
    out[n] = _mm512_reduce_add_ps(
                 _mm512_add_ps(_mm512_add_ps(a[n][0], a[n][1]), _mm512_add_ps(a[n][2], a[n][3]))) +
             tail;
  }
}

}  // namespace moekit::detail::avx512_bf16

#pragma GCC diagnostic pop

#endif
