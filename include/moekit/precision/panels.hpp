#pragma once
/// \file `MatrixOrder::panels4`: quantized rows stored four at a time, interleaved every 512
/// columns; `MatrixOrder::blocked_panels4`: the same panels in groups of 16, in column blocks;
/// and the functions that pack, unpack and read such matrices.
///
/// Why: a row-major GEMV reads one stream per row it works on, and how well the memory keeps up
/// with several streams, and with rows much longer than a page, differs between CPU cores
/// (row_streaming.hpp). In panels the four rows of a panel share every activation load and the
/// whole matrix is one sequential stream per thread, prefetched by the kernel a fixed distance
/// ahead, whatever the width (bench/RESULTS.md, "Panels (`MatrixOrder::panels4`)").
///
/// Layout of a `rows × cols` matrix in format (p, scheme), `RowLayout row = RowLayout::of(cols,
/// p, scheme)`, `S = cols / 512` whole steps, `tail = RowLayout::of(cols − 512·S, p, scheme)`:
///   panel k (rows 4k..4k+3), for k < rows / 4, `panel_bytes` each, back to back:
///     step s < S: [codes of the step, row 4k+0 .. 4k+3: 512·bits/8 bytes each]
///                 [scales of the step, rows 0..3: 2·512/g bytes each]
///                 [zeros of the step, rows 0..3: the same, affine schemes only]
///     then the tail of rows 4k+0 .. 4k+3, each a row of its own as `tail` says
///   then the last rows % 4 rows as in `MatrixOrder::rows`.
/// blocked_panels4, rows of more than 8 steps (up to 8, it is panels4): the panels in groups of 16
/// (the last group has the rest), each group's steps in B = ceil(S/8) column blocks of
/// ceil(S/B) steps: every panel's steps of block 0, then of block 1, ..., then every panel's tails
/// (PanelLayout::step, tail_row). Why: a 14336-column q4 panel read whole streams 32 KiB past the
/// 17.5 KiB int8 activation between two uses of the same activation byte and evicts it from L1;
/// in blocks, the 16 panels of a group reuse one block's activation (<= 4 KiB) back to back.
/// The codes and f16 values are the row's own (the same bits as format.hpp's row, split at
/// multiples of 512 columns, which are whole groups and whole bytes), so packing is a permutation
/// of bytes and `matrix_bytes()` is unchanged. Formats: q8/q4/q2 with groups of 32, 64 or 128.
/// The int8 kernels (AVX-512 VNNI and AVX2) read panels as they lie; every other path (float
/// activations, GEMM, the reference) gathers each row first, so the float GEMV is slower on
/// panels than on rows (much slower on AVX2) while the GEMM barely changes (bench/RESULTS.md,
/// "Panels (`MatrixOrder::panels4`)"). Pack for the int8 kernels.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "moekit/error.hpp"
#include "moekit/precision/format.hpp"

namespace moekit {

/// Offsets of the parts of the panels of one matrix, within a group (relative to the group's
/// first byte). MatrixOrder::panels4 is groups of one panel read whole (one column block);
/// MatrixOrder::blocked_panels4 groups 16 panels and splits their steps into column blocks.
struct PanelLayout {
  static constexpr std::size_t height = 4;            ///< rows per panel
  static constexpr std::size_t step_cols = 512;       ///< columns per step (16 chunks of 32)
  static constexpr std::size_t blocked_group = 16;    ///< panels per group, blocked_panels4
  static constexpr std::size_t most_block_steps = 8;  ///< blocked_panels4: <= 4096 columns

  RowLayout row{};              ///< one whole row, as MatrixOrder::rows stores it
  RowLayout tail{};             ///< the columns after the last whole step, as a row of their own
  std::size_t steps = 0;        ///< whole steps per row
  std::size_t code_bytes = 0;   ///< codes of one row in one step
  std::size_t value_bytes = 0;  ///< f16 scales (or zero points) of one row in one step
  std::size_t step_bytes = 0;   ///< one step of the panel (all its rows)
  std::size_t panel_bytes = 0;  ///< the whole panel: height rows
  std::size_t group = 1;        ///< panels stored together (the last group may have fewer)
  std::size_t block_steps = 0;  ///< steps per column block (the last block may have fewer)

