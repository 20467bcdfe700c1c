#pragma once
/// \file AVX-512 VNNI row kernel with int8 activations (opt-in: `KernelOptions::int8_activations`).
///
/// The activation is quantized once per call to int8 per 32-weight chunk (scale dx = max|x|/127,
/// as ggml's q8_0), in an arrangement that matches how the weight codes of two chunks unpack
/// into one 512-bit register; then `vpdpbusd` multiplies 64 unsigned codes by 64 int8
/// activations per instruction. Per chunk c: Σ s·(q − z)·x ≈ s·dx·(Σ q·xq − z·Σ xq). This trades
/// the activation's rounding (≤ dx/2 per element) for about three times fewer instructions than
/// the float path.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "moekit/precision/detail/avx512_rows.hpp"
#include "moekit/precision/detail/prepared_activation.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/quantize.hpp"

#if defined(MOEKIT_HAS_X86_KERNELS)
#define MOEKIT_TARGET_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace moekit::detail::avx512_int8 {

/// Byte position, within a pair of chunks (64 bytes), of slot `slot` (decode order, see
/// chunk_slot) of the chunk with parity `odd`, so that the pair's codes unpack in place.
constexpr std::size_t pair_position(unsigned bits, unsigned odd, unsigned slot) noexcept {
  if (bits == 8) return odd * 32 + slot;
  if (bits == 4) return (slot / 16) * 32 + odd * 16 + slot % 16;
  return (slot / 8) * 16 + odd * 8 + slot % 8;  // bits == 2
}

/// The int8 activation of one call: codes arranged per pair of chunks, and per chunk the scale dx
/// and dx·Σxq (for the zero-point term).
struct Int8Activation {
  const std::int8_t* xq = nullptr;
  const float* dx = nullptr;
  const float* dx_sum = nullptr;
  const float* x = nullptr;  ///< the float activation (columns after the last whole chunk)
};

/// Quantizes x for rows of `bits`-bit codes; storage is grown, never shrunk.
inline Int8Activation prepare(const float* x, std::size_t cols, unsigned bits,
                              std::vector<std::int8_t>& q_storage,
                              std::vector<float>& f_storage) {
  const std::size_t chunks = cols / 32;
  if (q_storage.size() < chunks * 32) q_storage.resize(chunks * 32);
  if (f_storage.size() < 2 * chunks) f_storage.resize(2 * chunks);
  std::int8_t* xq = q_storage.data();
  float* dx = f_storage.data();
  float* dxs = dx + chunks;
  for (std::size_t c = 0; c < chunks; ++c) {
    float amax = 0;
    for (std::size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * c + i]));
    const float d = amax / 127.f, inv = amax > 0 ? 127.f / amax : 0.f;
    // The last chunk of an odd count is unpacked on its own, in plain decode order.
    const bool single = (c % 2 == 0) && c + 1 == chunks;
    std::int8_t* base = xq + 64 * (c / 2);
    int sum = 0;
    for (unsigned i = 0; i < 32; ++i) {
      const auto v = static_cast<int>(std::nearbyint(x[32 * c + i] * inv));
      sum += v;
      const unsigned slot = static_cast<unsigned>(chunk_slot(bits, i));
      base[single ? slot : pair_position(bits, c % 2, slot)] = static_cast<std::int8_t>(v);
    }
    dx[c] = d;
    dxs[c] = d * static_cast<float>(sum);
  }
  return {xq, dx, dxs, x};
}

/// 32 codes of chunk `p` (decode order) as unsigned bytes in a 256-bit register.
template <unsigned Bits>
MOEKIT_TARGET_AVX512_VNNI inline __m256i codes32(const std::byte* p) noexcept {
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

/// 64 codes of chunks c, c+1 starting at `p`, arranged as pair_position says.
template <unsigned Bits>
MOEKIT_TARGET_AVX512_VNNI inline __m512i codes64(const std::byte* p) noexcept {
  if constexpr (Bits == 8) {
    return _mm512_loadu_si512(p);
  } else if constexpr (Bits == 4) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i m = _mm256_set1_epi8(0x0f);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m)),
                              _mm256_and_si256(_mm256_srli_epi16(v, 4), m), 1);
  } else {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(0x03);
    const __m256i lo = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 2), m), _mm_and_si128(b, m));
    const __m256i hi = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 6), m),
                                        _mm_and_si128(_mm_srli_epi16(b, 4), m));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
}

