#pragma once
/// \file CrossLayerGatePredictor: Fate's cross-layer gate prefetcher.
///
/// Algorithm (Fang et al., "Fate: Fast Edge Inference of Mixture-of-Experts Models via Cross-Layer
/// Gate", §4.2–4.3, §4.5): router inputs of consecutive layers are similar (cosine ≈ 0.89), so the
/// router of layer l+1 applied to layer l's gate input, P̂ = softmax(W_g^(l+1) · x_l), predicts
/// layer l+1 without training or statistics.
///  * Decode: the candidates are the experts whose score exceeds the 75th percentile, made exact
///    as the top ceil((1 − q)·E) by score (ties → smaller id); that widening lifts recall from
///    78.8 % (top-k) to 97.2 %. Resident candidates cost nothing; at most n = floor(T / t_expert)
///    non-resident ones are transferred, where T = t_moe + t_attn + t_gate is the compute that can
///    hide them, all at int4.
///  * Prefill: per token the predicted top-k; popularity = predicted token count; the predicted
///    active set is transferred in descending popularity (ties → smaller id), its least popular
///    floor(p·|A|) at int2 (p = 25 %), the rest at int4; no count cap.
/// No prediction from the last layer, none across tokens.

#include <algorithm>
#include <cmath>
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

namespace moekit {

/// Fate's cross-layer gate predictor; needs `GateView.hidden` (the gate input) on every call.
class CrossLayerGatePredictor {
 public:
  static constexpr std::string_view name = "cross-layer-gate";
  struct Config {
    /// Routers of all MoE layers, back to back: [n_layers · n_experts · hidden] f32 (row l·E + e).
    /// Copied (packed) by the constructor. These four fields are RouterStack's arguments.
    std::span<const float> router_weights{};
    std::uint32_t n_layers = 0;
    std::uint32_t n_experts = 0;
    std::uint32_t hidden = 0;
    std::uint32_t top_k = 2;   ///< experts the model routes each token to
    double percentile = 0.75;  ///< decode candidates: scores above this percentile
    /// Decode transfer budget n = floor(budget_time / expert_time), clamped to the candidate
    /// count; both in the same unit, measured offline (T = t_moe + t_attn + t_gate, t_expert at
    /// `decode_precision`). expert_time <= 0 means no cap (n = candidates).
    double budget_time = 0.0;
    double expert_time = 0.0;
    Precision decode_precision = Precision::q4;
    double int2_fraction = 0.25;  ///< prefill: least popular share moved at `prefill_low`
    Precision prefill_high = Precision::q4;
    Precision prefill_low = Precision::q2;
  };

  explicit CrossLayerGatePredictor(Config c)
      : cfg_(c),
        routers_(c.router_weights, c.n_layers, c.n_experts, c.hidden, "CrossLayerGatePredictor") {
    MOEKIT_EXPECTS(cfg_.top_k > 0 && cfg_.top_k <= cfg_.n_experts,
                   "CrossLayerGatePredictor: Config.top_k must be in [1, n_experts]");
    MOEKIT_EXPECTS(cfg_.percentile >= 0.0 && cfg_.percentile < 1.0,
                   "CrossLayerGatePredictor: Config.percentile must be in [0, 1)");
    MOEKIT_EXPECTS(cfg_.int2_fraction >= 0.0 && cfg_.int2_fraction <= 1.0,
                   "CrossLayerGatePredictor: Config.int2_fraction must be in [0, 1]");
    MOEKIT_EXPECTS(cfg_.budget_time >= 0.0 && std::isfinite(cfg_.budget_time) &&
                       std::isfinite(cfg_.expert_time),
                   "CrossLayerGatePredictor: Config.budget_time / expert_time must be finite and "
                   "budget_time >= 0");
    candidates_ = static_cast<std::uint32_t>(
        std::ceil((1.0 - cfg_.percentile) * double(cfg_.n_experts) - 1e-9));
    candidates_ = std::clamp<std::uint32_t>(candidates_, 1, cfg_.n_experts);
    transfers_ = candidates_;
    if (cfg_.expert_time > 0.0)
      transfers_ = static_cast<std::uint32_t>(
          std::min<double>(std::floor(cfg_.budget_time / cfg_.expert_time), double(candidates_)));
    order_.resize(cfg_.n_experts);
    pop_.resize(cfg_.n_experts);
    ids_.resize(cfg_.top_k);
  }