  static constexpr PanelLayout of(std::size_t cols, Precision p, QuantScheme scheme,
                                  MatrixOrder order = MatrixOrder::panels4) noexcept {
    PanelLayout l;
    l.row = RowLayout::of(cols, p, scheme);
    l.steps = cols / step_cols;
    l.tail = RowLayout::of(cols - l.steps * step_cols, p, scheme);
    l.code_bytes = step_cols * l.row.bits / 8;
    l.value_bytes = l.row.group_size ? 2 * step_cols / l.row.group_size : 0;
    l.step_bytes = height * (l.code_bytes + l.value_bytes * (l.row.affine ? 2 : 1));
    l.panel_bytes = l.steps * l.step_bytes + height * l.tail.bytes;
    l.block_steps = l.steps;
    // Rows of at most most_block_steps steps are one block, and then panels4's layout.
    const std::size_t blocks = (l.steps + most_block_steps - 1) / most_block_steps;
    if (order == MatrixOrder::blocked_panels4 && blocks > 1) {
      l.group = blocked_group;
      l.block_steps = (l.steps + blocks - 1) / blocks;
    }
    return l;
  }
  constexpr std::size_t blocks() const noexcept {
    return block_steps ? (steps + block_steps - 1) / block_steps : 0;
  }
  /// Steps of column block b.
  constexpr std::size_t block_len(std::size_t b) const noexcept {
    return std::min(block_steps, steps - b * block_steps);
  }
  /// Step s of panel k of a group of `count` panels (every panel's steps of a block, then the
  /// next block's).
  constexpr std::size_t step(std::size_t k, std::size_t s, std::size_t count) const noexcept {
    const std::size_t b = s / block_steps, first = b * block_steps;
    return (count * first + k * block_len(b) + (s - first)) * step_bytes;
  }
  constexpr std::size_t codes(std::size_t k, std::size_t s, std::size_t n,
                              std::size_t count) const noexcept {
    return step(k, s, count) + n * code_bytes;
  }
  constexpr std::size_t scales(std::size_t k, std::size_t s, std::size_t n,
                               std::size_t count) const noexcept {
    return step(k, s, count) + height * code_bytes + n * value_bytes;
  }
  constexpr std::size_t zeros(std::size_t k, std::size_t s, std::size_t n,
                              std::size_t count) const noexcept {
    return scales(k, s, n, count) + height * value_bytes;
  }
  /// Row n's tail in panel k of a group of `count` panels: after every panel's steps.
  constexpr std::size_t tail_row(std::size_t k, std::size_t n, std::size_t count) const noexcept {
    return count * steps * step_bytes + (k * height + n) * tail.bytes;
  }

