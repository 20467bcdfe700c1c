#pragma once
/// \file hobbit-oracle: HOBBIT with its stacked-gate predictor replaced by a noisy oracle over a
/// routing known ahead (moe-run --routing-trace; presets/oracle_stand_in.hpp says why). It runs
/// the model moe-sim's HOBBIT runs on traces without gate inputs (predict/ranked_guess.hpp, shared
/// with RankedNoisyOraclePredictor): each token's actual top-1 and lower ranks kept at their own
/// recall per distance (`--hobbit-recall`), and each prefetch's precision by T1/T2 on the
/// *predicted* gate weights. Everything else is HOBBIT's.

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "moekit/predict/lookahead_oracle.hpp"
#include "moekit/presets/hobbit.hpp"
#include "moekit/presets/hobbit_recall.hpp"
#include "moekit/presets/oracle_stand_in.hpp"

namespace moekit::presets {

struct HobbitOracleSpec
    : OracleStandIn<HobbitSpec, HobbitOracleSpec, LookaheadOraclePredictor<HobbitThresholdScorer>,
                    HobbitRecallProfile> {
  static constexpr std::string_view name = "hobbit-oracle";
  static constexpr std::string_view summary =
      "HOBBIT with a noisy oracle over --routing-trace instead of its stacked gate (each rank "
      "kept at its recall, --hobbit-recall, default the paper's 0.96/0.90/0.90 at +1/+2/+3 "
      "layers; precisions by T1/T2 on the predicted gate weights)";
  static constexpr PresetNeeds needs{.lookahead = true};

  static HobbitRecallProfile paper_recall() { return hobbit_paper_profile(); }
  static HobbitRecallProfile recall(const PresetParams& q) {
    return parse_hobbit_recall(q.hobbit_recall);
  }
  /// HOBBIT's checks; `--oracle-recall` (one figure per distance) is fate-oracle's.
  static void check(Precision base, const PresetParams& q) {
    HobbitSpec::check(base, q);
    if (!q.oracle_recall.empty())
      moekit::detail::fail(ErrorKind::invalid_argument,
                           "--oracle-recall: hobbit-oracle keeps each rank at its own recall; "
                           "give its figures with --hobbit-recall (paper, measured, "
                           "R1[,R2[,R3]] or TOP1,../LOWER,..)");
  }

  static Predictor predictor(const ModelShape& s, const Config& c, const PresetInputs& in) {
    return Predictor({.recall_by_rank = {c.recall.top1, c.recall.lower},
                      .distance = c.lookahead,
                      .n_layers = s.n_layers,
                      .n_experts = s.n_experts,
                      .pad_precision = c.rule.high},
                     lookahead_of(name, in), scorer(c));
  }
};

}  // namespace moekit::presets
