#pragma once
/// \file The routing function the gate predictors apply to the logits they compute: softmax and
/// top-k with the model's tie rule (smaller id first). Public so that tests and tools compare a
/// predictor's picks with the routing it predicts by the same rule.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

namespace moekit {

/// In place: row ← softmax(row) (max-subtracted).
inline void softmax_in_place(std::span<float> row) noexcept {
  float m = -std::numeric_limits<float>::infinity();
  for (float v : row) m = std::max(m, v);
  float s = 0.0f;
  for (float& v : row) s += (v = std::exp(v - m));
  if (s > 0.0f)
    for (float& v : row) v /= s;
}

/// The `k` largest entries of `probs` (descending, ties → smaller id) into `ids` (size k).
inline void top_k_experts(std::span<const float> probs, std::span<std::uint32_t> ids) noexcept {
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

}  // namespace moekit
