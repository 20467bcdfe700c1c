#pragma once
/// \file RouterBank: the routers of every MoE layer as one contiguous f32 matrix [L·E × d], and
/// the routing function predictors apply to the logits they compute.
///
/// Storing the routers back to back makes the routers of layers l+1..l+p one contiguous row slice,
/// so a stacked product of p gates is a single GEMV (HOBBIT §3.3) without copying.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/gemv.hpp"

namespace moekit::detail {

/// Non-owning view of all routers: row `l·E + e` is router row e of MoE layer l (d floats).
struct RouterBank {
  std::span<const float> weights;  ///< [n_layers · n_experts · hidden], row-major
  std::uint32_t n_layers = 0;
  std::uint32_t n_experts = 0;
  std::uint32_t hidden = 0;

  /// Throws `moekit::Error` naming `who` and the field when the bank cannot be used.
  void validate(const char* who) const {
    const std::string w(who);
    MOEKIT_EXPECTS(n_layers > 0 && n_experts > 0 && hidden > 0,
                   w + ": Config.n_layers, n_experts and hidden must be > 0");
    MOEKIT_EXPECTS(weights.size() == std::size_t{n_layers} * n_experts * hidden,
                   w + ": Config.router_weights must hold n_layers x n_experts x hidden = " +
                       std::to_string(std::size_t{n_layers} * n_experts * hidden) +
                       " floats (got " + std::to_string(weights.size()) + ")");
  }

  /// Routers of layers [first, first + count) as one matrix [count·E × d].
  [[nodiscard]] MatrixView layers(std::uint32_t first, std::uint32_t count) const noexcept {
    const std::size_t rows = std::size_t{count} * n_experts;
    const float* p = weights.data() + std::size_t{first} * n_experts * hidden;
    return MatrixView{reinterpret_cast<const std::byte*>(p), rows, hidden, Precision::f32, {}};
  }

  /// logits[t·rows + r] = router rows of layers [first, first+count) · x_t, for `n` tokens of
  /// `x` (n × d). One GEMV (n = 1) or one small GEMM over the stacked rows.
  void stacked_logits(std::uint32_t first, std::uint32_t count, std::span<const float> x,
                      std::size_t n, std::vector<float>& logits) const {
    const MatrixView w = layers(first, count);
    logits.resize(n * w.rows);
    if (n == 1) gemv(w, x.first(hidden), logits);
    else gemm(w, x.first(n * hidden), n, logits);
  }
};

/// In place: row ← softmax(row) (max-subtracted).
inline void softmax(std::span<float> row) noexcept {
  float m = -std::numeric_limits<float>::infinity();
  for (float v : row) m = std::max(m, v);
  float s = 0.0f;
  for (float& v : row) s += (v = std::exp(v - m));
  if (s > 0.0f)
    for (float& v : row) v /= s;
}

/// The `k` largest entries of `probs` (descending, ties → smaller id) into `ids` (size k).
inline void top_k(std::span<const float> probs, std::span<std::uint32_t> ids) noexcept {
  const std::size_t k = std::min(ids.size(), probs.size());
  for (std::size_t j = 0; j < k; ++j) {
    std::uint32_t best = 0;
    bool found = false;
    for (std::uint32_t e = 0; e < probs.size(); ++e) {
      bool taken = false;
      for (std::size_t i = 0; i < j; ++i) taken |= ids[i] == e;
      if (taken) continue;
      if (!found || probs[e] > probs[best]) best = e, found = true;
    }
    ids[j] = best;
  }
}

}  // namespace moekit::detail
