#pragma once
/// \file hobbit-oracle: HOBBIT with its stacked-gate predictor replaced by a noisy oracle over a
/// routing known ahead (moe-run --routing-trace). A model with random weights cannot predict a
/// trained model's recorded routing from its own gates, so replaying real routing through HOBBIT
/// measures a predictor that is never right; this stand-in predicts the replayed routing with the
/// accuracy the paper reports for the real one, as moe-sim's HOBBIT does on traces without hidden
/// states (predict/lookahead_oracle.hpp, predict/noisy_oracle.hpp). Everything else is HOBBIT's.

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/predict/lookahead_oracle.hpp"
#include "moekit/presets/hobbit.hpp"

namespace moekit::presets {

/// The recall of HOBBIT's stacked gate at 1, 2, 3 layers ahead: top-1 accuracy ~96 % at the next
/// layer, ~90 % at +2/+3 (Tang et al., arXiv:2411.01433, Fig. 7; paper).
inline constexpr std::array<double, 3> hobbit_paper_recall{0.96, 0.90, 0.90};

/// The recall figures a stand-in uses: `given` (--oracle-recall) or the paper's.
template <std::size_t N>
std::vector<double> oracle_recall(const std::vector<double>& given,
                                  const std::array<double, N>& paper) {
  return given.empty() ? std::vector<double>(paper.begin(), paper.end()) : given;
}

struct HobbitOracleSpec : HobbitSpec {
  static constexpr std::string_view name = "hobbit-oracle";
  static constexpr std::string_view summary =
      "HOBBIT with a noisy oracle over --routing-trace instead of its stacked gate (recall "
      "--oracle-recall, default the paper's 0.96/0.90/0.90 at +1/+2/+3 layers)";
  static constexpr PresetNeeds needs{.lookahead = true};

  using Predictor = LookaheadOraclePredictor<HobbitThresholdScorer>;
  template <class Loader>
  using Pipeline = PipelineWith<Loader, Predictor>;

  struct Config : HobbitSpec::Config {
    std::vector<double> recall{hobbit_paper_recall.begin(), hobbit_paper_recall.end()};
  };
  static Config configure(const ModelShape& s, Precision base, const PresetParams& q) {
    Config c{HobbitSpec::configure(s, base, q)};
    c.recall = oracle_recall(q.oracle_recall, hobbit_paper_recall);
    return c;
  }

  static Predictor predictor(const ModelShape& s, const Config& c, const PresetInputs& in) {
    return Predictor({.recall_by_distance = c.recall,
                      .distance = c.lookahead,
                      .n_layers = s.n_layers,
                      .n_experts = s.n_experts,
                      .pad_precision = c.rule.high},
                     lookahead_of(name, in), scorer(c));
  }

  template <class Loader>
  static std::unique_ptr<Pipeline<Loader>> build(const ModelShape& s, const PipelineConfig& pc,
                                                 Loader loader, const Config& c,
                                                 const PresetInputs& in) {
    return build_with(s, pc, std::move(loader), c, predictor(s, c, in));
  }
};

}  // namespace moekit::presets
