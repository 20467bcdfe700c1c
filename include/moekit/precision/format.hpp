#pragma once
/// \file The byte layout of one stored row of weights, and `MatrixView`, the non-owning view of a
/// stored matrix that every kernel takes. The layout is part of the expert-store format; it is
/// documented in docs/formats.md and its size always equals `moekit::row_bytes()`.
///
/// Quantized row (q8/q4/q2) of `cols` weights, `G = ceil(cols / g)` groups of `g` weights:
///   [payload: ceil(cols·bits/8) bytes][scales: G × f16][zeros: G × f16, affine schemes only]
/// Payload: unsigned codes q ∈ [0, 2^bits − 1] packed little-endian, weight c at bit (c·bits) % 8
/// of byte c·bits/8 (lower column in the lower bits). Value: w = scale · (q − zero), where zero is
/// the stored f16 zero point (affine) or 2^(bits−1) (symmetric).
///
/// GGUF K-quant row (q2_k .. q6_k): cols / 256 super-blocks back to back, each as ggml lays it out
/// (precision/gguf_q6_k.hpp, gguf_q4_k.hpp), so a row is the bytes of a GGUF tensor row as they
/// lie in the file; `cols` must be a multiple of 256.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "moekit/config.hpp"
#include "moekit/core/matrix_order.hpp"  // MatrixOrder
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// Offsets of the parts of one stored row (all relative to the start of the row).
struct RowLayout {
  std::size_t cols = 0;        ///< weights in the row
  std::size_t group_size = 0;  ///< effective group size (cols for channel-wise, 0 if not quantized)
  std::size_t groups = 0;      ///< number of groups (0 if not quantized)
  std::size_t payload_bytes = 0;  ///< packed weights (all of the row for f32/bf16/f16)
  std::size_t scales_offset = 0;  ///< first f16 scale
  std::size_t zeros_offset = 0;   ///< first f16 zero point (== bytes when symmetric)
  std::size_t bytes = 0;          ///< whole row; equals row_bytes(cols, p, scheme)
  unsigned bits = 0;              ///< bits per weight
  bool affine = false;            ///< zero points stored
  float symmetric_zero = 0;       ///< 2^(bits-1): the implicit zero of symmetric schemes

  /// Layout of a row; `p` must not be `skip` (returns an all-zero layout for it).
  MOEKIT_HOST_DEVICE static constexpr RowLayout of(std::size_t cols, Precision p,
                                                   QuantScheme scheme) noexcept {
    RowLayout l;
    l.cols = cols;
    l.bits = moekit::bits(p);
    l.payload_bytes = (cols * l.bits + 7) / 8;
    if (is_gguf_kquant(p)) {  // super-blocks carry their scales inside: all payload
      l.group_size = kquant_block_weights;
      l.groups = (cols + kquant_block_weights - 1) / kquant_block_weights;
      l.payload_bytes = l.groups * kquant_block_bytes(p);
    }
    l.scales_offset = l.zeros_offset = l.bytes = l.payload_bytes;
    if (is_quantized(p)) {
      l.group_size = scheme.group_size == 0 ? cols : scheme.group_size;
      l.groups = l.group_size == 0 ? 0 : (cols + l.group_size - 1) / l.group_size;
      l.affine = scheme.zero_point;
      l.zeros_offset = l.scales_offset + 2 * l.groups;
      l.bytes = l.zeros_offset + (l.affine ? 2 * l.groups : 0);
      l.symmetric_zero = static_cast<float>(1u << (l.bits - 1));
    }
    return l;
  }
};

static_assert(RowLayout::of(4096, Precision::q4, {}).bytes == row_bytes(4096, Precision::q4));
static_assert(RowLayout::of(100, Precision::q2, {0, true}).bytes ==
              row_bytes(100, Precision::q2, {0, true}));
static_assert(RowLayout::of(4096, Precision::q4_k, {}).bytes == row_bytes(4096, Precision::q4_k));
static_assert(RowLayout::of(512, Precision::q6_k, {}).bytes == 420);

