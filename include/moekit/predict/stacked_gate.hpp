#pragma once
/// \file StackedGatePredictor: HOBBIT's layer-level adaptive expert prefetcher (M2).
///
/// Algorithm (Tang et al., "HOBBIT: A Mixed Precision Expert Offloading System for Fast MoE
/// Inference", arXiv:2411.01433, §3.3, Fig. 8): gate inputs of consecutive layers are nearly equal
/// (residual stream), so layer l's gate input x_l, fed to the routers of layers l+1..l+p, predicts
/// their experts (top-1 96 % at +1, ~90 % at +2/+3 on Mixtral). The p routers are stacked into one
/// [p·E × d] matrix and applied to x_l in ONE product (RouterStack: consecutive packed panels,
/// read in one sequential pass). Walking forward from l+1, each examined layer's predicted experts
/// (top-k of the model's softmax routing) get HOBBIT's T1/T2 precision; they are pushed (the
/// pipeline pins them, and prefetches those not resident). The walk stops at the first layer with a
/// missing expert: only that layer is prefetched, so a wrong guess further ahead costs nothing.
/// Skip-predicted experts are not pushed. Several tokens (prefill): per expert, the most demanding
/// decision over tokens. No prediction past the last layer, none across tokens; p = 0 disables it.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/error.hpp"
#include "moekit/predict/router_stack.hpp"
#include "moekit/predict/routing.hpp"
#include "moekit/score/hobbit_threshold.hpp"

namespace moekit {

/// HOBBIT's stacked-gate predictor; needs `GateView.hidden` (the gate input) on every call.
class StackedGatePredictor {
 public:
  static constexpr std::string_view name = "stacked-gate";
  struct Config {
    /// Routers of all MoE layers, back to back: [n_layers · n_experts · hidden] f32, row l·E + e
    /// = router row of expert e of layer l. Copied (packed) by the constructor: the span only
    /// needs to live until then. These four fields are RouterStack's arguments.
    std::span<const float> router_weights{};
    std::uint32_t n_layers = 0;
    std::uint32_t n_experts = 0;
    std::uint32_t hidden = 0;
    std::uint32_t top_k = 2;      ///< experts the model routes each token to
    std::uint32_t lookahead = 2;  ///< p: layers examined ahead (HOBBIT recommends 1..3)
    HobbitRule rule{};            ///< precision of prefetches (same rule as the scorer)
  };

  /// Throws `moekit::Error` naming the Config field when it cannot work.
  explicit StackedGatePredictor(Config c)
      : cfg_(c),
        routers_(c.router_weights, c.n_layers, c.n_experts, c.hidden, "StackedGatePredictor") {
    MOEKIT_EXPECTS(
        cfg_.top_k > 0 && cfg_.top_k <= cfg_.n_experts && cfg_.top_k <= HobbitRule::max_k,
        "StackedGatePredictor: Config.top_k must be in [1, n_experts]");
    MOEKIT_EXPECTS(cfg_.lookahead <= max_prediction_distance,
                   "StackedGatePredictor: Config.lookahead must be <= " +
                       std::to_string(max_prediction_distance) +
                       " (the pipeline scores and admits prefetches up to " +
                       std::to_string(max_prediction_distance) + " layers ahead)");
    cfg_.rule.validate();
    best_.resize(cfg_.n_experts);
    conf_.resize(cfg_.n_experts);
  }

  void observe(const LayerContext&, const GateView&) const noexcept {}

  void predict(const LayerContext& ctx, const GateView& gate, const ResidencyView& residency,
               PrefetchList& out) {
    if (cfg_.lookahead == 0 || ctx.layer + 1 >= cfg_.n_layers) return;
    const std::uint32_t count = std::min(cfg_.lookahead, cfg_.n_layers - 1 - ctx.layer);
    stacked_logits(ctx.layer, gate, logits_);
    const std::size_t E = cfg_.n_experts, rows = count * E;
    std::array<std::uint32_t, HobbitRule::max_k> ids{};
    std::array<float, HobbitRule::max_k> w{};
    std::array<HobbitDecision, HobbitRule::max_k> dec{};
    const std::size_t k = cfg_.top_k;
    for (std::uint32_t j = 1; j <= count; ++j) {
      const std::uint32_t m = ctx.layer + j;
      std::fill(best_.begin(), best_.end(), HobbitDecision::skip);
      std::fill(conf_.begin(), conf_.end(), -1.0f);
      for (std::uint32_t t = 0; t < gate.n_tokens; ++t) {
        std::span<float> row(logits_.data() + t * rows + (j - 1) * E, E);
        softmax_in_place(row);
        top_k_experts(row, std::span(ids).first(k));
        for (std::size_t i = 0; i < k; ++i) w[i] = row[ids[i]];
        cfg_.rule.decide(std::span(ids).first(k), std::span(w).first(k), std::span(dec).first(k));
        for (std::size_t i = 0; i < k; ++i) {
          best_[ids[i]] = std::max(best_[ids[i]], dec[i]);
          conf_[ids[i]] = std::max(conf_[ids[i]], w[i]);
        }
      }
      bool missing = false;
      for (std::uint32_t e = 0; e < E; ++e) {
        if (conf_[e] < 0.0f || best_[e] == HobbitDecision::skip) continue;
        const Prefetch p{{m, e}, cfg_.rule.precision(best_[e]), conf_[e], j};
        missing |= !residency.resident(p.key, p.precision);
        out.push(p);
      }
      if (missing) break;  // prefetch the first layer with misses only
    }
  }

  /// The stacked product for layer `layer`'s call: logits[t · rows + (j−1)·E + e] = router of
  /// layer `layer + j`, row e, · x_t, for j = 1..min(p, L−1−layer). Throws when `gate` has no
  /// hidden state of the configured width.
  void stacked_logits(std::uint32_t layer, const GateView& gate, std::vector<float>& logits) const {
    routers_.check_gate_input(gate);
    const std::uint32_t count =
        layer + 1 >= cfg_.n_layers ? 0 : std::min(cfg_.lookahead, cfg_.n_layers - 1 - layer);
    routers_.logits(layer + 1, count, gate.hidden, gate.n_tokens, logits);
  }

  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] const RouterStack& routers() const noexcept { return routers_; }
  [[nodiscard]] RouterStack& routers() noexcept { return routers_; }

 private:
  Config cfg_;
  RouterStack routers_;
  std::vector<float> logits_;
  std::vector<HobbitDecision> best_;
  std::vector<float> conf_;
};
static_assert(Predictor<StackedGatePredictor>);

}  // namespace moekit
