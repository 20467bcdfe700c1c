// Device benchmark of moekit's CUDA kernels (issue #27). Every line is a ratio against a peer
// measured in the same run on the same device:
//   - GEMV weight bytes/s against a read kernel streaming the same bytes (the bandwidth bound),
//     per format on Mixtral-8x7B's expert shapes (w1/w3: 14336 × 4096, w2: 4096 × 14336);
//   - the same GEMV against cuBLAS (GemmEx, n = 1) on the dequantized f16 matrix;
//   - the fused expert FFN against three separate GEMVs over the same matrices;
//   - PrefillGemm (dequantize + cuBLASLt) TFLOP/s against cuBLASLt on the f16 matrix alone;
//   - host→device staging (StagingPipeline<CudaCopyEngine>, 2 × 8 MiB slots) against one pinned
//     cudaMemcpyAsync of the same bytes.
// Without a CUDA device it says "no CUDA device" and exits 0 (scripts/gpu-check.sh).
//
//   moekit_bench_gpu [--quick]      (--quick: fewer repetitions)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "moekit/io/byte_source.hpp"
#include "moekit/io/cuda_staging.hpp"
#include "moekit/precision/half.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit_cuda.hpp"

namespace {

using namespace moekit;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "moekit_bench_gpu: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "moekit_bench_gpu: %s: cuBLAS status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

int g_reps = 20;

/// Median time in ms of `launch()` on `stream` (3 warm-up runs, then g_reps timed ones).
template <class F>
double median_ms(cudaStream_t stream, F&& launch) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> t;
  for (int i = 0; i < g_reps; ++i) {
    check(cudaEventRecord(a, stream), "record");
    launch();
    check(cudaEventRecord(b, stream), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Streams `n` 16-byte words once (the peer of the GEMV's weight reads): XOR into one word that is
/// stored only if it matches an impossible value, so the loads cannot be removed.
__global__ void read_kernel(const uint4* p, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

void row(const std::string& what, double mine, double peer, const char* unit, double ratio) {
  std::printf("| %-58s | %10.1f | %10.1f | %-6s | %6.3f |\n", what.c_str(), mine, peer, unit,
              ratio);
}

struct DeviceMemory {
  void* p = nullptr;
  explicit DeviceMemory(std::size_t n) { check(cudaMalloc(&p, n), "cudaMalloc"); }
  ~DeviceMemory() { cudaFree(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

/// A random matrix in (p, s) on the device.
struct Matrix {
  std::vector<std::byte> host;
  DeviceMemory dev;
  MatrixView view;
  Matrix(std::size_t rows, std::size_t cols, Precision p, QuantScheme s, unsigned seed)
      : host(random_bytes(rows, cols, p, s, seed)),
        dev(host.size()),
        view{nullptr, rows, cols, p, s} {
    check(cudaMemcpy(dev.p, host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
    view.data = dev.as<std::byte>();
  }
  static std::vector<std::byte> random_bytes(std::size_t rows, std::size_t cols, Precision p,
                                             QuantScheme s, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, 0.05f);
    std::vector<float> w(rows * cols);
    for (auto& v : w) v = d(rng);
    return encode_matrix<float>(w, rows, cols, p, s);
  }
};

struct Format {
  Precision p;
  QuantScheme s;
  const char* name;
};
constexpr Format formats[] = {{Precision::q8, {32, false}, "q8 g32"},
                              {Precision::q4, {64, true}, "q4 g64 affine"},
                              {Precision::q2, {64, true}, "q2 g64 affine"},
                              {Precision::q4, {0, false}, "q4 channel"}};

/// GEMV vs the read kernel and vs cuBLAS on the f16 matrix, one format and shape.
void gemv_rows(cublasHandle_t blas, const Format& f, std::size_t rows, std::size_t cols,
               cudaStream_t s) {
  const Matrix m(rows, cols, f.p, f.s, 1);
  DeviceMemory x(cols * 2), y(rows * 4), sink(4), w16(rows * cols * 2);
  check(cudaMemset(x.p, 0x3c, cols * 2), "memset");  // f16 ~1.0: the values do not change the time
  const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
  const double gemv = median_ms(
      s, [&] { cuda::gemv(m.view, x.p, cuda::ActivationType::f16, y.as<float>(), 1.f, false, s); });
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
  const std::size_t words = m.host.size() / 16;
  const double read = median_ms(s, [&] {
    read_kernel<<<static_cast<unsigned>(sms) * 16, 256, 0, s>>>(m.dev.as<uint4>(), words,
                                                                sink.as<unsigned>());
  });
  const double bytes = static_cast<double>(m.host.size());
  row("gemv " + std::string(f.name) + " " + shape + " f16: GB/s vs read kernel", bytes / gemv / 1e6,
      static_cast<double>(words * 16) / read / 1e6, "GB/s",
      (bytes / gemv) / (static_cast<double>(words * 16) / read));
  cuda::dequantize_f16(m.view, w16.as<std::uint16_t>(), s);
  check(cublasSetStream(blas, s), "cublasSetStream");
  const float one = 1.f, zero = 0.f;
  const double blas_ms = median_ms(s, [&] {
    check(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), 1,
                       static_cast<int>(cols), &one, w16.p, CUDA_R_16F, static_cast<int>(cols), x.p,
                       CUDA_R_16F, static_cast<int>(cols), &zero, y.p, CUDA_R_32F,
                       static_cast<int>(rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  });
  row("gemv " + std::string(f.name) + " " + shape + ": us, cuBLAS f16 GEMV / moekit", gemv * 1e3,
      blas_ms * 1e3, "us", blas_ms / gemv);
}

/// Fused expert FFN vs three GEMVs (w1, w3, w2) over the same Mixtral expert.
void ffn_rows(const Format& f, cudaStream_t s) {
  const std::size_t hidden = 4096, ffn = 14336;
  const Matrix w1(ffn, hidden, f.p, f.s, 2), w3(ffn, hidden, f.p, f.s, 3),
      w2(hidden, ffn, f.p, f.s, 4);
  DeviceMemory x(hidden * 2), h(ffn * 4), g(ffn * 4), out(hidden * 4);
  check(cudaMemset(x.p, 0x3c, hidden * 2), "memset");
  check(cudaMemset(h.p, 0, ffn * 4), "memset");
  const double fused = median_ms(s, [&] {
    cuda::expert_ffn(w1.view, w3.view, w2.view, x.p, cuda::ActivationType::f16, h.as<float>(),
                     out.as<float>(), 1.f, s);
  });
  const double three = median_ms(s, [&] {
    cuda::gemv(w1.view, x.p, cuda::ActivationType::f16, g.as<float>(), 1.f, false, s);
    cuda::gemv(w3.view, x.p, cuda::ActivationType::f16, h.as<float>(), 1.f, false, s);
    cuda::gemv(w2.view, h.p, cuda::ActivationType::f32, out.as<float>(), 1.f, true, s);
  });
  row("expert FFN " + std::string(f.name) + " Mixtral: us, three GEMVs / fused", fused * 1e3,
      three * 1e3, "us", three / fused);
}

/// cuBLASLt f16 × f16 → f32 (fp32 compute) with the same operand layout as PrefillGemm: the peer.
struct LtGemm {
  cublasLtHandle_t handle{};
  cublasLtMatmulDesc_t op{};
  cublasLtMatrixLayout_t a{}, b{}, c{};
  cublasLtMatmulHeuristicResult_t algo{};
  LtGemm(std::uint64_t m, std::uint64_t k, std::uint64_t n, std::size_t workspace) {
    check(cublasLtCreate(&handle), "cublasLtCreate");
    check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const cublasOperation_t ta = CUBLAS_OP_T;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
          "transa");
    check(cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, k, m, static_cast<std::int64_t>(k)), "A");
    check(cublasLtMatrixLayoutCreate(&b, CUDA_R_16F, k, n, static_cast<std::int64_t>(k)), "B");
    check(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, m, n, static_cast<std::int64_t>(m)), "C");
    cublasLtMatmulPreference_t pref{};
    check(cublasLtMatmulPreferenceCreate(&pref), "pref");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &workspace, sizeof workspace),
          "workspace");
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, c, c, pref, 1, &algo, &found),
          "heuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) check(CUBLAS_STATUS_NOT_SUPPORTED, "cuBLASLt: no algorithm");
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(handle);
  }
  void run(const void* w16, const void* x, float* y, void* ws, std::size_t ws_bytes,
           cudaStream_t s) {
    const float one = 1.f, zero = 0.f;
    check(cublasLtMatmul(handle, op, &one, w16, a, x, b, &zero, y, c, y, c, &algo.algo, ws,
                         ws_bytes, s),
          "matmul");
  }
};

/// PrefillGemm (dequantize + cuBLASLt) vs cuBLASLt on the already-f16 matrix, Mixtral w1.
void prefill_rows(const Format& f, std::size_t n, cudaStream_t s) {
  const std::size_t rows = 14336, cols = 4096, ws_bytes = 32u << 20;
  const Matrix w(rows, cols, f.p, f.s, 5);
  DeviceMemory x(n * cols * 2), y(n * rows * 4), w16(rows * cols * 2), ws(ws_bytes);
  check(cudaMemset(x.p, 0x3c, n * cols * 2), "memset");
  cuda::PrefillGemm gemm;
  const double mine = median_ms(s, [&] {
    gemm.run(w.view, x.as<std::uint16_t>(), n, y.as<float>(), w16.as<std::uint16_t>(), ws.p,
             ws_bytes, s);
  });
  LtGemm lt(rows, cols, n, ws_bytes);
  const double peer = median_ms(s, [&] { lt.run(w16.p, x.p, y.as<float>(), ws.p, ws_bytes, s); });
  const double flops = 2.0 * static_cast<double>(rows * cols * n);
  row("prefill " + std::string(f.name) + " 14336x4096 n=" + std::to_string(n) +
          ": TFLOP/s vs cuBLASLt f16",
      flops / mine / 1e9, flops / peer / 1e9, "TFLOP/s", peer / mine);
}

/// StagingPipeline<CudaCopyEngine> from pageable memory vs one pinned cudaMemcpyAsync, 256 MiB.
void staging_row() {
  const std::size_t bytes = 256u << 20;
  std::vector<std::byte> file(bytes, std::byte{1});
  DeviceMemory dst(bytes);
  io::CudaCopyEngine engine;  // 2 slots × 8 MiB
  io::StagingPipeline pipeline(engine);
  const io::MemorySource source(file);
  auto seconds = [](auto&& f) {
    std::vector<double> t;
    for (int i = 0; i < std::max(3, g_reps / 4); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double staged = seconds([&] {
    pipeline.load(source, {0, bytes}, dst.p);
    pipeline.synchronize();
  });
  void* pinned = nullptr;
  check(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  std::memset(pinned, 1, bytes);
  const double copy = seconds([&] {
    check(cudaMemcpyAsync(dst.p, pinned, bytes, cudaMemcpyHostToDevice, engine.stream()), "copy");
    check(cudaStreamSynchronize(engine.stream()), "sync");
  });
  cudaFreeHost(pinned);
  row("staging 256 MiB, 2 x 8 MiB slots: GB/s vs pinned cudaMemcpyAsync", bytes / staged / 1e9,
      bytes / copy / 1e9, "GB/s", copy / staged);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      g_reps = 5;
    } else {
      std::fprintf(stderr,
                   "moekit_bench_gpu: unknown argument '%s' (usage: moekit_bench_gpu [--quick])\n",
                   argv[i]);
      return 2;
    }
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("moekit_bench_gpu: no CUDA device (%s); nothing measured\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("moekit_bench_gpu: %s (sm_%d%d, %d SMs), median of %d runs\n\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, g_reps);
  std::printf("| %-58s | %10s | %10s | %-6s | %6s |\n|%s|%s|%s|%s|%s|\n", "measurement", "moekit",
              "peer", "unit", "ratio", std::string(60, '-').c_str(), std::string(12, '-').c_str(),
              std::string(12, '-').c_str(), std::string(8, '-').c_str(),
              std::string(8, '-').c_str());
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cublasHandle_t blas;
  check(cublasCreate(&blas), "cublasCreate");
  for (const Format& f : formats) {
    gemv_rows(blas, f, 14336, 4096, s);
    gemv_rows(blas, f, 4096, 14336, s);
  }
  for (const Format& f : formats) ffn_rows(f, s);
  for (std::size_t n : {64u, 512u}) prefill_rows(formats[1], n, s);
  staging_row();
  cublasDestroy(blas);
  cudaStreamDestroy(s);
  std::printf(
      "\nratio: moekit / peer for bandwidths and TFLOP/s, peer time / moekit time for us rows (> "
      "1: moekit faster)\n");
  return 0;
}
