#pragma once
/// \file `MatrixOrder::panels4`: quantized rows stored four at a time, interleaved every 512
/// columns, and the functions that pack, unpack and read such matrices.
///
/// Why: a row-major GEMV reads one stream per row it works on, and how well the memory keeps up
/// with several streams, and with rows much longer than a page, differs between CPU cores
/// (row_streaming.hpp). In panels the four rows of a panel share every activation load and the
/// whole matrix is one sequential stream per thread, prefetched by the kernel a fixed distance
/// ahead, whatever the width (cold Mixtral shapes on Zen 5, one thread: w2's 14336-column rows
/// went from 55-67% of the streaming read in rows to 85-98% in panels; bench/RESULTS.md).
///
/// Layout of a `rows × cols` matrix in format (p, scheme), `RowLayout row = RowLayout::of(cols,
/// p, scheme)`, `S = cols / 512` whole steps, `tail = RowLayout::of(cols − 512·S, p, scheme)`:
///   panel k (rows 4k..4k+3), for k < rows / 4, `panel_bytes` each, back to back:
///     step s < S: [codes of the step, row 4k+0 .. 4k+3: 512·bits/8 bytes each]
///                 [scales of the step, rows 0..3: 2·512/g bytes each]
///                 [zeros of the step, rows 0..3: the same, affine schemes only]
///     then the tail of rows 4k+0 .. 4k+3, each a row of its own as `tail` says
///   then the last rows % 4 rows as in `MatrixOrder::rows`.
/// The codes and f16 values are the row's own (the same bits as format.hpp's row, split at
/// multiples of 512 columns, which are whole groups and whole bytes), so packing is a permutation
/// of bytes and `matrix_bytes()` is unchanged. Formats: q8/q4/q2 with groups of 32, 64 or 128.
/// Only the AVX-512 VNNI int8 kernel reads panels as they lie; every other path (float
/// activations, the AVX2 int8 kernel, GEMM, the reference) gathers each row first, 2-4x slower
/// than the same matrix in rows on AVX2 here: pack for that kernel only.

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "moekit/error.hpp"
#include "moekit/precision/format.hpp"

namespace moekit {

/// Offsets of the parts of one panel (relative to the panel's first byte).
struct PanelLayout {
  static constexpr std::size_t height = 4;       ///< rows per panel
  static constexpr std::size_t step_cols = 512;  ///< columns per step (16 chunks of 32)

  RowLayout row{};               ///< one whole row, as MatrixOrder::rows stores it
  RowLayout tail{};              ///< the columns after the last whole step, as a row of their own
  std::size_t steps = 0;         ///< whole steps per row
  std::size_t code_bytes = 0;    ///< codes of one row in one step
  std::size_t value_bytes = 0;   ///< f16 scales (or zero points) of one row in one step
  std::size_t step_bytes = 0;    ///< one step of the panel (all its rows)
  std::size_t panel_bytes = 0;   ///< the whole panel: height rows

  static constexpr PanelLayout of(std::size_t cols, Precision p, QuantScheme scheme) noexcept {
    PanelLayout l;
    l.row = RowLayout::of(cols, p, scheme);
    l.steps = cols / step_cols;
    l.tail = RowLayout::of(cols - l.steps * step_cols, p, scheme);
    l.code_bytes = step_cols * l.row.bits / 8;
    l.value_bytes = l.row.group_size ? 2 * step_cols / l.row.group_size : 0;
    l.step_bytes = height * (l.code_bytes + l.value_bytes * (l.row.affine ? 2 : 1));
    l.panel_bytes = l.steps * l.step_bytes + height * l.tail.bytes;
    return l;
  }
  constexpr std::size_t codes(std::size_t s, std::size_t n) const noexcept {
    return s * step_bytes + n * code_bytes;
  }
  constexpr std::size_t scales(std::size_t s, std::size_t n) const noexcept {
    return s * step_bytes + height * code_bytes + n * value_bytes;
  }
  constexpr std::size_t zeros(std::size_t s, std::size_t n) const noexcept {
    return scales(s, n) + height * value_bytes;
  }
  constexpr std::size_t tail_row(std::size_t n) const noexcept {
    return steps * step_bytes + n * tail.bytes;
  }

