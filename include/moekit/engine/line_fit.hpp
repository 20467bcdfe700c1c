#pragma once
/// \file Lines through timings: Fiddler's CPU latency (least squares, its own model) and the robust
/// per-token slope moe-calibrate fits through timings taken beside other work.

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "moekit/error.hpp"

namespace moekit::engine {

/// The least-squares line t = a + c·n through (n_i, t_i); with a negative intercept, the line
/// through 0 (Fiddler's own model). Returns {a, c}, c > 0.
inline std::pair<double, double> fit_cpu_line(std::span<const double> n,
                                              std::span<const double> t) {
  MOEKIT_EXPECTS(n.size() == t.size() && n.size() >= 2, "fit_cpu_line: need >= 2 points");
  double sn = 0, st = 0, snn = 0, snt = 0;
  for (std::size_t i = 0; i < n.size(); ++i)
    sn += n[i], st += t[i], snn += n[i] * n[i], snt += n[i] * t[i];
  const double k = double(n.size()), den = k * snn - sn * sn;
  double c = den > 0 ? (k * snt - sn * st) / den : 0.0;
  double a = (st - c * sn) / k;
  if (a < 0 || !(c > 0)) a = 0, c = snt / snn;
  return {a, std::max(c, 1e-12)};
}

/// The Theil–Sen slope through (n_i, t_i): the median of the slopes of every pair with n_i ≠ n_j.
/// One timing hit by a neighbour's burst moves a least-squares slope arbitrarily (even below 0);
/// it moves this one by at most one rank of the pairwise slopes (breakdown point 29%).
inline double theil_sen_slope(std::span<const double> n, std::span<const double> t) {
  MOEKIT_EXPECTS(n.size() == t.size() && n.size() >= 2, "theil_sen_slope: need >= 2 points");
  std::vector<double> slopes;
  for (std::size_t i = 0; i < n.size(); ++i)
    for (std::size_t j = i + 1; j < n.size(); ++j)
      if (n[i] != n[j]) slopes.push_back((t[j] - t[i]) / (n[j] - n[i]));
  MOEKIT_EXPECTS(!slopes.empty(), "theil_sen_slope: need two different x");
  const std::size_t mid = slopes.size() / 2;
  std::nth_element(slopes.begin(), slopes.begin() + std::ptrdiff_t(mid), slopes.end());
  const double upper = slopes[mid];
  if (slopes.size() % 2) return upper;
  return (upper + *std::max_element(slopes.begin(), slopes.begin() + std::ptrdiff_t(mid))) / 2;
}

}  // namespace moekit::engine
