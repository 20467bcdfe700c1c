// The float-row GEMV (f16/bf16 experts, as in-place Hugging Face checkpoints hold them) on cold
// Mixtral expert shapes, as a fraction of the streaming read of the same bytes, all timed round by
// round in one process: every way of streaming the rows (1, 2 or 4 streams per thread, with and
// without the software prefetch; * = this core's default, row_streaming.hpp) with the activation
// in floats (f32x, the widening kernels), and for bf16 rows the activation rounded to bf16 and
// dotted with vdpbf16ps (bf16x, KernelOptions::bf16_activations; where the CPU has AVX512_BF16).
// Every f32x way must give the same result bit for bit. Each fraction is the median of per-round
// ratios (the read's time in a round, the faster of its two, over the kernel's): on a machine
// shared with builds the bandwidth moves severalfold within a run, over seconds, and the calls of
// one round see the same machine.
//
// Usage: moekit_bench_float_gemv [--reps N] [--threads N] [--isa avx2|avx512]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "moekit/precision/gemv.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "cold_read.hpp"

using namespace moekit;
using Clock = std::chrono::steady_clock;

namespace {

/// max |a − b| / max |b|
double rel_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double d = 0, r = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(a[i] - b[i]));
    r = std::max(r, std::abs(b[i]));
  }
  return r > 0 ? d / r : d;
}

struct Args {
  int reps = 15, threads = 0;
  std::optional<Isa> isa;
};

std::optional<Args> parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      a.reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      a.threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--isa") && i + 1 < argc && parse_isa(argv[i + 1]) &&
             isa_supported(*parse_isa(argv[i + 1])) && *parse_isa(argv[i + 1]) != Isa::generic)
      a.isa = parse_isa(argv[++i]);
    else
      return std::nullopt;
  }
  return a;
}

const RowStreaming ways[] = {{1, false}, {1, true}, {2, false}, {2, true}, {4, false}, {4, true}};
constexpr std::size_t n_ways = std::size(ways);

