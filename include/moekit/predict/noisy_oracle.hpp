#pragma once
/// \file NoisyOraclePredictor: the true future routing, degraded to a given recall.
///
/// Model of a gate-based predictor on traces that cannot run it (no gate-input hidden states, or
/// no router weights). The design spec of Fate (fate.md §3: "model it as a noisy oracle whose
/// recall matches the measured values") and HOBBIT's reported accuracy motivate it:
///  * HOBBIT (Tang et al., arXiv:2411.01433, Fig. 7): stacked-gate top-1 accuracy 96 % at the next
///    layer, ~90 % at +2/+3;
///  * Fate (Fang et al., 2025, §4.2): 97.15 % decode recall with the 75th-percentile candidate set.
///
/// Algorithm. The predictor is given the script of layer calls (as OraclePredictor: each call's
/// layer and distinct experts, in `route` order). At each call it takes the following calls of the
/// same forward within `distance` layers and predicts each through RecallNoise
/// (predict/recall_noise.hpp): a true expert kept with the recall at that distance, otherwise a
/// random wrong expert of its layer, padded to `set_size`. The random numbers are a hash of
/// (seed, call index, expert position). recall = 1 reproduces OraclePredictor's predictions.
///
/// Precision of a prediction: `Config::precisions[call][i]` (parallel to `calls[call].experts`)
/// when given, e.g. the precision the run's scorer will ask for that demand, else
/// `Config::precision`; a wrong guess gets the precision of the true expert it replaces (pads get
/// `Config::precision`). A `skip` precision is not predicted (nothing would be loaded).
/// `max_nonresident` caps the non-resident predictions per predicted layer in decode forwards
/// (Fate's decode cap n = floor(T / t_expert); prefill has none); resident ones are always pushed
/// (they cost nothing and get pinned).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/error.hpp"
#include "moekit/predict/oracle.hpp"
#include "moekit/predict/recall_noise.hpp"

namespace moekit {

/// The oracle's script with each true expert kept with probability `recall`.
class NoisyOraclePredictor {
 public:
  static constexpr std::string_view name = "noisy-oracle";
  struct Config {
    std::vector<OracleCall> calls;  ///< every layer call, in the order `route` sees them
    /// Optional: per call, the precision of each expert of `calls[c].experts` (same order).
    std::vector<std::vector<Precision>> precisions{};
    double recall = 0.96;  ///< probability a true expert is predicted (HOBBIT: 0.96)
    /// Optional: the recall at 1, 2, 3 layers ahead (the last entry serves farther distances);
    /// replaces `recall` when given. A call is drawn with the same random numbers at every
    /// distance, so an expert predicted from farther away stays predicted as the call nears
    /// whenever the recall does not fall with distance.
    std::vector<double> recall_by_distance{};
    std::uint64_t seed = 0;
    std::uint32_t distance = 1;   ///< layers ahead to predict (1..max_prediction_distance)
    std::uint32_t set_size = 0;   ///< pad each predicted layer to this many (0: no pad)
    std::uint32_t n_experts = 0;  ///< experts per layer (required: wrong guesses)
    /// Non-resident predictions pushed per predicted layer in decode (default: no cap).
    std::uint32_t max_nonresident = std::numeric_limits<std::uint32_t>::max();
    Precision precision = Precision::f16;
  };

