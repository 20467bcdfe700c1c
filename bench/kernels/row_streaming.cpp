// Every way the int8-activation GEMV can stream its rows (1, 2 or 4 streams per thread, with and
// without the software prefetch), on cold Mixtral expert shapes, as a fraction of the streaming
// read of the same bytes, all timed round by round in one process. It is how the per-core table
// in moekit/precision/row_streaming.hpp was filled, and how to check it on another CPU: the
// column marked * is what this CPU gets by default. The last two columns are the same matrix in
// 4-row panels (MatrixOrder::panels4: one stream per thread, whatever the core) and in blocked
// panels (MatrixOrder::blocked_panels4), same rounds. At the end it prints what
// `moe-run --expert-layout auto` picks on this CPU (the per-core table of
// moekit/engine/expert_layout.hpp) and in how many cells this run's rows (at the default streaming)
// or blocked panels were closer to the read: how that table is filled for a new core.
//
// --kquant: the GGUF K-quant formats (q4_k, q5_k, q6_k, q2_k, q3_k; random blocks) instead, whose
// kernels have their own streaming (default_kquant_row_streaming in row_streaming.hpp, marked *;
// no panels).
//
// Usage: moekit_bench_row_streaming [--reps N] [--threads N] [--kquant]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "moekit/engine/expert_layout.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "cold_read.hpp"

using namespace moekit;
using Clock = std::chrono::steady_clock;

