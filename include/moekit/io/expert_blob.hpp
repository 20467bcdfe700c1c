#pragma once
/// \file The expert blob: one routed expert at one precision as one contiguous run of bytes, what
/// expert stores hold, loaders move and the expert FFN kernels read. Its three matrices lie back
/// to back — [w1 (gate) ffn×hidden][w3 (up) ffn×hidden][w2 (down) hidden×ffn] — each in the
/// precision's stored format (precision/format.hpp, docs/formats.md); its size is
/// `ModelShape::expert_bytes(p)` exactly. A quantized blob's matrices may be in rows or in panels
/// (`MatrixOrder`, precision/panels.hpp); f32/bf16/f16 blobs are always in rows.

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <string>
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

/// The types a K-quant blob's tag names (w1, w3, w2; core/model_shape.hpp, KquantBlob), each
/// checked to be a K-quant no wider than its slot.
inline std::array<Precision, 3> kquant_blob_types(const ModelShape& s,
                                                  std::span<const std::byte> b) {
  MOEKIT_EXPECTS(s.kquant.set() && b.size() == s.expert_bytes(s.kquant.precision),
                 "kquant_blob_types: not a K-quant blob of this shape");
  const Precision slots[3] = {s.kquant.w1, s.kquant.w3, s.kquant.w2};
  std::array<Precision, 3> t{};
  const std::byte* tag = b.data() + b.size() - kquant_tag_bytes;
  for (std::size_t i = 0; i < 3; ++i) {
    t[i] = static_cast<Precision>(tag[i]);
    if (!is_gguf_kquant(t[i]) || kquant_block_bytes(t[i]) > kquant_block_bytes(slots[i]))
      throw Error(ErrorKind::invalid_format, "K-quant expert blob: matrix " + std::to_string(i) +
                                                 " has type byte " +
                                                 std::to_string(unsigned(tag[i])) +
                                                 ", not a K-quant no wider than its slot (" +
                                                 std::string(name(slots[i])) + ")");
  }
  return t;
}

/// Writes the tag of a K-quant blob (its last kquant_tag_bytes bytes) naming `types`.
inline void write_kquant_tag(std::span<std::byte> blob, const std::array<Precision, 3>& types) {
  MOEKIT_EXPECTS(blob.size() >= kquant_tag_bytes, "write_kquant_tag: blob too small");
  std::byte* tag = blob.data() + blob.size() - kquant_tag_bytes;
  for (std::size_t i = 0; i < 3; ++i) tag[i] = static_cast<std::byte>(types[i]);
  tag[3] = std::byte{0};
}

/// The three matrices of blob `b` at `p`; `order`: where the rows of a quantized blob's matrices
/// are (ignored for f32/bf16/f16, always in rows). A K-quant blob read in place
/// (`s.kquant.precision == p`) has each matrix at the type its tag names, in its slot.
inline ExpertWeights expert_view(const ModelShape& s, std::span<const std::byte> b, Precision p,
                                 MatrixOrder order = MatrixOrder::rows) {
  if (s.kquant.set() && p == s.kquant.precision) {
    const std::array<Precision, 3> t = kquant_blob_types(s, b);
    const std::size_t slot1 = matrix_bytes(s.ffn, s.hidden, s.kquant.w1);
    const std::size_t slot3 = matrix_bytes(s.ffn, s.hidden, s.kquant.w3);
    return {make_matrix_view(b.subspan(0, matrix_bytes(s.ffn, s.hidden, t[0])), s.ffn, s.hidden,
                             t[0], {}, "expert w1"),
            make_matrix_view(b.subspan(slot1, matrix_bytes(s.ffn, s.hidden, t[1])), s.ffn, s.hidden,
                             t[1], {}, "expert w3"),
            make_matrix_view(b.subspan(slot1 + slot3, matrix_bytes(s.hidden, s.ffn, t[2])),
                             s.hidden, s.ffn, t[2], {}, "expert w2")};
  }
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
