#pragma once
/// \file RouterReplayPredictor: MoBiLE's fallback prefetch from the little pass's router trace.
///
/// Algorithm (Zhao et al., "MoBiLE: Efficient Mixture-of-Experts Inference on Consumer GPU with
/// Mixture of Big Little Experts", §III-B): during every little (K/2) decode pass the router
/// logits of each MoE layer are recorded for the current position. When the token policy falls
/// back, the big pass's experts of every layer are predicted at once as the top-K (full K, not
/// K/2) of the recorded logits, and all are prefetched before the big pass starts (the paper
/// reports > 80 % agreement with the big pass's own routing). Normal layer calls predict nothing
/// (base MoBiLE loads the little pass on demand). The predictor also measures the agreement: while
/// the big pass runs, each layer's true experts are compared with the replayed plan.
///
/// Pipeline hook: `on_verdict(TokenVerdict, PrefetchList&)`, called by `OffloadPipeline::end_token`
/// on a fallback.

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
#include "moekit/error.hpp"

namespace moekit {

/// MoBiLE's router-replay predictor; needs `GateView.logits` in decode.
class RouterReplayPredictor {
 public:
  static constexpr std::string_view name = "router-replay";
  static constexpr Hooks hooks = Hook::begin_sequence | Hook::on_verdict;
  struct Config {
    std::uint32_t top_k = 0;               ///< the model's K (required: the little pass uses K/2)
    Precision precision = Precision::f16;  ///< precision of the replayed prefetches
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
  }

  void observe(const LayerContext& ctx, const GateView& gate) {
    if (ctx.phase != Phase::decode || gate.n_tokens != 1) return;
    if (n_layers_ == 0) bind(ctx.n_layers, gate.n_experts);
    MOEKIT_EXPECTS(ctx.n_layers == n_layers_ && gate.n_experts == n_experts_,
                   "RouterReplayPredictor: the model shape changed between layer calls");
    if (replaying_) {  // the big pass: measure the plan against its true routing
      for (std::uint32_t e : gate.experts) {
        ++stats_.planned;
        stats_.matched += in_plan(ctx.layer, e);
      }
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

  void predict(const LayerContext&, const GateView&, const ResidencyView&,
               PrefetchList&) const noexcept {}

  /// On fallback: pushes the top-K of every layer recorded for the fallen-back token.
  void on_verdict(TokenVerdict v, PrefetchList& out) {
    if (v != TokenVerdict::fallback || n_layers_ == 0) return;
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
        out.push(Prefetch{{l, best}, cfg_.precision, 1.0f, l + 1});
      }
    }
    replaying_ = true;
  }

  void begin_sequence() noexcept {
    replaying_ = false;
    std::fill(recorded_.begin(), recorded_.end(), no_token);
  }

  [[nodiscard]] const Stats& stats() const noexcept { return stats_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

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
  }
  [[nodiscard]] bool in_plan(std::uint32_t layer, std::uint32_t e) const noexcept {
    const std::uint32_t k = std::min(cfg_.top_k, n_experts_);
    const std::uint32_t* ids = plan_.data() + std::size_t{layer} * k;
    return std::find(ids, ids + k, e) != ids + k;
  }

  Config cfg_;
  std::uint32_t n_layers_ = 0;
  std::uint32_t n_experts_ = 0;
  std::vector<float> trace_;             ///< [L × E] little-pass logits of the current token
  std::vector<std::uint64_t> recorded_;  ///< token index each layer's row belongs to
  std::vector<std::uint32_t> plan_;      ///< [L × K] replayed plan of the last fallback
  std::uint64_t token_ = no_token;
  bool replaying_ = false;
  Stats stats_{};
};
static_assert(Predictor<RouterReplayPredictor>);

}  // namespace moekit
