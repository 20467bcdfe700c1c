#pragma once
/// \file The int8-activation GEMM (prefill batches of quantized rows; `gemm` with
/// `KernelOptions::int8_activations`): every token rounded to int8 once per call (as the GEMV
/// rounds it). AVX-512 VNNI: groups of rows repacked once per call into 16-row panels
/// (avx512_int8_panel_tiles.hpp, lanes = rows) that every token tile then passes over. AVX2 and
/// scalar: tiles of R rows × T tokens (avx2_int8_tiles.hpp, scalar_int8_tiles.hpp) over the rows,
/// 16 rows at a time: their bytes (gathered when the matrix is in panels) and per-chunk scales
/// are made once and reused for every token, the tokens go in slices small enough to stay in L2
/// while the 16 rows pass over them.
///
/// A token's result does not depend on the batch: every (row, token) pair goes through the same
/// instructions whatever tile it falls in (a slice's last tokens go through a tile kernel for
/// fewer tokens, whose pairs run the same sequence; tiles past the last row repeat it, the
/// repeats computed and dropped).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "moekit/precision/detail/avx2_int8_tiles.hpp"
#include "moekit/precision/detail/avx512_int8_panel_tiles.hpp"
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
  avx512_vnni,  ///< avx512_int8_panel_tiles.hpp
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

#if defined(MOEKIT_HAS_X86_KERNELS)
/// Most rows the AVX-512 panel path repacks at a time.
inline constexpr std::size_t int8_panel_most_rows = 128;

/// Rows repacked at a time by the AVX-512 panel path: about 1 MiB of unpacked codes, so they stay
/// in L2 while every token passes over them and each token's bytes are read once per group
/// (bench/RESULTS.md, "Prefill GEMM: the AVX-512 panel tile").
inline std::size_t int8_panel_group_rows(std::size_t cols) noexcept {
  return avx512_int8::panel_group_rows(cols, 1u << 20, int8_panel_most_rows);
}

/// Tokens per panel tile: its int32 and float accumulators take 2·T of the 32 registers
/// (bench/RESULTS.md, "Prefill GEMM: the AVX-512 panel tile").
inline constexpr std::size_t int8_panel_tokens = 8;

/// The repacked panels of one group of rows (storage reused from call to call, per thread).
struct Int8Panels {
  std::vector<std::byte> bytes, codes;  ///< gathered rows; unpacked codes, 64-byte aligned
  std::vector<float> rs, rsz, s, sz;    ///< scales per row (row-major), then per chunk × 16 rows
  const std::byte* rows[int8_panel_most_rows];  ///< each row's bytes (the last one repeated)
  std::byte* code_base = nullptr;
};

/// Repacks rows [r0, r0 + rn) of `w` (rn <= int8_panel_most_rows) into `pk`: panels of 16 rows, the
/// last rows repeated up to a whole panel.
template <unsigned Bits>
void int8_pack_group(const MatrixView& w, std::size_t r0, std::size_t rn, Int8Panels& pk) {
  using namespace avx512_int8;
  const RowLayout l = w.layout();
  const std::size_t chunks = l.cols / 32,
                    blocked = chunks / block_chunks(Bits) * block_chunks(Bits);
  const std::size_t panels = (rn + panel_height - 1) / panel_height, height = panels * panel_height;
  pk.bytes.resize(height * l.bytes);
  pk.codes.resize(panels * blocked * 512 + 64);
  pk.rs.resize(height * chunks + 1), pk.rsz.resize(height * chunks + 1);
  pk.s.resize(panels * blocked * 16 + 1), pk.sz.resize(panels * blocked * 16 + 1);
  const auto base = reinterpret_cast<std::uintptr_t>(pk.codes.data());
  pk.code_base = pk.codes.data() + ((64 - base % 64) % 64);
  for (std::size_t i = 0; i < height; ++i) {
    pk.rows[i] = i < rn ? stored_row(w, r0 + i, pk.bytes.data() + i * l.bytes) : pk.rows[rn - 1];
    chunk_scales(pk.rows[i], l, pk.rs.data() + i * chunks, pk.rsz.data() + i * chunks);
  }
  for (std::size_t p = 0; p < panels; ++p) {
    const float* srow[panel_height];
    const float* zrow[panel_height];
    for (std::size_t r = 0; r < panel_height; ++r) {
      srow[r] = pk.rs.data() + (p * panel_height + r) * chunks;
      zrow[r] = pk.rsz.data() + (p * panel_height + r) * chunks;
    }
    pack_panel<Bits>(pk.rows + p * panel_height, blocked, pk.code_base + p * blocked * 512);
    transpose_scales(srow, blocked, pk.s.data() + p * blocked * 16);
    transpose_scales(zrow, blocked, pk.sz.data() + p * blocked * 16);
  }
}

