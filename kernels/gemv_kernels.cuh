#pragma once
// The GEMV and expert-FFN kernels: thin wrappers that put the per-thread bodies of
// moekit/precision/simt/gemv_body.hpp (tested on the host under simt/emulator.hpp) on the GPU.

#include <string>

#include <cuda_runtime.h>

#include "moekit/error.hpp"
#include "moekit/precision/simt/gemv_body.hpp"
#include "moekit/precision/simt/warp.hpp"
#include "moekit_cuda.hpp"

namespace moekit::cuda::detail {

/// Warps per block of the warp-per-row kernels: 4 (128 threads) keeps many blocks in flight per
/// SM for latency hiding with few registers; rows are independent, so the choice is not critical.
inline constexpr unsigned warps_per_block = 4;
static_assert(warps_per_block * simt::warp_size <= 1024, "a block holds at most 1024 threads");

template <unsigned Bits, class Act, bool Aligned>
__global__ void __launch_bounds__(warps_per_block* simt::warp_size)
    gemv_kernel(simt::GemvArgs<Act> a) {
  const unsigned lane = threadIdx.x % simt::warp_size, warp = threadIdx.x / simt::warp_size;
  const std::size_t r = simt::warp_row(blockIdx.x, warp, warps_per_block);
  if (r >= a.rows) return;  // the whole warp leaves together: warp_sum stays convergent
  float v = simt::gemv_lane<Bits, Act, Aligned>(lane, a.w + r * a.row_stride, a.layout, a.x);
  v = simt::warp_sum(v);
  if (lane == 0) simt::gemv_finish(a, r, v);
}

template <unsigned Bits, class Act, bool Aligned>
__global__ void __launch_bounds__(warps_per_block* simt::warp_size)
    up_gate_kernel(simt::UpGateArgs<Act> a) {
  const unsigned lane = threadIdx.x % simt::warp_size, warp = threadIdx.x / simt::warp_size;
  const std::size_t r = simt::warp_row(blockIdx.x, warp, warps_per_block);
  if (r >= a.rows) return;
  float g = simt::gemv_lane<Bits, Act, Aligned>(lane, a.w1 + r * a.row_stride, a.layout, a.x);
  float u = simt::gemv_lane<Bits, Act, Aligned>(lane, a.w3 + r * a.row_stride, a.layout, a.x);
  g = simt::warp_sum(g);
  u = simt::warp_sum(u);
  if (lane == 0) a.h[r] = simt::silu(g) * u;
}

inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    moekit::detail::fail(ErrorKind::internal,
                         std::string(what) + ": kernel launch failed: " + cudaGetErrorString(e));
}

inline bool aligned16(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

/// Blocks of a 1-D launch covering `work` items, `per_block` per block. gridDim.x is at most
/// 2^31 − 1 on every architecture moekit targets (docs/cuda.md): a larger matrix is refused by
/// name instead of being truncated to an unsigned that skips rows.
inline unsigned grid_blocks(std::size_t work, std::size_t per_block, const char* what) {
  const std::size_t blocks = (work + per_block - 1) / per_block;
  constexpr std::size_t max_grid_x = (std::size_t{1} << 31) - 1;
  if (blocks > max_grid_x)
    moekit::detail::fail(ErrorKind::unsupported,
                         std::string(what) + ": " + std::to_string(blocks) +
                             " blocks exceed the grid limit of 2^31-1 (split the matrix)");
  return static_cast<unsigned>(blocks);
}

inline void check_quantized(const MatrixView& w, const char* what) {
  validate_scheme(w.precision, w.scheme, what);
  if (!is_quantized(w.precision))
    moekit::detail::fail(ErrorKind::unsupported,
                         std::string(what) + ": the CUDA kernels take q8/q4/q2 weights, not " +
                             std::string(name(w.precision)));
  MOEKIT_EXPECTS(w.data && w.rows > 0 && w.cols > 0, std::string(what) + ": empty matrix");
  // gemv_lane does its column arithmetic in 32 bits.
  MOEKIT_EXPECTS(w.cols < (std::size_t{1} << 32),
                 std::string(what) + ": " + std::to_string(w.cols) + " columns (at most 2^32-1)");
  if (w.order != MatrixOrder::rows)
    moekit::detail::fail(ErrorKind::unsupported, std::string(what) +
                                                     ": the CUDA kernels take rows back to back "
                                                     "(MatrixOrder::rows), not 4-row panels");
}

/// Calls `f.template operator()<Bits, Act, Aligned>()` for the run-time combination.
template <class F>
void dispatch(Precision p, ActivationType act, bool aligned, F&& f) {
  auto by_act = [&]<unsigned Bits>() {
    auto by_align = [&]<class Act>() {
      if (aligned)
        f.template operator()<Bits, Act, true>();
      else
        f.template operator()<Bits, Act, false>();
    };
    switch (act) {
      case ActivationType::f16:
        by_align.template operator()<Float16>();
        break;
      case ActivationType::bf16:
        by_align.template operator()<BFloat16>();
        break;
      case ActivationType::f32:
        by_align.template operator()<float>();
        break;
    }
  };
  switch (p) {
    case Precision::q8:
      by_act.template operator()<8>();
      break;
    case Precision::q4:
      by_act.template operator()<4>();
      break;
    case Precision::q2:
      by_act.template operator()<2>();
      break;
    default:
      break;
  }
}

}  // namespace moekit::cuda::detail
