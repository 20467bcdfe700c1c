#pragma once
/// \file The int8-activation GEMM of GGUF K-quant rows (q2_k .. q6_k; `gemm` with
/// `KernelOptions::int8_activations` and n >= 2): every token's activation rounded once per call
/// (kquant_activation.hpp, as the GEMV rounds it), then one of two routes.
///
/// AVX-512 VNNI on q4_k, q5_k, q6_k, q2_k and q3_k (every batch: kquant_panel_min_tokens): groups
/// of rows repacked once per call into 16-row panels (detail/avx512_kquant_panel_tiles.hpp, lanes =
/// rows, the scales decoded once per call), which every tile of tokens then passes over.
///
/// The others: groups of rows over slices of tokens, each (4 rows, 1 token) pair of the group
/// through the GEMV's multi-row kernel of the path (detail/avx512_kquant_rows.hpp,
/// detail/avx2_kquant_rows.hpp, kquant_int8_rows.hpp), so the group's bytes stay in L2 while the
/// slice passes over them; the scales are decoded per (row, token) pair, as the GEMV does.
///
/// A token's result does not depend on the batch, on either route: which rows share a kernel
/// call or a panel is fixed by the row index alone, every row has its own accumulators (or lane),
/// and a token's activation is rounded from its own values only; so each (row, token) pair runs
/// the same instructions on the same inputs whatever the batch, the slice or the thread. The row
/// route gives the GEMV's result bit for bit; the panel route sums in another order (within float
/// rounding of it), so a token alone (n = 1, the GEMV) and in a batch differ by that rounding.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "moekit/core/precision.hpp"
#include "moekit/precision/detail/avx2_kquant_rows.hpp"
#include "moekit/precision/detail/avx512_kquant_panel_tiles.hpp"
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

/// The token's Σxq per 16-weight sub-block (q6_k, whose activation has dx·Σxq instead) into its
/// storage, as a.sums: the q6_k panel tile takes the code offset in integers.
inline void add_sub_block_sums(std::size_t cols, KQuantStorage& st, KQuantActivation& a) {
  if (st.s.size() < cols / 16) st.s.resize(cols / 16);
  for (std::size_t i = 0; i < cols / 16; ++i) {
    int sum = 0;
    for (std::size_t k = 0; k < 16; ++k) sum += a.xq[16 * i + k];
    st.s[i] = static_cast<std::int16_t>(sum);
  }
  a.sums = st.s.data();
}

