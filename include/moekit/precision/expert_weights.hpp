#pragma once
/// \file ExpertWeights: the three matrices of one expert as views, what the expert FFN kernels
/// (expert_ffn.hpp) take and what an expert blob (io/expert_blob.hpp) is seen as. Apart from the
/// kernels so that readers of blobs need no kernel code.

#include <cstddef>

#include "moekit/precision/format.hpp"

namespace moekit {

/// The three matrices of one expert: w1 (gate_proj) and w3 (up_proj) are ffn × hidden, w2
/// (down_proj) is hidden × ffn. Each may have its own precision and scheme.
struct ExpertWeights {
  MatrixView w1;
  MatrixView w3;
  MatrixView w2;

  [[nodiscard]] std::size_t hidden() const noexcept { return w1.cols; }
  [[nodiscard]] std::size_t ffn() const noexcept { return w1.rows; }
};

}  // namespace moekit
