// moekit's dequant-GEMV against ggml's CPU mul_mat (n = 1) and against a streaming read, all
// three timed rep by rep in one process, so the load of a shared machine hits them alike.
//
// Built and run by bench/kernels/ggml_peer.sh against the ggml that ggml-python compiled from
// source (its headers and libraries live in the script's venv); not part of the CMake build,
// which has no ggml. Weights are cold as in MoE decode: every call uses the next of a rotating set
// of copies larger than the last-level cache, for moekit, ggml and the read alike.
//
// For each (format, shape, threads): medians over --reps rounds; each round runs moekit's float-
// activation path, moekit's int8-activation path (VNNI) on the matrix in rows and in 4-row panels
// (MatrixOrder::panels4) and in blocked panels (blocked_panels4; both must give the rows' result
// bit for bit), ggml, and the streaming read (twice: as one stream and as four prefetched ones; the
// faster median is the bound), each on its own next cold copy. The error columns compare both
// results with the exact product of the unquantized weights (max abs error over max abs value), so
// both are known to compute the same thing. Ratios are ggml time / moekit time (> 1: moekit faster)
// and moekit bytes/s as a fraction of the read bandwidth of the same round set.
//
// --float: the float formats instead (issue 23 point 2): f16 and bf16 rows against ggml's F16 and
// BF16 mul_mat (which round the activation to f16 / bf16), moekit with float activations (f32x,
// the widening kernels) and, for bf16 where the CPU has AVX512_BF16, with the activation rounded
// to bf16 and dotted with vdpbf16ps (bf16x, KernelOptions::bf16_activations).
//
// K-quant cells (q4_K, q5_K, q6_K, q2_K, q3_K; after the others, or alone with --kquant): the
// matrix is quantized by ggml and moekit runs ggml's very bytes as its format of the same name
// (Precision::q4_k .. q3_k: read in place, no transcode), so both read the same bytes; i8x is
// moekit's int8-activation kernel (ggml rounds the activation to q8_K, one scale per 256 values;
// moekit too, except for q6_k: int8 per 32).
//
// Usage: gemv_vs_ggml [--reps N] [--quick] [--only q8_0|q4_0|q2_K|q3_K|q4_K|q5_K|q6_K] [--threads
// N]
//                     [--float | --kquant]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "moekit/precision/gemv.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "../cold_read.hpp"

#include <ggml-cpu.h>
#include <ggml.h>

using namespace moekit;
using Clock = std::chrono::steady_clock;