/// Rounds the n tokens of x (n × cols) for rows of format p into `tk`, split over `pool`; with
/// `sums16` (q6_k) also add_sub_block_sums.
inline void prepare_kquant_tokens(const float* x, std::size_t n, std::size_t cols, Precision p,
                                  KQuantGemmPath path, ThreadPool* pool, KQuantTokens& tk,
                                  bool sums16 = false) {
  if (tk.storage.size() < n) tk.storage.resize(n);
  tk.acts.resize(n);
  auto body = [&](std::size_t b, std::size_t e) {
    for (std::size_t t = b; t < e; ++t) {
      const float* xt = x + t * cols;
#if defined(MOEKIT_HAS_X86_KERNELS)
      if (path == KQuantGemmPath::avx512_vnni) {
        tk.acts[t] = avx512_kquant::prepare(xt, cols, p, tk.storage[t]);
        if (sums16) add_sub_block_sums(cols, tk.storage[t], tk.acts[t]);
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

/// Which kernels a K-quant int8 GEMM runs: by the batch (kquant_panel_takes), or forced (tests).
enum class KQuantRoute : std::uint8_t { by_batch, rows, panels };

/// Fewest tokens for which the AVX-512 panel path (avx512_kquant_panel_tiles.hpp) runs: every
/// batch. q4_k and q5_k win from 2 tokens; q6_k's and q2_k's row kernels are faster below about 4
/// (the repack per call dominates: bench/RESULTS.md, "Prefill GEMM on GGUF K-quants: the AVX-512
/// panel tile"), but a larger threshold would make a token's result depend on how many tokens
/// share its batch (prefill runs even one-token batches through gemm with n = 2: engine/ops.hpp
/// for_rows).
inline constexpr std::size_t kquant_panel_min_tokens = 2;

/// True for the formats the AVX-512 panel path has a tile for.
constexpr bool kquant_has_panel(Precision p) noexcept {
  return p == Precision::q4_k || p == Precision::q5_k || p == Precision::q6_k ||
         p == Precision::q2_k || p == Precision::q3_k;
}

/// True when a K-quant int8 GEMM of n tokens on `path` runs the panel path.
constexpr bool kquant_panel_takes(Precision p, KQuantGemmPath path, std::size_t n,
                                  KQuantRoute route) noexcept {
  if (path != KQuantGemmPath::avx512_vnni || !kquant_has_panel(p)) return false;
  return route == KQuantRoute::panels ||
         (route == KQuantRoute::by_batch && n >= kquant_panel_min_tokens);
}

#if defined(MOEKIT_HAS_X86_KERNELS)
/// Most rows the panel path repacks at a time.
inline constexpr std::size_t kquant_panel_most_rows = 128;

/// Rows repacked at a time: about 512 KiB of unpacked codes (a byte per weight), which stay in
/// the 1 MiB L2 beside a token tile's activations while every token passes over them (1 MiB
/// groups ran slower on 14336 columns: bench/RESULTS.md, "Prefill GEMM on GGUF K-quants: the
/// AVX-512 panel tile"). Fixed by the row's length alone.
inline std::size_t kquant_panel_group_rows(std::size_t cols) noexcept {
  return avx512_int8::panel_group_rows(cols, 1u << 19, kquant_panel_most_rows);
}

/// Tokens per panel tile: its accumulators (3 per token for q4_k, 4 for q6_k) take 18–24 of the
/// 32 registers (bench/RESULTS.md, "Prefill GEMM on GGUF K-quants: the AVX-512 panel tile").
inline constexpr std::size_t kquant_panel_tokens = 6;

/// int32 values and floats per super-block of a panel of format P.
template <Precision P>
inline constexpr std::size_t kquant_panel_ints =
    P == Precision::q6_k   ? avx512_kquant::q6_k_panel_ints
    : P == Precision::q2_k ? avx512_kquant::q2_k_panel_ints
    : P == Precision::q3_k ? avx512_kquant::q3_k_panel_ints
                           : avx512_kquant::panel_block_ints;
template <Precision P>
inline constexpr std::size_t kquant_panel_reals =
    P == Precision::q6_k   ? avx512_kquant::q6_k_panel_reals
    : P == Precision::q2_k ? avx512_kquant::q2_k_panel_reals
    : P == Precision::q3_k ? avx512_kquant::q3_k_panel_reals
                           : avx512_kquant::panel_block_reals;

/// The repacked panels of one group of rows (storage reused from call to call, per thread).
struct KQuantPanels {
  std::vector<std::byte> codes;  ///< unpacked codes, from code_base (64-byte aligned)
  std::vector<std::int32_t> ints;
  std::vector<float> reals;
  const std::byte* rows[kquant_panel_most_rows];  ///< each row's bytes (the last one repeated)
  std::byte* code_base = nullptr;
};

/// Repacks rows [r0, r0 + rn) of `w` (rn <= kquant_panel_most_rows) into `pk`: panels of 16 rows,
/// the last rows repeated up to a whole panel.
template <Precision P>
void kquant_pack_group(const MatrixView& w, std::size_t r0, std::size_t rn, KQuantPanels& pk) {
  using namespace avx512_kquant;
  constexpr std::size_t H = avx512_int8::panel_height;
  constexpr std::size_t ints = kquant_panel_ints<P>, reals = kquant_panel_reals<P>;
  const std::size_t blocks = w.cols / 256, panels = (rn + H - 1) / H;
  pk.codes.resize(panels * blocks * panel_block_codes + 64);
  pk.ints.resize(panels * blocks * ints);
  pk.reals.resize(panels * blocks * reals);
  const auto base = reinterpret_cast<std::uintptr_t>(pk.codes.data());
  pk.code_base = pk.codes.data() + ((64 - base % 64) % 64);
  for (std::size_t i = 0; i < panels * H; ++i) pk.rows[i] = w.row(r0 + std::min(i, rn - 1));
  for (std::size_t p = 0; p < panels; ++p) {
    std::byte* codes = pk.code_base + p * blocks * panel_block_codes;
    std::int32_t* in = pk.ints.data() + p * blocks * ints;
    float* re = pk.reals.data() + p * blocks * reals;
    if constexpr (P == Precision::q6_k)
      pack_q6_k_panel(pk.rows + p * H, blocks, codes, in, re);
    else if constexpr (P == Precision::q2_k)
      pack_q2_k_panel(pk.rows + p * H, blocks, codes, in, re);
    else if constexpr (P == Precision::q3_k)
      pack_q3_k_panel(pk.rows + p * H, blocks, codes, in, re);
    else
      pack_q4_k_panel<P == Precision::q5_k>(pk.rows + p * H, blocks, codes, in, re);
  }
}

/// The panel tile of format P for the first k + 1 tokens of its input, k < kquant_panel_tokens.
template <Precision P, std::size_t... K>
constexpr auto kquant_panel_fns(std::index_sequence<K...>) {
  if constexpr (P == Precision::q6_k)
    return std::array{&avx512_kquant::q6_k_panel_dots<K + 1>...};
  else if constexpr (P == Precision::q2_k || P == Precision::q3_k)  // one layout (q3_k_panel_ints)
    return std::array{&avx512_kquant::q2_k_panel_dots<K + 1>...};
  else
    return std::array{&avx512_kquant::q4_k_panel_dots<K + 1>...};
}

/// y as kquant_int8_gemm for the row groups [g0, g1) of kquant_panel_group_rows: each group
/// repacked (kquant_pack_group), then every token tile over each of its panels.
template <Precision P>
void kquant_panel_groups(const MatrixView& w, const KQuantTokens& tk, std::size_t n, float* y,
                         float scale, bool accumulate, std::size_t g0, std::size_t g1) {
  using namespace avx512_kquant;
  constexpr std::size_t T = kquant_panel_tokens, H = avx512_int8::panel_height;
  constexpr std::size_t ints = kquant_panel_ints<P>, reals = kquant_panel_reals<P>;
  static constexpr auto tiles = kquant_panel_fns<P>(std::make_index_sequence<T>{});
  const std::size_t blocks = w.cols / 256, group = kquant_panel_group_rows(w.cols);
  thread_local KQuantPanels pk;
  float out[H * T];
  const KQuantActivation* acts[T];
  for (std::size_t g = g0; g < g1; ++g) {
    const std::size_t r0 = g * group, rn = std::min(group, w.rows - r0);
    kquant_pack_group<P>(w, r0, rn, pk);
    for (std::size_t t = 0; t < n; t += T) {
      const std::size_t tn = std::min(T, n - t);
      for (std::size_t j = 0; j < tn; ++j) acts[j] = &tk.acts[t + j];
      for (std::size_t p = 0; p * H < rn; ++p) {
        tiles[tn - 1](pk.code_base + p * blocks * panel_block_codes,
                      pk.ints.data() + p * blocks * ints, pk.reals.data() + p * blocks * reals,
                      acts, blocks, out);
        for (std::size_t r = 0; r < H && p * H + r < rn; ++r)
          for (std::size_t j = 0; j < tn; ++j) {
            float& dst = y[(t + j) * w.rows + r0 + p * H + r];
            dst = accumulate ? dst + scale * out[H * j + r] : scale * out[H * j + r];
          }
      }
    }
  }
}
#endif

/// Y = scale·X·Wᵀ (+= Y when `accumulate`) with int8 activations: X is n × cols, Y n × rows,
/// `w` K-quant rows (MatrixOrder::rows); the AVX-512 panel path when kquant_panel_takes.
inline void kquant_int8_gemm(const MatrixView& w, const float* x, std::size_t n, float* y,
                             KQuantGemmPath path, ThreadPool* pool, float scale, bool accumulate,
                             KQuantRoute route = KQuantRoute::by_batch) {
  thread_local KQuantTokens storage;
  KQuantTokens& tk = storage;  // by name, a thread_local in the workers' lambdas would be theirs
  const bool panels = kquant_panel_takes(w.precision, path, n, route);
  prepare_kquant_tokens(x, n, w.cols, w.precision, path, pool, tk,
                        panels && w.precision == Precision::q6_k);
#if defined(MOEKIT_HAS_X86_KERNELS)
  if (panels) {
    const std::size_t rows_per = kquant_panel_group_rows(w.cols);
    const std::size_t groups = (w.rows + rows_per - 1) / rows_per;
    auto body = [&](std::size_t g0, std::size_t g1) {
      if (w.precision == Precision::q5_k)
        return kquant_panel_groups<Precision::q5_k>(w, tk, n, y, scale, accumulate, g0, g1);
      if (w.precision == Precision::q6_k)
        return kquant_panel_groups<Precision::q6_k>(w, tk, n, y, scale, accumulate, g0, g1);
      if (w.precision == Precision::q2_k)
        return kquant_panel_groups<Precision::q2_k>(w, tk, n, y, scale, accumulate, g0, g1);
      if (w.precision == Precision::q3_k)
        return kquant_panel_groups<Precision::q3_k>(w, tk, n, y, scale, accumulate, g0, g1);
      kquant_panel_groups<Precision::q4_k>(w, tk, n, y, scale, accumulate, g0, g1);
    };
    if (pool)
      pool->parallel_for(0, groups, 1, body);
    else
      body(0, groups);
    return;
  }
#endif
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
