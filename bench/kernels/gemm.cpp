// Prefill GEMM (n tokens × a quantized Mixtral expert matrix) with int8 activations
// (int8_gemm.hpp) against the float-decode GEMM it replaces (KernelOptions::int8_activations
// off) and against the int8 peak of this core: a tight loop of independent vpdpbusd, timed in
// the same run. Weights warm (prefill is compute-bound: every weight byte serves n tokens).
//
// GFLOP/s = 2·rows·cols·n / time. "of peak" = multiply-adds per second / the vpdpbusd loop's
// (64 per instruction on 512 bits, 32 on 256): what is left for a better kernel on this core.
//
// Usage: moekit_bench_gemm [--quick] [--reps N] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "int8_peak.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/panels.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit/precision/thread_pool.hpp"

using namespace moekit;
using moekit_bench::int8_peak;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<std::byte> random_matrix(std::size_t rows, std::size_t cols, Precision p,
                                     QuantScheme s) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<float> w(rows * cols);
  for (float& v : w) v = nd(rng);
  return encode_matrix<float>(w, rows, cols, p, s);
}

struct Path {
  const char* label;
  Isa isa;
  bool wide;  ///< its peak: 512-bit VNNI (else 256-bit)
};

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int reps = 3;
  unsigned threads = 1;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick"))
      quick = true, reps = 1;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = static_cast<unsigned>(std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--reps N] [--threads N]\n", argv[0]);
      return 2;
    }
  }
  ThreadPool pool(threads);
  std::vector<Path> paths;
  if (has_avx512_vnni()) paths.push_back({"avx512-vnni", Isa::avx512, true});
  if (isa_supported(Isa::avx2) && has_avx_vnni())
    paths.push_back({"avx2+avx-vnni", Isa::avx2, false});
  std::printf(
      "moekit prefill GEMM benchmark: %u thread(s), median of %d; int8 = int8 activations "
      "(int8_gemm.hpp), float = the float-decode GEMM (int8_activations off) on the same ISA\n",
      threads, reps);
  // Mixtral's expert shapes, and the default test model's (256 × 512 experts: under
  // activations.hpp's int8_min_row_width, where `--activations auto` keeps f32).
  const std::size_t shapes[][2] = {{14336, 4096}, {4096, 14336}, {512, 256}, {256, 512}};
  const std::size_t ns[] = {8, 32, 128, 512};
  struct Format {
    const char* label;
    Precision p;
    MatrixOrder order;
  };
  const Format formats[] = {{"q8 rows", Precision::q8, MatrixOrder::rows},
                            {"q4 rows", Precision::q4, MatrixOrder::rows},
                            {"q4 bpanels", Precision::q4, MatrixOrder::blocked_panels4}};
  for (const Path& path : paths) {
    std::printf("\n== %s (peak: the vpdpbusd loop in the same rounds, G multiply-adds/s)\n",
                path.label);
    std::printf("%-11s %-11s %4s %10s %9s %10s %9s %8s %8s %7s\n", "format", "shape", "n",
                "int8 ms", "GFLOP/s", "float ms", "GFLOP/s", "speedup", "of peak", "peak");
    for (const Format& f : formats) {
      if (quick && f.order != MatrixOrder::rows) continue;
      for (const auto& shape : shapes) {
        const std::size_t rows = shape[0], cols = shape[1];
        if (rows < 1024 && f.order != MatrixOrder::rows) continue;
        const QuantScheme s{32, false};
        const auto stored = random_matrix(rows, cols, f.p, s);
        std::vector<std::byte> bytes = stored;
        MatrixView w{stored.data(), rows, cols, f.p, s};
        if (f.order != MatrixOrder::rows) w = pack_panels(w, bytes, f.order);
        for (std::size_t n : ns) {
          if (quick && n == 512) continue;
          std::vector<float> x(n * cols), y(n * rows);
          std::mt19937 rng(static_cast<unsigned>(n));
          std::normal_distribution<float> nd(0.f, 1.f);
          for (float& v : x) v = nd(rng);
          KernelOptions o8{path.isa, &pool}, of{path.isa, &pool};
          o8.int8_activations = true;
          std::vector<double> t8, tf, tp;
          const int inner = rows < 1024 ? 200 : 1;  // the small shapes: many calls per timing
          for (int r = -1; r < reps; ++r) {         // a first, untimed round of each
            auto t0 = Clock::now();
            for (int i = 0; i < inner; ++i) gemm(w, x, n, y, o8);
            if (r >= 0)
              t8.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / inner);
            t0 = Clock::now();
            for (int i = 0; i < inner; ++i) gemm(w, x, n, y, of);
            if (r >= 0)
              tf.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / inner);
            if (r >= 0) tp.push_back(int8_peak(path.wide, pool));
          }
          const double s8 = median(t8), sf = median(tf), peak = median(tp);
          const double macs = static_cast<double>(rows) * cols * n;
          std::printf("%-11s %5zux%-5zu %4zu %10.3f %9.1f %10.3f %9.1f %7.2fx %7.0f%% %7.1f\n",
                      f.label, rows, cols, n, s8 * 1e3, 2 * macs / s8 / 1e9, sf * 1e3,
                      2 * macs / sf / 1e9, sf / s8, peak > 0 ? 100.0 * macs / s8 / peak : 0.0,
                      peak / 1e9);
        }
      }
    }
  }
  return 0;
}
