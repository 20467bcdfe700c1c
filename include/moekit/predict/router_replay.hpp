#pragma once
/// \file RouterReplayPredictor: MoBiLE's fallback prefetch from the little pass's router trace.
///
/// Algorithm (Zhao et al., "MoBiLE: Efficient Mixture-of-Experts Inference on Consumer GPU with
/// Mixture of Big Little Experts", §III-B): during every little (K/2) decode pass the router
/// logits of each MoE layer are recorded for the current position. When the token policy falls
/// back, the big pass's experts of every layer are predicted at once as the top-K (full K, not
/// K/2) of the recorded logits, and all are prefetched before the big pass starts (the paper
/// back, the big pass's experts of every layer are known at once: the top-K (full K, not K/2) of
/// the recorded logits, `plan[l]` (the paper reports > 80 % agreement with the big pass's own
/// routing). They are prefetched `lookahead` (1–3) layers ahead of the big pass, as the paper's
/// "prefetch 1–3 layers ahead" says: layers 0..d−1 at the fallback, plan[l + d] while the big pass
/// routes layer l (all known up front, so the distance is free to choose; design spec mobile.md
/// §2.4). Normal layer calls predict nothing (base MoBiLE loads the little pass on demand).
///
/// What the big pass runs (`Config.big_pass`):
///  * `little_plan` (the paper's reading, "for the big model, we directly employ the default number
///    of experts selected by the little model"): layer l runs exactly plan[l] (`planned_experts`),
///    with the gate weights of the big pass's own router at those experts (the engine's part), so
///    it never waits for an unplanned expert;
///  * `recompute` (exact: the big model's own output): the big pass routes with its own logits;
///    planned experts are prefetched, unplanned ones load on demand.
/// The predictor measures the agreement of each plan with the big pass's own top-K (in
/// `little_plan` mode from the big pass's router logits, since its selection is the plan).
///
/// Pipeline hooks: `on_verdict(TokenVerdict, PrefetchList&)`, called by
/// `OffloadPipeline::end_token` on a fallback; `planned_experts(layer)`, asked by the engine before
/// it routes a layer.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// MoBiLE's router-replay predictor; needs `GateView.logits` in decode.
class RouterReplayPredictor {
 public:
  static constexpr std::string_view name = "router-replay";
  static constexpr Hooks hooks = Hook::begin_sequence | Hook::on_verdict | Hook::planned_experts;
  /// What the big pass after a fallback runs (see the file comment).
  enum class BigPass : std::uint8_t {
    little_plan,  ///< the little pass's plan (paper)
    recompute,    ///< its own routing; the plan is only prefetched (exact model)
  };
  struct Config {
    std::uint32_t top_k = 0;               ///< the model's K (required: the little pass uses K/2)
    Precision precision = Precision::f16;  ///< precision of the replayed prefetches
    /// Layers ahead of the big pass the plan is prefetched (paper: 1–3; 1 on a fast link).
    std::uint32_t lookahead = 1;
    BigPass big_pass = BigPass::little_plan;
  };
  /// Agreement of the replayed plans with the big passes' own routing.
  struct Stats {
    std::uint64_t fallbacks = 0;
    std::uint64_t planned = 0;  ///< (layer, expert) pairs the big passes used
    std::uint64_t matched = 0;  ///< of which in the replayed plan
    [[nodiscard]] double accuracy() const noexcept {
      return planned ? double(matched) / double(planned) : 0.0;
    }
  };

  explicit RouterReplayPredictor(Config c) : cfg_(c) {
    MOEKIT_EXPECTS(cfg_.top_k > 0,
                   "RouterReplayPredictor: Config.top_k (the model's K) must be > 0");
    MOEKIT_EXPECTS(cfg_.precision != Precision::skip,
                   "RouterReplayPredictor: Config.precision must be a stored format");
    MOEKIT_EXPECTS(cfg_.lookahead >= 1 && cfg_.lookahead <= max_prediction_distance,
                   "RouterReplayPredictor: Config.lookahead must be in [1, " +
                       std::to_string(max_prediction_distance) + "] (MoBiLE: 1-3 layers ahead)");
  }

  void observe(const LayerContext& ctx, const GateView& gate) {
    if (ctx.layer == 0 && !replaying_)  // a prefill's fallback has no one-token trace to replay
      decode_pass_ = ctx.phase == Phase::decode && gate.n_tokens == 1;
    if (ctx.phase != Phase::decode || gate.n_tokens != 1) return;
    if (n_layers_ == 0) bind(ctx.n_layers, gate.n_experts);
    MOEKIT_EXPECTS(ctx.n_layers == n_layers_ && gate.n_experts == n_experts_,
                   "RouterReplayPredictor: the model shape changed between layer calls");
    if (replaying_) {  // the big pass: measure the plan against its own routing
      score_plan(ctx.layer, gate);
      if (ctx.is_last_layer()) replaying_ = false;
      return;
    }
    MOEKIT_EXPECTS(gate.has_logits(),
                   "RouterReplayPredictor: GateView.logits (all router logits) are required in "
                   "decode to replay them on a fallback");
    std::copy(gate.logits.begin(), gate.logits.end(),
              trace_.begin() + std::ptrdiff_t(std::size_t{ctx.layer} * n_experts_));
    recorded_[ctx.layer] = ctx.token_index;
    token_ = ctx.token_index;
  }

  /// During the big pass: the plan of the layer `lookahead` ahead.
  void predict(const LayerContext& ctx, const GateView&, const ResidencyView&,
               PrefetchList& out) const noexcept {
    if (!replaying_ || ctx.phase != Phase::decode) return;
    const std::uint32_t target = ctx.layer + cfg_.lookahead;
    if (target < n_layers_) push_plan(target, cfg_.lookahead, out);
  }

