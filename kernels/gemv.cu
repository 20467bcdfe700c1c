// Warp-per-row dequant-GEMV for q8/q4/q2 weights × f16/bf16/f32 activations.
#include "gemv_kernels.cuh"

namespace moekit::cuda {

void gemv(const MatrixView& w, const void* x, ActivationType act, float* y, float scale,
          bool accumulate, cudaStream_t stream) {
  detail::check_quantized(w, "cuda::gemv");
  MOEKIT_EXPECTS(x && y, "cuda::gemv: null activation or output");
  const bool aligned =
      w.row_stride() % 16 == 0 && detail::aligned16(w.data) && detail::aligned16(x);
  const unsigned blocks = detail::grid_blocks(w.rows, detail::warps_per_block, "cuda::gemv");
  detail::dispatch(w.precision, act, aligned, [&]<unsigned Bits, class Act, bool Aligned>() {
    simt::GemvArgs<Act> a{w.data, w.rows, w.row_stride(), w.layout(), static_cast<const Act*>(x),
                          y,      scale,  accumulate};
    detail::gemv_kernel<Bits, Act, Aligned>
        <<<blocks, detail::warps_per_block * simt::warp_size, 0, stream>>>(a);
  });
  detail::check_launch("cuda::gemv");
}

}  // namespace moekit::cuda
