#pragma once
/// \file The activation of a GEMV over GGUF K-quant rows (q4_k, q6_k), rounded to int8 per
/// 32-value chunk as the other int8 kernels round it (dx = max|x|/127, ggml's q8_0; error
/// ≤ dx/2 = max|x|/254 per element of the chunk), with the scale and dx·Σxq per sub-block of the
/// format (32 weights for q4_k, 16 for q6_k) so that each sub-block's minimum or code offset is
/// one product: Σ (a·q − b)·x ≈ a·dx·Σ q·xq − b·(dx·Σ xq).
///
/// Order of the codes: q6_k's are in column order. q4_k's are per super-block in the order its
/// codes unpack from 64 bytes: the low nibbles of qs[0..63] are sub-blocks 0 and 2, the high
/// nibbles 1 and 3, and so on, so the activation of each unpacked 64-byte vector is one load.
/// Once per GEMV, O(cols): scalar.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "moekit/core/precision.hpp"

namespace moekit::detail {

/// Prepared activation of K-quant rows; views into caller-owned storage.
struct KQuantActivation {
  const std::int8_t* xq = nullptr;  ///< cols codes, in the format's order (file comment)
  const float* dx = nullptr;        ///< per sub-block, column order: its chunk's scale
  const float* dx_sum = nullptr;    ///< per sub-block: dx·Σ xq over it
};

/// Weights per sub-block of a K-quant format: the span of one scale.
constexpr std::size_t kquant_sub_block(Precision p) noexcept {
  return p == Precision::q6_k ? 16 : 32;
}

/// Where chunk j (0..7) of a q4_k super-block's activation goes: 0 2 1 3 4 6 5 7.
constexpr std::size_t q4_k_chunk_slot(std::size_t j) noexcept {
  return (j & 4) | (j & 1) << 1 | (j & 2) >> 1;
}

/// Rounds x (cols, a multiple of 256) for rows of format `p` into `q` and `f` (grown as needed).
inline KQuantActivation prepare_kquant(const float* x, std::size_t cols, Precision p,
                                       std::vector<std::int8_t>& q, std::vector<float>& f) {
  const std::size_t sub = kquant_sub_block(p), subs = cols / sub;
  if (q.size() < cols) q.resize(cols);
  if (f.size() < 2 * subs) f.resize(2 * subs);
  std::int8_t* xq = q.data();
  float* dx = f.data();
  float* dxs = dx + subs;
  for (std::size_t c = 0; c < cols; c += 32) {
    float amax = 0;
    for (std::size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[c + i]));
    const float d = amax / 127.f, inv = amax > 0 ? 127.f / amax : 0.f;
    std::size_t at = c;  // where the chunk's codes go
    if (p == Precision::q4_k) at = c / 256 * 256 + 32 * q4_k_chunk_slot(c % 256 / 32);
    int sums[2] = {0, 0};
    for (std::size_t i = 0; i < 32; ++i) {
      const int v = static_cast<int>(std::nearbyint(x[c + i] * inv));
      xq[at + i] = static_cast<std::int8_t>(std::clamp(v, -127, 127));
      sums[i / 16] += xq[at + i];
    }
    if (sub == 32) {
      dx[c / 32] = d;
      dxs[c / 32] = d * static_cast<float>(sums[0] + sums[1]);
    } else {
      for (std::size_t h = 0; h < 2; ++h) {
        dx[c / 16 + h] = d;
        dxs[c / 16 + h] = d * static_cast<float>(sums[h]);
      }
    }
  }
  return {xq, dx, dxs};
}

}  // namespace moekit::detail
