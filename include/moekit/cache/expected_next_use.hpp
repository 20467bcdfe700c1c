#pragma once
/// \file ExpectedNextUsePolicy: an online estimate of Belady's rule for layer-cyclic MoE access.
///
/// moekit's own combination (not from the five papers), found by replaying the real Mixtral traces
/// (bench/cache/trace_replay.cpp). Belady evicts the expert used farthest in the future. In an MoE
/// decoder the layers run in a fixed cycle, so an expert of layer l is next *possible* d layers
/// from now (d = (l − current) mod L, d = L for the current layer, as HOBBIT's FLD), and is then
/// selected with some probability p; with independent visits its expected next use is
///
///   E[t] = d + L · (1/p − 1)   layer steps,
///
/// and the policy evicts the largest E[t]. p is estimated online per layer from a first-order
/// transition table (HOBBIT Fig. 10a / Fiddler-style temporal locality: an expert chosen at a
/// layer's last visit is likelier to be chosen at its next one) backed off to an exponentially
/// decayed frequency (sequence skew, HOBBIT Fig. 10b):
///
///   p(e) = (Σ_{a ∈ last(l)} T[l][a][e] + prior · f(e)) / (Σ_{a ∈ last(l)} N[l][a] + prior),
///   f(e) = (c(e) + k/E) / (V(l) + 1),  c, V decayed by `gamma` per visit of layer l.
///
/// A visit of layer l is the set of experts demanded with the same (layer, cache token); it is
/// folded into the statistics when the next visit begins. Prefetch insertions are not demands.
/// Within one layer d is common, so each layer keeps a heap on p (recomputed for that layer's
/// residents, and rebuilt in O(residents), when one of its visits is folded in): a victim costs a
/// pass over the layers' bounds plus O(1 + pinned) heap entries, a visit O(E + residents · k). Ties: least recently used, then smallest (layer, expert).
/// Statistics persist across sequences unless `Config::reset_per_sequence`.

#include <cstdint>
#include <optional>
#include <vector>

#include "moekit/cache/detail/dense_index.hpp"
#include "moekit/cache/detail/ranked_set.hpp"
#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// Evicts the resident with the largest expected time to its next use (see the file comment).
class ExpectedNextUsePolicy {
 public:
  /// Run-time knobs (defaults from the Mixtral trace replay, bench/RESULTS.md).
  struct Config {
    double gamma = 0.95;  ///< decay of the frequency estimate per visit of a layer, in (0, 1]
    double prior = 4.0;   ///< weight (in visits) of the frequency estimate behind the transitions
    bool reset_per_sequence = false;  ///< forget all statistics at begin_sequence
  };

  ExpectedNextUsePolicy() = default;
  explicit ExpectedNextUsePolicy(Config cfg) : cfg_(cfg) {
    MOEKIT_EXPECTS(cfg_.gamma > 0.0 && cfg_.gamma <= 1.0,
                   "ExpectedNextUsePolicy::Config.gamma must be in (0, 1]");
    MOEKIT_EXPECTS(cfg_.prior > 0.0, "ExpectedNextUsePolicy::Config.prior must be > 0");
  }

  void bind(const ModelShape& shape) {
    n_layers_ = shape.n_layers;
    n_experts_ = shape.n_experts;
    top_k_ = shape.top_k;
    clear_statistics();
    last_tick_.assign(shape.expert_count(), 0);
    resident_.assign(shape.expert_count(), false);
    ranked_.assign(n_layers_, {});
    for (auto& r : ranked_) r.reset(n_experts_);
    bound_.assign(n_layers_, 0.0);
  }
  void begin_sequence() {
    fold_visit();
    if (!cfg_.reset_per_sequence) return;
    clear_statistics();
    for (std::uint32_t l = 0; l < n_layers_; ++l) rerank_layer(l);
  }

  void on_hit(ExpertKey key, const AccessInfo& a) noexcept { demand(key, a); }
  void on_insert(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    resident_[i] = true;
    if (a.prefetch) {
      last_tick_[i] = a.tick;
      rerank(key);
    } else {
      demand(key, a);
    }
  }
  void on_evict(ExpertKey key) noexcept {
    resident_[detail::dense_index(key, n_experts_)] = false;
    ranked_[key.layer].erase(key.expert);
  }

