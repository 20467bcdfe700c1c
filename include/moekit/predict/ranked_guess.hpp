#pragma once
/// \file RankedRoutingGuess: the per-rank noise model of HOBBIT's stacked-gate stand-ins, written
/// once for moe-sim's RankedNoisyOraclePredictor (over a script of the trace's layer calls) and
/// moe-run's LookaheadOraclePredictor (over the replayed trace: the `hobbit-oracle` preset).
///
/// HOBBIT's gate predicts, for each token, a top-k with gate weights, and HOBBIT applies its T1/T2
/// rule to those predicted weights to pick each prefetch's precision (Tang et al.,
/// arXiv:2411.01433, §3.3). Given one later layer call's actual routing, `guess` forms what a gate
/// with a given accuracy per rank would predict, and scores it with (a copy of) the run's scorer:
///  * each token's experts are ranked by descending weight (ties: smaller id first); the actual
///    rank-r expert is kept with the recall of rank r at that distance, otherwise replaced by a
///    random expert the call does not use (RecallNoise::draw_ranked; hashes of seed, call, token,
///    rank: the call's index keys the draws, so both callers draw the same for the same call);
///  * the predicted top-k ranks the kept experts first, in their actual order, then the wrong
///    guesses (model, stated: the predicted logits track the actual ones, so an expert the gate
///    gets wrong scores below the actual ones it kept), and the predicted gate weights are the
///    token's actual weights by predicted rank (the gate's confidence profile taken as the
///    router's; traces hold no logits for the experts a token did not select);
///  * the scorer scores that predicted routing: with HOBBIT's rule the predicted top-1 is high
///    precision, the next by the cumulative predicted weight. A kept rank-2 expert whose top-1 was
///    missed is prefetched high, a wrong guess at rank 2 low (or not at all, when skipped).
/// With every recall 1 the prediction is the actual routing and each precision the one the scorer
/// asks for the demand.
///
/// Recall figures: `recall[rank][distance - 1]`; the last rank's list serves deeper ranks, a
/// list's last entry farther distances.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/error.hpp"
#include "moekit/predict/recall_noise.hpp"

namespace moekit {

/// Recall figures per actual rank, each a list over distances 1, 2, 3 (see the file comment).
using RecallByRank = std::vector<std::vector<double>>;

/// The recall of the actual rank-`rank` expert predicted from `distance` (>= 1) layers ahead.
[[nodiscard]] inline double ranked_recall(const RecallByRank& recall, std::size_t rank,
                                          std::uint32_t distance) noexcept {
  const auto& r = recall[std::min(rank, recall.size() - 1)];
  return r[std::min<std::size_t>(distance, r.size()) - 1];
}

/// Throws, naming `who`, unless `recall` holds at least one list, no empty one, and figures in
/// [0, 1] only.
inline void check_ranked_recall(const std::string& who, const RecallByRank& recall) {
  MOEKIT_EXPECTS(!recall.empty(), who + "the recall per rank is empty");
  for (const auto& by_distance : recall) {
    MOEKIT_EXPECTS(!by_distance.empty(), who + "the recall per rank holds an empty list");
    for (double r : by_distance)
      MOEKIT_EXPECTS(r >= 0.0 && r <= 1.0, who + "every recall must be in [0, 1]");
  }
}

/// One later layer call's routing as a gate of a given accuracy per rank predicts it, scored (see
/// the file comment). The result lives until the next `guess`.
class RankedRoutingGuess {
 public:
  RankedRoutingGuess(std::uint64_t seed, std::uint32_t n_experts)
      : noise_(seed, n_experts), slot_(n_experts, -1) {}

