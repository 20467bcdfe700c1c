// moekit's prefill GEMM (int8 activations, int8_gemm.hpp) against ggml's CPU mul_mat with n
// tokens (q8_0 / q4_0 weights; ggml quantizes the activations to q8_0 and, on AVX-512, may
// repack q4_0), timed rep by rep in one process, so the load of a shared machine hits both alike.
// Weights warm: prefill is compute-bound (every weight byte serves n tokens).
//
// Built and run by bench/kernels/ggml_peer.sh --gemm against the ggml that ggml-python compiled
// from source; not part of the CMake build, which has no ggml. The error columns compare token
// 0's result of each with the exact product of the unquantized weights (max abs error over max
// abs value), so both are known to compute the same thing. Ratio: ggml time / moekit time
// (> 1: moekit faster).
//
// ggml two ways: mul_mat on weights in a plain ggml context (its per-row q8_0 dot products),
// and the CPU backend with the weights in its "repack" extra buffer type (interleaved rows for its
// GEMM kernels; what llama.cpp does with q4_0/q8_0 weights on AVX2/AVX-512 CPUs).
//
// --kquant: the GGUF K-quant cells instead (q4_K, q5_K, q6_K, q2_K, q3_K; issue 23 point 3): ggml
// quantizes the matrix with its own quantizer and moekit runs those bytes in place (Precision::q4_k
// .. q6_k, kquant_int8_gemm.hpp), on the expert shapes only.
//
// Usage: gemm_vs_ggml [--reps N] [--threads N] [--isa avx2|avx512] [--kquant]
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../int8_peak.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit/precision/thread_pool.hpp"

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>

using namespace moekit;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(auto&& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// One quantized matrix and an n-token f32 input in a ggml context, with its mul_mat graph.
class GgmlGemm {
 public:
  GgmlGemm(ggml_type type, const std::vector<float>& w, std::size_t rows, std::size_t cols,
           std::size_t n, int threads) {
    const std::size_t mem = ggml_row_size(type, static_cast<std::int64_t>(cols)) * rows +
                            (n * cols + n * rows) * sizeof(float) + 4 * ggml_tensor_overhead() +
                            ggml_graph_overhead() + (1 << 20);
    ctx_ = ggml_init({mem, nullptr, false});
    if (!ctx_) throw std::runtime_error("ggml_init failed");
    m_ = ggml_new_tensor_2d(ctx_, type, static_cast<std::int64_t>(cols),
                            static_cast<std::int64_t>(rows));
    ggml_quantize_chunk(type, w.data(), m_->data, 0, static_cast<std::int64_t>(rows),
                        static_cast<std::int64_t>(cols), nullptr);
    x_ = ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, static_cast<std::int64_t>(cols),
                            static_cast<std::int64_t>(n));
    y_ = ggml_mul_mat(ctx_, m_, x_);
    graph_ = ggml_new_graph(ctx_);
    ggml_build_forward_expand(graph_, y_);
    plan_ = ggml_graph_plan(graph_, threads, nullptr);
    work_.resize(plan_.work_size);
    plan_.work_data = work_.data();
  }
  ~GgmlGemm() { ggml_free(ctx_); }
  GgmlGemm(const GgmlGemm&) = delete;
  GgmlGemm& operator=(const GgmlGemm&) = delete;

  void set_x(const std::vector<float>& x) {
    std::memcpy(x_->data, x.data(), x.size() * sizeof(float));
  }
  void run() {
    if (ggml_graph_compute(graph_, &plan_) != GGML_STATUS_SUCCESS)
      throw std::runtime_error("ggml_graph_compute failed");
  }
  const float* y() const { return static_cast<const float*>(y_->data); }  // n × rows
  /// The quantized matrix as ggml laid it out (K-quants: moekit runs these bytes in place).
  std::span<const std::byte> weights() const {
    return {static_cast<const std::byte*>(m_->data), ggml_nbytes(m_)};
  }

 private:
  ggml_context* ctx_ = nullptr;
  ggml_tensor *m_ = nullptr, *x_ = nullptr, *y_ = nullptr;
  ggml_cgraph* graph_ = nullptr;
  ggml_cplan plan_{};
  std::vector<std::uint8_t> work_;
};

