#pragma once
/// \file fate-oracle: Fate with its cross-layer gate replaced by a noisy oracle over a routing
/// known ahead (moe-run --routing-trace; presets/oracle_stand_in.hpp says why): the oracle
/// predicts the next layer's replayed routing with the paper's recall and pads the prediction to
/// the percentile rule's ceil((1 − q)·E) experts, under the same decode cap, spent in the order of
/// a score blind to which predictions are true (ScoreRankedCap, as moe-sim's Fate stand-in).
/// Everything else is Fate's.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/predict/lookahead_oracle.hpp"
#include "moekit/predict/score_ranked_cap.hpp"
#include "moekit/presets/fate.hpp"
#include "moekit/presets/oracle_stand_in.hpp"

namespace moekit::presets {

/// The recall of Fate's cross-layer gate at the next layer: 97.15 % in decode with the
/// 75th-percentile candidate set (Fang et al., 2025, §4.2; paper). Fate predicts one layer ahead.
inline constexpr std::array<double, 1> fate_paper_recall{0.9715};

struct FateOracleSpec : OracleStandIn<FateSpec, FateOracleSpec,
                                      ScoreRankedCap<LookaheadOraclePredictor<PopularityScorer>>,
                                      std::vector<double>> {
  static constexpr std::string_view name = "fate-oracle";
  static constexpr std::string_view summary =
      "Fate with a noisy oracle over --routing-trace instead of its cross-layer gate (recall "
      "--oracle-recall, default the paper's 0.9715 at the next layer)";
  static constexpr PresetNeeds needs{
      .decode_timing = true, .lookahead = true, .staged_misses = true};

  static std::vector<double> paper_recall() {
    return {fate_paper_recall.begin(), fate_paper_recall.end()};
  }
  /// `--oracle-recall`, or the paper's.
  static std::vector<double> recall(const PresetParams& q) {
    return q.oracle_recall.empty() ? paper_recall() : q.oracle_recall;
  }

  /// The decode cap n = floor(T / t_expert): `c`'s times, else the measured inputs (as
  /// FateSpec::predictor), else no cap.
  static std::uint32_t decode_cap(const Config& c, const PresetInputs& in) {
    const auto [T, t] = cap_times(c, in);
    if (!(T > 0) || !(t > 0)) return std::numeric_limits<std::uint32_t>::max();
    return static_cast<std::uint32_t>(std::floor(T / t));
  }

  static Predictor predictor(const ModelShape& s, const Config& c, const PresetInputs& in) {
    const auto set = static_cast<std::uint32_t>(std::ceil((1.0 - c.percentile) * s.n_experts));
    // Prefetches move at the decode precision: the oracle's scorer ignores the on-demand one (a
    // miss's load precision), as moe-sim's Fate stand-in does.
    PopularityScorer::Config sc = c.scorer;
    sc.on_demand_precision = Precision::skip;
    LookaheadOraclePredictor<PopularityScorer> oracle({.recall_by_distance = c.recall,
                                                       .distance = 1,
                                                       .set_size = std::min(set, s.n_experts),
                                                       .n_layers = s.n_layers,
                                                       .n_experts = s.n_experts,
                                                       .pad_precision = c.scorer.decode_precision},
                                                      lookahead_of(name, in), PopularityScorer(sc));
    return Predictor(std::move(oracle),
                     {.max_nonresident = decode_cap(c, in), .n_experts = s.n_experts});
  }
};

}  // namespace moekit::presets
