#pragma once
/// \file LookaheadOraclePredictor: a gate predictor's stand-in when the routing ahead is known,
/// e.g. moe-run --routing-trace, where a trained model's recorded routing drives a model whose
/// own gates (random weights) cannot predict it.
///
/// At each layer call it asks a `RoutingLookahead` what the forward's tokens will select at the
/// next `distance` MoE layers and predicts those calls with one of the two noise models moe-sim's
/// stand-ins run, so moe-run and moe-sim replay the same stand-in: only the random draws' keys
/// differ in origin (the layer call's index here, the script's call index there, equal when every
/// call is replayed; tests/predict/lookahead_oracle_test.cpp checks both models against moe-sim's).
///  * Per distance (Fate's stand-in, moe-sim's NoisyOraclePredictor): the demands are scored by a
///    copy of the run's scorer (so each carries the precision the scorer will ask for) and degraded
///    through RecallNoise (predict/recall_noise.hpp) with one recall per distance: a kept expert is
///    right, a dropped one is replaced by a random wrong expert of its layer at the same precision,
///    and `set_size` pads the prediction with wrong experts. Stated: the precisions are the true
///    demand's.
///  * Per rank (`Config::recall_by_rank`; HOBBIT's stand-in, moe-sim's RankedNoisyOraclePredictor):
///    each token's actual rank-r expert is kept at its own recall and the scorer decides the
///    precisions on the *predicted* routing (predict/ranked_guess.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/error.hpp"
#include "moekit/predict/ranked_guess.hpp"
#include "moekit/predict/recall_noise.hpp"

namespace moekit {

/// What the tokens of the forward under way will select at a later MoE layer.
class RoutingLookahead {
 public:
  virtual ~RoutingLookahead() = default;
  /// The current forward's routing at MoE layer `layer` (experts and weights of its tokens; the
  /// view lives until the next call), or nullopt when it is not known.
  virtual std::optional<GateView> routing_at(std::uint32_t layer) = 0;
};

/// Known routing, degraded to a measured recall (see the file comment).
template <Scorer S>
class LookaheadOraclePredictor {
  static_assert(!declares<S>(Hook::begin_sequence),
                "LookaheadOraclePredictor: its scorer copy would miss begin_sequence");

 public:
  static constexpr std::string_view name = "lookahead-oracle";
  struct Config {
    /// Recall at 1, 2, 3 layers ahead (the last entry serves farther distances).
    std::vector<double> recall_by_distance{0.96};
    /// Not empty: the per-rank model instead of `recall_by_distance`, [rank][distance - 1]
    /// (predict/ranked_guess.hpp); `set_size` must then be 0.
    RecallByRank recall_by_rank{};
    std::uint64_t seed = 0;
    std::uint32_t distance = 1;   ///< layers ahead to predict (0..max_prediction_distance)
    std::uint32_t set_size = 0;   ///< pad each predicted layer to this many (0: no pad)
    std::uint32_t n_layers = 0;   ///< MoE layers (required)
    std::uint32_t n_experts = 0;  ///< experts per layer (required: wrong guesses)
    /// Non-resident predictions pushed per predicted layer in decode (default: no cap).
    std::uint32_t max_nonresident = std::numeric_limits<std::uint32_t>::max();
    Precision pad_precision = Precision::f16;  ///< precision of the padding guesses
  };