/// The same product through the CPU backend with the weights in its first extra buffer type
/// (the "repack" one: q4_0/q8_0 interleaved for its GEMM kernels, as llama.cpp places them on
/// AVX2/AVX-512 CPUs), the activations and result in ordinary CPU memory.
class GgmlRepackedGemm {
 public:
  GgmlRepackedGemm(ggml_type type, const std::vector<float>& w, std::size_t rows, std::size_t cols,
                   std::size_t n, int threads) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    auto extra =
        reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(ggml_backend_reg_get_proc_address(
            ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts"));
    ggml_backend_buffer_type_t* bufts = extra ? extra(dev) : nullptr;
    if (!bufts || !*bufts) throw std::runtime_error("ggml: no extra (repack) buffer type");
    buft_name_ = ggml_backend_buft_name(bufts[0]);
    const ggml_init_params meta{8 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
    wctx_ = ggml_init(meta);
    xctx_ = ggml_init(meta);
    m_ = ggml_new_tensor_2d(wctx_, type, static_cast<std::int64_t>(cols),
                            static_cast<std::int64_t>(rows));
    x_ = ggml_new_tensor_2d(xctx_, GGML_TYPE_F32, static_cast<std::int64_t>(cols),
                            static_cast<std::int64_t>(n));
    y_ = ggml_mul_mat(xctx_, m_, x_);
    wbuf_ = ggml_backend_alloc_ctx_tensors_from_buft(wctx_, bufts[0]);
    xbuf_ = ggml_backend_alloc_ctx_tensors_from_buft(xctx_, ggml_backend_cpu_buffer_type());
    if (!wbuf_ || !xbuf_) throw std::runtime_error("ggml: buffer allocation failed");
    // The extra buffer takes only what it can repack for this CPU (llama.cpp asks the same).
    available_ = ggml_backend_dev_supports_op(dev, y_);
    if (!available_) return;
    std::vector<std::uint8_t> q(ggml_row_size(type, static_cast<std::int64_t>(cols)) * rows);
    ggml_quantize_chunk(type, w.data(), q.data(), 0, static_cast<std::int64_t>(rows),
                        static_cast<std::int64_t>(cols), nullptr);
    ggml_backend_tensor_set(m_, q.data(), 0, q.size());  // repacks
    graph_ = ggml_new_graph(xctx_);
    ggml_build_forward_expand(graph_, y_);
    backend_ = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend_, threads);
    y_host_.resize(n * rows);
  }
  ~GgmlRepackedGemm() {
    if (backend_) ggml_backend_free(backend_);
    ggml_backend_buffer_free(wbuf_);
    ggml_backend_buffer_free(xbuf_);
    ggml_free(wctx_);
    ggml_free(xctx_);
  }
  GgmlRepackedGemm(const GgmlRepackedGemm&) = delete;
  GgmlRepackedGemm& operator=(const GgmlRepackedGemm&) = delete;

  void set_x(const std::vector<float>& x) {
    ggml_backend_tensor_set(x_, x.data(), 0, x.size() * sizeof(float));
  }
  void run() {
    if (ggml_backend_graph_compute(backend_, graph_) != GGML_STATUS_SUCCESS)
      throw std::runtime_error("ggml_backend_graph_compute failed");
  }
  const float* y() {
    ggml_backend_tensor_get(y_, y_host_.data(), 0, y_host_.size() * sizeof(float));
    return y_host_.data();
  }
  const char* buffer_type() const { return buft_name_; }
  bool available() const { return available_; }

 private:
  ggml_context *wctx_ = nullptr, *xctx_ = nullptr;
  ggml_tensor *m_ = nullptr, *x_ = nullptr, *y_ = nullptr;
  ggml_backend_buffer_t wbuf_ = nullptr, xbuf_ = nullptr;
  ggml_cgraph* graph_ = nullptr;
  ggml_backend_t backend_ = nullptr;
  const char* buft_name_ = "";
  bool available_ = false;
  std::vector<float> y_host_;
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

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int reps = 3, threads = 1;
  bool kquant = false;
  std::optional<Isa> isa;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--isa") && i + 1 < argc && parse_isa(argv[i + 1]) &&
             isa_supported(*parse_isa(argv[i + 1])))
      isa = parse_isa(argv[++i]);
    else if (!std::strcmp(argv[i], "--kquant"))
      kquant = true;
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--threads N] [--isa avx2|avx512] [--kquant]\n",
                   argv[0]);
      return 2;
    }
  }
  ggml_cpu_init();
  const Isa our = isa.value_or(detect_isa());
  std::printf(
      "moekit int8 GEMM vs ggml mul_mat, warm weights, %d thread(s), ISA %s%s, medians of %d "
      "interleaved rounds; vs ggml = ggml time / moekit time (> 1: moekit faster)\n",
      threads, std::string(name(our)).c_str(),
      our == Isa::avx512 && has_avx512_vnni() ? "+vnni" : "", reps);
  std::printf(
      "ggml: plain = mul_mat on weights in a plain context (no repacking); repack = the CPU "
      "backend with the weights in its extra buffer type, as llama.cpp runs them\n");
  std::printf("%-5s %-11s %4s %9s %9s %9s %9s %9s %9s %8s %8s %7s %7s %7s %6s\n", "type", "shape",
              "n", "moekit ms", "GFLOP/s", "plain ms", "GFLOP/s", "repack ms", "GFLOP/s",
              "vs plain", "vs repk", "err", "pl err", "rp err", "of peak");
  struct Pair {
    Precision p;
    ggml_type gtype;
    const char* gname;
  };
  const std::vector<Pair> pairs = kquant
                                      ? std::vector<Pair>{{Precision::q4_k, GGML_TYPE_Q4_K, "q4_K"},
                                                          {Precision::q5_k, GGML_TYPE_Q5_K, "q5_K"},
                                                          {Precision::q6_k, GGML_TYPE_Q6_K, "q6_K"},
                                                          {Precision::q2_k, GGML_TYPE_Q2_K, "q2_K"},
                                                          {Precision::q3_k, GGML_TYPE_Q3_K, "q3_K"}}
                                      : std::vector<Pair>{{Precision::q8, GGML_TYPE_Q8_0, "q8_0"},
                                                          {Precision::q4, GGML_TYPE_Q4_0, "q4_0"}};
  // The expert shapes, then the attention projections (q/o, and Mixtral's k/v).
  const std::vector<std::array<std::size_t, 2>> shapes =
      kquant ? std::vector<std::array<std::size_t, 2>>{{14336, 4096}, {4096, 14336}}
             : std::vector<std::array<std::size_t, 2>>{
                   {14336, 4096}, {4096, 14336}, {4096, 4096}, {1024, 4096}};
  ThreadPool pool(static_cast<unsigned>(threads));
  for (const Pair& f : pairs)
    for (const auto& shape : shapes) {
      const std::size_t rows = shape[0], cols = shape[1];
      std::mt19937 rng(1);
      std::normal_distribution<float> d(0.f, 0.02f);
      std::vector<float> w(rows * cols);
      for (auto& v : w) v = d(rng);
      const QuantScheme s{32, false};
      const bool kq = is_gguf_kquant(f.p);
      const std::vector<std::byte> mat =
          kq ? std::vector<std::byte>{} : encode_matrix<float>(w, rows, cols, f.p, s);
      for (std::size_t n : {8u, 32u, 128u, 512u}) {
        GgmlGemm gg(f.gtype, w, rows, cols, n, threads);
        GgmlRepackedGemm gr(f.gtype, w, rows, cols, n, threads);
        // K-quants: ggml's bytes as they lie.
        const MatrixView view = kq ? make_matrix_view(gg.weights(), rows, cols, f.p)
                                   : MatrixView{mat.data(), rows, cols, f.p, s};
        std::vector<float> x(n * cols), y(n * rows), exact(rows);
        for (auto& v : x) v = d(rng) * 50.f;
        gg.set_x(x);
        if (gr.available()) gr.set_x(x);
        if (n == 8 && rows == 14336)
          std::printf("(%s: repack buffer type %s, %s)\n", f.gname, gr.buffer_type(),
                      gr.available() ? "takes it" : "does not take it: repack column n/a");
        for (std::size_t r = 0; r < rows; ++r) {  // token 0
          double acc = 0;
          for (std::size_t c = 0; c < cols; ++c) acc += double(w[r * cols + c]) * x[c];
          exact[r] = static_cast<float>(acc);
        }
        KernelOptions o{isa, &pool};
        o.int8_activations = true;
        std::vector<double> tm, tg, tr, tp;
        const bool wide = (!isa || *isa == Isa::avx512) && has_avx512_vnni();
        for (int r = -1; r < reps; ++r) {  // round -1 untimed
          if (r >= 0) tp.push_back(moekit_bench::int8_peak(wide, pool));
          const double a = seconds([&] { gemm(view, x, n, y, o); });
          const double g = seconds([&] { gg.run(); });
          const double p = gr.available() ? seconds([&] { gr.run(); }) : NAN;
          if (r >= 0) tm.push_back(a), tg.push_back(g), tr.push_back(p);
        }
        const double mm = median(tm), mg = median(tg), mr = median(tr),
                     flop = 2.0 * rows * cols * n;
        std::printf(
            "%-5s %5zux%-5zu %4zu %9.2f %9.1f %9.2f %9.1f %9.2f %9.1f %7.2fx %7.2fx %7.4f %7.4f "
            "%7.4f %5.0f%%\n",
            f.gname, rows, cols, n, mm * 1e3, flop / mm / 1e9, mg * 1e3, flop / mg / 1e9, mr * 1e3,
            flop / mr / 1e9, mg / mm, mr / mm, rel_diff(y.data(), exact.data(), rows),
            rel_diff(gg.y(), exact.data(), rows),
            gr.available() ? rel_diff(gr.y(), exact.data(), rows) : NAN,
            100.0 * flop / 2 / mm / median(tp));
      }
    }
  return 0;
}
