#pragma once
/// \file Routing replay (`moe-run --routing-trace FILE`): each token's experts and gate weights
/// come from a recorded RoutingTrace instead of the router's top-k, while the kernels and the
/// expert I/O (loads, caches, every preset's prefetching) run as usual. A model with random
/// weights routes unlike a trained one; replaying a trained model's routing makes its hit rates
/// and bytes loaded those of real traffic. The generated text is meaningless.
///
/// Which trace token an engine token uses: the trace's tokens of every sequence, in order, form
/// two walks, its prefill tokens and its decode tokens. A decode token takes the next token of the
/// decode walk, a prefill token the next of the prefill walk; a walk wraps around at its end, and
/// when the trace has no tokens of one phase that phase walks the other's tokens (the same
/// cursor, so a prompt replayed from a decode-only trace is followed by the trace tokens after
/// it, not by the same ones again). The walks continue across the engine's sequences; `rewind`
/// starts them over. A decode token recomputed after a token policy's fallback (MoBiLE) replays
/// the same trace token: the cursor moves only once a forward is kept.
///
/// Per (token, MoE layer): the record's expert ids and weights replace the router's in place,
/// before the pipeline sees the GateView, so routing, predictors' hit statistics, loads and the
/// experts that run all follow the trace. The router's logits and the gate-input hidden state stay
/// the model's own (HOBBIT's and Fate's predictors compute from them as usual), unless
/// `set_replace_logits` asks for the trace's (`apply_logits`: mobile-oracle's plan). The weights
/// are the trace's, which sum to 1, also for models that do not renormalise top-k (Qwen2-MoE,
/// OLMoE). When a token policy narrows top-k to k (MoBiLE's little pass), the record's first k
/// experts are used with their weights renormalised. Missing records (`valid()` false: the shared
/// Mixtral traces drop some) are first filled by the rule moe-sim uses too
/// (sim/fill_missing_records.hpp: the previous token's record at that layer; `filled()` counts
/// them); a record still missing (its layer has no record in the whole sequence) keeps the
/// router's own top-k for that layer and is counted (`missing()`).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/core/layer_context.hpp"
#include "moekit/error.hpp"
#include "moekit/predict/lookahead_oracle.hpp"
#include "moekit/sim/fill_missing_records.hpp"
#include "moekit/sim/route_logits.hpp"
#include "moekit/sim/trace.hpp"
#include "moekit/sim/trace_file.hpp"
#include "moekit/sim/trace_walk.hpp"

#include "moekit/engine/config.hpp"

namespace moekit::engine {

/// Replaces the router's selection with a trace's, token by token (see the file comment).
class RoutingReplay : public moekit::RoutingLookahead {
 public:
  /// Replays `trace` on a model of `cfg`. Throws `Error(invalid_argument)` starting with
  /// `origin` (moe-run: the flag and the file) and giving both values when the trace's MoE
  /// layers, experts or top-k differ from the model's, or when it holds no token.
  RoutingReplay(moekit::sim::RoutingTrace trace, const ModelConfig& cfg,
                std::string_view origin = "routing trace")
      : trace_(std::move(trace)), walks_(trace_) {
    check_dims(cfg, origin);
    filled_ = moekit::sim::fill_missing_records(trace_);
  }

  /// Reads the trace at `path` (any format of sim/trace_file.hpp) for a model of `cfg`; every
  /// error names `flag` and the file.
  static RoutingReplay from_file(const std::string& path, const ModelConfig& cfg,
                                 std::string_view flag = "--routing-trace") {
    moekit::sim::RoutingTrace t;
    try {
      t = moekit::sim::read_trace_file(path);
    } catch (const moekit::Error& e) {
      moekit::detail::fail(e.kind(), std::string(flag) + ": " + e.message());
    }
    return RoutingReplay(std::move(t), cfg, std::string(flag) + " '" + path + "'");
  }

  [[nodiscard]] const moekit::sim::RoutingTrace& trace() const noexcept { return trace_; }

  /// The trace's missing records filled with the previous token's (sim/fill_missing_records.hpp).
  [[nodiscard]] std::size_t filled() const noexcept { return filled_; }
  /// Records still missing after the fill, so the router's own top-k ran instead (kept forwards
  /// only).
  [[nodiscard]] std::size_t missing() const noexcept { return missing_; }
  /// Records whose experts replaced the router's (kept forwards only).
  [[nodiscard]] std::size_t replayed() const noexcept { return replayed_; }
  /// Engine tokens replayed (kept forwards only).
  [[nodiscard]] std::size_t tokens() const noexcept { return tokens_; }

  /// Both walks back to their first token; the counters back to 0.
  void rewind() noexcept {
    walks_.rewind();
    current_.reset();
    missing_ = replayed_ = tokens_ = 0;
  }

  // ---- called by Model and MoeLayer --------------------------------------------------------

  /// A forward of `n_tokens` tokens of `phase` starts: its rows take the next trace tokens of the
  /// phase's walk (the cursor moves at `end_forward`). Allocates only when a forward is wider
  /// than any before.
  void begin_forward(moekit::Phase phase, std::uint32_t n_tokens) {
    current_ = phase;
    walks_.peek(phase, n_tokens, rows_);
    pending_missing_ = pending_replayed_ = 0;
  }

  /// The forward begun last is kept (not recomputed): the walk moves past its tokens.
  void end_forward() noexcept {
    if (!current_) return;
    walks_.advance(*current_, rows_.size());
    tokens_ += rows_.size();
    missing_ += pending_missing_;
    replayed_ += pending_replayed_;
    current_.reset();
  }