/// Which chunk of the pair (0 or 1) each 32-bit lane of codes64 belongs to.
template <unsigned Bits>
MOEKIT_TARGET_AVX512_VNNI inline __m512i lane_parity() noexcept {
  if constexpr (Bits == 8) return _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  else if constexpr (Bits == 4)
    return _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
  else return _mm512_set_epi32(1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0);
}

/// Quantized row · x with int8 activations. `sdx` is per-thread scratch of ≥ cols/32 floats.
template <unsigned Bits>
MOEKIT_TARGET_AVX512_VNNI inline float row_dot(const std::byte* row, const RowLayout& l,
                                               const Int8Activation& a, float* sdx) noexcept {
  constexpr std::size_t chunk_bytes = 4 * Bits;
  const std::size_t chunks = l.cols / 32;
  const std::size_t per_group = l.group_size / 32;
  // Per chunk: sdx = scale·dx; the zero-point term Σ s·z·dx·Σxq.
  float zero_term = 0.f;
  std::size_t c = 0;
  if (per_group == 1 || per_group == 2 || per_group == 4) {  // groups of 32/64/128: 16 chunks a step
    const unsigned shift = per_group == 1 ? 0 : per_group == 2 ? 1 : 2;
    const __m512i lane_group = _mm512_srli_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), shift);
    const __mmask16 groups_mask = static_cast<__mmask16>((1u << (16u >> shift)) - 1u);
    __m512 zt = _mm512_setzero_ps();
    const __m512 zs = _mm512_set1_ps(l.symmetric_zero);
    for (; c + 16 <= chunks; c += 16) {
      const std::size_t g0 = c >> shift;
      // Masked loads: never read past this row's scales (or zeros).
      const __m512 s = _mm512_permutexvar_ps(
          lane_group, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(groups_mask, row + l.scales_offset + 2 * g0)));
      const __m512 z = l.affine ? _mm512_permutexvar_ps(lane_group, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                                                                        groups_mask, row + l.zeros_offset + 2 * g0)))
                                : zs;
      _mm512_storeu_ps(sdx + c, _mm512_mul_ps(s, _mm512_loadu_ps(a.dx + c)));
      zt = _mm512_fmadd_ps(_mm512_mul_ps(s, z), _mm512_loadu_ps(a.dx_sum + c), zt);
    }
    zero_term = _mm512_reduce_add_ps(zt);
  }
  // The rest group by group (no division per chunk: it costs more than the chunk itself).
  for (std::size_t g = per_group ? c / per_group : 0; c < chunks; ++g) {
    const float s = avx512::half_to_float(row + l.scales_offset + 2 * g);
    const float z = l.affine ? avx512::half_to_float(row + l.zeros_offset + 2 * g) : l.symmetric_zero;
    const std::size_t end = per_group ? std::min(chunks, (g + 1) * per_group) : chunks;
    for (; c < end; ++c) {
      sdx[c] = s * a.dx[c];
      zero_term += s * z * a.dx_sum[c];
    }
  }
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
  const __m512i parity = lane_parity<Bits>();
  c = 0;
  for (; c + 4 <= chunks; c += 4) {  // two pairs per step: independent accumulators
    const __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes64<Bits>(row + c * chunk_bytes),
                                           _mm512_loadu_si512(a.xq + 32 * c));
    const __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                           codes64<Bits>(row + (c + 2) * chunk_bytes),
                                           _mm512_loadu_si512(a.xq + 32 * (c + 2)));
    const __m512 s0 = _mm512_permutexvar_ps(parity, _mm512_castps128_ps512(_mm_castsi128_ps(
                                                        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sdx + c)))));
    const __m512 s1 = _mm512_permutexvar_ps(parity, _mm512_castps128_ps512(_mm_castsi128_ps(
                                                        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sdx + c + 2)))));
    acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), s0, acc0);
    acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), s1, acc1);
  }
  for (; c + 2 <= chunks; c += 2) {
    const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes64<Bits>(row + c * chunk_bytes),
                                          _mm512_loadu_si512(a.xq + 32 * c));
    const __m512 s = _mm512_permutexvar_ps(parity, _mm512_castps128_ps512(_mm_castsi128_ps(
                                                       _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sdx + c)))));
    acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc0);
  }
  float total = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  if (c < chunks) {  // a last single chunk
    const __m256i d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes32<Bits>(row + c * chunk_bytes),
                                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + 32 * c)));
    const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(sdx[c]));
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
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

}  // namespace moekit::detail::avx512_int8

#pragma GCC diagnostic pop

#endif