  /// Calls f(offset in the panel, offset in row n, bytes) for every piece of row n (< height).
  template <class F>
  constexpr void for_each_piece(std::size_t n, F&& f) const {
    for (std::size_t s = 0; s < steps; ++s) {
      f(codes(s, n), s * code_bytes, code_bytes);
      f(scales(s, n), row.scales_offset + s * value_bytes, value_bytes);
      if (row.affine) f(zeros(s, n), row.zeros_offset + s * value_bytes, value_bytes);
    }
    const std::size_t t = tail_row(n), g = steps * value_bytes;
    f(t, steps * code_bytes, tail.payload_bytes);
    f(t + tail.scales_offset, row.scales_offset + g, tail.zeros_offset - tail.scales_offset);
    if (row.affine) f(t + tail.zeros_offset, row.zeros_offset + g, tail.bytes - tail.zeros_offset);
  }
  /// Row n (< height) of the panel at `panel` into `out` (row.bytes bytes, RowLayout order).
  void gather_row(const std::byte* panel, std::size_t n, std::byte* out) const noexcept {
    for_each_piece(n, [&](std::size_t at, std::size_t in_row, std::size_t len) {
      std::memcpy(out + in_row, panel + at, len);
    });
  }
  /// The inverse: `in` (one row in RowLayout order) into row n of the panel at `panel`.
  void scatter_row(const std::byte* in, std::size_t n, std::byte* panel) const noexcept {
    for_each_piece(n, [&](std::size_t at, std::size_t in_row, std::size_t len) {
      std::memcpy(panel + at, in + in_row, len);
    });
  }
};

static_assert(PanelLayout::of(14336, Precision::q4, {}).panel_bytes ==
              4 * row_bytes(14336, Precision::q4));
static_assert(PanelLayout::of(1000, Precision::q2, {64, true}).panel_bytes ==
              4 * row_bytes(1000, Precision::q2, {64, true}));

/// True when quantized rows of `scheme` can be stored in panels: groups of 32, 64 or 128.
constexpr bool panels_supported(QuantScheme scheme) noexcept {
  const auto g = scheme.group_size;
  return g == 32 || g == 64 || g == 128;
}
/// True when (p, scheme) can be stored in panels: q8/q4/q2 with groups of 32, 64 or 128.
constexpr bool panels_supported(Precision p, QuantScheme scheme) noexcept {
  return is_quantized(p) && panels_supported(scheme);
}

namespace detail {
inline void check_pack(const MatrixView& src, std::span<std::byte> dst, MatrixOrder from,
                       std::string_view what) {
  validate_scheme(src.precision, src.scheme, what);
  MOEKIT_EXPECTS(src.data != nullptr && src.rows > 0 && src.cols > 0,
                 std::string(what) + ": empty matrix");
  if (src.order != from)
    fail(ErrorKind::invalid_argument,
         std::string(what) + ": the source matrix is " +
             (src.order == MatrixOrder::rows ? "in rows" : "in panels") + " already");
  if (!panels_supported(src.precision, src.scheme))
    fail(ErrorKind::unsupported,
         std::string(what) + ": panels take q8/q4/q2 with groups of 32, 64 or 128, not " +
             std::string(name(src.precision)) + " with group_size " +
             std::to_string(src.scheme.group_size));
  if (dst.size() != src.bytes())
    fail(ErrorKind::invalid_argument, std::string(what) + ": the destination has " +
                                          std::to_string(dst.size()) + " bytes, the matrix " +
                                          std::to_string(src.bytes()));
  const std::byte* s = src.data;
  if (dst.data() < s + src.bytes() && s < dst.data() + dst.size())
    fail(ErrorKind::invalid_argument, std::string(what) + ": source and destination overlap");
}

/// Moves every row of the full panels between the two orders (to_panels: rows -> panels).
inline void permute_panels(const MatrixView& src, std::byte* dst, bool to_panels) noexcept {
  const PanelLayout l = PanelLayout::of(src.cols, src.precision, src.scheme);
  const std::size_t panels = src.rows / PanelLayout::height, stride = l.row.bytes;
  for (std::size_t k = 0; k < panels; ++k)
    for (std::size_t n = 0; n < PanelLayout::height; ++n) {
      const std::size_t panel = k * l.panel_bytes, row = (k * PanelLayout::height + n) * stride;
      if (to_panels) l.scatter_row(src.data + row, n, dst + panel);
      else l.gather_row(src.data + panel, n, dst + row);
    }
  const std::size_t rest = panels * PanelLayout::height * stride;  // the same in both orders
  std::memcpy(dst + rest, src.data + rest, src.bytes() - rest);
}
}  // namespace detail

namespace detail {
/// `src` copied into `dst` in the order `to` (from the other one), and the view of `dst`.
inline MatrixView reorder(const MatrixView& src, std::span<std::byte> dst, MatrixOrder to,
                          std::string_view what) {
  const bool to_panels = to == MatrixOrder::panels4;
  check_pack(src, dst, to_panels ? MatrixOrder::rows : MatrixOrder::panels4, what);
  permute_panels(src, dst.data(), to_panels);
  MatrixView v = src;
  v.data = dst.data();
  v.order = to;
  return v;
}
}  // namespace detail

/// Copies `src` (MatrixOrder::rows) into `dst` (src.bytes() bytes, not overlapping it) in
/// panels and returns the view of `dst`. Throws Error(unsupported) for formats panels do not
/// take and Error(invalid_argument) for a wrong destination size or a source already in panels.
inline MatrixView pack_panels(const MatrixView& src, std::span<std::byte> dst) {
  return detail::reorder(src, dst, MatrixOrder::panels4, "pack_panels");
}

/// The inverse of pack_panels: `src` in panels, `dst` gets the same matrix in rows.
inline MatrixView unpack_panels(const MatrixView& src, std::span<std::byte> dst) {
  return detail::reorder(src, dst, MatrixOrder::rows, "unpack_panels");
}

/// Row `r`'s bytes laid out as `RowLayout` says, in either order: a pointer into `w` for
/// MatrixOrder::rows (and the rows after the last panel), else gathered into `buf`
/// (w.row_stride() bytes) and `buf` returned.
inline const std::byte* stored_row(const MatrixView& w, std::size_t r, std::byte* buf) noexcept {
  const std::size_t h = PanelLayout::height;
  if (w.order == MatrixOrder::rows || r >= w.rows / h * h) return w.row(r);
  const PanelLayout l = PanelLayout::of(w.cols, w.precision, w.scheme);
  l.gather_row(w.data + r / h * l.panel_bytes, r % h, buf);
  return buf;
}

}  // namespace moekit
