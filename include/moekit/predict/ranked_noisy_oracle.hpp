#pragma once
/// \file RankedNoisyOraclePredictor: the true future routing degraded per token and per rank, its
/// precisions decided by the run's scorer on the *predicted* routing.
///
/// moe-sim's stand-in for HOBBIT's stacked gate on traces without gate inputs (Tang et al.,
/// arXiv:2411.01433, §3.3): a gate predicts, for each token, a top-k with gate weights, and HOBBIT
/// applies its T1/T2 rule to those predicted weights to pick each prefetch's precision. Here:
///  * each token's actual rank-r expert is kept with the recall of rank r at that distance
///    (`Config::recall_by_rank[r][distance - 1]`; the last rank's list serves deeper ranks, the
///    last entry of a list farther distances), otherwise replaced by a random expert the call
///    does not use (RecallNoise::draw_ranked; hashes of seed, call, token, rank);
///  * the predicted top-k is ranked with the kept experts first, in their actual order, then the
///    wrong guesses (model, stated: the predicted logits track the actual ones, so an expert the
///    gate gets wrong scores below the actual ones it kept), and the predicted gate weights are
///    the token's actual weights by predicted rank (the gate's confidence profile taken as the
///    router's; the traces hold no logits for the experts a token did not select);
///  * the scorer (a copy of the run's) scores that predicted routing: with HOBBIT's rule the
///    predicted top-1 is high precision, the next by the cumulative predicted weight. So a kept
///    rank-2 expert whose top-1 was missed is prefetched at high precision, and a wrong guess at
///    rank 2 at low precision (or not at all, when skipped): a misprediction's transfer is cheap,
///    which is HOBBIT's argument for mixed-precision prefetch (§3.3, Fig. 9).
/// With every recall 1 the prediction is the actual routing and each precision the one the
/// scorer asks for the demand. `max_nonresident` caps the non-resident predictions per predicted
/// layer in decode forwards; resident ones are always pushed (they get pinned).

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
#include "moekit/predict/recall_noise.hpp"

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
    std::vector<std::vector<double>> recall_by_rank{{0.96}};
    std::uint64_t seed = 0;
    std::uint32_t distance = 1;   ///< layers ahead to predict (1..max_prediction_distance)
    std::uint32_t n_experts = 0;  ///< experts per layer (required: wrong guesses)
    /// Non-resident predictions pushed per predicted layer in decode (default: no cap).
    std::uint32_t max_nonresident = std::numeric_limits<std::uint32_t>::max();
  };

  RankedNoisyOraclePredictor(Config c, S scorer)
      : cfg_(std::move(c)), scorer_(std::move(scorer)), noise_(cfg_.seed, cfg_.n_experts) {
    const std::string who = "RankedNoisyOraclePredictor: ";
    MOEKIT_EXPECTS(cfg_.n_experts > 0, who + "Config.n_experts must be > 0");
    MOEKIT_EXPECTS(
        cfg_.distance >= 1 && cfg_.distance <= max_prediction_distance,
        who + "Config.distance must be in [1, " + std::to_string(max_prediction_distance) + "]");
    MOEKIT_EXPECTS(!cfg_.recall_by_rank.empty(), who + "Config.recall_by_rank is empty");
    for (const auto& by_distance : cfg_.recall_by_rank) {
      MOEKIT_EXPECTS(!by_distance.empty(), who + "Config.recall_by_rank holds an empty list");
      for (double r : by_distance)
        MOEKIT_EXPECTS(r >= 0.0 && r <= 1.0, who + "every recall must be in [0, 1]");
    }
    slot_.assign(cfg_.n_experts, -1);
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
    score_predicted(i, distance, phase);
    std::vector<std::pair<std::uint32_t, Precision>> r;
    for (std::size_t j = 0; j < demands_.size(); ++j) r.push_back({demands_[j].expert, prec_[j]});
    return r;
  }

  [[nodiscard]] double recall_at(std::size_t rank, std::uint32_t distance) const noexcept {
    const auto& r = cfg_.recall_by_rank[std::min(rank, cfg_.recall_by_rank.size() - 1)];
    return r[std::min<std::size_t>(distance, r.size()) - 1];
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

  // demands_/prec_: call i's predicted routing from `distance` ahead, scored.
  void score_predicted(std::size_t i, std::uint32_t distance, Phase phase) {
    const RoutedCall& c = cfg_.calls[i];
    recall_.resize(std::max<std::size_t>(c.k, 1));
    for (std::size_t r = 0; r < recall_.size(); ++r) recall_[r] = recall_at(r, distance);
    experts_.assign(c.experts.size(), 0);
    weights_.assign(c.weights.size(), 0.0f);
    std::uint32_t k = c.k;  // a call whose union covers the layer may predict fewer per token
    for (std::uint32_t t = 0; t < c.n_tokens; ++t) {
      const std::size_t at = std::size_t{t} * c.k;
      noise_.draw_ranked(i, t, std::span(c.experts).subspan(at, c.k), script_[i].experts, recall_,
                         token_);
      k = std::min<std::uint32_t>(k, static_cast<std::uint32_t>(token_.size()));
      std::copy(token_.begin(), token_.end(), experts_.begin() + std::ptrdiff_t(at));
      std::copy_n(c.weights.begin() + std::ptrdiff_t(at), c.k,
                  weights_.begin() + std::ptrdiff_t(at));
    }
    if (k < c.k) compact(c, k);
    const GateView g{.n_tokens = c.n_tokens,
                     .k = k,
                     .n_experts = cfg_.n_experts,
                     .experts = experts_,
                     .weights = weights_};
    collect_demands(g, slot_, demands_);
    prec_.assign(demands_.size(), Precision::skip);
    const LayerContext ctx{.layer = c.layer, .phase = phase, .n_tokens = c.n_tokens};
    scorer_.score(ctx, g, std::span<const ExpertDemand>(demands_), std::span<Precision>(prec_));
  }

  // Rare: some token kept fewer than k experts (its call uses every expert of the layer). A
  // GateView has one k: every token keeps its first k predictions.
  void compact(const RoutedCall& c, std::uint32_t k) {
    for (std::uint32_t t = 0; t < c.n_tokens; ++t)
      for (std::uint32_t j = 0; j < k; ++j) {
        experts_[std::size_t{t} * k + j] = experts_[std::size_t{t} * c.k + j];
        weights_[std::size_t{t} * k + j] = weights_[std::size_t{t} * c.k + j];
      }
    experts_.resize(std::size_t{c.n_tokens} * k);
    weights_.resize(std::size_t{c.n_tokens} * k);
  }

  void predict_call(const LayerContext& ctx, std::size_t i, std::uint32_t dist,
                    const ResidencyView& residency, PrefetchList& out) {
    score_predicted(i, dist, ctx.phase);
    const std::uint32_t layer = cfg_.calls[i].layer;
    const bool decode = ctx.phase == Phase::decode;
    std::uint32_t nonresident = 0;
    for (std::size_t j = 0; j < demands_.size(); ++j) {
      if (prec_[j] == Precision::skip) continue;
      const ExpertKey key{layer, demands_[j].expert};
      if (!residency.resident(key, prec_[j])) {
        if (decode && nonresident >= cfg_.max_nonresident) continue;
        ++nonresident;
      }
      out.push(Prefetch{key, prec_[j], float(recall_at(demands_[j].best_rank, dist)), dist});
    }
  }

  Config cfg_;
  S scorer_;
  RecallNoise noise_;
  std::vector<OracleCall> script_;
  std::size_t cursor_ = 0;
  std::vector<std::uint32_t> seen_;
  std::vector<double> recall_;
  std::vector<std::uint32_t> token_, experts_;
  std::vector<float> weights_;
  std::vector<int> slot_;
  std::vector<ExpertDemand> demands_;
  std::vector<Precision> prec_;
};

}  // namespace moekit
