// GEMV / fused expert FFN throughput on Mixtral expert shapes with cold weights, as a fraction of
// the streaming read bandwidth measured in the same run.
//
// Weights are cold as in MoE decode: each timed call uses the next of a rotating set of copies
// whose total size is several times the last-level cache. Bandwidth reference: a vectorised
// streaming sum over rotating buffers of the same size, on the same number of threads, timed in
// the same rounds as the kernels.
//
// Usage: moekit_bench_gemv [--quick] [--reps N]
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
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

using bench::ColdRead;
using bench::median;
using bench::rotation_bytes;

/// Medians of the seconds each of `fns(copy)` takes, timed round by round (every round runs each
/// once, on its own next copy of `copies`), so a shift in the shared machine's bandwidth hits
/// them alike. A first round over every copy warms them (page faults, thread wake-up), untimed.
template <class... Fns>
std::array<double, sizeof...(Fns)> time_rounds(std::size_t copies, int reps, Fns&&... fns) {
  std::array<std::vector<double>, sizeof...(Fns)> t;
  std::size_t next = 0;
  for (int r = -1; r < reps; ++r)
    for (std::size_t k = 0; k < (r < 0 ? copies : 1); ++k) {
      std::size_t i = 0;
      (([&] {
         const auto t0 = Clock::now();
         fns(next++ % copies);
         if (r >= 0) t[i].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
         ++i;
       }()),
       ...);
    }
  std::array<double, sizeof...(Fns)> m{};
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = median(t[i]);
  return m;
}

struct Format {
  const char* label;
  Precision p;
  QuantScheme s;
  bool int8 = false;  ///< KernelOptions::int8_activations
  MatrixOrder order = MatrixOrder::rows;
  std::optional<Isa> isa = std::nullopt;  ///< forced path (default: the best)
  bool avx_vnni = true;                   ///< KernelOptions::avx_vnni
};