  explicit NoisyOraclePredictor(Config c)
      : cfg_(std::move(c)), noise_(cfg_.seed, std::max(cfg_.n_experts, 1u)) {
    MOEKIT_EXPECTS(cfg_.recall >= 0.0 && cfg_.recall <= 1.0,
                   "NoisyOraclePredictor: Config.recall must be in [0, 1]");
    for (double r : cfg_.recall_by_distance)
      MOEKIT_EXPECTS(r >= 0.0 && r <= 1.0,
                     "NoisyOraclePredictor: Config.recall_by_distance entries must be in [0, 1]");
    MOEKIT_EXPECTS(cfg_.distance >= 1 && cfg_.distance <= max_prediction_distance,
                   "NoisyOraclePredictor: Config.distance must be in [1, " +
                       std::to_string(max_prediction_distance) + "]");
    MOEKIT_EXPECTS(cfg_.n_experts > 0, "NoisyOraclePredictor: Config.n_experts must be > 0");
    MOEKIT_EXPECTS(cfg_.set_size <= cfg_.n_experts,
                   "NoisyOraclePredictor: Config.set_size must be <= n_experts");
    MOEKIT_EXPECTS(cfg_.precision != Precision::skip,
                   "NoisyOraclePredictor: Config.precision must be a stored format");
    MOEKIT_EXPECTS(cfg_.precisions.empty() || cfg_.precisions.size() == cfg_.calls.size(),
                   "NoisyOraclePredictor: Config.precisions must be empty or hold one entry per "
                   "call");
    for (std::size_t i = 0; i < cfg_.calls.size(); ++i) {
      OracleCall& call = cfg_.calls[i];
      for (std::uint32_t e : call.experts)
        MOEKIT_EXPECTS(e < cfg_.n_experts, "NoisyOraclePredictor: call " + std::to_string(i) +
                                               " names expert " + std::to_string(e) +
                                               " >= n_experts");
      if (cfg_.precisions.empty()) {
        std::sort(call.experts.begin(), call.experts.end());
        continue;
      }
      std::vector<Precision>& p = cfg_.precisions[i];
      MOEKIT_EXPECTS(p.size() == call.experts.size(),
                     "NoisyOraclePredictor: Config.precisions[" + std::to_string(i) +
                         "] must hold one precision per expert of the call");
      std::vector<std::pair<std::uint32_t, Precision>> z(call.experts.size());
      for (std::size_t j = 0; j < z.size(); ++j) z[j] = {call.experts[j], p[j]};
      std::sort(z.begin(), z.end(), [](auto& a, auto& b) { return a.first < b.first; });
      for (std::size_t j = 0; j < z.size(); ++j) call.experts[j] = z[j].first, p[j] = z[j].second;
    }
  }

  /// Checks the call against the script and advances.
  void observe(const LayerContext& ctx, const GateView& gate) {
    detail::check_script_call("NoisyOraclePredictor", cfg_.calls, cursor_, seen_, ctx, gate);
  }

  void predict(const LayerContext& ctx, const GateView&, const ResidencyView& residency,
               PrefetchList& out) {
    if (cursor_ == 0) return;
    std::uint32_t prev = ctx.layer;
    for (std::size_t i = cursor_; i < cfg_.calls.size(); ++i) {
      const std::uint32_t m = cfg_.calls[i].layer;
      if (m <= prev || m > ctx.layer + cfg_.distance) break;
      predict_call(i, m - ctx.layer, ctx.phase == Phase::decode, residency, out);
      prev = m;
    }
  }

  /// The experts predicted for call `i` with their precisions, without residency (for tests and
  /// for measuring the realised recall).
  [[nodiscard]] std::vector<std::pair<std::uint32_t, Precision>> predictions(std::size_t i) {
    MOEKIT_EXPECTS(i < cfg_.calls.size(), "NoisyOraclePredictor::predictions: call out of range");
    draw(i);
    return picks_;
  }

  [[nodiscard]] std::size_t position() const noexcept { return cursor_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  // The recall at `distance` layers ahead.
  [[nodiscard]] double recall_at(std::uint32_t distance) const noexcept {
    const std::vector<double>& r = cfg_.recall_by_distance;
    return r.empty() ? cfg_.recall : r[std::min<std::size_t>(distance, r.size()) - 1];
  }

  // Fills picks_ with call i's predictions at `distance` layers ahead.
  void draw(std::size_t i, std::uint32_t distance = 1) {
    const OracleCall& c = cfg_.calls[i];
    prec_.assign(c.experts.size(), cfg_.precision);
    if (!cfg_.precisions.empty()) prec_ = cfg_.precisions[i];
    picks_ = noise_.draw(i, c.experts, prec_, recall_at(distance), cfg_.set_size, cfg_.precision);
  }

  void predict_call(std::size_t i, std::uint32_t dist, bool decode, const ResidencyView& residency,
                    PrefetchList& out) {
    draw(i, dist);
    const std::uint32_t layer = cfg_.calls[i].layer;
    std::uint32_t nonresident = 0;
    for (const auto& [e, p] : picks_) {
      if (p == Precision::skip) continue;
      const ExpertKey key{layer, e};
      if (!residency.resident(key, p)) {
        if (decode && nonresident >= cfg_.max_nonresident) continue;
        ++nonresident;
      }
      out.push(Prefetch{key, p, float(recall_at(dist)), dist});
    }
  }

  Config cfg_;
  std::size_t cursor_ = 0;
  std::vector<std::uint32_t> seen_;
  RecallNoise noise_;
  std::vector<Precision> prec_;
  std::vector<std::pair<std::uint32_t, Precision>> picks_;
};
static_assert(Predictor<NoisyOraclePredictor>);

}  // namespace moekit
