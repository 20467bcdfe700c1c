#pragma once
/// \file NoisyRouterReplay: MoBiLE's router replay for trace replay, with a stated plan accuracy.
///
/// A routing trace holds one forward per token: the little pass that moe-sim replays sees the
/// same router logits as the big pass, so RouterReplayPredictor's plan (the top-K of the little
/// pass's logits) would always equal the big pass's own top-K. In the real system the little pass
/// runs on other hidden states from layer 1 on, and the paper reports "more than 80 %" agreement
/// (MoBiLE §III-B). This wrapper makes that agreement a stated input: in each little decode pass
/// it hands the predictor a copy of the logits in which each of the big top-K experts that the
/// little pass did not select swaps its logit with a random expert outside the top-K, with the
/// probability that brings the plan's expected agreement to `Config.accuracy`. The little pass's
/// own experts stay in the plan (they are the top K_s of the same logits, mobile.md §2.2), so the
/// error falls on the other K − K_s: q = (1 − accuracy) · K / (K − K_s), at most 1 (the floor is
/// then K_s / K, which `floor_accuracy` says). The predictor's own statistics measure the
/// agreement reached (`inner().stats().accuracy()`). Deterministic for a seed.

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/error.hpp"
#include "moekit/predict/router_replay.hpp"

namespace moekit::sim {

/// RouterReplayPredictor fed little-pass logits with a set plan accuracy (see the file comment).
class NoisyRouterReplay {
 public:
  static constexpr std::string_view name = "noisy-router-replay";
  using wrapped_component = RouterReplayPredictor;
  static constexpr Hooks hooks = Hook::begin_sequence | Hook::on_verdict | Hook::planned_experts;
  struct Config {
    RouterReplayPredictor::Config replay{};
    double accuracy = 0.8;  ///< expected share of the plan in the big pass's top-K (paper: > 80 %)
    std::uint64_t seed = 1;
  };

  explicit NoisyRouterReplay(Config c) : cfg_(c), inner_(c.replay), rng_(c.seed) {
    MOEKIT_EXPECTS(cfg_.accuracy >= 0.0 && cfg_.accuracy <= 1.0,
                   "NoisyRouterReplay: Config.accuracy must be in [0, 1]");
  }

  void observe(const LayerContext& ctx, const GateView& gate) {
    if (ctx.phase != Phase::decode || gate.n_tokens != 1 || inner_.replaying() ||
        !gate.has_logits() || cfg_.accuracy >= 1.0) {
      inner_.observe(ctx, gate);
      return;
    }
    logits_.assign(gate.logits.begin(), gate.logits.end());
    perturb(gate.experts);
    GateView g = gate;
    g.logits = logits_;
    inner_.observe(ctx, g);
  }
  void predict(const LayerContext& ctx, const GateView& gate, const ResidencyView& r,
               PrefetchList& out) const noexcept {
    inner_.predict(ctx, gate, r, out);
  }
  void on_verdict(TokenVerdict v, PrefetchList& out) { inner_.on_verdict(v, out); }
  [[nodiscard]] std::span<const std::uint32_t> planned_experts(std::uint32_t layer) const noexcept {
    return inner_.planned_experts(layer);
  }
  void begin_sequence() { inner_.begin_sequence(); }

  /// Probability that a planned expert the little pass did not select is wrong, for a model with
  /// top-k `k` and little-pass `k_little`.
  [[nodiscard]] double swap_probability(std::uint32_t k, std::uint32_t k_little) const noexcept {
    if (k_little >= k) return 0.0;
    return std::min(1.0, (1.0 - cfg_.accuracy) * double(k) / double(k - k_little));
  }
  /// The lowest expected accuracy reachable with the little pass's experts kept: K_s / K.
  [[nodiscard]] static double floor_accuracy(std::uint32_t k, std::uint32_t k_little) noexcept {
    return k ? double(std::min(k_little, k)) / double(k) : 0.0;
  }

  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] const RouterReplayPredictor& inner() const noexcept { return inner_; }

 private:
  // Swaps the logit of each big top-K expert outside `little` with a random non-top-K expert's,
  // with probability swap_probability.
  void perturb(std::span<const std::uint32_t> little) {
    const auto E = static_cast<std::uint32_t>(logits_.size());
    const std::uint32_t K = std::min(cfg_.replay.top_k, E);
    order_.resize(E);
    for (std::uint32_t e = 0; e < E; ++e) order_[e] = e;
    std::stable_sort(order_.begin(), order_.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return logits_[a] > logits_[b]; });
    const double q = swap_probability(K, static_cast<std::uint32_t>(little.size()));
    std::uint32_t outside = E - K;  // order_[K, K + outside): not yet swapped in
    for (std::uint32_t j = 0; j < K && outside > 0; ++j) {
      const std::uint32_t e = order_[j];
      if (std::find(little.begin(), little.end(), e) != little.end()) continue;
      if (std::uniform_real_distribution<double>(0.0, 1.0)(rng_) >= q) continue;
      const std::uint32_t pick =
          K + std::uniform_int_distribution<std::uint32_t>(0, outside - 1)(rng_);
      std::swap(logits_[e], logits_[order_[pick]]);
      std::swap(order_[pick], order_[K + outside - 1]);  // each outsider swapped in once
      --outside;
    }
  }

  Config cfg_;
  RouterReplayPredictor inner_;
  std::mt19937_64 rng_;
  std::vector<float> logits_;
  std::vector<std::uint32_t> order_;
};
static_assert(Predictor<NoisyRouterReplay>);

}  // namespace moekit::sim