std::vector<std::byte> random_matrix(std::size_t rows, std::size_t cols, Format f, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 0.02f);
  std::vector<float> w(rows * cols);
  for (auto& v : w) v = d(rng);
  std::vector<std::byte> m = encode_matrix<float>(w, rows, cols, f.p, f.s);
  if (f.order == MatrixOrder::rows) return m;
  std::vector<std::byte> packed(m.size());
  pack_panels(MatrixView{m.data(), rows, cols, f.p, f.s}, packed, f.order);
  return packed;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear as they are measured
  bool quick = false;
  int reps = 40;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick"))
      quick = true, reps = 10;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  std::printf(
      "moekit GEMV benchmark: ISA %s%s, cold weights (rotation over %zu MiB)\n"
      "i8x = int8 activations (KernelOptions::int8_activations, AVX-512 VNNI); p8x = the "
      "same with the matrices in 4-row panels (MatrixOrder::panels4); b8x = in blocked panels "
      "(blocked_panels4); avx2 = the AVX2 float "
      "path, a2i8x = AVX2 with int8 activations (AVX-VNNI), a2i8m = the same with vpmaddubsw, "
      "a2b8x / "
      "a2b8m = the same in blocked panels\n",
      std::string(name(detect_isa())).c_str(), has_avx512_vnni() ? "+vnni" : "",
      rotation_bytes >> 20);
  const Format formats[] = {
      {"q8 g32 sym", Precision::q8, {32, false}},
      {"q4 g32 sym", Precision::q4, {32, false}},
      {"q8 g32 i8x", Precision::q8, {32, false}, true},
      {"q4 g32 i8x", Precision::q4, {32, false}, true},
      {"q8 g32 p8x", Precision::q8, {32, false}, true, MatrixOrder::panels4},
      {"q4 g32 p8x", Precision::q4, {32, false}, true, MatrixOrder::panels4},
      {"q8 g32 b8x", Precision::q8, {32, false}, true, MatrixOrder::blocked_panels4},
      {"q4 g32 b8x", Precision::q4, {32, false}, true, MatrixOrder::blocked_panels4},
      {"q4 g64 aff", Precision::q4, {64, true}},
      {"q4 g64 i8x", Precision::q4, {64, true}, true},
      {"q2 g64 aff", Precision::q2, {64, true}},
      {"q2 g64 i8x", Precision::q2, {64, true}, true},
      {"q2 g64 p8x", Precision::q2, {64, true}, true, MatrixOrder::panels4},
      // The AVX2 paths (what CPUs without AVX-512 VNNI run), forced here.
      {"q8 g32 avx2", Precision::q8, {32, false}, false, MatrixOrder::rows, Isa::avx2},
      {"q8 g32 a2i8x", Precision::q8, {32, false}, true, MatrixOrder::rows, Isa::avx2},
      {"q8 g32 a2i8m", Precision::q8, {32, false}, true, MatrixOrder::rows, Isa::avx2, false},
      {"q4 g32 avx2", Precision::q4, {32, false}, false, MatrixOrder::rows, Isa::avx2},
      {"q4 g32 a2i8x", Precision::q4, {32, false}, true, MatrixOrder::rows, Isa::avx2},
      {"q4 g32 a2i8m", Precision::q4, {32, false}, true, MatrixOrder::rows, Isa::avx2, false},
      {"q8 g32 a2b8x", Precision::q8, {32, false}, true, MatrixOrder::blocked_panels4, Isa::avx2},
      {"q8 g32 a2b8m",
       Precision::q8,
       {32, false},
       true,
       MatrixOrder::blocked_panels4,
       Isa::avx2,
       false},
      {"q4 g32 a2b8x", Precision::q4, {32, false}, true, MatrixOrder::blocked_panels4, Isa::avx2},
      {"q4 g32 a2b8m",
       Precision::q4,
       {32, false},
       true,
       MatrixOrder::blocked_panels4,
       Isa::avx2,
       false},
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
          if (c == 0)
            mats.push_back(random_matrix(rows, cols, f, 1));
          else
            mats.push_back(mats[0]);
        }
        std::vector<float> x(cols, 0.5f), y(rows);
        KernelOptions o{f.isa, &pool};
        o.int8_activations = f.int8;
        o.avx_vnni = f.avx_vnni;
        if (f.isa && !isa_supported(*f.isa)) continue;
        ColdRead read(pool, bytes, copies);
        const auto [s, r1, r4] = time_rounds(
            copies, reps,
            [&](std::size_t c) {
              gemv(MatrixView{mats[c].data(), rows, cols, f.p, f.s, f.order}, x, y, o);
            },
            [&](std::size_t c) { read(c, false); }, [&](std::size_t c) { read(c, true); });
        const double bw = bytes / std::min(r1, r4);
        std::printf("%-12s %5zux%-6zu %10.1f %9.3f %10.2f %10.2f %7.0f%%\n", f.label, rows, cols,
                    bytes / 1048576.0, s * 1e3, bytes / s / 1e9, bw / 1e9, 100.0 * bytes / s / bw);
      }
    }
    // Fused expert FFN vs three separate GEMVs (+ the elementwise step), one Mixtral expert.
    for (const Format& f : {formats[1], formats[3], formats[5], formats[7], formats[0], formats[2],
                            formats[4], formats[6]}) {
      const std::size_t hidden = 4096, ffn = 14336;
      const auto w1 = random_matrix(ffn, hidden, f, 2), w3 = random_matrix(ffn, hidden, f, 3),
                 w2 = random_matrix(hidden, ffn, f, 4);
      const std::size_t expert_bytes = w1.size() + w3.size() + w2.size();
      const std::size_t copies = std::max<std::size_t>(2, rotation_bytes / expert_bytes);
      std::vector<std::vector<std::byte>> c1(copies, w1), c3(copies, w3), c2(copies, w2);
      std::vector<float> x(hidden, 0.5f), out(hidden, 0.f), g(ffn), u(ffn);
      auto view = [&](const std::vector<std::byte>& b, std::size_t r, std::size_t c) {
        return MatrixView{b.data(), r, c, f.p, f.s, f.order};
      };
      KernelOptions opts{std::nullopt, &pool};
      opts.int8_activations = f.int8;
      ColdRead read(pool, expert_bytes, copies);
      const auto [fused, separate, r1, r4] = time_rounds(
          copies, reps,
          [&](std::size_t c) {
            expert_ffn(
                {view(c1[c], ffn, hidden), view(c3[c], ffn, hidden), view(c2[c], hidden, ffn)}, x,
                1, out, 0.5f, opts);
          },
          [&](std::size_t c) {
            gemv(view(c1[c], ffn, hidden), x, g, opts);
            gemv(view(c3[c], ffn, hidden), x, u, opts);
            for (std::size_t i = 0; i < ffn; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
            gemv(view(c2[c], hidden, ffn), g, out, opts, {0.5f, true});
          },
          [&](std::size_t c) { read(c, false); }, [&](std::size_t c) { read(c, true); });
      std::printf(
          "expert FFN %s (%.1f MiB): fused %.3f ms, 3 GEMVs %.3f ms, ratio %.2fx, %.2f GB/s, "
          "%.0f%% of read\n",
          f.label, expert_bytes / 1048576.0, fused * 1e3, separate * 1e3, separate / fused,
          expert_bytes / fused / 1e9, 100.0 * std::min(r1, r4) / fused);
    }
  }
  return 0;
}
