// Prefill GEMM: dequantize the expert matrix to f16 (one thread per 8 weights), then cuBLASLt
// with f16 inputs, fp32 compute and fp32 output.
#include <string>

#include "gemv_kernels.cuh"

namespace moekit::cuda {
namespace detail {

__global__ void __launch_bounds__(256) dequant_kernel(simt::DequantArgs a, std::size_t threads) {
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < threads) simt::dequant_thread(t, a);
}

inline void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    moekit::detail::fail(ErrorKind::internal,
                         std::string("cuBLASLt ") + what + " failed with status " +
                             std::to_string(static_cast<int>(s)));
}

}  // namespace detail

void dequantize_f16(const MatrixView& w, std::uint16_t* out, cudaStream_t stream) {
  detail::check_quantized(w, "cuda::dequantize_f16");
  MOEKIT_EXPECTS(out, "cuda::dequantize_f16: null output");
  const std::size_t threads = w.rows * ((w.cols + 7) / 8);
  const unsigned blocks = static_cast<unsigned>((threads + 255) / 256);
  detail::dequant_kernel<<<blocks, 256, 0, stream>>>(
      simt::DequantArgs{w.data, w.rows, w.row_stride(), w.layout(), out}, threads);
  detail::check_launch("cuda::dequantize_f16");
}

PrefillGemm::PrefillGemm() { detail::check_lt(cublasLtCreate(&handle_), "create"); }
PrefillGemm::~PrefillGemm() {
  if (handle_) cublasLtDestroy(handle_);
}

void PrefillGemm::run(const MatrixView& w, const std::uint16_t* x, std::size_t n, float* y,
                      std::uint16_t* w_f16, void* workspace, std::size_t workspace_bytes,
                      cudaStream_t stream) {
  MOEKIT_EXPECTS(n > 0 && x && y && w_f16, "PrefillGemm::run: null pointer or n = 0");
  dequantize_f16(w, w_f16, stream);
  // Row-major Y (n × rows) is column-major Yᵀ (rows × n) = W · Xᵀ; row-major W is column-major
  // Wᵀ (cols × rows), hence op(A) = T. X row-major is column-major Xᵀ (cols × n).
  const auto m = static_cast<std::uint64_t>(w.rows), k = static_cast<std::uint64_t>(w.cols),
             nn = static_cast<std::uint64_t>(n);
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  auto cleanup = [&] {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  };
  try {
    detail::check_lt(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    detail::check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
                     "transa");
    detail::check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
                     "transb");
    detail::check_lt(cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, k, m, static_cast<std::int64_t>(k)),
                     "layout A");
    detail::check_lt(cublasLtMatrixLayoutCreate(&b, CUDA_R_16F, k, nn, static_cast<std::int64_t>(k)),
                     "layout B");
    detail::check_lt(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, m, nn, static_cast<std::int64_t>(m)),
                     "layout C");
    detail::check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
    detail::check_lt(cublasLtMatmulPreferenceSetAttribute(
                         pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                         sizeof workspace_bytes),
                     "workspace preference");
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    detail::check_lt(cublasLtMatmulAlgoGetHeuristic(handle_, op, a, b, c, c, pref, 1, &heuristic,
                                                    &found),
                     "heuristic");
    if (found == 0)
      moekit::detail::fail(ErrorKind::unsupported, "cuBLASLt: no algorithm for this GEMM shape");
    const float alpha = 1.f, beta = 0.f;
    detail::check_lt(cublasLtMatmul(handle_, op, &alpha, w_f16, a, x, b, &beta, y, c, y, c,
                                    &heuristic.algo, workspace, workspace_bytes, stream),
                     "matmul");
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
}

}  // namespace moekit::cuda