  /// Guesses the call of index `call` whose actual routing is `actual` (a token's experts in any
  /// order), `distance` layers ahead, and scores the guess with `scorer` in context `at`.
  template <Scorer S>
  void guess(std::uint64_t call, const LayerContext& at, const GateView& actual,
             const RecallByRank& recall, std::uint32_t distance, S& scorer) {
    const std::uint32_t n = actual.n_tokens, k = actual.k;
    rank_tokens(actual);
    recall_.resize(std::max<std::size_t>(k, 1));
    for (std::size_t r = 0; r < recall_.size(); ++r)
      recall_[r] = ranked_recall(recall, r, distance);
    experts_.assign(ranked_.size(), 0);
    std::uint32_t kept = k;  // a call whose union covers the layer may predict fewer per token
    for (std::uint32_t t = 0; t < n; ++t) {
      const std::size_t first = std::size_t{t} * k;
      noise_.draw_ranked(call, t, std::span(ranked_).subspan(first, k), call_experts_, recall_,
                         token_);
      kept = std::min<std::uint32_t>(kept, static_cast<std::uint32_t>(token_.size()));
      std::copy(token_.begin(), token_.end(), experts_.begin() + std::ptrdiff_t(first));
    }
    if (kept < k) compact(n, k, kept);
    const GateView g{.n_tokens = n,
                     .k = kept,
                     .n_experts = noise_.n_experts(),
                     .experts = experts_,
                     .weights = ranked_weights_};
    collect_demands(g, slot_, demands_);
    prec_.assign(demands_.size(), Precision::skip);
    scorer.score(at, g, std::span<const ExpertDemand>(demands_), std::span<Precision>(prec_));
  }

  /// The guessed experts (first-seen order) and the precision the scorer gave each (`skip`: not
  /// to be loaded).
  [[nodiscard]] std::span<const ExpertDemand> demands() const noexcept { return demands_; }
  [[nodiscard]] std::span<const Precision> precisions() const noexcept { return prec_; }

  /// Pushes the guess for `layer`, `distance` ahead, as prefetches: skipped ones left out, and in
  /// a decode forward at most `max_nonresident` that `residency` does not hold (resident ones are
  /// always pushed: they get pinned). A prefetch's confidence is the recall of its best rank.
  void push(std::uint32_t layer, std::uint32_t distance, bool decode, std::uint32_t max_nonresident,
            const RecallByRank& recall, const ResidencyView& residency, PrefetchList& out) const {
    std::uint32_t nonresident = 0;
    for (std::size_t j = 0; j < demands_.size(); ++j) {
      if (prec_[j] == Precision::skip) continue;
      const ExpertKey key{layer, demands_[j].expert};
      if (!residency.resident(key, prec_[j])) {
        if (decode && nonresident >= max_nonresident) continue;
        ++nonresident;
      }
      out.push(Prefetch{key, prec_[j],
                        float(ranked_recall(recall, demands_[j].best_rank, distance)), distance});
    }
  }

 private:
  // ranked_ / ranked_weights_: each token's experts by descending weight (ties: smaller id);
  // call_experts_: the distinct experts of the call, ascending.
  void rank_tokens(const GateView& actual) {
    const std::uint32_t k = actual.k;
    ranked_.resize(std::size_t{actual.n_tokens} * k);
    ranked_weights_.resize(ranked_.size());
    call_experts_.clear();
    for (std::uint32_t t = 0; t < actual.n_tokens; ++t) {
      const TokenRoute r = actual.token(t);
      order_.clear();
      for (std::uint32_t j = 0; j < k; ++j) order_.push_back({r.weights[j], r.experts[j]});
      std::sort(order_.begin(), order_.end(), [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      });
      for (std::uint32_t j = 0; j < k; ++j) {
        ranked_[std::size_t{t} * k + j] = order_[j].second;
        ranked_weights_[std::size_t{t} * k + j] = order_[j].first;
        call_experts_.push_back(order_[j].second);
      }
    }
    std::sort(call_experts_.begin(), call_experts_.end());
    call_experts_.erase(std::unique(call_experts_.begin(), call_experts_.end()),
                        call_experts_.end());
  }

  // Rare: some token kept fewer than k experts (its call uses every expert of the layer). A
  // GateView has one k: every token keeps its first `kept` predictions.
  void compact(std::uint32_t n, std::uint32_t k, std::uint32_t kept) {
    for (std::uint32_t t = 0; t < n; ++t)
      for (std::uint32_t j = 0; j < kept; ++j) {
        experts_[std::size_t{t} * kept + j] = experts_[std::size_t{t} * k + j];
        ranked_weights_[std::size_t{t} * kept + j] = ranked_weights_[std::size_t{t} * k + j];
      }
    experts_.resize(std::size_t{n} * kept);
    ranked_weights_.resize(std::size_t{n} * kept);
  }

  RecallNoise noise_;
  std::vector<int> slot_;
  std::vector<std::pair<float, std::uint32_t>> order_;
  std::vector<std::uint32_t> ranked_, call_experts_, token_, experts_;
  std::vector<float> ranked_weights_;
  std::vector<double> recall_;
  std::vector<ExpertDemand> demands_;
  std::vector<Precision> prec_;
};

}  // namespace moekit