namespace {

const RowStreaming ways[] = {{1, false}, {1, true}, {2, false}, {2, true}, {4, false}, {4, true}};
constexpr std::size_t n_ways = std::size(ways);

/// A rows × cols K-quant matrix of random blocks with moderate f16 super-scales.
std::vector<std::byte> random_kquant(std::size_t rows, std::size_t cols, Precision p) {
  std::mt19937_64 rng(1);
  std::vector<std::byte> b(matrix_bytes(rows, cols, p));
  for (auto& v : b) v = static_cast<std::byte>(rng() & 0xff);
  const std::uint16_t d = float_to_half_bits(0.002f);
  // Where d lies (and dmin after it, for the formats with minimums).
  const std::size_t at = p == Precision::q6_k   ? q6_k::d_offset
                         : p == Precision::q3_k ? q3_k::d_offset
                         : p == Precision::q2_k ? q2_k::d_offset
                                                : 0;
  const bool dmin = p != Precision::q6_k && p != Precision::q3_k;
  for (std::size_t off = 0; off < b.size(); off += kquant_block_bytes(p)) {
    std::memcpy(b.data() + off + at, &d, 2);
    if (dmin) std::memcpy(b.data() + off + at + 2, &d, 2);
  }
  return b;
}

/// --kquant: every streaming of the K-quant int8 kernels against the read, same rounds.
int run_kquants(int reps, int only_threads) {
  std::printf(
      "GGUF K-quant int8-activation GEMV, cold weights, CPU core %s; medians of %d rounds; "
      "%% of the streaming read; * = this core's default (default_kquant_row_streaming)\n",
      std::string(name(detect_core())).c_str(), reps);
  const std::size_t shapes[][2] = {{14336, 4096}, {4096, 14336}};
  for (int threads : {1, 2}) {
    if (only_threads && threads != only_threads) continue;
    ThreadPool pool(static_cast<unsigned>(threads));
    std::printf("\n== %d thread(s)\nformat shape       read GB/s |", threads);
    for (const RowStreaming& w : ways) std::printf("  S%u%s", w.streams, w.prefetch ? "p" : " ");
    std::printf("\n");
    for (Precision p :
         {Precision::q4_k, Precision::q5_k, Precision::q6_k, Precision::q2_k, Precision::q3_k})
      for (const auto& shape : shapes) {
        const std::size_t rows = shape[0], cols = shape[1];
        const std::vector<std::byte> enc = random_kquant(rows, cols, p);
        const std::size_t bytes = enc.size(),
                          copies = std::max<std::size_t>(2, bench::rotation_bytes / bytes);
        std::vector<std::vector<std::byte>> mats(copies, enc);
        std::vector<float> x(cols, 0.5f), y(rows), y0(rows);
        bench::ColdRead read(pool, bytes, copies);
        std::vector<std::vector<double>> t(n_ways + 2);
        std::size_t next = 0;
        for (int r = -1; r < reps; ++r)  // round -1 warms every copy and the pool
          for (std::size_t k = 0; k < (r < 0 ? copies : 1); ++k)
            for (std::size_t v = 0; v < n_ways + 2; ++v) {
              const std::size_t c = next++ % copies;
              const auto t0 = Clock::now();
              if (v < n_ways) {
                KernelOptions o{std::nullopt, &pool};
                o.int8_activations = true;
                o.streaming = ways[v];
                gemv(MatrixView{mats[c].data(), rows, cols, p}, x, y, o);
                if (v == 0) y0 = y;
                if (y != y0) {  // every way computes each row alike
                  std::fprintf(stderr, "K-quant streaming gave a different result\n");
                  return 1;
                }
              } else {
                read(c, v == n_ways + 1);
              }
              if (r >= 0) t[v].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
            }
        const double bound = std::min(bench::median(t[n_ways]), bench::median(t[n_ways + 1]));
        std::printf("%-6s %5zux%-5zu %6.1f    |", std::string(name(p)).c_str(), rows, cols,
                    bytes / bound / 1e9);
        for (std::size_t v = 0; v < n_ways; ++v)
          std::printf(" %4.0f%%%s", 100 * bound / bench::median(t[v]),
                      ways[v] == default_kquant_row_streaming(detect_core()) ? "*" : " ");
        std::printf("\n");
      }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int reps = 15, only_threads = 0;
  bool kquants = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      only_threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--kquant"))
      kquants = true;
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--threads N] [--kquant]\n", argv[0]);
      return 2;
    }
  }
  if (!has_avx512_vnni()) {
    std::printf(
        "skipped: this CPU has no AVX-512 VNNI, so the int8-activation kernels do not run\n");
    return 0;
  }
  if (kquants) return run_kquants(reps, only_threads);
  std::printf(
      "int8-activation GEMV, cold weights (rotation over %zu MiB), CPU core %s; medians of %d "
      "rounds; %% of the streaming read (the faster of one and four prefetched streams per "
      "thread); S = streams per thread, p = prefetched, * = this core's default; panels = "
      "the matrix in 4-row panels, blocked = in blocked panels\n",
      bench::rotation_bytes >> 20, std::string(name(detect_core())).c_str(), reps);
  // As bench/kernels/ggml_peer.sh: the formats ggml's q8_0, q4_0 and q2_K compare with.
  const std::pair<Precision, QuantScheme> formats[] = {
      {Precision::q8, {32, false}}, {Precision::q4, {32, false}}, {Precision::q2, {64, true}}};
  const std::size_t shapes[][2] = {{14336, 4096}, {4096, 14336}};
  int rows_ahead = 0, blocked_ahead = 0;  // cells where rows (default streaming) / blocked won
  for (int threads : {1, 2}) {
    if (only_threads && threads != only_threads) continue;
    ThreadPool pool(static_cast<unsigned>(threads));
    std::printf("\n== %d thread(s)\nformat shape       read GB/s |", threads);
    for (const RowStreaming& w : ways) std::printf("  S%u%s", w.streams, w.prefetch ? "p" : " ");
    std::printf("  panels blocked\n");
    for (const auto& [p, s] : formats)
      for (const auto& shape : shapes) {
        const std::size_t rows = shape[0], cols = shape[1];
        std::mt19937 rng(1);
        std::normal_distribution<float> d(0.f, 0.02f);
        std::vector<float> w(rows * cols), x(cols);
        for (auto& v : w) v = d(rng);
        for (auto& v : x) v = d(rng) * 50.f;
        const std::vector<std::byte> enc = encode_matrix<float>(w, rows, cols, p, s);
        const std::size_t bytes = enc.size(),
                          copies = std::max<std::size_t>(2, bench::rotation_bytes / bytes);
        std::vector<std::vector<std::byte>> mats(copies, enc),
            panels(copies, std::vector<std::byte>(bytes)),
            blocked(copies, std::vector<std::byte>(bytes));
        for (auto& m : panels) pack_panels(MatrixView{enc.data(), rows, cols, p, s}, m);
        for (auto& m : blocked)
          pack_panels(MatrixView{enc.data(), rows, cols, p, s}, m, MatrixOrder::blocked_panels4);
        const RowStreaming chosen = default_row_streaming(detect_core(), cols);
        std::vector<float> y(rows), y0(rows);
        bench::ColdRead read(pool, bytes, copies);
        std::vector<std::vector<double>> t(n_ways + 4);
        std::size_t next = 0;
        for (int r = -1; r < reps; ++r)  // round -1 warms every copy and the pool
          for (std::size_t k = 0; k < (r < 0 ? copies : 1); ++k)
            for (std::size_t v = 0; v < n_ways + 4; ++v) {
              const std::size_t c = next++ % copies;
              const auto t0 = Clock::now();
              if (v < n_ways) {
                KernelOptions o{std::nullopt, &pool};
                o.int8_activations = true;
                o.streaming = ways[v];
                gemv(MatrixView{mats[c].data(), rows, cols, p, s}, x, y, o);
                if (v == 0)
                  y0 = y;
                else if (y != y0) {  // every way computes each row alike
                  std::fprintf(stderr, "streaming S%u%s gave a different result\n", ways[v].streams,
                               ways[v].prefetch ? "p" : "");
                  return 1;
                }
              } else if (v >= n_ways + 2) {
                KernelOptions o{std::nullopt, &pool};
                o.int8_activations = true;
                const bool b = v == n_ways + 3;
                gemv(MatrixView{(b ? blocked : panels)[c].data(), rows, cols, p, s,
                                b ? MatrixOrder::blocked_panels4 : MatrixOrder::panels4},
                     x, y, o);
                if (y != y0) {  // the panel kernel does the row kernel's operations in its order
                  std::fprintf(stderr, "panels gave a different result from rows\n");
                  return 1;
                }
              } else {
                read(c, v == n_ways + 1);
              }
              if (r >= 0) t[v].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
            }
        const double bound = std::min(bench::median(t[n_ways]), bench::median(t[n_ways + 1]));
        for (std::size_t v = 0; v < n_ways; ++v)
          if (ways[v] == chosen)
            ++(bench::median(t[v]) < bench::median(t[n_ways + 3]) ? rows_ahead : blocked_ahead);
        std::printf("%-6s %5zux%-5zu %6.1f    |", std::string(name(p)).c_str(), rows, cols,
                    bytes / bound / 1e9);
        for (std::size_t v = 0; v < n_ways; ++v)
          std::printf(" %4.0f%%%s", 100 * bound / bench::median(t[v]),
                      ways[v] == chosen ? "*" : " ");
        std::printf("   %4.0f%%   %4.0f%%\n", 100 * bound / bench::median(t[n_ways + 2]),
                    100 * bound / bench::median(t[n_ways + 3]));
      }
  }
  const MatrixOrder pick = engine::auto_expert_order(detect_core(), true);
  std::printf(
      "\n--expert-layout auto on this CPU (core %s, int8 activations): %s (engine/"
      "expert_layout.hpp); in this run rows at the default streaming were ahead of blocked panels "
      "in %d of %d cells, blocked panels in %d\n",
      std::string(name(detect_core())).c_str(), engine::layout_word(pick), rows_ahead,
      rows_ahead + blocked_ahead, blocked_ahead);
  return 0;
}
