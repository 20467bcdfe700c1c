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
/// same forward within `distance` layers and, for each true expert e of such a call, keeps e with
/// probability `recall`, otherwise predicts a uniformly random expert of that layer that the call
/// does not use (and that is not already predicted): a wrong guess costs a transfer, exactly as a
/// real predictor's error does. `set_size` > 0 pads each predicted layer with further random wrong
/// experts up to that many predictions (Fate's percentile rule predicts ceil((1 − q)·E) experts,
/// more than the k it needs). When a layer has no wrong expert left (every expert is used), a
/// dropped expert is simply not predicted.
///
/// Randomness: every decision is a hash of (seed, call index, expert position), not a draw from a
/// stream, so the predictions of a call do not depend on how often `predict` ran before it and a
/// seed always gives the same predictions. recall = 1 reproduces OraclePredictor's predictions;
/// recall = 0 never predicts a used expert while a wrong one exists.
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
    std::uint64_t seed = 0;
    std::uint32_t distance = 1;   ///< layers ahead to predict (1..max_prediction_distance)
    std::uint32_t set_size = 0;   ///< pad each predicted layer to this many (0: no pad)
    std::uint32_t n_experts = 0;  ///< experts per layer (required: wrong guesses)
    /// Non-resident predictions pushed per predicted layer in decode (default: no cap).
    std::uint32_t max_nonresident = std::numeric_limits<std::uint32_t>::max();
    Precision precision = Precision::f16;
  };

  explicit NoisyOraclePredictor(Config c) : cfg_(std::move(c)) {
    MOEKIT_EXPECTS(cfg_.recall >= 0.0 && cfg_.recall <= 1.0,
                   "NoisyOraclePredictor: Config.recall must be in [0, 1]");
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
    used_.assign(cfg_.n_experts, 0);
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
  // splitmix64 finaliser: a well-mixed 64-bit hash.
  static std::uint64_t mix(std::uint64_t x) noexcept {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  [[nodiscard]] std::uint64_t hash(std::size_t call, std::uint64_t j, std::uint64_t salt) const {
    return mix(mix(mix(cfg_.seed ^ salt) ^ call) ^ j);
  }
  static double unit(std::uint64_t h) noexcept { return double(h >> 11) * 0x1.0p-53; }

  // A random expert of the layer not marked in used_ (marks it); n_experts if none is left.
  std::uint32_t wrong(std::size_t call, std::uint64_t j, std::uint32_t& free_left) {
    if (free_left == 0) return cfg_.n_experts;
    std::uint64_t r = hash(call, j, 0x77726f6e67ull) % free_left;
    for (std::uint32_t e = 0; e < cfg_.n_experts; ++e) {
      if (used_[e]) continue;
      if (r-- == 0) {
        used_[e] = 1;
        --free_left;
        return e;
      }
    }
    return cfg_.n_experts;  // unreachable: free_left counts the unmarked experts
  }

  // Fills picks_ with call i's predictions.
  void draw(std::size_t i) {
    const OracleCall& c = cfg_.calls[i];
    picks_.clear();
    std::uint32_t free_left = cfg_.n_experts;
    for (std::uint32_t e : c.experts) used_[e] = 1, --free_left;
    for (std::size_t j = 0; j < c.experts.size(); ++j) {
      const Precision p = cfg_.precisions.empty() ? cfg_.precision : cfg_.precisions[i][j];
      // recall 1 keeps all (unit() < 1), recall 0 none (unit() >= 0).
      if (unit(hash(i, j, 0x6b656570ull)) < cfg_.recall) {
        picks_.push_back({c.experts[j], p});
        continue;
      }
      const std::uint32_t w = wrong(i, j, free_left);
      if (w < cfg_.n_experts) picks_.push_back({w, p});
    }
    for (std::uint64_t j = c.experts.size(); picks_.size() < cfg_.set_size; ++j) {
      const std::uint32_t w = wrong(i, j, free_left);
      if (w == cfg_.n_experts) break;
      picks_.push_back({w, cfg_.precision});
    }
    std::fill(used_.begin(), used_.end(), std::uint8_t{0});
  }

  void predict_call(std::size_t i, std::uint32_t dist, bool decode, const ResidencyView& residency,
                    PrefetchList& out) {
    draw(i);
    const std::uint32_t layer = cfg_.calls[i].layer;
    std::uint32_t nonresident = 0;
    for (const auto& [e, p] : picks_) {
      if (p == Precision::skip) continue;
      const ExpertKey key{layer, e};
      if (!residency.resident(key, p)) {
        if (decode && nonresident >= cfg_.max_nonresident) continue;
        ++nonresident;
      }
      out.push(Prefetch{key, p, float(cfg_.recall), dist});
    }
  }

  Config cfg_;
  std::size_t cursor_ = 0;
  std::vector<std::uint32_t> seen_;
  std::vector<std::uint8_t> used_;
  std::vector<std::pair<std::uint32_t, Precision>> picks_;
};
static_assert(Predictor<NoisyOraclePredictor>);

}  // namespace moekit
