#pragma once
/// \file Host API of moekit's CUDA kernels (library moekit::cuda, built from kernels/*.cu).
///
/// All pointers are device pointers; MatrixView::data points to device memory holding the same
/// bytes as the host format (docs/formats.md). Kernels are asynchronous on `stream`; launch
/// failures throw moekit::Error(internal). Quantized weights only (q8/q4/q2, any scheme); rows
/// whose stride is a multiple of 16 bytes (e.g. cols % 1024 == 0 with group sizes 32/64/128) use
/// 128-bit loads, other rows a byte-wise fallback.

#include <cstddef>
#include <cstdint>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "moekit/precision/format.hpp"

namespace moekit::cuda {

/// Element type of activation vectors.
enum class ActivationType { f16, bf16, f32 };

/// y = scale·(W·x) (+ y when `accumulate`); W: rows × cols quantized, x: cols, y: rows floats.
/// Warp per row, 128-bit loads, fp32 accumulation.
void gemv(const MatrixView& w, const void* x, ActivationType act, float* y, float scale,
          bool accumulate, cudaStream_t stream);

/// out += scale · w2·(silu(w1·x) ⊙ w3·x) for one token. w1/w3: ffn × hidden (same format),
/// w2: hidden × ffn. `h` is a device workspace of ffn floats. out: hidden floats.
void expert_ffn(const MatrixView& w1, const MatrixView& w3, const MatrixView& w2, const void* x,
                ActivationType act, float* h, float* out, float scale, cudaStream_t stream);

/// Dequantizes W into row-major f16 (`out`: rows × cols f16 bits).
void dequantize_f16(const MatrixView& w, std::uint16_t* out, cudaStream_t stream);

/// Prefill-size GEMM: dequantize W to f16, then cuBLASLt (f16 inputs, fp32 compute and output).
class PrefillGemm {
 public:
  PrefillGemm();
  ~PrefillGemm();
  PrefillGemm(const PrefillGemm&) = delete;
  PrefillGemm& operator=(const PrefillGemm&) = delete;

  /// y (n × rows, row-major, f32) = x (n × cols, row-major, f16) · Wᵀ. `w_f16` is a device
  /// workspace of rows × cols f16; `workspace` (may be null) is cuBLASLt's scratch.
  void run(const MatrixView& w, const std::uint16_t* x, std::size_t n, float* y,
           std::uint16_t* w_f16, void* workspace, std::size_t workspace_bytes, cudaStream_t stream);

 private:
  cublasLtHandle_t handle_ = nullptr;
};

}  // namespace moekit::cuda
