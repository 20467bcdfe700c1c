#pragma once
/// \file HOBBIT's threshold calibration: T1 / T2 from the score distribution of a calibration set.
///
/// HOBBIT (Tang et al., arXiv:2411.01433, §3.2) profiles T1 = 0.6 / T2 = 0.9 for Mixtral from the
/// distribution of the unimportance scores s_i (Eq. 2). For another model (spec §2.2): collect the
/// score of every selection of a calibration run (rank 0 counted as 0), pick target fractions of
/// all N selections to run low (f_low, default 0.30) and to skip (f_skip, default 0.03); then
/// T2 = the smallest score value with at most f_skip·N scores above it, and T1 = the same with
/// (f_skip + f_low)·N.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/score/hobbit_threshold.hpp"

namespace moekit::tools {

/// Collects HOBBIT scores of expert selections and derives thresholds from them.
class HobbitScoreCollector {
 public:
  /// Adds one token's selection (any order; weights normalised as the rule does).
  void add(std::span<const std::uint32_t> experts, std::span<const float> weights) {
    const std::size_t k = experts.size();
    MOEKIT_EXPECTS(k == weights.size() && k > 0 && k <= HobbitRule::max_k,
                   "HobbitScoreCollector::add: experts and weights must have the same size in "
                   "[1, 64]");
    std::array<float, HobbitRule::max_k> w{};
    std::array<std::uint32_t, HobbitRule::max_k> order{};
    float sum = 0.0f;
    for (std::size_t i = 0; i < k; ++i) {
      const float a = std::fabs(weights[i]);
      w[i] = std::isfinite(a) ? a : 0.0f;
      sum += w[i];
      order[i] = static_cast<std::uint32_t>(i);
    }
    for (std::size_t i = 0; i < k; ++i) w[i] = sum > 0.0f ? w[i] / sum : 1.0f / float(k);
    std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k),
              [&](std::uint32_t a, std::uint32_t b) {
                return w[a] != w[b] ? w[a] > w[b] : experts[a] < experts[b];
              });
    float acc = 0.0f;
    for (std::size_t r = 0; r < k; ++r) {
      scores_.push_back(r == 0 ? 0.0f : acc);
      acc += w[order[r]];
    }
  }

  /// Selections collected so far.
  [[nodiscard]] std::size_t size() const noexcept { return scores_.size(); }

  /// The thresholds for target fractions `f_low` and `f_skip` of all selections; the returned
  /// rule keeps the default precisions.
  [[nodiscard]] HobbitRule thresholds(double f_low = 0.30, double f_skip = 0.03) const {
    MOEKIT_EXPECTS(!scores_.empty(), "HobbitScoreCollector::thresholds: no selections collected");
    MOEKIT_EXPECTS(f_low >= 0.0 && f_skip >= 0.0 && f_low + f_skip <= 1.0,
                   "HobbitScoreCollector::thresholds: need f_low, f_skip >= 0 and f_low + f_skip "
                   "<= 1");
    std::vector<float> a = scores_;
    std::sort(a.begin(), a.end());
    const double n = double(a.size());
    // smallest value v among the scores with #(s > v) <= limit
    auto smallest_with_at_most_above = [&](double fraction_limit) {
      const double limit = fraction_limit + 1e-9 * n;  // 0.33 · 200 must admit 66
      for (std::size_t i = 0; i < a.size();) {
        const auto ub = std::upper_bound(a.begin(), a.end(), a[i]) - a.begin();
        if (double(a.size() - std::size_t(ub)) <= limit) return a[i];
        i = std::size_t(ub);
      }
      return a.back();
    };
    HobbitRule r{};
    r.t2 = std::min(1.0f, smallest_with_at_most_above(f_skip * n));
    r.t1 = std::min(r.t2, smallest_with_at_most_above((f_skip + f_low) * n));
    return r;
  }

 private:
  std::vector<float> scores_;
};

}  // namespace moekit::tools
