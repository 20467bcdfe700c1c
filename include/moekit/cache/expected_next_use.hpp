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
/// Ties: least recently used, then smallest (layer, expert).
///
/// Cost: p changes only when a visit is folded, so the policy keeps p and g = L · (1/p − 1) per
/// expert (recomputed for the folded layer in contiguous passes, O(E · k) per visit) and, per
/// layer, its residents and their largest g. Within a layer d is common, so d + (largest g) bounds
/// the layer's E[t]: a victim is one pass over the layers' bounds, then a scan of the residents of
/// the layer with the largest bound (others only if their bound can still tie or win). A hit only
/// records the tick: no per-access re-ranking.
/// Statistics persist across sequences unless `Config::reset_per_sequence`.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "moekit/cache/detail/dense_index.hpp"
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
    const std::size_t n = shape.expert_count();
    last_tick_.assign(n, 0);
    p_.assign(n, 1.0);
    g_.assign(n, 0.0);
    pos_.assign(n, none);
    members_.assign(n_layers_, {});
    for (auto& m : members_) m.reserve(n_experts_);
    member_g_.assign(n_layers_, {});
    for (auto& m : member_g_) m.reserve(n_experts_);
    max_g_.assign(n_layers_, -std::numeric_limits<double>::infinity());
    bound_.assign(n_layers_, 0.0);
    ramp_.resize(2 * std::size_t{n_layers_});
    for (std::size_t j = 0; j < ramp_.size(); ++j)
      ramp_[j] = double(j % n_layers_ == 0 ? n_layers_ : j % n_layers_);
  }
  void begin_sequence() {
    fold_visit();
    if (!cfg_.reset_per_sequence) return;
    clear_statistics();
    for (std::uint32_t l = 0; l < n_layers_; ++l) rerank_layer(l);
  }

  void on_hit(ExpertKey key, const AccessInfo& a) noexcept { demand(key, a); }
  void on_insert(ExpertKey key, const AccessInfo& a) noexcept {
    if (a.prefetch) last_tick_[detail::dense_index(key, n_experts_)] = a.tick;
    else demand(key, a);  // may fold the previous visit first
    admit(key);
  }
  void on_evict(ExpertKey key) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    if (pos_[i] == none) return;
    auto& m = members_[key.layer];
    auto& mg = member_g_[key.layer];
    const std::uint32_t last = m.back();
    m[pos_[i]] = last;
    mg[pos_[i]] = mg.back();
    pos_[detail::dense_index({key.layer, last}, n_experts_)] = pos_[i];
    m.pop_back();
    mg.pop_back();
    pos_[i] = none;
    if (g_[i] == max_g_[key.layer]) refresh_max(key.layer);
  }

  /// The layer with the largest bound d + (largest g) is scanned first; another layer is scanned
  /// only when its bound can still tie or beat the best E[t] found.
  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    Best best;
    const std::uint32_t L = n_layers_, cur = q.layer % L;
    // bound_[l] = d + (largest g), with d read from a ramp (no modulo, no branch: vectorizable).
    const double* d_of = &ramp_[L - cur];
    for (std::uint32_t l = 0; l < L; ++l) bound_[l] = d_of[l] + max_g_[l];  // -inf when empty
    const double first_bound = largest(bound_.data(), L);
    std::uint32_t first = 0;
    while (bound_[first] != first_bound) ++first;
    const double second_bound = std::max(largest(bound_.data(), first),
                                         largest(bound_.data() + first + 1, L - first - 1));
    if (members_[first].empty()) return std::nullopt;
    search_layer(q, first, (first + n_layers_ - cur) % n_layers_, best);
    if (best.key && best.t > second_bound) return best.key;  // no other layer can tie or win
    for (std::uint32_t l = 0, d = (n_layers_ - cur) % n_layers_; l < n_layers_;
         ++l, d = d + 1 == n_layers_ ? 0 : d + 1) {
      if (l == first || members_[l].empty() || (best.key && bound_[l] < best.t)) continue;
      search_layer(q, l, d, best);
    }
    return best.key;
  }

  /// The current estimate of p for `key` (probability it is chosen at its layer's next visit).
  [[nodiscard]] double probability(ExpertKey key) const noexcept {
    return estimate(key.layer, key.expert);
  }

 private:
  static constexpr std::uint32_t none = 0xffffffffu;

  /// E[t] of an expert of a layer `d` layers ahead (d = 0: the current layer, a full pass away),
  /// from its g = L · (1/p − 1).
  [[nodiscard]] double expected_next_use(std::uint32_t d, double g) const noexcept {
    return double(d == 0 ? n_layers_ : d) + g;
  }
  [[nodiscard]] double g_of(double p) const noexcept {
    return double(n_layers_) * (1.0 / p - 1.0);
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
    for (const std::uint32_t a : last_[l]) num += double(trans_[(base + a) * n_experts_ + e]);
    return num / den;
  }

  /// The best victim so far: largest E[t], then least recently used, then smaller key.
  struct Best {
    std::optional<ExpertKey> key;
    double t = 0.0;
    std::uint64_t tick = 0;
  };
  /// Offers every evictable resident of layer `l` (d layers ahead) that beats `best`. Usually the
  /// layer's largest g (known) belongs to an evictable resident: then only the residents whose
  /// E[t] equals it are compared (ties); otherwise every resident is.
  void search_layer(const EvictionQuery& q, std::uint32_t l, std::uint32_t d,
                    Best& best) const noexcept {
    const std::size_t base = std::size_t{l} * n_experts_;
    const auto& m = members_[l];
    const auto& mg = member_g_[l];
    const auto offer = [&](std::size_t j, double t) {
      const std::uint64_t tick = last_tick_[base + m[j]];
      const ExpertKey k{l, m[j]};
      if (best.key && (t < best.t || (t == best.t && (tick > best.tick ||
                                                       (tick == best.tick && k > *best.key)))))
        return;
      if (q.evictable(k)) best = {k, t, tick};  // the predicate only for a would-be winner
    };
    const double top = expected_next_use(d, max_g_[l]);
    if (best.key && top < best.t) return;
    const std::optional<ExpertKey> before = best.key;
    for (std::size_t j = 0; j < m.size(); ++j)
      if (expected_next_use(d, mg[j]) == top) offer(j, top);
    if (best.key != before || (best.key && best.t == top)) return;  // a top resident was taken
    for (std::size_t j = 0; j < m.size(); ++j) offer(j, expected_next_use(d, mg[j]));
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
    last_tick_[detail::dense_index(key, n_experts_)] = a.tick;
  }

  /// Folds the open visit into its layer's statistics and re-ranks that layer.
  void fold_visit() noexcept {
    if (!visit_open_) return;
    visit_open_ = false;
    const std::uint32_t l = visit_layer_;
    const std::size_t base = std::size_t{l} * n_experts_;
    for (const std::uint32_t a : last_[l]) {
      from_[base + a] += 1.0;
      for (const std::uint32_t b : visit_) {
        std::int32_t& t = trans_[(base + a) * n_experts_ + b];
        if (t != std::numeric_limits<std::int32_t>::max()) ++t;  // saturates at 2^31 − 1
      }
    }
    visits_[l] = cfg_.gamma * visits_[l] + 1.0;
    for (std::uint32_t e = 0; e < n_experts_; ++e) count_[base + e] *= cfg_.gamma;
    for (const std::uint32_t b : visit_) count_[base + b] += 1.0;
    last_[l].assign(visit_.begin(), visit_.end());
    visit_.clear();
    rerank_layer(l);
  }

  /// Adds a newly resident `key` with the current estimate of its p.
  void admit(ExpertKey key) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    p_[i] = estimate(key.layer, key.expert);
    g_[i] = g_of(p_[i]);
    if (pos_[i] == none) {
      auto& m = members_[key.layer];
      pos_[i] = static_cast<std::uint32_t>(m.size());
      m.push_back(key.expert);  // capacities reserved in bind(): never reallocate
      member_g_[key.layer].push_back(g_[i]);
    } else {
      member_g_[key.layer][pos_[i]] = g_[i];
    }
    if (g_[i] > max_g_[key.layer]) max_g_[key.layer] = g_[i];
  }
  /// Recomputes p and g of every expert of layer `l` (the same operations in the same order as
  /// `estimate`, so the same values), in contiguous passes over the layer's statistics.
  void rerank_layer(std::uint32_t l) noexcept {
    const std::size_t base = std::size_t{l} * n_experts_;
    const double k = last_[l].empty() ? double(top_k_) : double(last_[l].size());
    const double ke = k / double(n_experts_), v1 = visits_[l] + 1.0;
    const double den = denominator(l);
    double* p = &p_[base];
    double* g = &g_[base];
    const double* c = &count_[base];
    for (std::uint32_t e = 0; e < n_experts_; ++e) p[e] = cfg_.prior * ((c[e] + ke) / v1);
    for (const std::uint32_t a : last_[l]) {
      const std::int32_t* row = &trans_[(base + a) * n_experts_];
      for (std::uint32_t e = 0; e < n_experts_; ++e) p[e] += double(row[e]);
    }
    const double layers = double(n_layers_);
    for (std::uint32_t e = 0; e < n_experts_; ++e) {
      p[e] = p[e] / den;
      g[e] = layers * (1.0 / p[e] - 1.0);
    }
    const auto& m = members_[l];
    auto& mg = member_g_[l];
    for (std::size_t j = 0; j < m.size(); ++j) mg[j] = g[m[j]];
    refresh_max(l);
  }
  void refresh_max(std::uint32_t l) noexcept {
    max_g_[l] = largest(member_g_[l].data(), member_g_[l].size());
  }
  /// Largest of `n` values (−inf if none); four running maxima keep it branch-free and pipelined.
  [[nodiscard]] static double largest(const double* v, std::size_t n) noexcept {
    constexpr double lo = -std::numeric_limits<double>::infinity();
    double m0 = lo, m1 = lo, m2 = lo, m3 = lo;
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      m0 = v[i] > m0 ? v[i] : m0;
      m1 = v[i + 1] > m1 ? v[i + 1] : m1;
      m2 = v[i + 2] > m2 ? v[i + 2] : m2;
      m3 = v[i + 3] > m3 ? v[i + 3] : m3;
    }
    for (; i < n; ++i) m0 = v[i] > m0 ? v[i] : m0;
    m0 = m1 > m0 ? m1 : m0;
    m2 = m3 > m2 ? m3 : m2;
    return m2 > m0 ? m2 : m0;
  }
  void clear_statistics() {
    const std::size_t n = std::size_t{n_layers_} * n_experts_;
    trans_.assign(n * n_experts_, 0);
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
  /// [layer][from][to] transition counts between consecutive visits. Whole numbers: 32-bit
  /// counters halve the memory the estimate streams through (exact up to 2^31 − 1, then saturate).
  std::vector<std::int32_t> trans_;
  std::vector<double> from_;   ///< [layer][from] visits that followed one where `from` was chosen
  std::vector<double> count_;  ///< [layer][expert] decayed selection counts
  std::vector<double> visits_;  ///< [layer] decayed visit count
  std::vector<std::vector<std::uint32_t>> last_;  ///< [layer] experts chosen at its last visit
  std::vector<std::uint32_t> visit_;              ///< experts of the open visit
  std::uint32_t visit_layer_ = 0;
  std::uint64_t visit_token_ = 0;
  bool visit_open_ = false;
  std::vector<std::uint64_t> last_tick_;  ///< [expert] tick of the last demand or prefetch landing
  std::vector<double> p_, g_;  ///< [expert] current p and g = L · (1/p − 1) (current for residents)
  std::vector<std::vector<std::uint32_t>> members_;  ///< [layer] resident experts, unordered
  std::vector<std::vector<double>> member_g_;        ///< [layer] g of members_, same order
  std::vector<std::uint32_t> pos_;  ///< [expert] index in its layer's members, `none` if absent
  std::vector<double> max_g_;       ///< [layer] largest g of its residents, −inf if none
  mutable std::vector<double> bound_;  ///< victim's scratch: [layer] largest E[t] of the layer
  std::vector<double> ramp_;  ///< [j] the layer distance j mod L as a double, L for 0; j < 2L
};
static_assert(CachePolicy<ExpectedNextUsePolicy>);

}  // namespace moekit