namespace {

using bench::median;
using bench::rotation_bytes;

double seconds(auto&& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// A ggml context holding `copies` copies of one quantized matrix, each with its own n = 1 graph.
class GgmlGemv {
 public:
  GgmlGemv(ggml_type type, const std::vector<float>& w, std::size_t rows, std::size_t cols,
           std::size_t copies, int threads) {
    mat_bytes_ = ggml_row_size(type, static_cast<std::int64_t>(cols)) * rows;
    const std::size_t mem =
        copies * (mat_bytes_ + 3 * ggml_tensor_overhead() + ggml_graph_overhead()) +
        (cols + rows) * sizeof(float) + (16u << 20);
    ctx_ = ggml_init({mem, nullptr, false});
    if (!ctx_) throw std::runtime_error("ggml_init failed");
    x_ = ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, static_cast<std::int64_t>(cols), 1);
    std::fill_n(static_cast<float*>(x_->data), cols, 0.5f);
    for (std::size_t c = 0; c < copies; ++c) {
      ggml_tensor* m = ggml_new_tensor_2d(ctx_, type, static_cast<std::int64_t>(cols),
                                          static_cast<std::int64_t>(rows));
      if (c == 0)
        ggml_quantize_chunk(type, w.data(), m->data, 0, static_cast<std::int64_t>(rows),
                            static_cast<std::int64_t>(cols), nullptr);
      else
        std::memcpy(m->data, mats_[0]->data, mat_bytes_);
      mats_.push_back(m);
      ggml_tensor* y = ggml_mul_mat(ctx_, m, x_);
      ys_.push_back(y);
      ggml_cgraph* g = ggml_new_graph(ctx_);
      ggml_build_forward_expand(g, y);
      graphs_.push_back(g);
    }
    // One plan and work buffer (the activation quantized to q8) reused by every call.
    plan_ = ggml_graph_plan(graphs_[0], threads, nullptr);
    work_.resize(plan_.work_size + 64);
    plan_.work_data = work_.data();
  }
  GgmlGemv(const GgmlGemv&) = delete;
  GgmlGemv& operator=(const GgmlGemv&) = delete;
  ~GgmlGemv() { ggml_free(ctx_); }

  void run(std::size_t copy) {
    if (ggml_graph_compute(graphs_[copy], &plan_) != GGML_STATUS_SUCCESS)
      throw std::runtime_error("ggml_graph_compute failed");
  }
  void set_x(const std::vector<float>& x) {
    std::copy(x.begin(), x.end(), static_cast<float*>(x_->data));
  }
  const float* y(std::size_t copy) const { return static_cast<const float*>(ys_[copy]->data); }
  /// The bytes of copy `copy` of the matrix, as ggml quantized them.
  const std::byte* matrix(std::size_t copy) const {
    return static_cast<const std::byte*>(mats_[copy]->data);
  }
  std::size_t bytes() const { return mat_bytes_; }

 private:
  ggml_context* ctx_ = nullptr;
  ggml_tensor* x_ = nullptr;
  std::vector<ggml_tensor*> mats_, ys_;
  std::vector<ggml_cgraph*> graphs_;
  ggml_cplan plan_{};
  std::vector<std::uint8_t> work_;
  std::size_t mat_bytes_ = 0;
};

struct Pair {
  const char* label;
  Precision p;
  QuantScheme s;
  ggml_type gtype;
  const char* gname;
};

/// max |a − b| / max |b|
double rel_diff(const float* a, const float* b, std::size_t n) {
  double d = 0, r = 0;
  for (std::size_t i = 0; i < n; ++i) {
    d = std::max(d, double(std::abs(a[i] - b[i])));
    r = std::max(r, double(std::abs(b[i])));
  }
  return r > 0 ? d / r : d;
}

/// One float-format line of --float: f32x, bf16x (bf16 with AVX512_BF16), ggml, the two reads.
void run_float(Precision p, ggml_type gtype, std::size_t rows, std::size_t cols, ThreadPool& pool,
               int threads, int reps, std::optional<Isa> isa) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.f, 0.02f);
  std::vector<float> w(rows * cols);
  for (auto& v : w) v = d(rng);
  const std::size_t bytes = matrix_bytes(rows, cols, p, {});
  const std::size_t copies = std::max<std::size_t>(2, rotation_bytes / bytes);
  std::vector<std::vector<std::byte>> mats(copies, encode_matrix<float>(w, rows, cols, p, {}));
  GgmlGemv gg(gtype, w, rows, cols, copies, threads);
  std::vector<float> x(cols), y(rows), yb(rows), exact(rows);
  for (auto& v : x) v = d(rng) * 50.f;
  gg.set_x(x);
  for (std::size_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (std::size_t c = 0; c < cols; ++c) acc += double(w[r * cols + c]) * x[c];
    exact[r] = static_cast<float>(acc);
  }
  const bool bf16x =
      p == Precision::bf16 && isa.value_or(detect_isa()) == Isa::avx512 && has_avx512_bf16();
  KernelOptions of{isa, &pool}, ob{isa, &pool};
  ob.bf16_activations = true;
  bench::ColdRead read(pool, bytes, copies);
  std::vector<double> tf, tb, tg, tr, tr4;
  for (int r = -1; r < reps; ++r) {  // round -1 warms every copy (page faults, threads)
    for (std::size_t k = 0; k < (r < 0 ? copies : 1); ++k) {
      const std::size_t i = r < 0 ? k : static_cast<std::size_t>(r);
      auto view = [&](std::size_t c) {
        return MatrixView{mats[c % copies].data(), rows, cols, p, {}};
      };
      const double a = seconds([&] { gemv(view(i), x, y, of); });
      const double b = bf16x ? seconds([&] { gemv(view(i + 1), x, yb, ob); }) : 0.0;
      const double g = seconds([&] { gg.run((i + 2) % copies); });
      const double s = seconds([&] { read(i % copies, false); });
      const double s4 = seconds([&] { read((i + 1) % copies, true); });
      if (r >= 0)
        tf.push_back(a), tb.push_back(b), tg.push_back(g), tr.push_back(s), tr4.push_back(s4);
    }
  }
  // Per-round ratios, then their median: on a machine shared with builds the bandwidth moves
  // severalfold within a run, over seconds; calls of one round see the same machine.
  auto ratio = [&](const std::vector<double>& num, const std::vector<double>& den) {
    std::vector<double> q(num.size());
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = num[i] / den[i];
    return median(q);
  };
  std::vector<double> tread(tr.size());
  for (std::size_t i = 0; i < tr.size(); ++i) tread[i] = std::min(tr[i], tr4[i]);
  const double mf = median(tf), mb = median(tb), mg = median(tg), mr = median(tread), nan = NAN;
  auto best = [](const std::vector<double>& t) { return *std::min_element(t.begin(), t.end()); };
  const double rf = ratio(tread, tf), rb = bf16x ? ratio(tread, tb) : nan, rg = ratio(tread, tg),
               gf = ratio(tg, tf), gb = bf16x ? ratio(tg, tb) : nan;
  std::printf(
      "%-5s %5zux%-5zu %6.1f | %7.3f %7.3f %7.3f %7.3f | %6.0f%% %6.0f%% %6.0f%% | %6.2fx %6.2fx | "
      "%7.1e %7.1e %7.1e | %4.0f%% %4.0f%% %4.0f%%\n",
      std::string(name(p)).c_str(), rows, cols, bytes / 1048576.0, mf * 1e3, bf16x ? mb * 1e3 : nan,
      mg * 1e3, mr * 1e3, 100 * rf, 100 * rb, 100 * rg, gf, gb,
      rel_diff(y.data(), exact.data(), rows), bf16x ? rel_diff(yb.data(), exact.data(), rows) : nan,
      rel_diff(gg.y(0), exact.data(), rows), 100 * best(tread) / best(tf),
      bf16x ? 100 * best(tread) / best(tb) : nan, 100 * best(tread) / best(tg));
}

