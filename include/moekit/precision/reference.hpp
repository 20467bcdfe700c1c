#pragma once
/// \file Scalar reference kernels: dequant-GEMV, small-batch GEMM and the SwiGLU expert FFN,
/// decoding every weight through `weight_at()` and accumulating in double. Slow and obviously
/// right: the fast CPU paths and the CUDA kernel bodies are tested against these.

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/panels.hpp"
#include "moekit/precision/quantize.hpp"

namespace moekit::reference {

/// Row `r` of `w` (either MatrixOrder) dotted with `x[0..w.cols)`, in double.
inline double dot_row(const MatrixView& w, std::size_t r, const float* x) {
  const RowLayout l = w.layout();
  std::vector<std::byte> buf(w.order == MatrixOrder::rows ? 0 : l.bytes);
  const std::byte* row = stored_row(w, r, buf.data());
  double acc = 0;
  for (std::size_t c = 0; c < w.cols; ++c)
    acc += static_cast<double>(weight_at(row, l, w.precision, c)) * static_cast<double>(x[c]);
  return acc;
}

/// y[r] = Σ_c W[r,c]·x[c] for r < rows.
inline void gemv(const MatrixView& w, const float* x, float* y) {
  for (std::size_t r = 0; r < w.rows; ++r) y[r] = static_cast<float>(dot_row(w, r, x));
}

/// Y[b, r] = Σ_c W[r,c]·X[b,c] for b < n: X is n × cols, Y is n × rows, both row-major.
inline void gemm(const MatrixView& w, const float* x, std::size_t n, float* y) {
  for (std::size_t b = 0; b < n; ++b) gemv(w, x + b * w.cols, y + b * w.rows);
}

/// SiLU(a) = a·σ(a).
inline double silu(double a) noexcept { return a / (1.0 + std::exp(-a)); }

/// out[b] += scale · w2·(silu(w1·x[b]) ⊙ w3·x[b]) for b < n (x, out: n × hidden).
/// w1, w3: ffn × hidden; w2: hidden × ffn.
inline void expert_ffn(const MatrixView& w1, const MatrixView& w3, const MatrixView& w2,
                       const float* x, std::size_t n, float* out, float scale) {
  MOEKIT_EXPECTS(
      w1.rows == w3.rows && w1.cols == w3.cols && w2.cols == w1.rows && w2.rows == w1.cols,
      "reference::expert_ffn: w1/w3 must be ffn x hidden and w2 hidden x ffn");
  std::vector<float> h(w1.rows);
  for (std::size_t b = 0; b < n; ++b) {
    const float* xb = x + b * w1.cols;
    for (std::size_t r = 0; r < w1.rows; ++r)
      h[r] = static_cast<float>(silu(dot_row(w1, r, xb)) * dot_row(w3, r, xb));
    for (std::size_t r = 0; r < w2.rows; ++r)
      out[b * w2.rows + r] += static_cast<float>(scale * dot_row(w2, r, h.data()));
  }
}

}  // namespace moekit::reference