/// The panel tile for the first k + 1 tokens of its input, k < int8_panel_tokens.
template <unsigned Bits, std::size_t... K>
constexpr auto panel_tile_fns(std::index_sequence<K...>) {
  return std::array{&avx512_int8::panel_dots<Bits, K + 1>...};
}

/// y as int8_gemm for the row groups [g0, g1) of int8_panel_group_rows: each group repacked
/// (int8_pack_group), then every token tile over each of its panels; the chunks after the last
/// whole block through the row tile's tail.
template <unsigned Bits>
void int8_panel_groups(const MatrixView& w, const Int8Tokens& tk, std::size_t n, float* y,
                       float scale, bool accumulate, std::size_t g0, std::size_t g1) {
  using namespace avx512_int8;
  constexpr std::size_t T = int8_panel_tokens;
  static constexpr auto tiles = panel_tile_fns<Bits>(std::make_index_sequence<T>{});
  const RowLayout l = w.layout();
  const std::size_t chunks = l.cols / 32,
                    blocked = chunks / block_chunks(Bits) * block_chunks(Bits);
  const bool tail = blocked < chunks || chunks * 32 < l.cols;
  const std::size_t group = int8_panel_group_rows(l.cols);
  thread_local Int8Panels pk;
  float out[16 * T];
  const Int8Activation* acts[T];
  for (std::size_t g = g0; g < g1; ++g) {
    const std::size_t r0 = g * group, rn = std::min(group, w.rows - r0);
    int8_pack_group<Bits>(w, r0, rn, pk);
    for (std::size_t t = 0; t < n; t += T) {
      const std::size_t tn = std::min(T, n - t);
      for (std::size_t j = 0; j < tn; ++j) acts[j] = &tk.acts[t + j];
      for (std::size_t p = 0; p * panel_height < rn; ++p) {
        tiles[tn - 1](pk.code_base + p * blocked * 512, pk.s.data() + p * blocked * 16,
                      pk.sz.data() + p * blocked * 16, acts, blocked, out);
        for (std::size_t r = 0; r < panel_height && p * panel_height + r < rn; ++r) {
          const std::size_t i = p * panel_height + r;
          for (std::size_t j = 0; j < tn; ++j) {
            float v = out[16 * j + r];
            if (tail)
              v += tile_tail<Bits>(pk.rows[i], l, pk.rs.data() + i * chunks,
                                   pk.rsz.data() + i * chunks, *acts[j], blocked);
            float& dst = y[(t + j) * w.rows + r0 + i];
            dst = accumulate ? dst + scale * v : scale * v;
          }
        }
      }
    }
  }
}
#endif

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
#if defined(MOEKIT_HAS_X86_KERNELS)
  if (path == Int8GemmPath::avx512_vnni) {
    const std::size_t rows_per = int8_panel_group_rows(l.cols);
    const std::size_t groups = (w.rows + rows_per - 1) / rows_per;
    auto body = [&](std::size_t g0, std::size_t g1) {
      with_bits(l, [&]<unsigned Bits>() {
        int8_panel_groups<Bits>(w, tk, n, y, scale, accumulate, g0, g1);
      });
    };
    if (pool)
      pool->parallel_for(0, groups, 1, body);
    else
      body(0, groups);
    return;
  }
#endif
  const std::size_t groups = (w.rows + int8_group_rows - 1) / int8_group_rows;
  auto body = [&](std::size_t g0, std::size_t g1) {
    with_bits(l, [&]<unsigned Bits>() {
      auto run = [&]<std::size_t R, std::size_t T>(const TileFns<R, T>& tiles, auto scales) {
        int8_row_groups<R, T>(w, tk, n, y, scale, accumulate, g0, g1, tiles, scales);
      };
#if defined(MOEKIT_HAS_X86_KERNELS)
      constexpr std::size_t R256 = Bits == 2 ? 1 : 2;
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
