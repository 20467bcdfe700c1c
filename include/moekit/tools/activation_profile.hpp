#pragma once
/// \file Builds EdgeMoE activation-path profiles from routing traces, and measures how well a
/// profile predicts a trace.
///
/// The profile (see `predict/activation_path.hpp`) counts, per token, the selected experts of
/// every layer given those of the one and two previous layers. EdgeMoE builds it offline from
/// decode traces of several datasets (§III-C1). Only traces whose layers are aligned token by
/// token are meaningful here (for the shared Mixtral data: the raw prefill+decode file, not the
/// per-layer `.decode.jsonl` files).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/predict/activation_path.hpp"
#include "moekit/sim/trace.hpp"

namespace moekit::tools {

using sim::RoutingTrace;
using sim::TraceDims;

/// Which tokens of a trace to use.
struct TraceSelection {
  bool prefill = false;         ///< include prefill tokens
  bool decode = true;           ///< include decode tokens
  std::size_t first_token = 0;  ///< global token range [first_token, end_token)
  std::size_t end_token = std::numeric_limits<std::size_t>::max();

  [[nodiscard]] bool takes(const RoutingTrace& t, std::size_t token) const noexcept {
    if (token < first_token || token >= end_token) return false;
    return t.phase(token) == Phase::prefill ? prefill : decode;
  }
};

/// Adds the selected tokens of `trace` to `profile` (missing records contribute nothing).
inline void add_trace(ActivationPathProfile& profile, const RoutingTrace& trace,
                      const TraceSelection& sel = {}) {
  const TraceDims& d = trace.dims();
  MOEKIT_EXPECTS(profile.n_layers() == d.n_layers && profile.n_experts() == d.n_experts,
                 "add_trace: the profile and the trace describe different models");
  std::vector<std::span<const std::uint32_t>> sets(d.n_layers);
  for (std::size_t t = 0; t < trace.token_count(); ++t) {
    if (!sel.takes(trace, t)) continue;
    for (std::uint32_t l = 0; l < d.n_layers; ++l)
      sets[l] = trace.valid(t, l) ? trace.experts(t, l) : std::span<const std::uint32_t>{};
    profile.add_path(sets);
  }
}

/// A profile of the selected tokens of `trace`.
[[nodiscard]] inline ActivationPathProfile build_activation_profile(
    const RoutingTrace& trace, const TraceSelection& sel = {}) {
  ActivationPathProfile p(trace.dims().n_layers, trace.dims().n_experts, trace.dims().top_k);
  add_trace(p, trace, sel);
  return p;
}

/// How well the top-`budget` ranked experts cover the true experts of the next layer.
struct ActivationPathAccuracy {
  std::uint64_t queries = 0;        ///< (token, layer ≥ 1) with the layer and its history present
  std::uint64_t truth = 0;          ///< true experts over those queries
  std::uint64_t covered = 0;        ///< of which among the top-`budget` predictions
  std::uint64_t top1_hits = 0;      ///< queries whose true top-1 expert was among the predictions
  std::uint64_t by_source[4] = {};  ///< answered by path2, path1, marginal, none
  [[nodiscard]] double recall() const noexcept {
    return truth ? double(covered) / double(truth) : 0.0;
  }
  [[nodiscard]] double top1_recall() const noexcept {
    return queries ? double(top1_hits) / double(queries) : 0.0;
  }
};

/// Replays the selected tokens of `trace`: for every layer n ≥ 1 whose record is present, ranks
/// layer n from the records of layers n−2 and n−1 (as the predictor does) and counts how many of
/// its true experts the top `budget` predictions contain.
[[nodiscard]] inline ActivationPathAccuracy evaluate_activation_path(
    const ActivationPathProfile& profile, const RoutingTrace& trace, const TraceSelection& sel,
    std::uint32_t budget, std::uint64_t min_support = 5) {
  const TraceDims& d = trace.dims();
  MOEKIT_EXPECTS(profile.n_layers() == d.n_layers && profile.n_experts() == d.n_experts,
                 "evaluate_activation_path: the profile and the trace describe different models");
  ActivationPathAccuracy acc;
  std::vector<std::pair<std::uint32_t, float>> ranked;
  ActivationPathProfile::Key key;
  std::vector<std::uint32_t> prev1, prev2;
  auto sorted = [&](std::size_t t, std::uint32_t l, std::vector<std::uint32_t>& out) {
    out.clear();
    if (!trace.valid(t, l)) return;
    auto e = trace.experts(t, l);
    out.assign(e.begin(), e.end());
    std::sort(out.begin(), out.end());
  };
  for (std::size_t t = 0; t < trace.token_count(); ++t) {
    if (!sel.takes(trace, t)) continue;
    for (std::uint32_t n = 1; n < d.n_layers; ++n) {
      if (!trace.valid(t, n) || !trace.valid(t, n - 1)) continue;
      sorted(t, n - 1, prev1);
      if (n >= 2)
        sorted(t, n - 2, prev2);
      else
        prev2.clear();
      const auto src = profile.rank(n, prev2, prev1, min_support, ranked, key);
      ++acc.by_source[static_cast<int>(src)];
      ++acc.queries;
      const auto truth = trace.experts(t, n);
      const std::size_t m = std::min<std::size_t>(budget, ranked.size());
      auto predicted = [&](std::uint32_t e) {
        for (std::size_t i = 0; i < m; ++i)
          if (ranked[i].first == e) return true;
        return false;
      };
      for (std::uint32_t e : truth) {
        ++acc.truth;
        acc.covered += predicted(e);
      }
      acc.top1_hits += predicted(truth[0]);
    }
  }
  return acc;
}

}  // namespace moekit::tools
