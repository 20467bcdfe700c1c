#pragma once
/// \file HobbitThresholdScorer: HOBBIT's token-level mixed-precision rule (M1).
///
/// Algorithm (Tang et al., "HOBBIT: A Mixed Precision Expert Offloading System for Fast MoE
/// Inference", arXiv:2411.01433, §3.2, Eq. 2): per token, the selected experts are ranked by their
/// gate weight normalised over the selection, w_i = |g_i| / Σ_j |g_j| (descending, ties → smaller
/// id). The unimportance score of rank i is the cumulative weight of the higher-ranked experts,
/// s_0 = 0, s_i = Σ_{j<i} w_j. Rank 0 is always high precision; otherwise s ≤ T1 → high,
/// s ≤ T2 → low, else skip. Defaults T1 = 0.6, T2 = 0.9 (the paper's Mixtral profile) with f16/q4
/// (a q8 model uses q8/q2). A forward of several tokens gives each expert the most demanding
/// decision among the tokens that selected it (high > low > skip); `tokens_asking` says how many
/// of its tokens asked for that decision themselves (a token that asked low is served by the high
/// copy another token asked for, but it is not a high-precision use for HOBBIT's LHU).
///
/// `HobbitRule` is the rule alone; the stacked-gate predictor applies it to predicted weights.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// HOBBIT's decision for one (token, expert) use.
enum class HobbitDecision : std::uint8_t { skip = 0, low = 1, high = 2 };

/// The T1/T2 rule with its two precisions.
struct HobbitRule {
  float t1 = 0.6f;                  ///< cumulative weight up to which experts run high
  float t2 = 0.9f;                  ///< cumulative weight up to which experts run low
  Precision high = Precision::f16;  ///< the model's own precision (q8 for a q8 model)
  Precision low = Precision::q4;    ///< the low-precision copy (q2 for a q8 model)

  /// The rule for a model stored at q8: high = q8, low = q2 (the paper's Jetson setting).
  [[nodiscard]] static constexpr HobbitRule for_q8_model() noexcept {
    return HobbitRule{0.6f, 0.9f, Precision::q8, Precision::q2};
  }

  /// Throws `moekit::Error` naming the field when the rule cannot work.
  void validate() const {
    MOEKIT_EXPECTS(t1 >= 0.0f && t1 <= t2 && t2 <= 1.0f,
                   "HobbitRule: thresholds must satisfy 0 <= t1 <= t2 <= 1 (t1 = " +
                       std::to_string(t1) + ", t2 = " + std::to_string(t2) + ")");
    MOEKIT_EXPECTS(high != Precision::skip && low != Precision::skip,
                   "HobbitRule: high and low must be stored precisions, not skip");
    MOEKIT_EXPECTS(bits(low) <= bits(high), "HobbitRule: low must not be more precise than high");
  }

  [[nodiscard]] constexpr Precision precision(HobbitDecision d) const noexcept {
    return d == HobbitDecision::high ? high : d == HobbitDecision::low ? low : Precision::skip;
  }

  /// Decides every selected expert of one token. `experts[i]` / `weights[i]` may come in any
  /// order; `out[i]` receives the decision for `experts[i]`. At most 64 experts per token.
  void decide(std::span<const std::uint32_t> experts, std::span<const float> weights,
              std::span<HobbitDecision> out) const noexcept {
    const std::size_t k = std::min<std::size_t>(experts.size(), max_k);
    std::array<float, max_k> w{};
    std::array<std::uint8_t, max_k> order{};
    float sum = 0.0f;
    for (std::size_t i = 0; i < k; ++i) {
      const float a = std::fabs(weights[i]);
      w[i] = std::isfinite(a) ? a : 0.0f;  // NaN weights count as 0
      sum += w[i];
      order[i] = static_cast<std::uint8_t>(i);
    }
    if (!(sum > 0.0f) || !std::isfinite(sum)) {
      for (std::size_t i = 0; i < k; ++i) w[i] = 1.0f / float(k);
    } else {
      for (std::size_t i = 0; i < k; ++i) w[i] /= sum;
    }
    std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k),
              [&](std::uint8_t a, std::uint8_t b) {
                return w[a] != w[b] ? w[a] > w[b] : experts[a] < experts[b];
              });
    float acc = 0.0f;
    for (std::size_t r = 0; r < k; ++r) {
      const std::size_t i = order[r];
      out[i] = (r == 0 || acc <= t1) ? HobbitDecision::high
               : acc <= t2           ? HobbitDecision::low
                                     : HobbitDecision::skip;
      acc += w[i];
    }
  }

  static constexpr std::size_t max_k = 64;
};

/// HOBBIT's expert scorer: high / low precision or skip per needed expert, by the T1/T2 rule.
class HobbitThresholdScorer {
 public:
  static constexpr std::string_view name = "hobbit-threshold";
  static constexpr Hooks hooks = Hook::tokens_asking;
  struct Config {
    HobbitRule rule{};  ///< thresholds and precisions (defaults: 0.6 / 0.9, f16 / q4)
  };
  HobbitThresholdScorer() = default;
  explicit HobbitThresholdScorer(Config c) : cfg_(c) { cfg_.rule.validate(); }

  /// Throws `moekit::Error` when a token selects more than `HobbitRule::max_k` experts.
  void score(const LayerContext&, const GateView& gate, std::span<const ExpertDemand> demands,
             std::span<Precision> out) {
    MOEKIT_EXPECTS(gate.k <= HobbitRule::max_k,
                   "HobbitThresholdScorer: GateView.k exceeds HobbitRule::max_k (64)");
    if (best_.size() < gate.n_experts) best_.resize(gate.n_experts), asking_.resize(gate.n_experts);
    for (const ExpertDemand& d : demands) best_[d.expert] = HobbitDecision::skip;
    for (const ExpertDemand& d : demands) asking_[d.expert] = 0;
    std::array<HobbitDecision, HobbitRule::max_k> dec{};
    for (std::uint32_t t = 0; t < gate.n_tokens; ++t) {
      const TokenRoute r = gate.token(t);
      cfg_.rule.decide(r.experts, r.weights,
                       std::span<HobbitDecision>(dec).first(r.experts.size()));
      for (std::size_t j = 0; j < r.experts.size(); ++j) {
        const std::uint32_t e = r.experts[j];
        if (dec[j] > best_[e]) best_[e] = dec[j], asking_[e] = 0;
        asking_[e] += dec[j] == best_[e];
      }
    }
    if (asking_by_demand_.size() < demands.size()) asking_by_demand_.resize(demands.size());
    for (std::size_t i = 0; i < demands.size(); ++i) {
      const HobbitDecision d = best_[demands[i].expert];
      out[i] = cfg_.rule.precision(d);
      asking_by_demand_[i] = asking_[demands[i].expert];
      ++counts_[static_cast<std::size_t>(d)];
    }
  }

  /// Of demand `i`'s tokens in the last `score`, those whose own decision was the one it got.
  [[nodiscard]] std::uint32_t tokens_asking(std::size_t i) const noexcept {
    return asking_by_demand_[i];
  }

  /// Decisions made so far, per expert of a layer call: [skip, low, high].
  [[nodiscard]] const std::array<std::uint64_t, 3>& decision_counts() const noexcept {
    return counts_;
  }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  Config cfg_{};
  std::vector<HobbitDecision> best_;
  std::vector<std::uint32_t> asking_, asking_by_demand_;
  std::array<std::uint64_t, 3> counts_{};
};
static_assert(Scorer<HobbitThresholdScorer>);

}  // namespace moekit
