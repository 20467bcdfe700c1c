#pragma once
/// \file Kernels of RouterStack: one panel of 8 router rows, packed column-chunk-major
/// ([ceil(d/16)][8 rows][16 floats], 64-byte aligned, zero padded), dotted with one activation.
///
/// Why this layout: the product is bound by reading the weights, not by arithmetic (2·8·4096 flops
/// per 128 KiB read at d = 4096). Reading the 8 rows as ONE sequential, aligned stream with x
/// loaded once per chunk beats 8 row-wise dots over 16-byte aligned rows (split cache-line loads,
/// 8 streams, two loads per FMA): moekit_bench_predictor_cost, bench/RESULTS.md, "Predictors".

#include <cstddef>
#include <cstdint>

#include "moekit/precision/detail/avx2_rows.hpp"
#include "moekit/precision/detail/avx512_rows.hpp"
#include "moekit/precision/isa.hpp"

namespace moekit::detail {

/// 16 floats, one 64-byte line: the unit of a packed router panel.
struct alignas(64) RouterChunk {
  float v[16];
};

inline constexpr std::size_t panel_rows = 8;

/// out[r] = Σ_c panel(c, r) · x[c] for the 8 rows of one panel; `chunks` = ceil(d / 16).
inline void panel_dot_generic(const RouterChunk* panel, std::size_t chunks, const float* x,
                              std::size_t d, float* out) noexcept {
  float acc[panel_rows] = {};
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t n = d - 16 * c < 16 ? d - 16 * c : 16;
    for (std::size_t r = 0; r < panel_rows; ++r) {
      const float* w = panel[c * panel_rows + r].v;
      float s = 0.0f;
      for (std::size_t i = 0; i < n; ++i) s += w[i] * x[16 * c + i];
      acc[r] += s;
    }
  }
  for (std::size_t r = 0; r < panel_rows; ++r) out[r] = acc[r];
}

#if defined(MOEKIT_HAS_X86_KERNELS)
// GCC 12 warns about the deliberately undefined pass-through operand inside its own AVX-512
// intrinsics (_mm512_reduce_add_ps) once inlined into a caller, where these pragmas no longer
// apply; so the horizontal sum below uses only zero-masked extracts, and the pragmas stay for
// the rest.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
MOEKIT_TARGET_AVX512 inline float hsum_avx512(__m512 v) noexcept {
  const __m256d hi = _mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(v), 1);
  const __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(hi));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

MOEKIT_TARGET_AVX512 inline void panel_step_avx512(const float* w, __m512 xv,
                                                   __m512 (&a)[panel_rows]) noexcept {
  for (std::size_t r = 0; r < panel_rows; ++r)
    a[r] = _mm512_fmadd_ps(_mm512_load_ps(w + 16 * r), xv, a[r]);
}

MOEKIT_TARGET_AVX512 inline void panel_dot_avx512(const RouterChunk* panel, std::size_t chunks,
                                                  const float* x, std::size_t d,
                                                  float* out) noexcept {
  __m512 a[panel_rows];
  for (auto& v : a) v = _mm512_setzero_ps();
  const std::size_t full = d / 16;
  for (std::size_t c = 0; c < full; ++c)
    panel_step_avx512(panel[c * panel_rows].v, _mm512_loadu_ps(x + 16 * c), a);
  if (full < chunks) {  // the last chunk: x read under a mask (the weights are zero padded)
    const auto m = static_cast<__mmask16>((1u << (d - 16 * full)) - 1u);
    panel_step_avx512(panel[full * panel_rows].v, _mm512_maskz_loadu_ps(m, x + 16 * full), a);
  }
  for (std::size_t r = 0; r < panel_rows; ++r) out[r] = hsum_avx512(a[r]);
}

MOEKIT_TARGET_AVX2 inline void panel_dot_avx2(const RouterChunk* panel, std::size_t chunks,
                                              const float* x, std::size_t d, float* out) noexcept {
  __m256 a[panel_rows];
  for (auto& v : a) v = _mm256_setzero_ps();
  for (std::size_t c = 0; c < chunks; ++c) {
    for (std::size_t h = 0; h < 2; ++h) {  // two 8-lane halves of each 16-float chunk
      const std::size_t col = 16 * c + 8 * h;
      __m256 xv;
      if (col + 8 <= d) {
        xv = _mm256_loadu_ps(x + col);
      } else if (col < d) {
        alignas(32) std::int32_t mask[8];
        for (std::size_t i = 0; i < 8; ++i) mask[i] = col + i < d ? -1 : 0;
        xv = _mm256_maskload_ps(x + col, _mm256_load_si256(reinterpret_cast<const __m256i*>(mask)));
      } else {
        break;
      }
      const float* w = panel[c * panel_rows].v + 8 * h;
      for (std::size_t r = 0; r < panel_rows; ++r)
        a[r] = _mm256_fmadd_ps(_mm256_load_ps(w + 16 * r), xv, a[r]);
    }
  }
  for (std::size_t r = 0; r < panel_rows; ++r) out[r] = avx2::hsum(a[r]);
}
#pragma GCC diagnostic pop
#endif

using PanelDotFn = void (*)(const RouterChunk*, std::size_t, const float*, std::size_t,
                            float*) noexcept;

/// The panel kernel for `isa` (which the caller has checked is supported).
inline PanelDotFn panel_dot_for(Isa isa) noexcept {
#if defined(MOEKIT_HAS_X86_KERNELS)
  if (isa == Isa::avx512) return &panel_dot_avx512;
  if (isa == Isa::avx2) return &panel_dot_avx2;
#endif
  (void)isa;
  return &panel_dot_generic;
}

}  // namespace moekit::detail