/// --float: f16 and bf16 against ggml's F16 and BF16 mul_mat.
void run_floats(int reps, bool quick, int only_threads, std::optional<Isa> isa) {
  std::printf(
      "--float: ms are medians; rd and /gg are medians of per-round ratios (the calls of one round "
      "see the same machine; the read is the faster of its two in the round); best: each one's "
      "fastest "
      "round against the read's fastest; f32x: float "
      "activations (the widening kernels); bf16x: the activation rounded to bf16, "
      "vdpbf16ps (KernelOptions::bf16_activations; bf16 rows on AVX512_BF16 only); ggml rounds the "
      "activation to the weights' type; rd: the read's time / the kernel's; /gg: ggml time / "
      "moekit time; err: max |y - exact| / max |exact|\n");
  const std::size_t shapes[][2] = {{14336, 4096}, {4096, 14336}};
  for (int threads : {1, 2}) {
    if (only_threads && threads != only_threads) continue;
    ThreadPool pool(static_cast<unsigned>(threads));
    std::printf(
        "\n== %d thread(s)\n%-5s %-11s %6s | %7s %7s %7s %7s | %7s %7s %7s | %7s %7s | %7s %7s "
        "%7s | best: f32x bf16x ggml\n",
        threads, "fmt", "shape", "MiB", "f32x ms", "bf16x", "ggml ms", "read ms", "f32x rd",
        "bf16x rd", "ggml rd", "f32x/gg", "bf16x/gg", "f err", "b err", "gg err");
    for (auto [p, gtype] :
         {std::pair{Precision::bf16, GGML_TYPE_BF16}, std::pair{Precision::f16, GGML_TYPE_F16}})
      for (const auto& shape : shapes) {
        if (quick && shape[0] != 14336) continue;
        run_float(p, gtype, shape[0], shape[1], pool, threads, reps, isa);
      }
  }
}

