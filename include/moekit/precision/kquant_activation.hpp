#pragma once
/// \file The activation of a GEMV over GGUF K-quant rows (q2_k .. q6_k), rounded to int8.
///
/// q6_k: per 32-value chunk as the other int8 kernels round it (dx = max|x|/127, ggml's q8_0;
/// error ≤ dx/2 = max|x|/254 per element of the chunk), with dx and dx·Σxq per 16-weight
/// sub-block, so that the code offset 32 of each sub-block is one product:
/// Σ g·(q − 32)·x ≈ g·dx·(Σ q·xq − 32·Σ xq).
///
/// q4_k, q5_k, q2_k and q3_k: per 256-value super-block (dx = max|x|/127 over the block, as
/// ggml's q8_K; error ≤ max|x|/254 of the block), with the integer Σ xq of each sub-block (32
/// weights for q4_k and q5_k, 16 for q2_k and q3_k): one activation scale per block lets the
/// kernels weight the sub-blocks' integer sums by their scales in integers (`vpdpwssd` /
/// `vpmaddwd`) and convert once per block, which the q4_k kernels need to keep up with the memory
/// (bench/RESULTS.md); the minimums (q4_k, q5_k, q2_k: Σ_s m_s·Σxq_s) and q3_k's code offset 4
/// (Σ_s sc_s·4·Σxq_s) are integers too. q5_k has q4_k's scales and sub-blocks, and its activation.
///
/// Order of the codes: q6_k's, q2_k's and q3_k's are in column order. q4_k's (and q5_k's) are per
/// super-block in the order its codes unpack from 64 bytes: the low nibbles of qs[0..63] are
/// sub-blocks 0 and 2, the high nibbles 1 and 3, and so on, so the activation of each unpacked
/// 64-byte vector is one load.
/// This scalar version is the definition (and the generic path); the AVX-512 and AVX2 ones
/// (detail/avx512_kquant_rows.hpp, detail/avx2_kquant_rows.hpp; `prepare_kquant` with an `Isa`
/// in gemv.hpp) give the same bytes.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "moekit/core/precision.hpp"

namespace moekit {

/// Prepared activation of K-quant rows; views into caller-owned storage.
struct KQuantActivation {
  const std::int8_t* xq = nullptr;     ///< cols codes, in the format's order (file comment)
  const float* dx = nullptr;           ///< q6_k: per 16-weight sub-block; others: per super-block
  const float* dx_sum = nullptr;       ///< q6_k: dx·Σ xq per sub-block (others: none)
  const std::int16_t* sums = nullptr;  ///< the others: Σ xq per sub-block (q6_k: none)
};

/// Weights per sub-block of a K-quant format: the span of one scale.
constexpr std::size_t kquant_sub_block(Precision p) noexcept {
  return p == Precision::q4_k || p == Precision::q5_k ? 32 : 16;
}

/// True for the formats whose activation has one scale per super-block (all but q6_k).
constexpr bool kquant_block_scaled(Precision p) noexcept { return p != Precision::q6_k; }

/// True for the formats whose activation is in q4_k's chunk order (q4_k, q5_k; file comment).
constexpr bool kquant_chunk_order(Precision p) noexcept {
  return p == Precision::q4_k || p == Precision::q5_k;
}

namespace detail {

/// Where chunk j (0..7) of a q4_k super-block's activation goes: 0 2 1 3 4 6 5 7.
constexpr std::size_t q4_k_chunk_slot(std::size_t j) noexcept {
  return (j & 4) | (j & 1) << 1 | (j & 2) >> 1;
}

/// The scale and the codes of `n` values rounded to int8 (round to nearest even) into q.
inline float round_int8(const float* x, std::size_t n, std::int8_t* q) noexcept {
  float amax = 0;
  for (std::size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float inv = amax > 0 ? 127.f / amax : 0.f;
  for (std::size_t i = 0; i < n; ++i)
    q[i] = static_cast<std::int8_t>(
        std::clamp(static_cast<int>(std::nearbyint(x[i] * inv)), -127, 127));
  return amax / 127.f;
}

}  // namespace detail

/// Storage of a prepared activation: q (cols codes), f (floats), s (int16 sums).
struct KQuantStorage {
  std::vector<std::int8_t> q;
  std::vector<float> f;
  std::vector<std::int16_t> s;