  /// Decode candidates per layer, m = ceil((1 − q)·E).
  [[nodiscard]] std::uint32_t candidate_count() const noexcept { return candidates_; }
  /// Decode transfer cap n.
  [[nodiscard]] std::uint32_t transfer_cap() const noexcept { return transfers_; }

  void observe(const LayerContext&, const GateView&) const noexcept {}

  void predict(const LayerContext& ctx, const GateView& gate, const ResidencyView& residency,
               PrefetchList& out) {
    if (ctx.layer + 1 >= cfg_.n_layers) return;
    routers_.check_gate_input(gate);
    const std::uint32_t next = ctx.layer + 1;
    routers_.logits(next, 1, gate.hidden, gate.n_tokens, probs_);
    const std::size_t E = cfg_.n_experts;
    for (std::uint32_t t = 0; t < gate.n_tokens; ++t)
      softmax_in_place(std::span<float>(probs_.data() + t * E, E));
    if (gate.n_tokens == 1 && ctx.phase == Phase::decode) {
      predict_decode(next, residency, out);
    } else {
      predict_popularity(next, gate.n_tokens, ctx.phase == Phase::prefill, out);
    }
  }

  /// Predicted probabilities of the last `predict` call ([n_tokens × E], row-major).
  [[nodiscard]] std::span<const float> last_probabilities() const noexcept { return probs_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }
  [[nodiscard]] const RouterStack& routers() const noexcept { return routers_; }
  [[nodiscard]] RouterStack& routers() noexcept { return routers_; }

 private:
  void predict_decode(std::uint32_t next, const ResidencyView& residency, PrefetchList& out) {
    const std::span<const float> p(probs_.data(), cfg_.n_experts);
    for (std::uint32_t e = 0; e < cfg_.n_experts; ++e) order_[e] = e;
    std::stable_sort(order_.begin(), order_.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return p[a] > p[b]; });
    std::uint32_t sent = 0;
    for (std::uint32_t r = 0; r < candidates_; ++r) {
      const std::uint32_t e = order_[r];
      const Prefetch pf{{next, e}, cfg_.decode_precision, p[e], 1};
      if (residency.resident(pf.key, pf.precision)) {
        out.push(pf);  // free: the pipeline pins it for the next layer
      } else if (sent < transfers_) {
        out.push(pf);
        ++sent;
      }
    }
  }

  // Prefill (and multi-request decode batches, at the decode precision): predicted popularity.
  void predict_popularity(std::uint32_t next, std::uint32_t n, bool prefill, PrefetchList& out) {
    const std::size_t E = cfg_.n_experts;
    std::fill(pop_.begin(), pop_.end(), 0u);
    for (std::uint32_t t = 0; t < n; ++t) {
      top_k_experts(std::span<const float>(probs_.data() + t * E, E), ids_);
      for (std::uint32_t e : ids_) ++pop_[e];
    }
    std::size_t active = 0;
    for (std::uint32_t e = 0; e < E; ++e)
      if (pop_[e] > 0) order_[active++] = e;
    std::stable_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(active),
                     [&](std::uint32_t a, std::uint32_t b) { return pop_[a] > pop_[b]; });
    const auto n_low = static_cast<std::size_t>(std::floor(cfg_.int2_fraction * double(active)));
    for (std::size_t r = 0; r < active; ++r) {
      const std::uint32_t e = order_[r];
      const Precision prec = !prefill              ? cfg_.decode_precision
                             : r + n_low >= active ? cfg_.prefill_low
                                                   : cfg_.prefill_high;
      out.push(Prefetch{{next, e}, prec, float(pop_[e]) / float(n), 1});
    }
  }

  Config cfg_;
  RouterStack routers_;
  std::uint32_t candidates_ = 1;
  std::uint32_t transfers_ = 1;
  std::vector<float> probs_;
  std::vector<std::uint32_t> order_;
  std::vector<std::uint32_t> pop_;
  std::vector<std::uint32_t> ids_;
};
static_assert(Predictor<CrossLayerGatePredictor>);

}  // namespace moekit
