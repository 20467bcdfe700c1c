#pragma once
/// \file The int8-activation GEMM of GGUF K-quant rows (q2_k .. q6_k; `gemm` with
/// `KernelOptions::int8_activations` and n >= 2): every token's activation rounded once per call
/// (kquant_activation.hpp, as the GEMV rounds it), then groups of rows over slices of tokens,
/// each (4 rows, 1 token) pair of the group through the GEMV's multi-row kernel of the path
/// (detail/avx512_kquant_rows.hpp, detail/avx2_kquant_rows.hpp, kquant_int8_rows.hpp), so the
/// group's bytes stay in L2 while the slice passes over them instead of the float path's decode
/// to f32 per row.
///
/// A token's result does not depend on the batch: which rows share a kernel call is fixed by the
/// row index alone (groups of kquant_group_rows from row 0, fours from the group's start, the
/// last rows one by one), every row has its own accumulators in that call, and a token's activation
/// is rounded from its own values only; so each (row, token) pair runs the same instructions on the
/// same inputs whatever the batch, the slice or the thread.
///
/// Not done yet (issue 23 point 3): the scales are decoded per (row, token) pair, as the GEMV
/// does, not once per group of rows; no repacked panel tile as int8_gemm.hpp has for q8/q4/q2.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "moekit/core/precision.hpp"
#include "moekit/precision/detail/avx2_kquant_rows.hpp"
#include "moekit/precision/detail/avx512_kquant_rows.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/kquant_activation.hpp"
#include "moekit/precision/kquant_int8_rows.hpp"
#include "moekit/precision/thread_pool.hpp"