  /// Grows the storage for `cols` values of rows in format `p`.
  void grow(std::size_t cols, Precision p) {
    if (q.size() < cols) q.resize(cols);
    if (f.size() < cols / 8) f.resize(cols / 8);  // q6_k: dx and dx·Σxq per 16; others: fewer
    const std::size_t sums = cols / kquant_sub_block(p);
    if (kquant_block_scaled(p) && s.size() < sums) s.resize(sums);
  }
  /// The view of the prepared activation in this storage.
  KQuantActivation view(std::size_t cols, Precision p) const noexcept {
    if (kquant_block_scaled(p)) return {q.data(), f.data(), nullptr, s.data()};
    return {q.data(), f.data(), f.data() + cols / 16, nullptr};
  }
};

/// Rounds x (cols, a multiple of 256) for rows of format `p` into `st`: the definition (and the
/// generic path) the vectorised preparations give the bytes of.
inline KQuantActivation prepare_kquant(const float* x, std::size_t cols, Precision p,
                                       KQuantStorage& st) {
  using detail::q4_k_chunk_slot, detail::round_int8;
  st.grow(cols, p);
  std::int8_t* xq = st.q.data();
  float* dx = st.f.data();
  if (kquant_block_scaled(p)) {
    const std::size_t sub = kquant_sub_block(p);
    std::int16_t* sums = st.s.data();
    for (std::size_t b = 0; b < cols / 256; ++b) {
      std::int8_t codes[256];
      dx[b] = round_int8(x + 256 * b, 256, codes);
      for (std::size_t j = 0; j < 8; ++j) {
        const std::size_t slot = kquant_chunk_order(p) ? q4_k_chunk_slot(j) : j;
        for (std::size_t i = 0; i < 32; ++i) xq[256 * b + 32 * slot + i] = codes[32 * j + i];
      }
      for (std::size_t s = 0; s < 256 / sub; ++s) {
        int sum = 0;
        for (std::size_t i = sub * s; i < sub * s + sub; ++i) sum += codes[i];
        sums[256 / sub * b + s] = static_cast<std::int16_t>(sum);
      }
    }
    return st.view(cols, p);
  }
  float* dxs = dx + cols / 16;
  for (std::size_t c = 0; c < cols; c += 32) {
    const float d = round_int8(x + c, 32, xq + c);
    for (std::size_t h = 0; h < 2; ++h) {
      int sum = 0;
      for (std::size_t i = 16 * h; i < 16 * h + 16; ++i) sum += xq[c + i];
      dx[c / 16 + h] = d;
      dxs[c / 16 + h] = d * static_cast<float>(sum);
    }
  }
  return st.view(cols, p);
}

namespace detail {

/// The vectorised preparations' loop (detail/avx512_kquant_rows.hpp, detail/avx2_kquant_rows.hpp),
/// the same values as prepare_kquant: `MaxAbs(x, n)` is max |x| over n values, `Round(x, inv, q)`
/// rounds 32 values times inv into q and returns the code sums of their two halves; both are an
/// ISA's (called, not inlined: this runs once per GEMV).
template <auto MaxAbs, auto Round>
KQuantActivation prepare_kquant_with(const float* x, std::size_t cols, Precision p,
                                     KQuantStorage& st) {
  st.grow(cols, p);
  std::int8_t* xq = st.q.data();
  float* dx = st.f.data();
  const std::size_t span = kquant_block_scaled(p) ? 256 : 32;  // values per activation scale
  for (std::size_t c = 0; c < cols; c += span) {
    const float amax = MaxAbs(x + c, span);
    const float d = amax / 127.f, inv = amax > 0 ? 127.f / amax : 0.f;
    if (kquant_block_scaled(p)) {
      dx[c / 256] = d;
      for (std::size_t j = 0; j < 8; ++j) {
        const std::size_t slot = kquant_chunk_order(p) ? q4_k_chunk_slot(j) : j;
        const auto [s0, s1] = Round(x + c + 32 * j, inv, xq + c + 32 * slot);
        if (kquant_sub_block(p) == 32) {
          st.s[c / 32 + j] = static_cast<std::int16_t>(s0 + s1);
        } else {
          st.s[c / 16 + 2 * j] = static_cast<std::int16_t>(s0);
          st.s[c / 16 + 2 * j + 1] = static_cast<std::int16_t>(s1);
        }
      }
    } else {
      const auto [s0, s1] = Round(x + c, inv, xq + c);
      float* dxs = dx + cols / 16;
      dx[c / 16] = dx[c / 16 + 1] = d;
      dxs[c / 16] = d * static_cast<float>(s0);
      dxs[c / 16 + 1] = d * static_cast<float>(s1);
    }
  }
  return st.view(cols, p);
}

}  // namespace detail

}  // namespace moekit