  /// Overwrites, for each row t of the current forward at MoE layer `layer`, its `k` experts
  /// experts[t·k, (t+1)·k) and their weights with the trace record's, unless it is missing.
  void apply(std::uint32_t layer, std::uint32_t k, std::span<std::uint32_t> experts,
             std::span<float> weights) {
    MOEKIT_EXPECTS(current_.has_value(), "RoutingReplay::apply: no forward begun");
    MOEKIT_EXPECTS(k >= 1 && k <= trace_.dims().top_k,
                   "RoutingReplay: the token policy's top-k exceeds the trace's top-k");
    MOEKIT_EXPECTS(experts.size() == rows_.size() * k && weights.size() == experts.size(),
                   "RoutingReplay::apply: the selection is not n_tokens × k");
    for (std::size_t t = 0; t < rows_.size(); ++t) {
      if (!trace_.valid(rows_[t], layer)) {
        ++pending_missing_;
        continue;
      }
      const auto ids = trace_.experts(rows_[t], layer);
      const auto w = trace_.weights(rows_[t], layer);
      float sum = 0.f;
      for (std::uint32_t j = 0; j < k; ++j) sum += w[j];
      for (std::uint32_t j = 0; j < k; ++j) {
        experts[t * k + j] = ids[j];
        weights[t * k + j] = w[j] / sum;  // at the full top-k the sum is already 1 (to rounding)
      }
      ++pending_replayed_;
    }
  }

  /// Replaces the router's logits [rows × n_experts] of the current forward at MoE layer `layer`
  /// with the trace's, when `set_replace_logits(true)` asked (else leaves them): the record's
  /// stored logits, or, for a trace without them, logits made from its experts and weights
  /// (sim/route_logits.hpp). For stand-ins whose predictor reads the logits as the trace's router
  /// would have produced them (mobile-oracle's plan); a missing record keeps the router's.
  void apply_logits(std::uint32_t layer, std::span<float> logits) {
    if (!replace_logits_) return;
    MOEKIT_EXPECTS(current_.has_value(), "RoutingReplay::apply_logits: no forward begun");
    const std::size_t E = trace_.dims().n_experts;
    MOEKIT_EXPECTS(logits.size() == rows_.size() * E,
                   "RoutingReplay::apply_logits: the logits are not n_tokens × n_experts");
    for (std::size_t t = 0; t < rows_.size(); ++t) {
      if (!trace_.valid(rows_[t], layer)) continue;
      const std::span<float> row = logits.subspan(t * E, E);
      if (trace_.has_logits()) {
        const auto stored = trace_.logits(rows_[t], layer);
        std::copy(stored.begin(), stored.end(), row.begin());
      } else {
        moekit::sim::route_logits(trace_.experts(rows_[t], layer), trace_.weights(rows_[t], layer),
                                  row);
      }
    }
  }
  /// Whether `apply_logits` replaces the router's logits (default: no, they stay the model's).
  void set_replace_logits(bool on) noexcept { replace_logits_ = on; }
  [[nodiscard]] bool replaces_logits() const noexcept { return replace_logits_; }

  /// The trace's routing of the forward in flight at MoE layer `layer`, at the full top-k
  /// (LookaheadOraclePredictor's source: the experts `apply` will put there). Rows whose record
  /// is missing are left out (the router's own choice, unknown ahead); nullopt when no forward is
  /// under way or every row's record is missing.
  std::optional<moekit::GateView> routing_at(std::uint32_t layer) override {
    if (!current_ || layer >= trace_.dims().n_layers) return std::nullopt;
    const std::uint32_t k = trace_.dims().top_k;
    ahead_experts_.clear();
    ahead_weights_.clear();
    for (std::size_t t : rows_) {
      if (!trace_.valid(t, layer)) continue;
      const auto ids = trace_.experts(t, layer);
      const auto w = trace_.weights(t, layer);
      ahead_experts_.insert(ahead_experts_.end(), ids.begin(), ids.begin() + k);
      ahead_weights_.insert(ahead_weights_.end(), w.begin(), w.begin() + k);
    }
    if (ahead_experts_.empty()) return std::nullopt;
    return moekit::GateView{.n_tokens = static_cast<std::uint32_t>(ahead_experts_.size() / k),
                            .k = k,
                            .n_experts = trace_.dims().n_experts,
                            .experts = ahead_experts_,
                            .weights = ahead_weights_};
  }

 private:
  void check_dims(const ModelConfig& cfg, std::string_view origin) const {
    const moekit::sim::TraceDims& d = trace_.dims();
    auto differ = [&](const char* what, std::uint32_t trace_value, std::uint32_t model_value) {
      if (trace_value != model_value)
        moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                             std::string(origin) + ": the trace has " + what + " = " +
                                 std::to_string(trace_value) + ", the model has " +
                                 std::to_string(model_value));
    };
    differ("n_layers (MoE layers)", d.n_layers, cfg.n_moe_layers);
    differ("n_experts", d.n_experts, cfg.n_experts);
    differ("top_k", d.top_k, cfg.top_k);
    MOEKIT_EXPECTS(trace_.token_count() > 0, std::string(origin) + ": the trace holds no token");
  }

  moekit::sim::RoutingTrace trace_;
  moekit::sim::PhaseWalks walks_;         ///< which trace token each engine token takes
  std::optional<moekit::Phase> current_;  ///< phase of the forward in flight (none: no forward)
  std::vector<std::size_t> rows_;         ///< trace token of each row of the forward in flight
  std::size_t pending_missing_ = 0, pending_replayed_ = 0;
  std::size_t missing_ = 0, replayed_ = 0, tokens_ = 0;
  std::size_t filled_ = 0;                    // set once, by the constructor
  std::vector<std::uint32_t> ahead_experts_;  ///< routing_at's view
  std::vector<float> ahead_weights_;
  bool replace_logits_ = false;  ///< apply_logits writes the trace's logits
};

}  // namespace moekit::engine