  /// Calls f(offset in the group, offset in row n, bytes) for every piece of row n (< height) of
  /// panel k of a group of `count` panels.
  template <class F>
  constexpr void for_each_piece(std::size_t k, std::size_t n, std::size_t count, F&& f) const {
    for (std::size_t s = 0; s < steps; ++s) {
      f(codes(k, s, n, count), s * code_bytes, code_bytes);
      f(scales(k, s, n, count), row.scales_offset + s * value_bytes, value_bytes);
      if (row.affine) f(zeros(k, s, n, count), row.zeros_offset + s * value_bytes, value_bytes);
    }
    const std::size_t t = tail_row(k, n, count), g = steps * value_bytes;
    f(t, steps * code_bytes, tail.payload_bytes);
    f(t + tail.scales_offset, row.scales_offset + g, tail.zeros_offset - tail.scales_offset);
    if (row.affine) f(t + tail.zeros_offset, row.zeros_offset + g, tail.bytes - tail.zeros_offset);
  }
  /// Row n of panel k of the group at `g` (`count` panels) into `out` (row.bytes bytes).
  void gather_row(const std::byte* g, std::size_t k, std::size_t n, std::size_t count,
                  std::byte* out) const noexcept {
    for_each_piece(k, n, count, [&](std::size_t at, std::size_t in_row, std::size_t len) {
      std::memcpy(out + in_row, g + at, len);
    });
  }
  /// The inverse: `in` (one row in RowLayout order) into row n of panel k of the group at `g`.
  void scatter_row(const std::byte* in, std::size_t k, std::size_t n, std::size_t count,
                   std::byte* g) const noexcept {
    for_each_piece(k, n, count, [&](std::size_t at, std::size_t in_row, std::size_t len) {
      std::memcpy(g + at, in + in_row, len);
    });
  }
  /// Panels in group `g` of a matrix of `panels` panels.
  constexpr std::size_t group_count(std::size_t g, std::size_t panels) const noexcept {
    return std::min(group, panels - g * group);
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

/// True for the orders that store quantized rows in panels.
constexpr bool in_panels(MatrixOrder o) noexcept { return o != MatrixOrder::rows; }

/// What MatrixOrder `o` is called in errors, manifests and documentation.
constexpr std::string_view name(MatrixOrder o) noexcept {
  switch (o) {
    case MatrixOrder::rows:
      return "rows";
    case MatrixOrder::panels4:
      return "panels4";
    case MatrixOrder::blocked_panels4:
      return "blocked_panels4";
  }
  return "?";
}

namespace detail {
inline void check_pack(const MatrixView& src, std::span<std::byte> dst, MatrixOrder from,
                       std::string_view what) {
  validate_scheme(src.precision, src.scheme, what);
  MOEKIT_EXPECTS(src.data != nullptr && src.rows > 0 && src.cols > 0,
                 std::string(what) + ": empty matrix");
  if (src.order != from)
    fail(ErrorKind::invalid_argument, std::string(what) + ": the source matrix is in " +
                                          std::string(name(src.order)) + ", not " +
                                          std::string(name(from)));
  if (!panels_supported(src.precision, src.scheme))
    fail(ErrorKind::unsupported, std::string(what) +
                                     ": panels take q8/q4/q2 with groups of 32, 64 or 128, not " +
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

/// Moves every row of the full panels between rows and `order` (to_panels: rows -> panels).
inline void permute_panels(const MatrixView& src, std::byte* dst, MatrixOrder order,
                           bool to_panels) noexcept {
  const PanelLayout l = PanelLayout::of(src.cols, src.precision, src.scheme, order);
  const std::size_t panels = src.rows / PanelLayout::height, stride = l.row.bytes;
  for (std::size_t g = 0; g * l.group < panels; ++g) {
    const std::size_t count = l.group_count(g, panels), at = g * l.group * l.panel_bytes;
    for (std::size_t k = 0; k < count; ++k)
      for (std::size_t n = 0; n < PanelLayout::height; ++n) {
        const std::size_t row = ((g * l.group + k) * PanelLayout::height + n) * stride;
        if (to_panels)
          l.scatter_row(src.data + row, k, n, count, dst + at);
        else
          l.gather_row(src.data + at, k, n, count, dst + row);
      }
  }
  const std::size_t rest = panels * PanelLayout::height * stride;  // the same in both orders
  std::memcpy(dst + rest, src.data + rest, src.bytes() - rest);
}

/// `src` copied into `dst` from `from` into `to` (one of them rows), and the view of `dst`.
inline MatrixView reorder(const MatrixView& src, std::span<std::byte> dst, MatrixOrder from,
                          MatrixOrder to, std::string_view what) {
  check_pack(src, dst, from, what);
  if (in_panels(from) == in_panels(to))
    fail(ErrorKind::invalid_argument, std::string(what) + ": from " + std::string(name(from)) +
                                          " to " + std::string(name(to)) + " is not a packing");
  permute_panels(src, dst.data(), in_panels(to) ? to : from, in_panels(to));
  MatrixView v = src;
  v.data = dst.data();
  v.order = to;
  return v;
}
}  // namespace detail

/// Copies `src` (MatrixOrder::rows) into `dst` (src.bytes() bytes, not overlapping it) in
/// panels (`to`: panels4 or blocked_panels4) and returns the view of `dst`. Throws
/// Error(unsupported) for formats panels do not take and Error(invalid_argument) for a wrong
/// destination size or a source not in rows.
inline MatrixView pack_panels(const MatrixView& src, std::span<std::byte> dst,
                              MatrixOrder to = MatrixOrder::panels4) {
  return detail::reorder(src, dst, MatrixOrder::rows, to, "pack_panels");
}

/// The inverse of pack_panels: `src` in panels, `dst` gets the same matrix in rows.
inline MatrixView unpack_panels(const MatrixView& src, std::span<std::byte> dst) {
  if (!in_panels(src.order))
    detail::fail(ErrorKind::invalid_argument, "unpack_panels: the source matrix is in rows");
  return detail::reorder(src, dst, src.order, MatrixOrder::rows, "unpack_panels");
}

/// Row `r`'s bytes laid out as `RowLayout` says, in any order: a pointer into `w` for
/// MatrixOrder::rows (and the rows after the last panel), else gathered into `buf`
/// (w.row_stride() bytes) and `buf` returned.
inline const std::byte* stored_row(const MatrixView& w, std::size_t r, std::byte* buf) noexcept {
  const std::size_t h = PanelLayout::height;
  if (!in_panels(w.order) || r >= w.rows / h * h) return w.row(r);
  const PanelLayout l = PanelLayout::of(w.cols, w.precision, w.scheme, w.order);
  const std::size_t panel = r / h, g = panel / l.group;
  l.gather_row(w.data + g * l.group * l.panel_bytes, panel % l.group, r % h,
               l.group_count(g, w.rows / h), buf);
  return buf;
}

}  // namespace moekit