namespace moekit::detail {

/// Which row kernels run a K-quant int8 GEMM (the caller has checked the CPU).
enum class KQuantGemmPath : std::uint8_t {
  scalar,       ///< kquant_int8_rows.hpp
  avx2,         ///< avx2_kquant_rows.hpp, vpmaddubsw
  avx_vnni,     ///< avx2_kquant_rows.hpp, AVX-VNNI (not q2_k / q3_k: the caller picks avx2)
  avx512_vnni,  ///< avx512_kquant_rows.hpp (q2_k / q3_k: with GFNI and VBMI)
};

/// The prepared activations of a batch (storage reused from call to call, per thread).
struct KQuantTokens {
  std::vector<KQuantStorage> storage;
  std::vector<KQuantActivation> acts;
};

/// Rounds the n tokens of x (n × cols) for rows of format p into `tk`, split over `pool`.
inline void prepare_kquant_tokens(const float* x, std::size_t n, std::size_t cols, Precision p,
                                  KQuantGemmPath path, ThreadPool* pool, KQuantTokens& tk) {
  if (tk.storage.size() < n) tk.storage.resize(n);
  tk.acts.resize(n);
  auto body = [&](std::size_t b, std::size_t e) {
    for (std::size_t t = b; t < e; ++t) {
      const float* xt = x + t * cols;
#if defined(MOEKIT_HAS_X86_KERNELS)
      if (path == KQuantGemmPath::avx512_vnni) {
        tk.acts[t] = avx512_kquant::prepare(xt, cols, p, tk.storage[t]);
        continue;
      }
      if (path != KQuantGemmPath::scalar) {
        tk.acts[t] = avx2_kquant::prepare(xt, cols, p, tk.storage[t]);
        continue;
      }
#endif
      tk.acts[t] = prepare_kquant(xt, cols, p, tk.storage[t]);
    }
  };
  if (pool && n >= 8)
    pool->parallel_for(0, n, std::max<std::size_t>(1, n / (2 * pool->size())), body);
  else
    body(0, n);
}

/// Rows per group: about 512 KiB of rows, which stay in L2 while a slice passes over them, and
/// which each token's slice is read from L3 for once (16-row groups read a 512-token batch's
/// activations 4–14× as often and ran slower at n = 512 than at 128: bench/RESULTS.md, "Prefill
/// GEMM on GGUF K-quants"). Depends on the row's size only, never on the batch.
inline std::size_t kquant_group_rows(std::size_t row_bytes) noexcept {
  const std::size_t g =
      std::clamp<std::size_t>((512 * 1024) / std::max<std::size_t>(row_bytes, 1), 16, 256);
  return g / 4 * 4;
}

/// Rows per kernel call, sharing each activation load (the GEMV's widest streaming).
inline constexpr std::size_t kquant_tile_rows = 4;

/// Tokens per slice: about 256 KiB of int8 activation, so the slice stays in L2 too.
inline std::size_t kquant_slice_tokens(std::size_t cols) noexcept {
  return std::clamp<std::size_t>((256 * 1024) / std::max<std::size_t>(cols, 1), 1, 64);
}

/// out[i] = rows[i] · a for i < N through the kernels of `path` for format P.
template <Precision P, std::size_t N>
void kquant_tile(KQuantGemmPath path, const std::byte* const* rows, std::size_t blocks,
                 const KQuantActivation& a, float* out) noexcept {
#if defined(MOEKIT_HAS_X86_KERNELS)
  constexpr bool q6 = P == Precision::q6_k, q5 = P == Precision::q5_k;
  constexpr bool q2 = P == Precision::q2_k, q3 = P == Precision::q3_k;
  if (path == KQuantGemmPath::avx512_vnni) {
    if constexpr (q6) return avx512_kquant::q6_k_row_dots<N>(rows, blocks, a, out, nullptr);
    if constexpr (q2) return avx512_kquant::q2_k_row_dots<N>(rows, blocks, a, out, nullptr);
    if constexpr (q3) return avx512_kquant::q3_k_row_dots<N>(rows, blocks, a, out, nullptr);
    if constexpr (!q6 && !q2 && !q3)
      return avx512_kquant::q4_k_row_dots<N, q5>(rows, blocks, a, out, nullptr);
  }
  if (path == KQuantGemmPath::avx2 || path == KQuantGemmPath::avx_vnni) {
    const bool vnni = path == KQuantGemmPath::avx_vnni;
    for (std::size_t i = 0; i < N; ++i) {
      if constexpr (q6)
        out[i] = vnni ? avx2_kquant::q6_k_row_dot<true>(rows[i], blocks, a, nullptr)
                      : avx2_kquant::q6_k_row_dot<false>(rows[i], blocks, a, nullptr);
      else if constexpr (q2)
        out[i] = avx2_kquant::q2_k_row_dot(rows[i], blocks, a, nullptr);
      else if constexpr (q3)
        out[i] = avx2_kquant::q3_k_row_dot(rows[i], blocks, a, nullptr);
      else
        out[i] = vnni ? avx2_kquant::q4_k_row_dot<true, q5>(rows[i], blocks, a, nullptr)
                      : avx2_kquant::q4_k_row_dot<false, q5>(rows[i], blocks, a, nullptr);
    }
    return;
  }
#endif
  for (std::size_t i = 0; i < N; ++i) out[i] = scalar_kquant::row_dot(P, rows[i], blocks, a);
}

/// y as kquant_int8_gemm for the row groups [g0, g1): per group, slice by slice, every token
/// through fours of the group's rows (the rows after the last four one by one).
template <Precision P>
void kquant_row_groups(const MatrixView& w, const KQuantTokens& tk, std::size_t n, float* y,
                       KQuantGemmPath path, float scale, bool accumulate, std::size_t g0,
                       std::size_t g1) {
  constexpr std::size_t R = kquant_tile_rows;
  const RowLayout l = w.layout();
  const std::size_t slice = kquant_slice_tokens(l.cols);
  auto store = [&](std::size_t t, std::size_t r, float v) {
    float& dst = y[t * w.rows + r];
    dst = accumulate ? dst + scale * v : scale * v;
  };
  const std::size_t group = kquant_group_rows(l.bytes);
  for (std::size_t g = g0; g < g1; ++g) {
    const std::size_t r0 = g * group, r1 = std::min(w.rows, r0 + group);
    for (std::size_t t0 = 0; t0 < n; t0 += slice) {
      const std::size_t t1 = std::min(n, t0 + slice);
      std::size_t r = r0;
      for (; r + R <= r1; r += R) {
        const std::byte* rows[R];
        for (std::size_t i = 0; i < R; ++i) rows[i] = w.row(r + i);
        for (std::size_t t = t0; t < t1; ++t) {
          float out[R];
          kquant_tile<P, R>(path, rows, l.groups, tk.acts[t], out);
          for (std::size_t i = 0; i < R; ++i) store(t, r + i, out[i]);
        }
      }
      for (; r < r1; ++r) {
        const std::byte* row = w.row(r);
        for (std::size_t t = t0; t < t1; ++t) {
          float out;
          kquant_tile<P, 1>(path, &row, l.groups, tk.acts[t], &out);
          store(t, r, out);
        }
      }
    }
  }
}

/// Y = scale·X·Wᵀ (+= Y when `accumulate`) with int8 activations: X is n × cols, Y n × rows,
/// `w` K-quant rows (MatrixOrder::rows).
inline void kquant_int8_gemm(const MatrixView& w, const float* x, std::size_t n, float* y,
                             KQuantGemmPath path, ThreadPool* pool, float scale, bool accumulate) {
  thread_local KQuantTokens storage;
  KQuantTokens& tk = storage;  // by name, a thread_local in the workers' lambdas would be theirs
  prepare_kquant_tokens(x, n, w.cols, w.precision, path, pool, tk);
  const std::size_t group = kquant_group_rows(w.layout().bytes);
  const std::size_t groups = (w.rows + group - 1) / group;
  auto body = [&](std::size_t g0, std::size_t g1) {
    auto run = [&]<Precision P>() {
      kquant_row_groups<P>(w, tk, n, y, path, scale, accumulate, g0, g1);
    };
    switch (w.precision) {
      case Precision::q2_k:
        return run.template operator()<Precision::q2_k>();
      case Precision::q3_k:
        return run.template operator()<Precision::q3_k>();
      case Precision::q5_k:
        return run.template operator()<Precision::q5_k>();
      case Precision::q6_k:
        return run.template operator()<Precision::q6_k>();
      default:
        return run.template operator()<Precision::q4_k>();
    }
  };
  if (pool)
    pool->parallel_for(0, groups, std::max<std::size_t>(1, groups / (4 * pool->size())), body);
  else
    body(0, groups);
}

}  // namespace moekit::detail