/// One (precision, shape) line: the ways, bf16x and the two reads, round by round.
bool measure(Precision p, std::size_t rows, std::size_t cols, ThreadPool& pool, const Args& a) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.f, 0.02f);
  std::vector<float> w(rows * cols), x(cols);
  for (auto& v : w) v = d(rng);
  for (auto& v : x) v = d(rng) * 50.f;
  const std::vector<std::byte> enc = encode_matrix<float>(w, rows, cols, p, {});
  std::vector<double> exact(rows);  // of the stored (rounded) weights
  const MatrixView v0{enc.data(), rows, cols, p, {}};
  for (std::size_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (std::size_t c = 0; c < cols; ++c)
      acc += double(weight_at(v0.row(r), v0.layout(), p, c)) * x[c];
    exact[r] = acc;
  }
  const std::size_t bytes = enc.size(),
                    copies = std::max<std::size_t>(2, bench::rotation_bytes / bytes);
  std::vector<std::vector<std::byte>> mats(copies, enc);
  const bool bf16x =
      p == Precision::bf16 && has_avx512_bf16() && a.isa.value_or(detect_isa()) == Isa::avx512;
  const RowStreaming chosen = default_float_row_streaming(detect_core(), cols);
  std::vector<float> y(rows), y0(rows), yb(rows);
  bench::ColdRead read(pool, bytes, copies);
  const std::size_t kinds = n_ways + 3;  // the ways, bf16x, the two reads
  std::vector<std::vector<double>> t(kinds);
  std::size_t next = 0;
  for (int r = -1; r < a.reps; ++r)  // round -1 warms every copy and the pool
    for (std::size_t k = 0; k < (r < 0 ? copies : 1); ++k)
      for (std::size_t v = 0; v < kinds; ++v) {
        const std::size_t c = next++ % copies;
        const MatrixView m{mats[c].data(), rows, cols, p, {}};
        KernelOptions o{a.isa, &pool};
        const auto t0 = Clock::now();
        if (v < n_ways) {
          o.streaming = ways[v];
          gemv(m, x, y, o);
        } else if (v == n_ways) {
          if (!bf16x) continue;
          o.bf16_activations = true;
          gemv(m, x, yb, o);
        } else {
          read(c, v == n_ways + 2);
        }
        if (r >= 0) t[v].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        if (v == 0) y0 = y;
        if (v > 0 && v < n_ways && y != y0) {
          std::fprintf(stderr, "streaming S%u%s gave a different result\n", ways[v].streams,
                       ways[v].prefetch ? "p" : "");
          return false;
        }
      }
  std::vector<double> tread(t[n_ways + 1].size());
  for (std::size_t i = 0; i < tread.size(); ++i)
    tread[i] = std::min(t[n_ways + 1][i], t[n_ways + 2][i]);
  auto of_read = [&](std::size_t v) {
    std::vector<double> q(tread.size());
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = tread[i] / t[v][i];
    return bench::median(q);
  };
  const double bound = bench::median(tread);
  // The fastest round of the kernel against the fastest of the read (both least hit by the
  // shared machine): the other estimate, printed after the median.
  auto best_of_read = [&](std::size_t v) {
    return *std::min_element(tread.begin(), tread.end()) /
           *std::min_element(t[v].begin(), t[v].end());
  };
  std::printf("%-5s %5zux%-5zu %6.1f    |", std::string(name(p)).c_str(), rows, cols,
              bytes / bound / 1e9);
  for (std::size_t v = 0; v < n_ways; ++v)
    std::printf(" %3.0f/%3.0f%%%s", 100 * of_read(v), 100 * best_of_read(v),
                ways[v] == chosen ? "*" : " ");
  if (bf16x)
    std::printf(" | %3.0f/%3.0f%% | %.1e %.1e\n", 100 * of_read(n_ways), 100 * best_of_read(n_ways),
                rel_diff(y0, exact), rel_diff(yb, exact));
  else
    std::printf(" |     -    | %.1e       -\n", rel_diff(y0, exact));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::optional<Args> a = parse(argc, argv);
  if (!a) {
    std::fprintf(stderr, "usage: %s [--reps N] [--threads N] [--isa avx2|avx512]\n", argv[0]);
    return 2;
  }
  const Isa isa = a->isa.value_or(detect_isa());
  if (isa == Isa::generic) {
    std::printf("skipped: this CPU has neither AVX2 nor AVX-512, the float-row kernels measured\n");
    return 0;
  }
  std::printf(
      "float-row GEMV, cold weights (rotation over %zu MiB), ISA %s%s, CPU core %s; %d rounds; "
      "%% of the streaming read as med/best (med: the median of per-round ratios; best: the "
      "kernel's fastest round against the read's fastest) (the faster of one and four "
      "prefetched streams per "
      "thread); f32x: float activations, S = streams per thread, p = prefetched, * = this core's "
      "default; bf16x: bf16 activations, vdpbf16ps, default streaming; err: max |y - exact| / "
      "max |exact| (f32x, bf16x)\n",
      bench::rotation_bytes >> 20, std::string(name(isa)).c_str(), has_avx512_bf16() ? "+bf16" : "",
      std::string(name(detect_core())).c_str(), a->reps);
  const std::size_t shapes[][2] = {{14336, 4096}, {4096, 14336}};
  for (int threads : {1, 2}) {
    if (a->threads && threads != a->threads) continue;
    ThreadPool pool(static_cast<unsigned>(threads));
    std::printf("\n== %d thread(s)\nfmt   shape       read GB/s |", threads);
    for (const RowStreaming& w : ways)
      std::printf("  S%u%s      ", w.streams, w.prefetch ? "p" : " ");
    std::printf(" | bf16x    | err f32x bf16x\n");
    for (Precision p : {Precision::bf16, Precision::f16})
      for (const auto& shape : shapes)
        if (!measure(p, shape[0], shape[1], pool, *a)) return 1;
  }
  return 0;
}
