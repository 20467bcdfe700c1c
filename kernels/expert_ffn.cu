// Expert FFN for one token: an up/gate kernel (rows of w1 and w3 together, h = silu(w1·x)·w3·x)
// then the GEMV kernel over w2 with fp32 activations h, accumulating scale·w2·h into out.
#include "gemv_kernels.cuh"

namespace moekit::cuda {

void expert_ffn(const MatrixView& w1, const MatrixView& w3, const MatrixView& w2, const void* x,
                ActivationType act, float* h, float* out, float scale, cudaStream_t stream) {
  detail::check_quantized(w1, "cuda::expert_ffn: w1");
  detail::check_quantized(w3, "cuda::expert_ffn: w3");
  detail::check_quantized(w2, "cuda::expert_ffn: w2");
  MOEKIT_EXPECTS(w1.precision == w3.precision && w1.scheme == w3.scheme && w1.rows == w3.rows &&
                     w1.cols == w3.cols,
                 "cuda::expert_ffn: w1 and w3 must have the same shape and format");
  MOEKIT_EXPECTS(w2.rows == w1.cols && w2.cols == w1.rows,
                 "cuda::expert_ffn: w2 must be hidden x ffn");
  MOEKIT_EXPECTS(x && h && out, "cuda::expert_ffn: null pointer");
  const bool aligned = w1.row_stride() % 16 == 0 && detail::aligned16(w1.data) &&
                       detail::aligned16(w3.data) && detail::aligned16(x);
  const unsigned blocks = detail::grid_blocks(w1.rows, detail::warps_per_block, "cuda::expert_ffn");
  detail::dispatch(w1.precision, act, aligned, [&]<unsigned Bits, class Act, bool Aligned>() {
    simt::UpGateArgs<Act> a{
        w1.data, w3.data, w1.rows, w1.row_stride(), w1.layout(), static_cast<const Act*>(x), h};
    detail::up_gate_kernel<Bits, Act, Aligned>
        <<<blocks, detail::warps_per_block * simt::warp_size, 0, stream>>>(a);
  });
  detail::check_launch("cuda::expert_ffn (up/gate)");
  gemv(w2, h, ActivationType::f32, out, scale, true, stream);
}

}  // namespace moekit::cuda
