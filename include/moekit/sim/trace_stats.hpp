#pragma once
/// \file Cache-independent statistics of a RoutingTrace: expert popularity, temporal reuse and
/// HOBBIT's precision split. Used to check traces (real and synthetic) against published facts.
///
/// HOBBIT split (Tang et al., arXiv:2411.01433, Eq. 2 / Fig. 5b): the selected experts of a
/// record, by descending weight, get score s_0 = 0 and s_i = Σ_{j<i} w_j; rank 0 is always HIGH,
/// else s ≤ T1 → HIGH, s ≤ T2 → LOW, otherwise SKIP. Reuse (HOBBIT Fig. 10a): for consecutive
/// tokens of a sequence at the same layer, whether token t's top-1 expert is among token t+1's
/// experts, and whether any of token t's experts is.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "moekit/sim/trace.hpp"

namespace moekit::sim {

/// Fractions of all expert selections (valid records only) in each HOBBIT precision class.
struct PrecisionSplit {
  double high = 0, low = 0, skip = 0;
  std::size_t selections = 0;
};

/// HOBBIT's T1/T2 split over the records of `phase` (all phases when empty).
[[nodiscard]] inline PrecisionSplit hobbit_split(const RoutingTrace& trace, double t1, double t2,
                                                 std::optional<Phase> phase = std::nullopt) {
  MOEKIT_EXPECTS(0 <= t1 && t1 <= t2 && t2 <= 1, "hobbit_split: need 0 <= T1 <= T2 <= 1");
  const TraceDims& d = trace.dims();
  std::size_t high = 0, low = 0, skip = 0;
  for (std::size_t g = 0; g < trace.token_count(); ++g) {
    if (phase && trace.phase(g) != *phase) continue;
    for (std::uint32_t l = 0; l < d.n_layers; ++l) {
      if (!trace.valid(g, l)) continue;
      double s = 0;
      const auto w = trace.weights(g, l);
      for (std::uint32_t i = 0; i < d.top_k; ++i) {
        if (i == 0 || s <= t1)
          ++high;
        else if (s <= t2)
          ++low;
        else
          ++skip;
        s += w[i];
      }
    }
  }
  PrecisionSplit out;
  out.selections = high + low + skip;
  if (out.selections) {
    const double n = static_cast<double>(out.selections);
    out.high = static_cast<double>(high) / n;
    out.low = static_cast<double>(low) / n;
    out.skip = static_cast<double>(skip) / n;
  }
  return out;
}

/// Temporal reuse between consecutive tokens at the same layer.
struct ReuseStats {
  double top1_reused = 0;  ///< P(top-1 of token t is among the experts of token t+1)
  double any_reused = 0;   ///< P(at least one expert of token t is among those of token t+1)
  std::size_t pairs = 0;   ///< (t, t+1) pairs with both records present
};

/// Reuse over consecutive tokens of each sequence (pairs with a missing record are skipped).
[[nodiscard]] inline ReuseStats reuse_stats(const RoutingTrace& trace,
                                            std::optional<Phase> phase = std::nullopt) {
  const TraceDims& d = trace.dims();
  std::size_t top1 = 0, any = 0, pairs = 0;
  for (std::size_t s = 0; s < trace.sequence_count(); ++s) {
    const std::size_t n = trace.sequence_length(s);
    for (std::size_t t = 0; t + 1 < n; ++t) {
      const std::size_t g = trace.global_token(s, t);
      if (phase && (trace.phase(g) != *phase || trace.phase(g + 1) != *phase)) continue;
      for (std::uint32_t l = 0; l < d.n_layers; ++l) {
        if (!trace.valid(g, l) || !trace.valid(g + 1, l)) continue;
        const auto a = trace.experts(g, l), b = trace.experts(g + 1, l);
        auto in_b = [&](std::uint32_t e) {
          for (std::uint32_t x : b)
            if (x == e) return true;
          return false;
        };
        ++pairs;
        top1 += in_b(a[0]);
        bool hit = false;
        for (std::uint32_t e : a) hit = hit || in_b(e);
        any += hit;
      }
    }
  }
  ReuseStats r;
  r.pairs = pairs;
  if (pairs) {
    r.top1_reused = static_cast<double>(top1) / static_cast<double>(pairs);
    r.any_reused = static_cast<double>(any) / static_cast<double>(pairs);
  }
  return r;
}

/// Per-layer share of selections per expert, [n_layers × n_experts] row-major; each row sums to
/// 1 (rows of layers without valid records are 0). With `top1_only`, counts rank-0 experts only.
[[nodiscard]] inline std::vector<double> expert_shares(const RoutingTrace& trace,
                                                       bool top1_only = false) {
  const TraceDims& d = trace.dims();
  std::vector<double> counts(std::size_t{d.n_layers} * d.n_experts, 0.0);
  for (std::size_t g = 0; g < trace.token_count(); ++g)
    for (std::uint32_t l = 0; l < d.n_layers; ++l) {
      if (!trace.valid(g, l)) continue;
      const auto ids = trace.experts(g, l);
      const std::size_t k = top1_only ? 1 : ids.size();
      for (std::size_t i = 0; i < k; ++i) counts[std::size_t{l} * d.n_experts + ids[i]] += 1;
    }
  for (std::uint32_t l = 0; l < d.n_layers; ++l) {
    double sum = 0;
    for (std::uint32_t e = 0; e < d.n_experts; ++e) sum += counts[std::size_t{l} * d.n_experts + e];
    if (sum > 0)
      for (std::uint32_t e = 0; e < d.n_experts; ++e)
        counts[std::size_t{l} * d.n_experts + e] /= sum;
  }
  return counts;
}

}  // namespace moekit::sim
