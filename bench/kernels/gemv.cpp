// GEMV / fused expert FFN throughput on Mixtral expert shapes with cold weights, as a fraction of
// the streaming read bandwidth measured in the same run.
//
// Weights are cold as in MoE decode: each timed call uses the next of a rotating set of copies
// whose total size is several times the last-level cache. Bandwidth reference: a vectorised
// streaming sum over the same rotating buffers, on the same number of threads.
//
// Usage: moekit_bench_gemv [--quick] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moekit/precision/expert_ffn.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "cold_read.hpp"

using namespace moekit;
using Clock = std::chrono::steady_clock;

namespace {

using bench::median;
using bench::rotation_bytes;
using bench::stream_sum;

/// Median seconds of `fn(copy)` over `reps` calls rotating over `copies`.
template <class Fn>
double time_rotating(std::size_t copies, int reps, Fn&& fn) {
  for (std::size_t c = 0; c < copies; ++c) fn(c);  // warm-up (page faults, thread wake-up)
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn(static_cast<std::size_t>(i) % copies);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

/// Streaming read bandwidth (bytes/s) of `threads` threads over buffers of `bytes` each: the
/// faster of one stream per thread and four prefetched ones (see cold_read.hpp).
double read_bandwidth(ThreadPool& pool, std::size_t bytes, int reps) {
  const std::size_t copies = std::max<std::size_t>(2, rotation_bytes / bytes);
  const std::size_t n = bytes / 4;
  std::vector<std::vector<float>> bufs(copies, std::vector<float>(n, 1.f));
  volatile float sink = 0;
  double best = 0;
  for (bool quarters : {false, true}) {
    const double s = time_rotating(copies, reps, [&](std::size_t c) {
      const float* p = bufs[c].data();
      std::vector<float> part(pool.size(), 0.f);
      const std::size_t per = (n / pool.size() + 63) / 64 * 64;
      pool.parallel_for(0, pool.size(), 1, [&](std::size_t b, std::size_t) {
        const std::size_t lo = b * per, hi = std::min(n, lo + per);
        if (lo < hi) part[b] = stream_sum(p + lo, hi - lo, quarters);
      });
      for (float v : part) sink = sink + v;
    });
    best = std::max(best, static_cast<double>(bytes) / s);
  }
  return best;
}

struct Format {
  const char* label;
  Precision p;
  QuantScheme s;
  bool int8 = false;  ///< KernelOptions::int8_activations
};

std::vector<std::byte> random_matrix(std::size_t rows, std::size_t cols, Format f, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 0.02f);
  std::vector<float> w(rows * cols);
  for (auto& v : w) v = d(rng);
  return encode_matrix<float>(w, rows, cols, f.p, f.s);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear as they are measured
  bool quick = false;
  int reps = 40;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true, reps = 10;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  std::printf("moekit GEMV benchmark: ISA %s%s, cold weights (rotation over %zu MiB)\n"
              "i8x = int8 activations (KernelOptions::int8_activations, AVX-512 VNNI)\n",
              std::string(name(detect_isa())).c_str(), has_avx512_vnni() ? "+vnni" : "",
              rotation_bytes >> 20);
  const Format formats[] = {{"q8 g32 sym", Precision::q8, {32, false}},
                            {"q4 g32 sym", Precision::q4, {32, false}},
                            {"q8 g32 i8x", Precision::q8, {32, false}, true},
                            {"q4 g32 i8x", Precision::q4, {32, false}, true},
                            {"q4 g64 aff", Precision::q4, {64, true}},
                            {"q4 g64 i8x", Precision::q4, {64, true}, true},
                            {"q2 g64 aff", Precision::q2, {64, true}},
                            {"q2 g64 i8x", Precision::q2, {64, true}, true},
                            {"bf16", Precision::bf16, {}}};
  const std::size_t shapes[][2] = {{14336, 4096}, {4096, 14336}};
  for (unsigned threads : {1u, 2u}) {
    ThreadPool pool(threads);
    std::printf("\n== %u thread(s)\n", threads);
    std::printf("%-12s %-12s %10s %9s %10s %10s %8s\n", "format", "shape", "MiB", "ms", "GB/s",
                "read GB/s", "of read");
    for (const Format& f : formats) {
      if (quick && f.p == Precision::bf16) continue;
      for (const auto& shape : shapes) {
        const std::size_t rows = shape[0], cols = shape[1];
        const std::size_t bytes = matrix_bytes(rows, cols, f.p, f.s);
        const std::size_t copies = std::max<std::size_t>(2, rotation_bytes / bytes);
        std::vector<std::vector<std::byte>> mats;
        for (std::size_t c = 0; c < copies; ++c) {
          if (c == 0) mats.push_back(random_matrix(rows, cols, f, 1));
          else mats.push_back(mats[0]);
        }
        std::vector<float> x(cols, 0.5f), y(rows);
        KernelOptions o{std::nullopt, &pool};
        o.int8_activations = f.int8;
        const double s = time_rotating(copies, reps, [&](std::size_t c) {
          gemv(MatrixView{mats[c].data(), rows, cols, f.p, f.s}, x, y, o);
        });
        mats.clear();
        const double bw = read_bandwidth(pool, bytes, reps);
        std::printf("%-12s %5zux%-6zu %10.1f %9.3f %10.2f %10.2f %7.0f%%\n", f.label, rows, cols,
                    bytes / 1048576.0, s * 1e3, bytes / s / 1e9, bw / 1e9, 100.0 * bytes / s / bw);
      }
    }
    // Fused expert FFN vs three separate GEMVs (+ the elementwise step), one Mixtral expert.
    for (const Format& f : {formats[1], formats[3], formats[0], formats[2]}) {
      const std::size_t hidden = 4096, ffn = 14336;
      const auto w1 = random_matrix(ffn, hidden, f, 2), w3 = random_matrix(ffn, hidden, f, 3),
                 w2 = random_matrix(hidden, ffn, f, 4);
      const std::size_t expert_bytes = w1.size() + w3.size() + w2.size();
      const std::size_t copies = std::max<std::size_t>(2, rotation_bytes / expert_bytes);
      std::vector<std::vector<std::byte>> c1(copies, w1), c3(copies, w3), c2(copies, w2);
      std::vector<float> x(hidden, 0.5f), out(hidden, 0.f), g(ffn), u(ffn);
      auto view = [&](const std::vector<std::byte>& b, std::size_t r, std::size_t c) {
        return MatrixView{b.data(), r, c, f.p, f.s};
      };
      KernelOptions opts{std::nullopt, &pool};
      opts.int8_activations = f.int8;
      const double fused = time_rotating(copies, reps, [&](std::size_t c) {
        expert_ffn({view(c1[c], ffn, hidden), view(c3[c], ffn, hidden), view(c2[c], hidden, ffn)},
                   x, 1, out, 0.5f, opts);
      });
      const double separate = time_rotating(copies, reps, [&](std::size_t c) {
        gemv(view(c1[c], ffn, hidden), x, g, opts);
        gemv(view(c3[c], ffn, hidden), x, u, opts);
        for (std::size_t i = 0; i < ffn; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
        gemv(view(c2[c], hidden, ffn), g, out, opts, {0.5f, true});
      });
      std::printf("expert FFN %s (%.1f MiB): fused %.3f ms, 3 GEMVs %.3f ms, ratio %.2fx, %.2f GB/s\n",
                  f.label, expert_bytes / 1048576.0, fused * 1e3, separate * 1e3, separate / fused,
                  expert_bytes / fused / 1e9);
    }
  }
  return 0;
}
