#pragma once
/// \file Walking a routing trace the way `replay` does: its forwards in order (ForwardWalker)
/// and the GateView of each layer call (GateGatherer). For tools that derive something else from
/// the same demands as a replay, e.g. what a scorer decides at each of them. And the trace tokens
/// an engine's tokens take when it replays a trace (PhaseWalks: `moe-run --routing-trace`).

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "moekit/core/gate_view.hpp"
#include "moekit/core/layer_context.hpp"
#include "moekit/sim/trace.hpp"

namespace moekit::sim {

/// Walks a trace's forwards in the order `replay` runs them: per sequence, its prefill tokens as
/// one forward, then each decode token as a forward of its own.
class ForwardWalker {
 public:
  explicit ForwardWalker(const RoutingTrace& trace) : trace_(trace) {}

  /// Calls `forward(seq, first_token, n_tokens, phase)` for each forward, in replay order.
  template <class F>
  void for_each_forward(F&& forward) const {
    for (std::size_t s = 0; s < trace_.sequence_count(); ++s) {
      const std::size_t len = trace_.sequence_length(s);
      if (len == 0) continue;
      const std::size_t first = trace_.global_token(s, 0);
      const std::size_t pre = trace_.prefill_length(s);
      if (pre > 0) forward(s, first, pre, Phase::prefill);
      for (std::size_t t = pre; t < len; ++t) forward(s, first + t, std::size_t{1}, Phase::decode);
    }
  }

 private:
  const RoutingTrace& trace_;
};

/// Which trace token each engine token takes when an engine replays a trace token by token: the
/// trace's prefill tokens and its decode tokens, each in order over every sequence, form two
/// walks, each wrapping around at its end; when the trace has no token of one phase, that phase
/// walks the other's tokens (the same cursor). The engine (engine/routing_replay.hpp) and moe-sim's
/// `--replay-slice` both take their tokens from here.
class PhaseWalks {
 public:
  explicit PhaseWalks(const RoutingTrace& trace) {
    for (std::size_t t = 0; t < trace.token_count(); ++t)
      walks_[trace.phase(t) == Phase::prefill ? 0 : 1].tokens.push_back(t);
  }
  [[nodiscard]] bool empty() const noexcept {
    return walks_[0].tokens.empty() && walks_[1].tokens.empty();
  }
  /// The global trace tokens of the next `n` tokens of `phase`, into `out` (the walk stays put).
  void peek(Phase phase, std::size_t n, std::vector<std::size_t>& out) const {
    const Walk& w = walks_[walk_of(phase)];
    out.resize(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = w.tokens[(w.next + i) % w.tokens.size()];
  }
  /// `phase`'s walk moves past `n` tokens.
  void advance(Phase phase, std::size_t n) noexcept {
    Walk& w = walks_[walk_of(phase)];
    w.next = (w.next + n) % w.tokens.size();
  }
  /// Both walks back to their first token.
  void rewind() noexcept {
    for (Walk& w : walks_) w.next = 0;
  }

 private:
  struct Walk {
    std::vector<std::size_t> tokens;  ///< global trace tokens, in order
    std::size_t next = 0;             ///< index into `tokens` of the next one to replay
  };
  // `phase`'s walk, or the other phase's when the trace has no token of this one.
  [[nodiscard]] int walk_of(Phase phase) const noexcept {
    const int own = phase == Phase::prefill ? 0 : 1;
    return walks_[own].tokens.empty() ? 1 - own : own;
  }
  std::array<Walk, 2> walks_;  ///< [0] the trace's prefill tokens, [1] its decode tokens
};

/// Gathers one layer call's GateView from a trace the way `replay` routes it, into buffers it
/// reuses (no allocation once sized).
struct GateGatherer {
  std::vector<std::uint32_t> ids;
  std::vector<float> weights, logits, hidden;

  /// Gathers the present records of tokens [first, first+n) at `layer`, keeping the first `k`
  /// experts of each (weights renormalised over them). Returns the view (n_tokens = 0 when no
  /// record is present) and adds the missing records to `missing`.
  GateView gather(const RoutingTrace& tr, std::size_t first, std::size_t n, std::uint32_t layer,
                  std::uint32_t k, std::uint64_t& missing) {
    const TraceDims& d = tr.dims();
    if (n == 1 && k == d.top_k) {  // a decode record as stored: view it, copy nothing
      GateView g;
      g.k = k;
      g.n_experts = d.n_experts;
      if (!tr.valid(first, layer)) {
        ++missing;
        g.n_tokens = 0;
        return g;
      }
      g.experts = tr.experts(first, layer);
      g.weights = tr.weights(first, layer);
      g.logits = tr.logits(first, layer);
      g.hidden = tr.hidden(first, layer);
      return g;
    }
    ids.clear(), weights.clear(), logits.clear(), hidden.clear();
    std::uint32_t rows = 0;
    for (std::size_t t = first; t < first + n; ++t) {
      if (!tr.valid(t, layer)) {
        ++missing;
        continue;
      }
      const auto e = tr.experts(t, layer);
      const auto w = tr.weights(t, layer);
      float sum = 0.0f;
      for (std::uint32_t j = 0; j < k; ++j) sum += w[j];
      for (std::uint32_t j = 0; j < k; ++j) {
        ids.push_back(e[j]);
        weights.push_back(k == d.top_k || !(sum > 0) ? w[j] : w[j] / sum);
      }
      if (d.has_logits) {
        const auto l = tr.logits(t, layer);
        logits.insert(logits.end(), l.begin(), l.end());
      }
      if (d.hidden) {
        const auto h = tr.hidden(t, layer);
        hidden.insert(hidden.end(), h.begin(), h.end());
      }
      ++rows;
    }
    GateView g;
    g.n_tokens = rows;
    g.k = k;
    g.n_experts = d.n_experts;
    g.experts = ids;
    g.weights = weights;
    g.logits = logits;
    g.hidden = hidden;
    return g;
  }
};

}  // namespace moekit::sim