  /// The experts layer `layer` of the big pass runs in `little_plan` mode (empty otherwise, and
  /// outside a big pass: the engine routes as usual).
  [[nodiscard]] std::span<const std::uint32_t> planned_experts(std::uint32_t layer) const noexcept {
    if (!replaying_ || cfg_.big_pass != BigPass::little_plan || layer >= n_layers_) return {};
    const std::span<const std::uint32_t> ids = plan_row(layer);
    return ids.empty() || ids[0] == none ? std::span<const std::uint32_t>{} : ids;
  }

  /// On fallback: plans every layer recorded for the fallen-back token (the top-K of its logits)
  /// and pushes the plans of the first `lookahead` layers.
  void on_verdict(TokenVerdict v, PrefetchList& out) {
    if (v != TokenVerdict::fallback || n_layers_ == 0 || !decode_pass_) return;
    ++stats_.fallbacks;
    const std::uint32_t k = std::min(cfg_.top_k, n_experts_);
    for (std::uint32_t l = 0; l < n_layers_; ++l) {
      std::uint32_t* ids = plan_.data() + std::size_t{l} * k;
      if (recorded_[l] != token_) {
        std::fill(ids, ids + k, none);
        continue;
      }
      const float* row = trace_.data() + std::size_t{l} * n_experts_;
      for (std::uint32_t j = 0; j < k; ++j) {  // top-K, ties → smaller id
        std::uint32_t best = none;
        for (std::uint32_t e = 0; e < n_experts_; ++e) {
          if (std::find(ids, ids + j, e) != ids + j) continue;
          if (best == none || row[e] > row[best]) best = e;
        }
        ids[j] = best;
      }
    }
    for (std::uint32_t l = 0; l < std::min(cfg_.lookahead, n_layers_); ++l)
      push_plan(l, l + 1, out);
    replaying_ = true;
  }

  void begin_sequence() noexcept {
    replaying_ = false;
    decode_pass_ = false;
    std::fill(recorded_.begin(), recorded_.end(), no_token);
  }

  [[nodiscard]] const Stats& stats() const noexcept { return stats_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  /// True from a fallback until the big pass's last layer was observed.
  [[nodiscard]] bool replaying() const noexcept { return replaying_; }

 private:
  static constexpr std::uint32_t none = 0xFFFFFFFFu;
  static constexpr std::uint64_t no_token = ~std::uint64_t{0};

  void bind(std::uint32_t n_layers, std::uint32_t n_experts) {
    MOEKIT_EXPECTS(
        n_layers > 0 && n_experts > 0,
        "RouterReplayPredictor: LayerContext.n_layers and GateView.n_experts must be > 0");
    n_layers_ = n_layers;
    n_experts_ = n_experts;
    trace_.assign(std::size_t{n_layers} * n_experts, 0.0f);
    recorded_.assign(n_layers, no_token);
    plan_.assign(std::size_t{n_layers} * std::min(cfg_.top_k, n_experts), none);
    own_.assign(std::min(cfg_.top_k, n_experts), none);
  }
  [[nodiscard]] std::span<const std::uint32_t> plan_row(std::uint32_t layer) const noexcept {
    const std::uint32_t k = std::min(cfg_.top_k, n_experts_);
    return std::span<const std::uint32_t>(plan_).subspan(std::size_t{layer} * k, k);
  }
  [[nodiscard]] bool in_plan(std::uint32_t layer, std::uint32_t e) const noexcept {
    const auto ids = plan_row(layer);
    return std::find(ids.begin(), ids.end(), e) != ids.end();
  }
  void push_plan(std::uint32_t layer, std::uint32_t distance, PrefetchList& out) const noexcept {
    for (std::uint32_t e : plan_row(layer))
      if (e != none) out.push(Prefetch{{layer, e}, cfg_.precision, 1.0f, distance});
  }
  // Agreement of the plan with the big pass's own top-K: its selection in `recompute` mode; in
  // `little_plan` mode the selection is the plan, so the top-K of its router logits.
  void score_plan(std::uint32_t layer, const GateView& gate) {
    if (cfg_.big_pass == BigPass::recompute || !gate.has_logits()) {
      for (std::uint32_t e : gate.experts) {
        ++stats_.planned;
        stats_.matched += in_plan(layer, e);
      }
      return;
    }
    const std::uint32_t k = std::min(cfg_.top_k, n_experts_);
    for (std::uint32_t j = 0; j < k; ++j) {  // the j-th largest logit, ties → smaller id
      std::uint32_t best = none;
      for (std::uint32_t e = 0; e < n_experts_; ++e) {
        if (std::find(own_.begin(), own_.begin() + j, e) != own_.begin() + j) continue;
        if (best == none || gate.logits[e] > gate.logits[best]) best = e;
      }
      own_[j] = best;
      ++stats_.planned;
      stats_.matched += in_plan(layer, best);
    }
  }

  Config cfg_;
  std::uint32_t n_layers_ = 0;
  std::uint32_t n_experts_ = 0;
  std::vector<float> trace_;             ///< [L × E] little-pass logits of the current token
  std::vector<std::uint64_t> recorded_;  ///< token index each layer's row belongs to
  std::vector<std::uint32_t> plan_;      ///< [L × K] replayed plan of the last fallback
  std::vector<std::uint32_t> own_;       ///< [K] the big pass's own top-K (scratch)
  std::uint64_t token_ = no_token;
  bool replaying_ = false;
  bool decode_pass_ = false;  ///< the forward being judged is a one-token decode pass
  Stats stats_{};
};
static_assert(Predictor<RouterReplayPredictor>);

}  // namespace moekit
