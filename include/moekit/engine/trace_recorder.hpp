#pragma once
/// \file Recording the engine's routing as a moekit RoutingTrace (`moe-run --trace-out FILE`).
///
/// `TracingPipeline<P>` wraps the preset's pipeline and shows every `route` call's GateView to a
/// `TraceRecorder`, which stores per token and MoE layer the top-k experts with their weights
/// (normalised to sum 1, descending), the full router logits and the gate-input hidden state —
/// what cross-layer predictors (Fate, HOBBIT) need offline. Prefill tokens are recorded as one
/// forward; a decode token is kept only once its token policy accepts it (a MoBiLE fallback's
/// little pass is overwritten by the recomputation). When a token policy narrows top-k (MoBiLE's
/// little pass), the record holds the model's full top-k taken from the router logits, so the
/// trace is the model's routing, not the preset's. Written in the binary .mktrace format
/// (sim/trace_binary.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/core/gate_view.hpp"
#include "moekit/core/layer_context.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/error.hpp"
#include "moekit/io/output_file.hpp"
#include "moekit/sim/trace.hpp"
#include "moekit/sim/trace_binary.hpp"

#include "moekit/engine/config.hpp"
#include "moekit/engine/forwarding_pipeline.hpp"
#include "moekit/engine/ops.hpp"

namespace moekit::engine {

/// Collects the routing of every forward into a RoutingTrace.
class TraceRecorder {
 public:
  /// A recorder for `cfg`'s MoE layers; `name` is the trace's name.
  TraceRecorder(const ModelConfig& cfg, std::string name)
      : cfg_(cfg),
        trace_(moekit::sim::TraceDims{.n_layers = cfg.n_moe_layers,
                                      .n_experts = cfg.n_experts,
                                      .top_k = cfg.top_k,
                                      .hidden = cfg.hidden,
                                      .has_logits = true},
               std::move(name)) {}

  /// Name of the sequence the next `begin_sequence` starts (default "seq-N").
  void name_next_sequence(std::string name) { next_name_ = std::move(name); }

  void begin_sequence() {
    std::string name = next_name_.empty() ? "seq-" + std::to_string(trace_.sequence_count())
                                          : std::move(next_name_);
    next_name_.clear();
    trace_.begin_sequence(std::move(name));
    pending_ = false;
  }

  /// Records the layer call (`ctx`, `gate`).
  void record(const moekit::LayerContext& ctx, const moekit::GateView& gate) {
    MOEKIT_EXPECTS(trace_.sequence_count() > 0,
                   "TraceRecorder: a layer call before begin_sequence");
    MOEKIT_EXPECTS(gate.has_hidden() && gate.hidden_size() == cfg_.hidden,
                   "TraceRecorder: the GateView carries no gate-input hidden state");
    if (ctx.layer == 0) {
      if (ctx.phase == moekit::Phase::decode) {
        MOEKIT_EXPECTS(gate.n_tokens == 1, "TraceRecorder: decode forwards carry one token");
        if (!pending_) first_ = trace_.append_token(moekit::Phase::decode);
        pending_ = true;  // until end_token accepts it; a fallback overwrites it
      } else {
        first_ = trace_.token_count();
        for (std::uint32_t t = 0; t < gate.n_tokens; ++t)
          trace_.append_token(moekit::Phase::prefill);
      }
      tokens_ = gate.n_tokens;
    }
    MOEKIT_EXPECTS(gate.n_tokens == tokens_,
                   "TraceRecorder: layers of one forward carry different token counts");
    const std::uint32_t K = cfg_.top_k, E = cfg_.n_experts;
    ids_.resize(K);
    w_.resize(K);
    for (std::uint32_t t = 0; t < gate.n_tokens; ++t) {
      const moekit::TokenRoute r = gate.token(t);
      if (gate.k == K) {
        std::copy(r.experts.begin(), r.experts.end(), ids_.begin());
        std::copy(r.weights.begin(), r.weights.end(), w_.begin());
      } else {  // narrowed by the token policy: the model's own top-k from the logits
        probs_.assign(r.logits.begin(), r.logits.end());
        softmax(probs_);
        order_.resize(E);
        std::iota(order_.begin(), order_.end(), 0u);
        std::partial_sort(order_.begin(), order_.begin() + K, order_.end(),
                          [&](std::uint32_t a, std::uint32_t b) {
                            return probs_[a] > probs_[b] || (probs_[a] == probs_[b] && a < b);
                          });
        for (std::uint32_t j = 0; j < K; ++j) {
          ids_[j] = order_[j];
          w_[j] = probs_[order_[j]];
        }
      }
      moekit::sim::normalize_route(ids_, w_);  // Qwen2-MoE / OLMoE weights do not sum to 1
      trace_.set_route(first_ + t, ctx.layer, ids_, w_, r.logits, r.hidden);
    }
  }

  /// The decode token in flight was accepted (or is to be recomputed).
  void end_token(moekit::TokenVerdict v) noexcept {
    if (v == moekit::TokenVerdict::accept) pending_ = false;
  }

  [[nodiscard]] const moekit::sim::RoutingTrace& trace() const noexcept { return trace_; }

  /// Writes the trace as .mktrace; refuses to replace a file unless `overwrite`.
  /// Written to a temporary file renamed into place: a failed write leaves nothing behind.
  void write(const std::string& path, bool overwrite, std::string_view flag = "--trace-out") const {
    moekit::io::write_file_atomically(path, moekit::sim::serialize_trace_binary(trace_), overwrite,
                                      flag);
  }

 private:
  const ModelConfig& cfg_;
  moekit::sim::RoutingTrace trace_;
  std::string next_name_;
  std::size_t first_ = 0;
  std::uint32_t tokens_ = 0;
  bool pending_ = false;
  std::vector<std::uint32_t> ids_, order_;
  std::vector<float> w_, probs_;
};

/// A pipeline that forwards everything to `inner` and shows each layer call to a recorder.
/// `Model<TracingPipeline<P>>` runs exactly as `Model<P>`.
template <class Pipeline>
class TracingPipeline : public ForwardingPipeline<Pipeline> {
 public:
  TracingPipeline(Pipeline& inner, TraceRecorder& recorder)
      : ForwardingPipeline<Pipeline>(inner), rec_(recorder) {}

  void begin_sequence() {
    this->inner().begin_sequence();
    rec_.begin_sequence();
  }
  decltype(auto) route(const moekit::LayerContext& ctx, const moekit::GateView& gate) {
    rec_.record(ctx, gate);
    return this->inner().route(ctx, gate);
  }
  moekit::TokenVerdict end_token(std::span<const float> logits) {
    const moekit::TokenVerdict v = this->inner().end_token(logits);
    rec_.end_token(v);
    return v;
  }

 private:
  TraceRecorder& rec_;
};

/// The preset's own pipeline behind an optional TracingPipeline (for preset-specific statistics).
template <class P>
P& base_pipeline(P& p) noexcept {
  return p;
}
template <class P>
P& base_pipeline(TracingPipeline<P>& p) noexcept {
  return p.inner();
}
template <class P>
const P& base_pipeline(const P& p) noexcept {
  return p;
}
template <class P>
const P& base_pipeline(const TracingPipeline<P>& p) noexcept {
  return p.inner();
}

}  // namespace moekit::engine