/// One K-quant line: moekit's f32x and i8x on ggml's bytes, ggml, the two reads.
void run_kquant(Precision p, ggml_type gtype, std::size_t rows, std::size_t cols, ThreadPool& pool,
                int threads, int reps, std::optional<Isa> isa) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.f, 0.02f);
  std::vector<float> w(rows * cols);
  for (auto& v : w) v = d(rng);
  const std::size_t bytes = matrix_bytes(rows, cols, p);
  const std::size_t copies = std::max<std::size_t>(2, rotation_bytes / bytes);
  GgmlGemv gg(gtype, w, rows, cols, copies, threads);
  if (gg.bytes() != bytes) throw std::runtime_error("ggml's row size differs from moekit's");
  // moekit's copies are ggml's bytes as they lie (apart from ggml's, so each side is cold).
  std::vector<std::vector<std::byte>> mats(
      copies, std::vector<std::byte>(gg.matrix(0), gg.matrix(0) + bytes));
  std::vector<float> x(cols), y(rows), y8(rows), exact(rows);
  for (auto& v : x) v = d(rng) * 50.f;
  gg.set_x(x);
  for (std::size_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (std::size_t c = 0; c < cols; ++c) acc += double(w[r * cols + c]) * x[c];
    exact[r] = static_cast<float>(acc);
  }
  KernelOptions of{isa, &pool}, o8{isa, &pool};
  o8.int8_activations = true;
  bench::ColdRead read(pool, bytes, copies);
  auto view = [&](std::size_t c) { return MatrixView{mats[c % copies].data(), rows, cols, p}; };
  std::vector<double> tf, t8, tg, tr;
  const int float_reps = std::min(reps, 3);  // the float path decodes every row: slow, shown once
  for (int r = -1; r < reps; ++r) {          // round -1 warms every copy (page faults, threads)
    for (std::size_t k = 0; k < (r < 0 ? copies : 1); ++k) {
      const std::size_t i = r < 0 ? k : static_cast<std::size_t>(r);
      const double a = r < float_reps ? seconds([&] { gemv(view(i), x, y, of); }) : NAN;
      const double b = seconds([&] { gemv(view(i + 1), x, y8, o8); });
      const double g = seconds([&] { gg.run((i + 2) % copies); });
      const double s = std::min(seconds([&] { read(i % copies, false); }),
                                seconds([&] { read((i + 1) % copies, true); }));
      if (r >= 0) {
        if (r < float_reps) tf.push_back(a);
        t8.push_back(b), tg.push_back(g), tr.push_back(s);
      }
    }
  }
  auto ratio = [&](const std::vector<double>& num, const std::vector<double>& den) {
    std::vector<double> q(num.size());
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = num[i] / den[i];
    return median(q);
  };
  const double mf = median(tf), m8 = median(t8), mg = median(tg), mr = median(tr);
  auto best = [](const std::vector<double>& t) { return *std::min_element(t.begin(), t.end()); };
  std::printf(
      "%-6s %5zux%-5zu %6.1f | %7.3f %7.3f %7.3f %7.3f | %6.0f%% %6.0f%% %6.0f%% | %6.2fx "
      "%6.2fx | %5.3f %5.3f %5.3f | %4.0f%% %4.0f%% %5.2fx\n",
      std::string(name(p)).c_str(), rows, cols, bytes / 1048576.0, mf * 1e3, m8 * 1e3, mg * 1e3,
      mr * 1e3, 100 * mr / mf, 100 * ratio(tr, t8), 100 * ratio(tr, tg), mg / mf, ratio(tg, t8),
      rel_diff(y.data(), exact.data(), rows), rel_diff(y8.data(), exact.data(), rows),
      rel_diff(gg.y(0), exact.data(), rows), 100 * best(tr) / best(t8), 100 * best(tr) / best(tg),
      best(tg) / best(t8));
}