  LookaheadOraclePredictor(Config c, std::shared_ptr<RoutingLookahead> source, S scorer)
      : cfg_(std::move(c)),
        source_(std::move(source)),
        scorer_(std::move(scorer)),
        noise_(cfg_.seed, std::max(cfg_.n_experts, 1u)),
        ranked_(cfg_.seed, std::max(cfg_.n_experts, 1u)) {
    const std::string who = "LookaheadOraclePredictor: ";
    MOEKIT_EXPECTS(source_ != nullptr, who + "needs a RoutingLookahead");
    MOEKIT_EXPECTS(cfg_.n_layers > 0 && cfg_.n_experts > 0,
                   who + "Config.n_layers and n_experts must be > 0");
    if (ranked()) {
      check_ranked_recall(who + "Config.recall_by_rank: ", cfg_.recall_by_rank);
      MOEKIT_EXPECTS(cfg_.set_size == 0, who + "Config.set_size must be 0 with recall_by_rank");
    } else {
      MOEKIT_EXPECTS(!cfg_.recall_by_distance.empty(), who + "Config.recall_by_distance is empty");
      for (double r : cfg_.recall_by_distance)
        MOEKIT_EXPECTS(r >= 0.0 && r <= 1.0, who + "every recall must be in [0, 1]");
    }
    MOEKIT_EXPECTS(
        cfg_.distance <= max_prediction_distance,
        who + "Config.distance must be in [0, " + std::to_string(max_prediction_distance) + "]");
    MOEKIT_EXPECTS(cfg_.set_size <= cfg_.n_experts, who + "Config.set_size must be <= n_experts");
    MOEKIT_EXPECTS(cfg_.pad_precision != Precision::skip,
                   who + "Config.pad_precision must be a stored format");
    slot_.assign(cfg_.n_experts, -1);
  }

  /// Counts layer calls: the random draws of a later call are keyed by its index.
  void observe(const LayerContext&, const GateView&) { ++calls_; }

  void predict(const LayerContext& ctx, const GateView&, const ResidencyView& residency,
               PrefetchList& out) {
    for (std::uint32_t d = 1; d <= cfg_.distance && ctx.layer + d < cfg_.n_layers; ++d) {
      const std::optional<GateView> g = source_->routing_at(ctx.layer + d);
      if (!g) continue;
      LayerContext at = ctx;
      at.layer = ctx.layer + d;
      at.n_tokens = g->n_tokens;
      // calls_ - 1 is this call's index; every MoE layer is called once per forward.
      predict_layer(at, *g, calls_ - 1 + d, d, residency, out);
    }
  }

  [[nodiscard]] double recall_at(std::uint32_t distance) const noexcept {
    const std::vector<double>& r = cfg_.recall_by_distance;
    return r[std::min<std::size_t>(distance, r.size()) - 1];
  }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  /// Whether each rank has its own recall (`Config::recall_by_rank`).
  [[nodiscard]] bool ranked() const noexcept { return !cfg_.recall_by_rank.empty(); }

 private:
  void predict_layer(const LayerContext& at, const GateView& g, std::uint64_t call,
                     std::uint32_t dist, const ResidencyView& residency, PrefetchList& out) {
    if (ranked()) {
      ranked_.guess(call, at, g, cfg_.recall_by_rank, dist, scorer_);
      ranked_.push(at.layer, dist, at.phase == Phase::decode, cfg_.max_nonresident,
                   cfg_.recall_by_rank, residency, out);
      return;
    }
    collect_demands(g, slot_, demands_);
    std::sort(demands_.begin(), demands_.end(),
              [](const ExpertDemand& a, const ExpertDemand& b) { return a.expert < b.expert; });
    prec_.assign(demands_.size(), cfg_.pad_precision);
    scorer_.score(at, g, std::span<const ExpertDemand>(demands_), std::span<Precision>(prec_));
    experts_.resize(demands_.size());
    for (std::size_t i = 0; i < demands_.size(); ++i) experts_[i] = demands_[i].expert;
    const auto& picks =
        noise_.draw(call, experts_, prec_, recall_at(dist), cfg_.set_size, cfg_.pad_precision);
    const bool decode = at.phase == Phase::decode;
    std::uint32_t nonresident = 0;
    for (const auto& [e, p] : picks) {
      if (p == Precision::skip) continue;
      const ExpertKey key{at.layer, e};
      if (!residency.resident(key, p)) {
        if (decode && nonresident >= cfg_.max_nonresident) continue;
        ++nonresident;
      }
      out.push(Prefetch{key, p, float(recall_at(dist)), dist});
    }
  }

  Config cfg_;
  std::shared_ptr<RoutingLookahead> source_;
  S scorer_;
  RecallNoise noise_;
  RankedRoutingGuess ranked_;
  std::uint64_t calls_ = 0;
  std::vector<int> slot_;
  std::vector<ExpertDemand> demands_;
  std::vector<Precision> prec_;
  std::vector<std::uint32_t> experts_;
};

}  // namespace moekit