  /// Within a layer d is common, so each layer keeps a heap on p and its lowest p bounds its E[t].
  /// The layer with the largest bound is searched first; another layer is searched only when its
  /// bound is not below the best E[t] found. Inside a layer the heap is walked while E[t] (as
  /// computed, in doubles) can still tie or win, so ties follow the documented order.
  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    Best best;
    const std::uint32_t cur = q.layer % n_layers_;
    std::uint32_t first = n_layers_;
    double first_bound = 0.0;
    for (std::uint32_t l = 0, d = (n_layers_ - cur) % n_layers_; l < n_layers_;
         ++l, d = d + 1 == n_layers_ ? 0 : d + 1) {
      const auto& heap = ranked_[l];
      if (heap.size() == 0) continue;
      const double b = expected_next_use(d, heap.min_rank().p);
      bound_[l] = b;
      if (first == n_layers_ || b > first_bound) first = l, first_bound = b;
    }
    if (first == n_layers_) return std::nullopt;
    search_layer(q, first, (first + n_layers_ - cur) % n_layers_, best);
    for (std::uint32_t l = 0, d = (n_layers_ - cur) % n_layers_; l < n_layers_;
         ++l, d = d + 1 == n_layers_ ? 0 : d + 1) {
      if (l == first || ranked_[l].size() == 0 || (best.key && bound_[l] < best.t)) continue;
      search_layer(q, l, d, best);
    }
    return best.key;
  }

  /// The current estimate of p for `key` (probability it is chosen at its layer's next visit).
  [[nodiscard]] double probability(ExpertKey key) const noexcept {
    return estimate(key.layer, key.expert);
  }

 private:
  struct Rank {
    double p;
    std::uint64_t tick;
    friend bool operator<(const Rank& a, const Rank& b) noexcept {
      if (a.p != b.p) return a.p < b.p;
      return a.tick < b.tick;
    }
  };

  /// E[t] of an expert of a layer `d` layers ahead (d = 0: the current layer, a full pass away).
  [[nodiscard]] double expected_next_use(std::uint32_t d, double p) const noexcept {
    return double(d == 0 ? n_layers_ : d) + double(n_layers_) * (1.0 / p - 1.0);
  }
  [[nodiscard]] double estimate(std::uint32_t l, std::uint32_t e) const noexcept {
    return estimate(l, e, denominator(l));
  }
  /// prior + Σ_{a ∈ last(l)} N[l][a], common to the layer's experts.
  [[nodiscard]] double denominator(std::uint32_t l) const noexcept {
    const std::size_t base = std::size_t{l} * n_experts_;
    double den = cfg_.prior;
    for (const std::uint32_t a : last_[l]) den += from_[base + a];
    return den;
  }
  [[nodiscard]] double estimate(std::uint32_t l, std::uint32_t e, double den) const noexcept {
    const std::size_t base = std::size_t{l} * n_experts_;
    const double k = last_[l].empty() ? double(top_k_) : double(last_[l].size());
    const double f = (count_[base + e] + k / double(n_experts_)) / (visits_[l] + 1.0);
    double num = cfg_.prior * f;
    for (const std::uint32_t a : last_[l]) num += trans_[(base + a) * n_experts_ + e];
    return num / den;
  }

  /// The best victim so far: largest E[t], then least recently used, then smaller key.
  struct Best {
    std::optional<ExpertKey> key;
    double t = 0.0;
    std::uint64_t tick = 0;
  };
  /// Offers every evictable entry of layer `l` (d layers ahead) that may beat or tie `best`.
  void search_layer(const EvictionQuery& q, std::uint32_t l, std::uint32_t d,
                    Best& best) const noexcept {
    const auto& heap = ranked_[l];
    heap.walk([&](std::uint32_t e) {
      // Children have p >= their parent's, hence E[t] <= (rounding is monotone).
      const double t = expected_next_use(d, heap.rank(e).p);
      if (best.key && t < best.t) return false;
      const ExpertKey k{l, e};
      if (!q.evictable(k)) return true;
      const std::uint64_t tick = last_tick_[detail::dense_index(k, n_experts_)];
      if (!best.key || t > best.t || tick < best.tick || (tick == best.tick && k < *best.key))
        best = {k, t, tick};
      return true;
    });
  }

  void demand(ExpertKey key, const AccessInfo& a) noexcept {
    if (!visit_open_ || key.layer != visit_layer_ || a.token != visit_token_) {
      fold_visit();
      visit_open_ = true;
      visit_layer_ = key.layer;
      visit_token_ = a.token;
    }
    bool seen = false;
    for (const std::uint32_t x : visit_)
      if (x == key.expert) seen = true;
    if (!seen && visit_.size() < n_experts_) visit_.push_back(key.expert);
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    last_tick_[i] = a.tick;
    auto& heap = ranked_[key.layer];
    if (heap.contains(key.expert))  // statistics change only when a visit is folded: keep p
      heap.update(key.expert, Rank{heap.rank(key.expert).p, a.tick});
    else
      rerank(key);
  }

  /// Folds the open visit into its layer's statistics and re-ranks that layer's residents.
  void fold_visit() noexcept {
    if (!visit_open_) return;
    visit_open_ = false;
    const std::uint32_t l = visit_layer_;
    const std::size_t base = std::size_t{l} * n_experts_;
    for (const std::uint32_t a : last_[l]) {
      from_[base + a] += 1.0;
      for (const std::uint32_t b : visit_) trans_[(base + a) * n_experts_ + b] += 1.0;
    }
    visits_[l] = cfg_.gamma * visits_[l] + 1.0;
    for (std::uint32_t e = 0; e < n_experts_; ++e) count_[base + e] *= cfg_.gamma;
    for (const std::uint32_t b : visit_) count_[base + b] += 1.0;
    last_[l].assign(visit_.begin(), visit_.end());
    visit_.clear();
    rerank_layer(l);
  }

  void rerank(ExpertKey key) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    if (resident_[i])
      ranked_[key.layer].update(key.expert, Rank{estimate(key.layer, key.expert), last_tick_[i]});
  }
  /// Re-ranks the layer's residents (its heap's members) at once: O(residents · |last|).
  void rerank_layer(std::uint32_t l) noexcept {
    const double den = denominator(l);
    const std::size_t base = std::size_t{l} * n_experts_;
    ranked_[l].rerank_all(
        [&](std::uint32_t e) { return Rank{estimate(l, e, den), last_tick_[base + e]}; });
  }
  void clear_statistics() {
    const std::size_t n = std::size_t{n_layers_} * n_experts_;
    trans_.assign(n * n_experts_, 0.0);
    from_.assign(n, 0.0);
    count_.assign(n, 0.0);
    visits_.assign(n_layers_, 0.0);
    last_.assign(n_layers_, {});
    for (auto& v : last_) v.reserve(n_experts_);
    visit_.clear();
    visit_.reserve(n_experts_);
    visit_open_ = false;
  }

  Config cfg_{};
  std::uint32_t n_layers_ = 1, n_experts_ = 1, top_k_ = 1;
  std::vector<double> trans_;  ///< [layer][from][to] transition counts between consecutive visits
  std::vector<double> from_;   ///< [layer][from] visits that followed one where `from` was chosen
  std::vector<double> count_;  ///< [layer][expert] decayed selection counts
  std::vector<double> visits_;  ///< [layer] decayed visit count
  std::vector<std::vector<std::uint32_t>> last_;  ///< [layer] experts chosen at its last visit
  std::vector<std::uint32_t> visit_;              ///< experts of the open visit
  std::uint32_t visit_layer_ = 0;
  std::uint64_t visit_token_ = 0;
  bool visit_open_ = false;
  std::vector<std::uint64_t> last_tick_;
  std::vector<bool> resident_;
  std::vector<detail::RankedSet<Rank>> ranked_;  ///< per layer, indexed by expert
  mutable std::vector<double> bound_;  ///< victim's scratch: [layer] largest E[t] of the layer
};
static_assert(CachePolicy<ExpectedNextUsePolicy>);

}  // namespace moekit
