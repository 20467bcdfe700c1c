#pragma once
/// \file The expert blob: one routed expert at one precision as one contiguous run of bytes, what
/// expert stores hold, loaders move and the expert FFN kernels read. Its three matrices lie back
/// to back — [w1 (gate) ffn×hidden][w3 (up) ffn×hidden][w2 (down) hidden×ffn] — each in the
/// precision's stored format (precision/format.hpp, docs/formats.md); its size is
/// `ModelShape::expert_bytes(p)` exactly. A quantized blob's matrices may be in rows or in panels
/// (`MatrixOrder`, precision/panels.hpp); f32/bf16/f16 blobs are always in rows.

#include <algorithm>
#include <cstddef>
#include <span>
#include <tuple>
#include <vector>

#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/precision/expert_weights.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/panels.hpp"
#include "moekit/precision/quantize.hpp"

namespace moekit::io {

/// Encodes w1, w3 (ffn × hidden) and w2 (hidden × ffn), f32 row-major, at `p` into `dst`, which
/// must be exactly `s.expert_bytes(p)` long: the blob in rows.
inline void encode_expert_blob(const ModelShape& s, std::span<const float> w1,
                               std::span<const float> w3, std::span<const float> w2, Precision p,
                               std::span<std::byte> dst) {
  MOEKIT_EXPECTS(dst.size() == s.expert_bytes(p),
                 "encode_expert_blob: destination size differs from expert_bytes");
  const std::size_t f = s.ffn, h = s.hidden;
  MOEKIT_EXPECTS(w1.size() == f * h && w3.size() == f * h && w2.size() == h * f,
                 "encode_expert_blob: matrix sizes differ from the shape");
  std::byte* out = dst.data();
  for (auto [m, rows, cols] : {std::tuple{w1, f, h}, std::tuple{w3, f, h}, std::tuple{w2, h, f}}) {
    const auto enc = encode_matrix<float>(m, rows, cols, p, s.quant);
    std::copy(enc.begin(), enc.end(), out);
    out += enc.size();
  }
}

/// The same, returning a new blob.
inline std::vector<std::byte> encode_expert_blob(const ModelShape& s, std::span<const float> w1,
                                                 std::span<const float> w3,
                                                 std::span<const float> w2, Precision p) {
  std::vector<std::byte> b(s.expert_bytes(p));
  encode_expert_blob(s, w1, w3, w2, p, b);
  return b;
}

/// The three matrices of blob `b` at `p`; `order`: where the rows of a quantized blob's matrices
/// are (ignored for f32/bf16/f16, always in rows).
inline ExpertWeights expert_view(const ModelShape& s, std::span<const std::byte> b, Precision p,
                                 MatrixOrder order = MatrixOrder::rows) {
  const std::size_t m13 = matrix_bytes(s.ffn, s.hidden, p, s.quant);
  const std::size_t m2 = matrix_bytes(s.hidden, s.ffn, p, s.quant);
  MOEKIT_EXPECTS(b.size() == 2 * m13 + m2, "expert_view: blob size does not match the shape");
  ExpertWeights e{
      make_matrix_view(b.subspan(0, m13), s.ffn, s.hidden, p, s.quant, "expert w1"),
      make_matrix_view(b.subspan(m13, m13), s.ffn, s.hidden, p, s.quant, "expert w3"),
      make_matrix_view(b.subspan(2 * m13, m2), s.hidden, s.ffn, p, s.quant, "expert w2")};
  if (is_quantized(p)) e.w1.order = e.w3.order = e.w2.order = order;
  return e;
}

/// A blob in rows with each of its three matrices packed into panels (`order`: panels4 or
/// blocked_panels4). Throws as pack_panels for formats panels do not take.
inline std::vector<std::byte> expert_blob_in_panels(const ModelShape& s, Precision p,
                                                    std::span<const std::byte> rows,
                                                    MatrixOrder order = MatrixOrder::panels4) {
  std::vector<std::byte> out(rows.size());
  const std::size_t m13 = matrix_bytes(s.ffn, s.hidden, p, s.quant);
  const struct {
    std::size_t at, rows, cols;
  } parts[] = {{0, s.ffn, s.hidden}, {m13, s.ffn, s.hidden}, {2 * m13, s.hidden, s.ffn}};
  for (const auto& m : parts)
    pack_panels(MatrixView{rows.data() + m.at, m.rows, m.cols, p, s.quant},
                std::span(out).subspan(m.at, matrix_bytes(m.rows, m.cols, p, s.quant)), order);
  return out;
}

}  // namespace moekit::io
