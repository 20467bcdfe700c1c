#pragma once
/// \file A small SIMT emulation on the host: runs the per-thread bodies of gemv_body.hpp the way
/// the CUDA kernels do (warp per row, lanes looped, warp sums through the host `warp_sum`), so
/// the tests check the device code paths without a GPU.

#include <cstddef>

#include "moekit/precision/simt/gemv_body.hpp"
#include "moekit/precision/simt/warp.hpp"

namespace moekit::simt {

/// Runs the GEMV kernel body for every row, as a launch with `warps_per_block` warps per block.
template <unsigned Bits, class Act, bool Aligned>
void emulate_gemv(const GemvArgs<Act>& a, unsigned warps_per_block = 4) {
  const std::size_t blocks = (a.rows + warps_per_block - 1) / warps_per_block;
  for (std::size_t b = 0; b < blocks; ++b)
    for (unsigned w = 0; w < warps_per_block; ++w) {
      const std::size_t r = warp_row(b, w, warps_per_block);
      if (r >= a.rows) continue;
      LaneValues lanes;
      for (unsigned l = 0; l < warp_size; ++l)
        lanes[l] = gemv_lane<Bits, Act, Aligned>(l, a.w + r * a.row_stride, a.layout, a.x);
      warp_sum(lanes);
      gemv_finish(a, r, lanes[0]);
    }
}

/// Runs the expert-FFN up/gate kernel body for every row.
template <unsigned Bits, class Act, bool Aligned>
void emulate_up_gate(const UpGateArgs<Act>& a, unsigned warps_per_block = 4) {
  const std::size_t blocks = (a.rows + warps_per_block - 1) / warps_per_block;
  for (std::size_t b = 0; b < blocks; ++b)
    for (unsigned w = 0; w < warps_per_block; ++w) {
      const std::size_t r = warp_row(b, w, warps_per_block);
      if (r >= a.rows) continue;
      LaneValues g, u;
      for (unsigned l = 0; l < warp_size; ++l) {
        g[l] = gemv_lane<Bits, Act, Aligned>(l, a.w1 + r * a.row_stride, a.layout, a.x);
        u[l] = gemv_lane<Bits, Act, Aligned>(l, a.w3 + r * a.row_stride, a.layout, a.x);
      }
      warp_sum(g);
      warp_sum(u);
      a.h[r] = silu(g[0]) * u[0];
    }
}

/// Runs the dequantize body for every thread of the launch.
inline void emulate_dequant(const DequantArgs& a) {
  const std::size_t threads = a.rows * ((a.layout.cols + 7) / 8);
  for (std::size_t t = 0; t < threads; ++t) dequant_thread(t, a);
}

}  // namespace moekit::simt
