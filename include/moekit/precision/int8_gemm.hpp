#pragma once
/// \file The int8-activation GEMM (prefill batches of quantized rows; `gemm` with
/// `KernelOptions::int8_activations`): every token rounded to int8 once per call (as the GEMV
/// rounds it), then tiles of R rows × T tokens (avx512_int8_tiles.hpp, avx2_int8_tiles.hpp,
/// scalar_int8_tiles.hpp) over the rows, 16 rows at a time: their bytes (gathered when the matrix
/// is in panels) and per-chunk scales are made once and reused for every token, the tokens go
/// in slices small enough to stay in L2 while the 16 rows pass over them.
///
/// A token's result does not depend on the batch: every (row, token) pair goes through the same
/// instructions whatever tile it falls in (a slice's last tokens go through a tile kernel for
/// fewer tokens, whose pairs run the same sequence; tiles past the last row repeat it, the
/// repeats computed and dropped).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "moekit/precision/detail/avx2_int8_tiles.hpp"
#include "moekit/precision/detail/avx512_int8_tiles.hpp"
#include "moekit/precision/detail/prepared_activation.hpp"
#include "moekit/precision/detail/scalar_int8_tiles.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/panels.hpp"
#include "moekit/precision/thread_pool.hpp"

namespace moekit::detail {

/// Which tile kernel runs an int8-activation GEMM.
enum class Int8GemmPath : std::uint8_t {
  scalar,       ///< scalar_int8_tiles.hpp (any CPU, any group size)
  avx2,         ///< avx2_int8_tiles.hpp, vpmaddubsw
  avx_vnni,     ///< avx2_int8_tiles.hpp, AVX-VNNI's 256-bit vpdpbusd
  avx512_vnni,  ///< avx512_int8_tiles.hpp
};

/// True when `path` runs rows of layout `l`: the SIMD tiles take groups of 32/64/128 only.
inline bool int8_gemm_takes(Int8GemmPath path, const RowLayout& l) noexcept {
  return path == Int8GemmPath::scalar || l.group_size == 32 || l.group_size == 64 ||
         l.group_size == 128;
}

/// The int8 activations of a batch (storage reused from call to call, per thread).
struct Int8Tokens {
  std::vector<std::int8_t> q;
  std::vector<float> f;
  std::vector<Int8Activation> acts;
};

/// Rounds the n tokens of x (n × cols) for `path` into `tk`, split over `pool`.
inline void prepare_tokens(const float* x, std::size_t n, const RowLayout& l, Int8GemmPath path,
                           ThreadPool* pool, Int8Tokens& tk) {
  const std::size_t chunks = l.cols / 32;
  tk.q.resize(std::max<std::size_t>(1, n * chunks * 32));
  tk.f.resize(std::max<std::size_t>(1, n * 2 * chunks));
  tk.acts.resize(n);
  auto body = [&](std::size_t b, std::size_t e) {
    for (std::size_t t = b; t < e; ++t) {
      const float* xt = x + t * l.cols;
      std::int8_t* q = tk.q.data() + t * chunks * 32;
      float* f = tk.f.data() + t * 2 * chunks;
#if defined(MOEKIT_HAS_X86_KERNELS)
      if (path == Int8GemmPath::avx512_vnni) {
        tk.acts[t] = avx512_int8::prepare_into(xt, l.cols, l.bits, q, f);
        continue;
      }
      if (path != Int8GemmPath::scalar) {
        tk.acts[t] = avx2_int8::prepare_into(xt, l.cols, l.bits, q, f);
        continue;
      }
#endif
      tk.acts[t] = scalar_int8::prepare_into(xt, l.cols, q, f);
    }
  };
  if (pool && n >= 8)
    pool->parallel_for(0, n, std::max<std::size_t>(1, n / (2 * pool->size())), body);
  else
    body(0, n);
}

/// Rows per group: made once (gathered, scales converted) and reused for all tokens.
inline constexpr std::size_t int8_group_rows = 16;

/// Tokens per slice: about 256 KiB of int8 activation (the slice and a group's rows stay in L2).
inline std::size_t int8_slice_tokens(std::size_t cols, std::size_t tile) noexcept {
  const std::size_t s =
      std::clamp<std::size_t>((256 * 1024) / std::max<std::size_t>(cols, 1), tile, 64);
  return s / tile * tile;
}

/// The tile kernels of one path for R rows: tiles[k] takes the first k + 1 tokens of its input.
template <std::size_t R, std::size_t T>
using TileFns = std::array<void (*)(const TileInput<R, T>&, const RowLayout&, float*), T>;

/// y[t·rows + r] = scale·(row r · token t) (+= when `accumulate`) for the row groups [g0, g1),
/// tiles of R × T through `tiles` (a slice's last k < T tokens through tiles[k − 1]),
/// per-chunk scales from `scales(row, l, s, sz)`.
template <std::size_t R, std::size_t T, class Scales>
void int8_row_groups(const MatrixView& w, const Int8Tokens& tk, std::size_t n, float* y,
                     float scale, bool accumulate, std::size_t g0, std::size_t g1,
                     const TileFns<R, T>& tiles, Scales scales) {
  static_assert(int8_group_rows % R == 0);
  const RowLayout l = w.layout();
  const std::size_t chunks = l.cols / 32, slice = int8_slice_tokens(l.cols, T);
  thread_local std::vector<std::byte> bytes;
  thread_local std::vector<float> sc;
  bytes.resize(int8_group_rows * l.bytes);
  sc.resize(std::max<std::size_t>(1, 2 * int8_group_rows * chunks));
  const std::byte* rows[int8_group_rows];
  float out[R * T];
  for (std::size_t g = g0; g < g1; ++g) {
    const std::size_t r0 = g * int8_group_rows, rn = std::min(int8_group_rows, w.rows - r0);
    for (std::size_t i = 0; i < rn; ++i) {
      rows[i] = stored_row(w, r0 + i, bytes.data() + i * l.bytes);
      scales(rows[i], l, sc.data() + 2 * i * chunks, sc.data() + (2 * i + 1) * chunks);
    }
    for (std::size_t t0 = 0; t0 < n; t0 += slice) {
      const std::size_t t1 = std::min(n, t0 + slice);
      for (std::size_t i = 0; i < rn; i += R) {
        TileInput<R, T> in;
        for (std::size_t k = 0; k < R; ++k) {
          const std::size_t ri = std::min(i + k, rn - 1);  // past the last row: repeat it
          in.rows[k] = rows[ri];
          in.s[k] = sc.data() + 2 * ri * chunks;
          in.sz[k] = sc.data() + (2 * ri + 1) * chunks;
        }
        for (std::size_t t = t0; t < t1; t += T) {
          const std::size_t tn = std::min(T, t1 - t);
          for (std::size_t j = 0; j < tn; ++j) in.acts[j] = &tk.acts[t + j];
          tiles[tn - 1](in, l, out);
          for (std::size_t k = 0; k < R && i + k < rn; ++k)
            for (std::size_t j = 0; j < tn; ++j) {
              float& dst = y[(t + j) * w.rows + r0 + i + k];
              dst = accumulate ? dst + scale * out[k * tn + j] : scale * out[k * tn + j];
            }
        }
      }
    }
  }
}

/// Calls f.template operator()<Bits>() for the code width of `l`.
template <class F>
void with_bits(const RowLayout& l, F&& f) {
  switch (l.bits) {
    case 8:
      return f.template operator()<8>();
    case 4:
      return f.template operator()<4>();
    default:
      return f.template operator()<2>();
  }
}

/// Y = scale·X·Wᵀ (+= Y when `accumulate`) with int8 activations: X is n × cols, Y n × rows;
/// `w` quantized, in rows or panels, with a group size `path` takes (int8_gemm_takes).
inline void int8_gemm(const MatrixView& w, const float* x, std::size_t n, float* y,
                      Int8GemmPath path, ThreadPool* pool, float scale, bool accumulate) {
  const RowLayout l = w.layout();
  thread_local Int8Tokens storage;
  Int8Tokens& tk = storage;  // by name, a thread_local in the workers' lambdas would be theirs
  prepare_tokens(x, n, l, path, pool, tk);
  const std::size_t groups = (w.rows + int8_group_rows - 1) / int8_group_rows;
  auto body = [&](std::size_t g0, std::size_t g1) {
    with_bits(l, [&]<unsigned Bits>() {
      auto run = [&]<std::size_t R, std::size_t T>(const TileFns<R, T>& tiles, auto scales) {
        int8_row_groups<R, T>(w, tk, n, y, scale, accumulate, g0, g1, tiles, scales);
      };
#if defined(MOEKIT_HAS_X86_KERNELS)
      constexpr std::size_t R512 = Bits == 2 ? 2 : 4, R256 = Bits == 2 ? 1 : 2;
      using avx512_int8::tile_dots;
      if (path == Int8GemmPath::avx512_vnni)
        return run(TileFns<R512, 4>{&tile_dots<Bits, R512, 1, 4>, &tile_dots<Bits, R512, 2, 4>,
                                    &tile_dots<Bits, R512, 3, 4>, &tile_dots<Bits, R512, 4, 4>},
                   &avx512_int8::chunk_scales);
      if (path == Int8GemmPath::avx_vnni)
        return run(TileFns<R256, 2>{&avx2_int8::tile_dots<Bits, true, R256, 1, 2>,
                                    &avx2_int8::tile_dots<Bits, true, R256, 2, 2>},
                   &avx2_int8::chunk_scales<Bits, true>);
      if (path == Int8GemmPath::avx2)
        return run(TileFns<R256, 2>{&avx2_int8::tile_dots<Bits, false, R256, 1, 2>,
                                    &avx2_int8::tile_dots<Bits, false, R256, 2, 2>},
                   &avx2_int8::chunk_scales<Bits, false>);
#endif
      run(TileFns<1, 1>{&scalar_int8::tile_dots<1, 1>}, &scalar_int8::chunk_scales);
    });
  };
  if (pool)
    pool->parallel_for(0, groups, std::max<std::size_t>(1, groups / (4 * pool->size())), body);
  else
    body(0, groups);
}

}  // namespace moekit::detail
