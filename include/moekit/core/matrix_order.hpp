#pragma once
/// \file MatrixOrder: where the rows of a stored matrix are. A property of stored bytes like their
/// `Precision`, so it lives beside it: a loader says in which order the experts it delivers are
/// (`Hook::matrix_order`), and the pipeline's `WeightView` carries it to the kernels.

#include <cstdint>

namespace moekit {

/// Where the rows of a stored matrix are. Either way the matrix takes `matrix_bytes()` bytes.
enum class MatrixOrder : std::uint8_t {
  /// Rows back to back, each as `RowLayout` says: what files, expert stores and every kernel take.
  rows,
  /// Quantized rows four at a time, interleaved every 512 columns, so that a GEMV reads one
  /// sequential stream per thread however wide the rows are (panels.hpp, docs/formats.md).
  panels4,
  /// panels4 grouped 16 panels at a time, each group's steps in column blocks of at most 4096
  /// columns (every panel's first block, then every panel's next one), so that one block of the
  /// activation stays in L1 while the group streams past (panels.hpp, docs/formats.md).
  blocked_panels4,
};

}  // namespace moekit
