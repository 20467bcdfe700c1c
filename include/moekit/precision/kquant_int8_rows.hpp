#pragma once
/// \file The portable int8-activation row dots of the GGUF K-quant formats: what the AVX-512
/// and AVX2 kernels compute, in plain C++ (the generic ISA, and the definition the SIMD kernels
/// are tested beside). Per sub-block an exact integer Σ q·xq, weighted by the scales as
/// kquant_activation.hpp describes for each format.

#include <cstddef>
#include <cstdint>

#include "moekit/core/precision.hpp"
#include "moekit/precision/gguf_q2_k.hpp"
#include "moekit/precision/gguf_q3_k.hpp"
#include "moekit/precision/gguf_q4_k.hpp"
#include "moekit/precision/gguf_q5_k.hpp"
#include "moekit/precision/gguf_q6_k.hpp"
#include "moekit/precision/kquant_activation.hpp"

namespace moekit::scalar_kquant {

/// A q4_k row of `blocks` super-blocks · the prepared activation: per block,
/// d·dx·Σ_j sc_j·(Σ q·xq)_j − dmin·dx·Σ_j m_j·(Σ xq)_j, the sums in integers. Q5: q5_k rows
/// (the same scales, a fifth bit per code).
template <bool Q5 = false>
float q4_k_row_dot(const std::byte* row, std::size_t blocks, const KQuantActivation& a) noexcept {
  float acc = 0, mins = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* block = row + b * (Q5 ? q5_k::block_bytes : q4_k::block_bytes);
    std::uint8_t sc[8], m[8];
    q4_k::scales_mins(block, sc, m);
    const auto* qs = reinterpret_cast<const std::uint8_t*>(block + q4_k::codes_offset);
    int codes = 0, sums = 0;
    for (std::size_t j = 0; j < 8; ++j) {
      const std::uint8_t* q = qs + 32 * (j / 2);
      const std::int8_t* xq = a.xq + 256 * b + 32 * detail::q4_k_chunk_slot(j);
      const int shift = 4 * (j % 2);
      int s = 0;
      for (std::size_t l = 0; l < 32; ++l) {
        const int code =
            Q5 ? static_cast<int>(q5_k::code(block, 32 * j + l)) : (q[l] >> shift) & 15;
        s += code * xq[l];
      }
      codes += sc[j] * s;
      sums += m[j] * a.sums[8 * b + j];
    }
    acc += q4_k::d_of(block) * a.dx[b] * static_cast<float>(codes);
    mins += q4_k::dmin_of(block) * a.dx[b] * static_cast<float>(sums);
  }
  return acc - mins;
}

/// A q6_k row of `blocks` super-blocks · the prepared activation: Σ g·dx·(Σ q·xq − 32·Σ xq)
/// per sub-block, g = d·scale.
inline float q6_k_row_dot(const std::byte* row, std::size_t blocks,
                          const KQuantActivation& a) noexcept {
  float acc = 0, offset = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* block = row + b * q6_k::block_bytes;
    const float d = q6_k::d_of(block);
    const std::int8_t* xq = a.xq + 256 * b;
    for (std::size_t s = 0; s < 16; ++s) {
      int t = 0;
      for (std::size_t i = 16 * s; i < 16 * s + 16; ++i)
        t += static_cast<int>(q6_k::code(block, i)) * xq[i];
      const float g = d * static_cast<float>(q6_k::scale(block, s));
      acc += g * a.dx[16 * b + s] * static_cast<float>(t);
      offset += g * a.dx_sum[16 * b + s];
    }
  }
  return acc - 32.f * offset;
}

/// A q2_k row of `blocks` super-blocks · the prepared activation: per block,
/// d·dx·Σ_s sc_s·(Σ q·xq)_s − dmin·dx·Σ_s m_s·(Σ xq)_s over its 16 sub-blocks, the sums in
/// integers.
inline float q2_k_row_dot(const std::byte* row, std::size_t blocks,
                          const KQuantActivation& a) noexcept {
  float acc = 0, mins = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* block = row + b * q2_k::block_bytes;
    const std::int8_t* xq = a.xq + 256 * b;
    int codes = 0, sums = 0;
    for (std::size_t s = 0; s < 16; ++s) {
      int t = 0;
      for (std::size_t i = 16 * s; i < 16 * s + 16; ++i)
        t += static_cast<int>(q2_k::code(block, i)) * xq[i];
      codes += static_cast<int>(q2_k::scale(block, s)) * t;
      sums += static_cast<int>(q2_k::min(block, s)) * a.sums[16 * b + s];
    }
    acc += q2_k::d_of(block) * a.dx[b] * static_cast<float>(codes);
    mins += q2_k::dmin_of(block) * a.dx[b] * static_cast<float>(sums);
  }
  return acc - mins;
}

/// A q3_k row of `blocks` super-blocks · the prepared activation: per block,
/// d·dx·Σ_s sc_s·(Σ u·xq − 4·Σ xq)_s over its 16 sub-blocks (u the unsigned 3-bit code, q = u − 4),
/// the sums in integers.
inline float q3_k_row_dot(const std::byte* row, std::size_t blocks,
                          const KQuantActivation& a) noexcept {
  float acc = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* block = row + b * q3_k::block_bytes;
    const std::int8_t* xq = a.xq + 256 * b;
    std::int8_t sc[16];
    q3_k::scales(block, sc);
    int total = 0;
    for (std::size_t s = 0; s < 16; ++s) {
      int t = 0;
      for (std::size_t i = 16 * s; i < 16 * s + 16; ++i)
        t += static_cast<int>(q3_k::code(block, i)) * xq[i];
      total += sc[s] * (t - 4 * a.sums[16 * b + s]);
    }
    acc += q3_k::d_of(block) * a.dx[b] * static_cast<float>(total);
  }
  return acc;
}

/// A row of K-quant format `p` (q2_k .. q6_k) of `blocks` super-blocks · the activation
/// `prepare_kquant` rounded for `p`.
inline float row_dot(Precision p, const std::byte* row, std::size_t blocks,
                     const KQuantActivation& a) noexcept {
  if (p == Precision::q2_k) return q2_k_row_dot(row, blocks, a);
  if (p == Precision::q3_k) return q3_k_row_dot(row, blocks, a);
  if (p == Precision::q6_k) return q6_k_row_dot(row, blocks, a);
  if (p == Precision::q5_k) return q4_k_row_dot<true>(row, blocks, a);
  return q4_k_row_dot(row, blocks, a);
}

}  // namespace moekit::scalar_kquant