/// Throws `Error(invalid_argument)` naming `what` unless a row of `cols` weights can be stored
/// as `p`: the GGUF K-quants hold whole super-blocks of 256 weights only.
inline void validate_cols(Precision p, std::size_t cols, std::string_view what = "matrix") {
  if (is_gguf_kquant(p) && cols % kquant_block_weights != 0)
    detail::fail(ErrorKind::invalid_argument, std::string(what) + ": a " + std::string(name(p)) +
                                                  " row holds whole 256-weight " +
                                                  "super-blocks, and " + std::to_string(cols) +
                                                  " columns are not a multiple " + "of 256");
}

/// Throws `Error(invalid_argument)` unless `scheme` is usable with `p`: group size 32, 64, 128 or
/// 0 (one group per row) for the quantized formats; `skip` is never a stored format.
inline void validate_scheme(Precision p, QuantScheme scheme, std::string_view what = "matrix") {
  if (p == Precision::skip)
    detail::fail(ErrorKind::invalid_argument,
                 std::string(what) + ": precision 'skip' is a decision, not a stored format");
  if (!is_quantized(p)) return;
  const auto g = scheme.group_size;
  if (g != 0 && g != 32 && g != 64 && g != 128)
    detail::fail(ErrorKind::invalid_argument,
                 std::string(what) + ": group_size " + std::to_string(g) +
                     " is not supported (use 32, 64, 128, or 0 for one group per row)");
}

/// A stored `rows × cols` matrix, `cols` = input dimension; in `MatrixOrder::rows` (the default)
/// each row laid out as `RowLayout` says, rows packed back to back (stride
/// `row_bytes(cols, precision, scheme)`); the panel orders are in panels.hpp.
/// Non-owning and trivially copyable: pass by value to kernels and threads.
struct MatrixView {
  const std::byte* data = nullptr;
  std::size_t rows = 0;
  std::size_t cols = 0;
  Precision precision = Precision::f32;
  QuantScheme scheme{};
  MatrixOrder order = MatrixOrder::rows;

  MOEKIT_HOST_DEVICE constexpr std::size_t row_stride() const noexcept {
    return row_bytes(cols, precision, scheme);
  }
  MOEKIT_HOST_DEVICE constexpr std::size_t bytes() const noexcept { return rows * row_stride(); }
  /// Row `r`'s bytes; `MatrixOrder::rows` only (panels: `stored_row()` in panels.hpp).
  MOEKIT_HOST_DEVICE constexpr const std::byte* row(std::size_t r) const noexcept {
    return data + r * row_stride();
  }
  MOEKIT_HOST_DEVICE constexpr RowLayout layout() const noexcept {
    return RowLayout::of(cols, precision, scheme);
  }
};

/// Checks that `bytes` holds exactly a `rows × cols` matrix in format (`p`, `scheme`) and returns
/// the view; throws `Error(invalid_argument)` naming `what` otherwise.
inline MatrixView make_matrix_view(std::span<const std::byte> bytes, std::size_t rows,
                                   std::size_t cols, Precision p, QuantScheme scheme = {},
                                   std::string_view what = "matrix") {
  validate_scheme(p, scheme, what);
  MOEKIT_EXPECTS(rows > 0 && cols > 0, std::string(what) + ": empty shape");
  validate_cols(p, cols, what);
  const std::size_t want = matrix_bytes(rows, cols, p, scheme);
  if (bytes.size() != want)
    detail::fail(ErrorKind::invalid_argument,
                 std::string(what) + ": " + std::to_string(bytes.size()) + " bytes given, a " +
                     std::to_string(rows) + "x" + std::to_string(cols) + " " +
                     std::string(name(p)) + " matrix needs " + std::to_string(want));
  return MatrixView{bytes.data(), rows, cols, p, scheme};
}

/// Reads code `c` of a packed quantized payload (bits = 8, 4 or 2).
MOEKIT_HOST_DEVICE constexpr unsigned read_code(const std::byte* payload, std::size_t c,
                                                unsigned bits) noexcept {
  const std::size_t bit = c * bits;
  const auto byte = static_cast<unsigned>(payload[bit / 8]);
  return (byte >> (bit % 8)) & ((1u << bits) - 1u);
}

}  // namespace moekit
