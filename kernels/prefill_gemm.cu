// Prefill GEMM: dequantize the expert matrix to f16 (one thread per 8 weights), then cuBLASLt
// with f16 inputs, fp32 compute and fp32 output.
#include <cstdint>
#include <string>
#include <utility>

#include "gemv_kernels.cuh"

namespace moekit::cuda {
namespace detail {

/// Threads per block of the dequantize kernel (one thread per 8 weights, no shared memory).
inline constexpr unsigned dequant_block = 256;

__global__ void __launch_bounds__(dequant_block)
    dequant_kernel(simt::DequantArgs a, std::size_t threads) {
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < threads) simt::dequant_thread(t, a);
}

static_assert(dequant_block <= 1024 && dequant_block % simt::warp_size == 0,
              "a block holds at most 1024 threads, in whole warps");

/// Largest power of two <= 256 that divides the address. cuBLASLt's heuristic assumes 256-byte
/// aligned matrices unless the CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES preferences say less,
/// and `x` / `y` may point into the middle of a batch (chunked prefill), so each is told.
inline std::uint32_t pointer_alignment(const void* p) noexcept {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

inline void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    moekit::detail::fail(ErrorKind::internal, std::string("cuBLASLt ") + what +
                                                  " failed with status " +
                                                  std::to_string(static_cast<int>(s)));
}

}  // namespace detail

void dequantize_f16(const MatrixView& w, std::uint16_t* out, cudaStream_t stream) {
  detail::check_quantized(w, "cuda::dequantize_f16");
  MOEKIT_EXPECTS(out, "cuda::dequantize_f16: null output");
  const std::size_t threads = w.rows * ((w.cols + 7) / 8);
  const unsigned blocks =
      detail::grid_blocks(threads, detail::dequant_block, "cuda::dequantize_f16");
  detail::dequant_kernel<<<blocks, detail::dequant_block, 0, stream>>>(
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
    detail::check_lt(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "transa");
    detail::check_lt(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "transb");
    detail::check_lt(cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, k, m, static_cast<std::int64_t>(k)),
                     "layout A");
    detail::check_lt(
        cublasLtMatrixLayoutCreate(&b, CUDA_R_16F, k, nn, static_cast<std::int64_t>(k)),
        "layout B");
    detail::check_lt(
        cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, m, nn, static_cast<std::int64_t>(m)),
        "layout C");
    detail::check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
    detail::check_lt(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes, sizeof workspace_bytes),
        "workspace preference");
    const std::uint32_t align_a = detail::pointer_alignment(w_f16),
                        align_b = detail::pointer_alignment(x),
                        align_cd = detail::pointer_alignment(y);
    for (auto [attr, value] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_cd},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_cd}})
      detail::check_lt(
          cublasLtMatmulPreferenceSetAttribute(pref, attr, value, sizeof(std::uint32_t)),
          "alignment preference");
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    detail::check_lt(
        cublasLtMatmulAlgoGetHeuristic(handle_, op, a, b, c, c, pref, 1, &heuristic, &found),
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
