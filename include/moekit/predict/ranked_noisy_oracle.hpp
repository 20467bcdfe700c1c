#pragma once
/// \file RankedNoisyOraclePredictor: the true future routing degraded per token and per rank, its
/// precisions decided by the run's scorer on the *predicted* routing.
///
/// moe-sim's stand-in for HOBBIT's stacked gate on traces without gate inputs (Tang et al.,
/// arXiv:2411.01433, §3.3). It holds the script of the trace's layer calls with their tokens'
/// routing and, at each call, predicts the following calls of the same forward within `distance`
/// layers through the per-rank noise model of predict/ranked_guess.hpp (the one moe-run's
/// `hobbit-oracle` runs over a replayed trace): each token's actual rank-r expert kept with the
/// recall of rank r at that distance, otherwise replaced by a random expert the call does not
/// use; the kept experts ranked first, the wrong guesses after, the actual weights by predicted
/// rank; the scorer's precisions on that predicted routing. With every recall 1 the prediction is
/// the actual routing and each precision the one the scorer asks for the demand.
/// `max_nonresident` caps the non-resident predictions per predicted layer in decode forwards;
/// resident ones are always pushed (they get pinned).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/error.hpp"
#include "moekit/predict/oracle.hpp"
#include "moekit/predict/ranked_guess.hpp"

namespace moekit {

/// One layer call of the script with its tokens' routing.
struct RoutedCall {
  std::uint32_t layer = 0;
  std::uint32_t n_tokens = 0;
  std::uint32_t k = 0;                 ///< experts per token
  std::vector<std::uint32_t> experts;  ///< [n_tokens × k], each token's by descending weight
  std::vector<float> weights;          ///< [n_tokens × k], same order
};

/// The scripted routing kept per token and rank (see the file comment).
template <Scorer S>
class RankedNoisyOraclePredictor {
  static_assert(!declares<S>(Hook::begin_sequence),
                "RankedNoisyOraclePredictor: its scorer copy would miss begin_sequence");

 public:
  static constexpr std::string_view name = "ranked-noisy-oracle";
  struct Config {
    std::vector<RoutedCall> calls;  ///< every layer call, in the order `route` sees them
    /// [rank][distance - 1]: the recall of the actual rank-r expert at that distance (the last
    /// list serves deeper ranks, a list's last entry farther distances).
    RecallByRank recall_by_rank{{0.96}};
    std::uint64_t seed = 0;
    std::uint32_t distance = 1;   ///< layers ahead to predict (1..max_prediction_distance)
    std::uint32_t n_experts = 0;  ///< experts per layer (required: wrong guesses)
    /// Non-resident predictions pushed per predicted layer in decode (default: no cap).
    std::uint32_t max_nonresident = std::numeric_limits<std::uint32_t>::max();
  };

  RankedNoisyOraclePredictor(Config c, S scorer)
      : cfg_(std::move(c)), scorer_(std::move(scorer)), guess_(cfg_.seed, cfg_.n_experts) {
    const std::string who = "RankedNoisyOraclePredictor: ";
    MOEKIT_EXPECTS(cfg_.n_experts > 0, who + "Config.n_experts must be > 0");
    MOEKIT_EXPECTS(
        cfg_.distance >= 1 && cfg_.distance <= max_prediction_distance,
        who + "Config.distance must be in [1, " + std::to_string(max_prediction_distance) + "]");
    check_ranked_recall(who + "Config.recall_by_rank: ", cfg_.recall_by_rank);
    script_.reserve(cfg_.calls.size());
    for (std::size_t i = 0; i < cfg_.calls.size(); ++i) script_.push_back(checked_call(i));
  }

  /// Checks the call against the script and advances.
  void observe(const LayerContext& ctx, const GateView& gate) {
    detail::check_script_call("RankedNoisyOraclePredictor", script_, cursor_, seen_, ctx, gate);
  }

  void predict(const LayerContext& ctx, const GateView&, const ResidencyView& residency,
               PrefetchList& out) {
    if (cursor_ == 0) return;
    std::uint32_t prev = ctx.layer;
    for (std::size_t i = cursor_; i < cfg_.calls.size(); ++i) {
      const std::uint32_t m = cfg_.calls[i].layer;
      if (m <= prev || m > ctx.layer + cfg_.distance) break;
      predict_call(ctx, i, m - ctx.layer, residency, out);
      prev = m;
    }
  }

  /// Call `i`'s predicted experts and precisions from `distance` layers ahead (predicted rank
  /// order, a skipped one at `skip`), without residency (for tests and the realised recall).
  [[nodiscard]] std::vector<std::pair<std::uint32_t, Precision>> predictions(
      std::size_t i, std::uint32_t distance = 1, Phase phase = Phase::decode) {
    MOEKIT_EXPECTS(i < cfg_.calls.size(),
                   "RankedNoisyOraclePredictor::predictions: call out of range");
    guess(i, distance, phase);
    std::vector<std::pair<std::uint32_t, Precision>> r;
    for (std::size_t j = 0; j < guess_.demands().size(); ++j)
      r.push_back({guess_.demands()[j].expert, guess_.precisions()[j]});
    return r;
  }

  [[nodiscard]] double recall_at(std::size_t rank, std::uint32_t distance) const noexcept {
    return ranked_recall(cfg_.recall_by_rank, rank, distance);
  }
  [[nodiscard]] std::size_t position() const noexcept { return cursor_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  // Validates call i; returns its OracleCall (distinct experts, sorted) for the script check.
  OracleCall checked_call(std::size_t i) const {
    const RoutedCall& c = cfg_.calls[i];
    const std::string where = "RankedNoisyOraclePredictor: call " + std::to_string(i);
    const std::size_t n = std::size_t{c.n_tokens} * c.k;
    MOEKIT_EXPECTS(c.experts.size() == n && c.weights.size() == n,
                   where + " must hold n_tokens x k experts and weights");
    MOEKIT_EXPECTS(c.k >= 1 && c.k <= 64, where + ": k must be in [1, 64]");
    OracleCall o{c.layer, c.experts};
    for (std::uint32_t e : o.experts)
      MOEKIT_EXPECTS(e < cfg_.n_experts,
                     where + " names expert " + std::to_string(e) + " >= n_experts");
    std::sort(o.experts.begin(), o.experts.end());
    o.experts.erase(std::unique(o.experts.begin(), o.experts.end()), o.experts.end());
    return o;
  }

  // guess_: call i's predicted routing from `distance` ahead, scored.
  void guess(std::size_t i, std::uint32_t distance, Phase phase) {
    const RoutedCall& c = cfg_.calls[i];
    const GateView actual{.n_tokens = c.n_tokens,
                          .k = c.k,
                          .n_experts = cfg_.n_experts,
                          .experts = c.experts,
                          .weights = c.weights};
    const LayerContext ctx{.layer = c.layer, .phase = phase, .n_tokens = c.n_tokens};
    guess_.guess(i, ctx, actual, cfg_.recall_by_rank, distance, scorer_);
  }

  void predict_call(const LayerContext& ctx, std::size_t i, std::uint32_t dist,
                    const ResidencyView& residency, PrefetchList& out) {
    guess(i, dist, ctx.phase);
    guess_.push(cfg_.calls[i].layer, dist, ctx.phase == Phase::decode, cfg_.max_nonresident,
                cfg_.recall_by_rank, residency, out);
  }

  Config cfg_;
  S scorer_;
  RankedRoutingGuess guess_;
  std::vector<OracleCall> script_;
  std::size_t cursor_ = 0;
  std::vector<std::uint32_t> seen_;
};

}  // namespace moekit