/// The K-quant cells: q4_K, q5_K, q6_K, q2_K and q3_K on the Mixtral expert shapes, 1 and 2
/// threads.
void run_kquants(int reps, bool quick, const std::string& only, int only_threads,
                 std::optional<Isa> isa) {
  std::printf(
      "\nK-quants: moekit runs ggml's bytes as Precision::q4_k / q5_k / q6_k / q2_k / q3_k (in "
      "place). ms are "
      "medians; "
      "i8x rd, ggml rd and i8x/gg are medians of per-round ratios (rd: the read's time / the "
      "kernel's, the read the faster of one stream and four prefetched ones in the round; /gg: "
      "ggml time / moekit time); f32x: float activations (decodes each row; 3 rounds); err: max "
      "|y - exact| / max |exact|; best: each one's fastest round against the read's fastest, "
      "and ggml's fastest / i8x's fastest (a loaded machine preempts whole rounds)\n");
  const std::size_t shapes[][2] = {{14336, 4096}, {4096, 14336}};
  for (int threads : {1, 2}) {
    if (only_threads && threads != only_threads) continue;
    ThreadPool pool(static_cast<unsigned>(threads));
    std::printf(
        "\n== %d thread(s)\n%-6s %-11s %6s | %7s %7s %7s %7s | %7s %7s %7s | %7s %7s | "
        "%5s %5s %5s | best: i8x rd, ggml rd, i8x/gg\n",
        threads, "fmt", "shape", "MiB", "f32x ms", "i8x ms", "ggml ms", "read ms", "f32x rd",
        "i8x rd", "ggml rd", "f32x/gg", "i8x/gg", "f err", "i8err", "gg er");
    for (auto [p, gtype, gname] : {std::tuple{Precision::q4_k, GGML_TYPE_Q4_K, "q4_K"},
                                   std::tuple{Precision::q5_k, GGML_TYPE_Q5_K, "q5_K"},
                                   std::tuple{Precision::q6_k, GGML_TYPE_Q6_K, "q6_K"},
                                   std::tuple{Precision::q2_k, GGML_TYPE_Q2_K, "q2_K"},
                                   std::tuple{Precision::q3_k, GGML_TYPE_Q3_K, "q3_K"}}) {
      if (!only.empty() && only != gname) continue;
      for (const auto& shape : shapes) {
        if (quick && shape[0] != 14336) continue;
        run_kquant(p, gtype, shape[0], shape[1], pool, threads, reps, isa);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int reps = 21;
  bool quick = false;
  std::string only;
  int only_threads = 0;
  std::optional<Isa> isa;
  bool floats = false, kquants_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true, reps = 7;
    else if (!std::strcmp(argv[i], "--float"))
      floats = true;
    else if (!std::strcmp(argv[i], "--kquant"))
      kquants_only = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      only_threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--isa") && i + 1 < argc && parse_isa(argv[i + 1]) &&
             isa_supported(*parse_isa(argv[i + 1])))
      isa = parse_isa(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: %s [--reps N] [--quick] [--only q8_0|q4_0|q2_K|q3_K|q4_K|q5_K|q6_K] "
                   "[--threads N] "
                   "[--float | --kquant] "
                   "[--isa avx2|avx512 (moekit's path; must be supported)]\n",
                   argv[0]);
      return 2;
    }
  }
  ggml_cpu_init();
  // The int8 kernels: AVX-512 VNNI, else AVX2 (with AVX-VNNI where present).
  const Isa our = isa.value_or(detect_isa());
  const bool int8 = our != Isa::generic;
  std::printf(
      "moekit GEMV vs ggml mul_mat, n = 1, cold weights (rotation over %zu MiB each), "
      "ISA %s%s, medians of %d interleaved rounds\n",
      rotation_bytes >> 20, std::string(name(our)).c_str(),
      our == Isa::avx512 && has_avx512_vnni() ? "+vnni" : "", reps);
  if (floats) {
    run_floats(reps, quick, only_threads, isa);
    return 0;
  }
  if (kquants_only) {
    run_kquants(reps, quick, only, only_threads, isa);
    return 0;
  }
  std::printf(
      "f32x: float activations; i8x: int8 activations (KernelOptions::int8_activations); "
      "p8x: int8 activations, the matrix in 4-row panels (MatrixOrder::panels4); b8x: the same in "
      "blocked panels (MatrixOrder::blocked_panels4)\n"
      "vs ggml: ggml time / moekit time (> 1: moekit faster); of read: moekit bytes/s over a "
      "streaming read of the same bytes (the faster of one stream and four prefetched ones)\n");
  const Pair pairs[] = {{"q8 g32 sym", Precision::q8, {32, false}, GGML_TYPE_Q8_0, "q8_0"},
                        {"q4 g32 sym", Precision::q4, {32, false}, GGML_TYPE_Q4_0, "q4_0"},
                        {"q2 g64 aff", Precision::q2, {64, true}, GGML_TYPE_Q2_K, "q2_K"}};
  const std::size_t shapes[][2] = {{14336, 4096}, {4096, 14336}};
  for (int threads : {1, 2}) {
    if (only_threads && threads != only_threads) continue;
    ThreadPool pool(static_cast<unsigned>(threads));
    std::printf(
        "\n== %d thread(s)\n%-11s %-11s %6s %6s | %7s %7s %7s %7s %7s %7s | %7s %7s %7s %7s | %7s "
        "%7s %7s %7s | %5s %5s %5s\n",
        threads, "format", "shape", "MiB", "gg MiB", "f32x ms", "i8x ms", "p8x ms", "b8x ms",
        "ggml ms", "read ms", "f32x rd", "i8x rd", "p8x rd", "b8x rd", "f32x/gg", "i8x/gg",
        "p8x/gg", "b8x/gg", "f err", "i8err", "gg er");
    for (const Pair& f : pairs) {
      if (!only.empty() && only != f.gname) continue;
      for (const auto& shape : shapes) {
        if (quick && shape[0] != 14336) continue;
        const std::size_t rows = shape[0], cols = shape[1];
        std::mt19937 rng(1);
        std::normal_distribution<float> d(0.f, 0.02f);
        std::vector<float> w(rows * cols);
        for (auto& v : w) v = d(rng);

        const std::size_t bytes = matrix_bytes(rows, cols, f.p, f.s);
        const std::size_t copies = std::max<std::size_t>(2, rotation_bytes / bytes);
        std::vector<std::vector<std::byte>> mats(copies);
        mats[0] = encode_matrix<float>(w, rows, cols, f.p, f.s);
        for (std::size_t c = 1; c < copies; ++c) mats[c] = mats[0];
        std::vector<std::vector<std::byte>> panels(copies, std::vector<std::byte>(bytes)),
            blocked = panels;
        for (std::size_t c = 0; c < copies; ++c) {
          pack_panels(MatrixView{mats[0].data(), rows, cols, f.p, f.s}, panels[c]);
          pack_panels(MatrixView{mats[0].data(), rows, cols, f.p, f.s}, blocked[c],
                      MatrixOrder::blocked_panels4);
        }
        const std::size_t gbytes = ggml_row_size(f.gtype, static_cast<std::int64_t>(cols)) * rows;
        const std::size_t gcopies = std::max<std::size_t>(2, rotation_bytes / gbytes);
        GgmlGemv gg(f.gtype, w, rows, cols, gcopies, threads);
        std::vector<float> x(cols), y(rows), y8(rows), yp(rows), yb(rows), exact(rows);
        for (auto& v : x) v = d(rng) * 50.f;
        gg.set_x(x);
        for (std::size_t r = 0; r < rows; ++r) {
          double acc = 0;
          for (std::size_t c = 0; c < cols; ++c) acc += double(w[r * cols + c]) * x[c];
          exact[r] = static_cast<float>(acc);
        }
        w.clear();
        w.shrink_to_fit();
        KernelOptions of{isa, &pool}, o8{isa, &pool};
        o8.int8_activations = true;
        bench::ColdRead read(pool, bytes, copies);
        auto ours = [&](std::size_t c, const KernelOptions& o, std::vector<float>& out) {
          gemv(MatrixView{mats[c].data(), rows, cols, f.p, f.s}, x, out, o);
        };
        auto ours_panels = [&](std::size_t c) {
          gemv(MatrixView{panels[c].data(), rows, cols, f.p, f.s, MatrixOrder::panels4}, x, yp, o8);
        };
        auto ours_blocked = [&](std::size_t c) {
          gemv(MatrixView{blocked[c].data(), rows, cols, f.p, f.s, MatrixOrder::blocked_panels4}, x,
               yb, o8);
        };
        std::vector<double> tf, t8, tp, tb, tg, tr, tr4;
        for (int r = -1; r < reps; ++r) {  // round -1 warms every copy (page faults, threads)
          const std::size_t n_rounds = r < 0 ? std::max(copies, gcopies) : 1;
          for (std::size_t k = 0; k < n_rounds; ++k) {
            const std::size_t i = r < 0 ? k : static_cast<std::size_t>(r);
            const double a = seconds([&] { ours(i % copies, of, y); });
            const double b = seconds([&] { ours((i + 1) % copies, o8, y8); });
            const double pn = seconds([&] { ours_panels((i + 2) % copies); });
            const double bl = seconds([&] { ours_blocked((i + 3) % copies); });
            const double g = seconds([&] { gg.run(i % gcopies); });
            const double s = seconds([&] { read(i % copies, false); });
            const double s4 = seconds([&] { read((i + 1) % copies, true); });
            if (r >= 0)
              tf.push_back(a), t8.push_back(b), tp.push_back(pn), tb.push_back(bl), tg.push_back(g),
                  tr.push_back(s), tr4.push_back(s4);
          }
        }
        // The bound: the faster of the two reads (one stream, four prefetched streams).
        const double mf = median(tf), m8 = median(t8), mp = median(tp), mb = median(tb),
                     mg = median(tg), mr = std::min(median(tr), median(tr4));
        if (int8 && (yp != y8 ||
                     yb != y8)) {  // the panel kernel does the row kernel's operations in its order
          std::fprintf(stderr, "%s %zux%zu: panels gave a different result from rows\n", f.gname,
                       rows, cols);
          return 1;
        }
        // Same math: each result's error against the exact product of the unquantized weights.
        const double err_f = rel_diff(y.data(), exact.data(), rows);
        const double err_8 = rel_diff(y8.data(), exact.data(), rows);
        const double err_g = rel_diff(gg.y(0), exact.data(), rows);
        const double nan = NAN;
        std::printf(
            "%-4s/%-6s %5zux%-5zu %6.1f %6.1f | %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f | %6.0f%% "
            "%6.0f%% %6.0f%% %6.0f%% | %6.2fx %6.2fx %6.2fx %6.2fx | %5.3f %5.3f %5.3f\n",
            f.gname, f.label, rows, cols, bytes / 1048576.0, gbytes / 1048576.0, mf * 1e3,
            int8 ? m8 * 1e3 : nan, int8 ? mp * 1e3 : nan, int8 ? mb * 1e3 : nan, mg * 1e3, mr * 1e3,
            100 * mr / mf, int8 ? 100 * mr / m8 : nan, int8 ? 100 * mr / mp : nan,
            int8 ? 100 * mr / mb : nan, mg / mf, int8 ? mg / m8 : nan, int8 ? mg / mp : nan,
            int8 ? mg / mb : nan, err_f, err_8, err_g);
      }
    }
  }
  if (int8) run_kquants(reps, quick, only, only_threads, isa);
  return 0;
}
