#pragma once
/// \file Per-call preparation of an activation vector for the fast row kernels.
///
/// The kernels decode 32 weights (one "chunk") at a time. q4 and q2 unpack a chunk as bit planes
/// (all low nibbles, then all high nibbles; or the four 2-bit planes), which yields the weights in
/// a fixed permuted order; instead of shuffling every weight back, the activation is permuted once
/// per call to match (cost O(cols), amortised over all rows). Group sums of x let affine and
/// symmetric rows share one inner loop: Σ s·(q − z)·x = s·Σ q·x − s·z·Σ x.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "moekit/core/precision.hpp"
#include "moekit/precision/format.hpp"

namespace moekit::detail {

/// Position within a 32-weight chunk that weight `i` (0..31) takes in the kernels' decode order.
constexpr std::size_t chunk_slot(unsigned bits, std::size_t i) noexcept {
  if (bits == 4) return (i % 2) * 16 + i / 2;  // low nibbles (even i) then high nibbles (odd i)
  if (bits == 2) return (i % 4) * 8 + i / 4;   // plane k holds weights 4j + k
  return i;
}

/// The activation in decode order plus per-group sums; views into caller-owned storage.
struct PreparedActivation {
  const float* xp = nullptr;          ///< x permuted chunk by chunk (x itself when no permutation)
  const float* x = nullptr;           ///< x in column order (for the tail of a row)
  const float* group_sums = nullptr;  ///< Σ x over each group (quantized formats)
};

/// Fills `storage` and returns the prepared view of x for rows laid out as `l` at precision `p`.
inline PreparedActivation prepare_activation(const float* x, const RowLayout& l, Precision p,
                                             std::vector<float>& storage) {
  const bool permute = p == Precision::q4 || p == Precision::q2;
  const std::size_t need = (permute ? l.cols : 0) + l.groups;
  if (storage.size() < need) storage.resize(need);
  PreparedActivation a{x, x, storage.data()};
  float* sums = storage.data();
  if (permute) {
    float* xp = storage.data();
    sums = xp + l.cols;
    const std::size_t full = l.cols / 32 * 32;
    for (std::size_t c = 0; c < full; c += 32)
      for (std::size_t i = 0; i < 32; ++i) xp[c + chunk_slot(l.bits, i)] = x[c + i];
    for (std::size_t c = full; c < l.cols; ++c) xp[c] = x[c];
    a.xp = xp;
  }
  for (std::size_t g = 0; g < l.groups; ++g) {
    const std::size_t b = g * l.group_size;
    const std::size_t e = b + l.group_size < l.cols ? b + l.group_size : l.cols;
    float s = 0;
    for (std::size_t c = b; c < e; ++c) s += x[c];
    sums[g] = s;
  }
  a.group_sums = sums;
  return a;
}

/// A token's activation rounded to int8 per 32-value chunk (ggml's q8_0: dx = max|x|/127), for
/// the int8 kernels: codes in the order the kernels read them (avx512_int8_rows.hpp; column
/// order for the scalar GEMM), per chunk the scale dx and dx·Σxq (for the zero-point term).
struct Int8Activation {
  const std::int8_t* xq = nullptr;
  const float* dx = nullptr;
  const float* dx_sum = nullptr;
  const float* x = nullptr;  ///< the float activation (columns after the last whole chunk)
};

/// What one call of an int8 GEMM tile kernel reads: R rows (codes) with their per-chunk scale s
/// and s·z, and T prepared tokens.
template <std::size_t R, std::size_t T>
struct TileInput {
  const std::byte* rows[R];
  const float* s[R];
  const float* sz[R];
  const Int8Activation* acts[T];
};

}  // namespace moekit::detail
