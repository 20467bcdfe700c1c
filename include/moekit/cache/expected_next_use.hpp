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
/// Cost: p changes only when a visit is folded, so the policy keeps, per layer, its residents'
/// g = L · (1/p − 1) (recomputed for the folded layer: numerators in contiguous passes, O(E · k)
/// per visit, the divisions only for residents), their largest g, which resident holds it and the
/// runner-up. Within a layer d is common, so d + (largest g) bounds the layer's E[t]: a victim is
/// one pass over the layers' bounds, then the holder of the best layer's largest g, with no scan
/// unless d + runner-up rounds to the same E[t] (ties) or the holder is pinned (others only if
/// their bound can still tie or win). A hit only records the tick: no per-access re-ranking.
/// Statistics persist across sequences unless `Config::reset_per_sequence`.

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "moekit/cache/detail/dense_index.hpp"
#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// Evicts the resident with the largest expected time to its next use (see the file comment).
class ExpectedNextUsePolicy {
 public:
  static constexpr std::string_view name = "expected-next-use";
  static constexpr Hooks hooks = Hook::bind | Hook::begin_sequence;
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
    pos_.assign(n, none);
    members_.assign(n_layers_, {});
    for (auto& m : members_) m.reserve(n_experts_);
    member_g_.assign(n_layers_, {});
    for (auto& m : member_g_) m.reserve(n_experts_);
    rows_.reserve(n_experts_);
    num_.assign(n_experts_, 0.0);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__AVX__)
    // With few experts per layer the out-of-line AVX passes cost more than they save.
    rerank_avx_ = n_experts_ >= 16 && [] {
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx") != 0;
    }();
#endif
    max_g_.assign(n_layers_, -std::numeric_limits<double>::infinity());
    next_g_.assign(n_layers_, -std::numeric_limits<double>::infinity());
    top_.assign(n_layers_, 0);
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
    if (a.prefetch)
      last_tick_[detail::dense_index(key, n_experts_)] = a.tick;
    else
      demand(key, a);  // may fold the previous visit first
    admit(key);
  }
  void on_evict(ExpertKey key) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    if (pos_[i] == none) return;
    const std::uint32_t l = key.layer, j = pos_[i];
    auto& m = members_[l];
    auto& mg = member_g_[l];
    const double g = mg[j];
    const auto moved = static_cast<std::uint32_t>(m.size() - 1);  // the last slot moves to j
    m[j] = m[moved];
    mg[j] = mg[moved];
    pos_[detail::dense_index({l, m[j]}, n_experts_)] = j;
    m.pop_back();
    mg.pop_back();
    pos_[i] = none;
    if (j == top_[l] || g >= next_g_[l])
      refresh_top(l);  // the largest or the runner-up left
    else if (top_[l] == moved)
      top_[l] = j;
  }

  /// The layer with the largest bound d + (largest g) is searched first; another layer is searched
  /// only when its bound can still tie or beat the best E[t] found.
  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    Best best;
    const std::uint32_t L = n_layers_, cur = q.layer % L;
    // bound_[l] = d + (largest g), with d read from a ramp (no modulo, no branch: vectorizable).
    const double* d_of = &ramp_[L - cur];
    for (std::uint32_t l = 0; l < L; ++l) bound_[l] = d_of[l] + max_g_[l];  // -inf when empty
    const TopTwo b = top_two(bound_.data(), L);
    if (members_[b.at].empty()) return std::nullopt;
    search_layer(q, b.at, d_of[b.at], best);
    if (best.key && best.t > b.next) return best.key;  // no other layer can tie or win
    for (std::uint32_t l = 0; l < L; ++l) {
      if (l == b.at || members_[l].empty() || (best.key && bound_[l] < best.t)) continue;
      search_layer(q, l, d_of[l], best);
    }
    return best.key;
  }

  /// The current estimate of p for `key` (probability it is chosen at its layer's next visit).
  [[nodiscard]] double probability(ExpertKey key) const noexcept {
    return estimate(key.layer, key.expert);
  }

 private:
  static constexpr std::uint32_t none = 0xffffffffu;

  [[nodiscard]] double g_of(double p) const noexcept { return double(n_layers_) * (1.0 / p - 1.0); }
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
  /// Offers every evictable resident of layer `l` (at layer distance `d`, L for the current layer)
  /// that beats `best`. Usually the layer's largest g belongs to one evictable resident, known
  /// without a scan (`top_`): then it is the only candidate, since every other resident's E[t] is
  /// below it (d + runner-up < d + largest; if they round to one E[t], the residents whose E[t]
  /// equals it are compared: ties). Otherwise every resident is.
  void search_layer(const EvictionQuery& q, std::uint32_t l, double d, Best& best) const noexcept {
    const std::size_t base = std::size_t{l} * n_experts_;
    const std::uint32_t* m = members_[l].data();
    const double* mg = member_g_[l].data();
    const std::size_t n = members_[l].size();
    const auto offer = [&](std::size_t j, double t) {
      const std::uint64_t tick = last_tick_[base + m[j]];
      const ExpertKey k{l, m[j]};
      if (best.key && (t < best.t ||
                       (t == best.t && (tick > best.tick || (tick == best.tick && k > *best.key)))))
        return;
      if (q.evictable(k)) best = {k, t, tick};  // the predicate only for a would-be winner
    };
    const double top = d + max_g_[l];
    if (best.key && top < best.t) return;
    const std::optional<ExpertKey> before = best.key;
    if (d + next_g_[l] < top) {
      offer(top_[l], top);
    } else {
      for (std::size_t j = 0; j < n; ++j)
        if (d + mg[j] == top) offer(j, top);  // d + mg[j] <= top for every j
    }
    if (best.key != before || (best.key && best.t == top)) return;  // a top resident was taken
    for (std::size_t j = 0; j < n; ++j) {
      const double t = d + mg[j];
      if (!best.key || t >= best.t) offer(j, t);  // offer() re-checks; this skips the call
    }
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
    if (!seen && visit_.size() < n_experts_) {
      visit_.push_back(key.expert);
      // Its transition row is summed when this visit is folded: start loading it now.
      const std::int32_t* row =
          &trans_[std::size_t{detail::dense_index(key, n_experts_)} * n_experts_];
      for (std::uint32_t e = 0; e < n_experts_; e += 16) __builtin_prefetch(row + e);
    }
    last_tick_[detail::dense_index(key, n_experts_)] = a.tick;
  }

  /// Folds the open visit into its layer's statistics and re-ranks that layer.
  void fold_visit() noexcept {
    if (!visit_open_) return;
    visit_open_ = false;
    const std::uint32_t l = visit_layer_;
    const std::size_t base = std::size_t{l} * n_experts_;
    // Locals: the compiler cannot keep members in registers across stores that may alias them.
    const std::uint32_t* v = visit_.data();
    const std::size_t nv = visit_.size();
    for (const std::uint32_t a : last_[l]) {
      from_[base + a] += 1.0;
      std::int32_t* row = &trans_[(base + a) * n_experts_];
      for (std::size_t j = 0; j < nv; ++j)  // saturates at 2^31 − 1
        row[v[j]] += row[v[j]] != std::numeric_limits<std::int32_t>::max() ? 1 : 0;
    }
    const double gamma = cfg_.gamma;
    visits_[l] = gamma * visits_[l] + 1.0;
    double* c = &count_[base];
    for (std::uint32_t e = 0; e < n_experts_; ++e) c[e] *= gamma;
    for (std::size_t j = 0; j < nv; ++j) c[v[j]] += 1.0;
    last_[l].assign(visit_.begin(), visit_.end());
    visit_.clear();
    rerank_layer(l);
  }

  /// Adds a newly resident `key` with the current estimate of its p.
  void admit(ExpertKey key) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    const double g = g_of(estimate(key.layer, key.expert));
    if (pos_[i] == none) {
      auto& m = members_[key.layer];
      pos_[i] = static_cast<std::uint32_t>(m.size());
      m.push_back(key.expert);  // capacities reserved in bind(): never reallocate
      member_g_[key.layer].push_back(g);
      note_top(key.layer, pos_[i], g);
    } else {
      member_g_[key.layer][pos_[i]] = g;
      refresh_top(key.layer);  // its g may have been the largest
    }
  }
  /// Recomputes g of the residents of layer `l` with the same operations in the same order as
  /// `estimate` and `g_of`, so the same values (`admit` computes a newcomer's g).
  void rerank_layer(std::uint32_t l) noexcept {
    const std::size_t base = std::size_t{l} * n_experts_;
    const double k = last_[l].empty() ? double(top_k_) : double(last_[l].size());
    rows_.clear();
    for (const std::uint32_t a : last_[l]) rows_.push_back(&trans_[(base + a) * n_experts_]);
    const RerankInputs in{&count_[base],  k / double(n_experts_), visits_[l] + 1.0,
                          cfg_.prior,     rows_.data(),           rows_.size(),
                          n_experts_,     members_[l].data(),     members_[l].size(),
                          denominator(l), double(n_layers_)};
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__AVX__)
    if (rerank_avx_)
      rerank_avx(in, num_.data(), member_g_[l].data());
    else
      rerank_values(in, num_.data(), member_g_[l].data());
#else
    rerank_values(in, num_.data(), member_g_[l].data());
#endif
    refresh_top(l);
  }
  struct RerankInputs {
    const double* count;              ///< [expert] decayed counts of the layer
    double ke, v1, prior;             ///< k / E, V(l) + 1, prior
    const std::int32_t* const* rows;  ///< transition rows of last(l)
    std::size_t n_rows;
    std::uint32_t n_experts;
    const std::uint32_t* members;  ///< the layer's residents
    std::size_t n_members;
    double den, layers;
  };
  /// The numerators are summed for the whole layer in contiguous passes (the transition rows are
  /// streamed once, a block of experts held in registers across the rows); the two divisions of g
  /// run only for the residents, in member order. Writes `num` [expert] and `g` [member].
  [[gnu::always_inline]] static inline void rerank_values(const RerankInputs& in, double* num,
                                                          double* g) noexcept {
    // Locals: stores to num and g may alias `in`, which would force reloads in every iteration.
    const double* c = in.count;
    const double ke = in.ke, v1 = in.v1, prior = in.prior, den = in.den, layers = in.layers;
    const std::int32_t* const* rows = in.rows;
    const std::size_t n_rows = in.n_rows, n = in.n_members;
    const std::uint32_t* m = in.members;
    const std::uint32_t E = in.n_experts;
    for (std::uint32_t e = 0; e < E; ++e) num[e] = prior * ((c[e] + ke) / v1);
    constexpr std::uint32_t B = 8;
    std::uint32_t e0 = 0;
    for (; e0 + B <= E; e0 += B) {
      double acc[B];
      for (std::uint32_t i = 0; i < B; ++i) acc[i] = num[e0 + i];
      for (std::size_t r = 0; r < n_rows; ++r)
        for (std::uint32_t i = 0; i < B; ++i) acc[i] += double(rows[r][e0 + i]);
      for (std::uint32_t i = 0; i < B; ++i) num[e0 + i] = acc[i];
    }
    for (std::size_t r = 0; r < n_rows; ++r)
      for (std::uint32_t e = e0; e < E; ++e) num[e] += double(rows[r][e]);
    for (std::size_t j = 0; j < n; ++j) g[j] = num[m[j]];
    for (std::size_t j = 0; j < n; ++j) g[j] = layers * (1.0 / (g[j] / den) - 1.0);
  }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__AVX__)
  /// The same passes compiled for AVX (twice the divisions per instruction; IEEE division, no FMA
  /// in this target, so the same values bit for bit), chosen at run time when the CPU has it.
  [[gnu::target("avx")]] static void rerank_avx(const RerankInputs& in, double* num,
                                                double* g) noexcept {
    rerank_values(in, num, g);
  }
#endif
  /// Largest of `n` values (−inf if none), an index holding it, and the largest of the others
  /// (−inf if none; equal to the largest on a tie).
  struct TopTwo {
    double value;
    std::uint32_t at;
    double next;
  };
  /// Branch-free (the values come in no order, so a branch on "new largest" mispredicts): four
  /// lanes (lane k holds the indices ≡ k mod 4) keep their largest and runner-up with min/max, are
  /// merged, and the holder is looked for in the winning lane only.
  [[nodiscard]] static TopTwo top_two(const double* v, std::size_t n) noexcept {
    constexpr double lo = -std::numeric_limits<double>::infinity();
    if (n == 0) return {lo, 0, lo};
#if defined(__SSE2__)
    // Two SSE2 registers of two lanes each, kept in registers through the merge (a store of the
    // lanes read back as scalars stalls on store forwarding). The tail is padded with −inf.
    __m128d h01 = _mm_set1_pd(lo), h23 = h01, r01 = h01, r23 = h01;
    const auto step = [&](__m128d x01, __m128d x23) {
      r01 = _mm_max_pd(r01, _mm_min_pd(h01, x01));
      r23 = _mm_max_pd(r23, _mm_min_pd(h23, x23));
      h01 = _mm_max_pd(h01, x01);
      h23 = _mm_max_pd(h23, x23);
    };
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) step(_mm_loadu_pd(v + i), _mm_loadu_pd(v + i + 2));
    if (i < n) {
      double t[4] = {lo, lo, lo, lo};
      for (std::size_t k = 0; i + k < n; ++k) t[k] = v[i + k];
      step(_mm_loadu_pd(t), _mm_loadu_pd(t + 2));
    }
    const __m128d m = _mm_max_pd(h01, h23);
    const __m128d top = _mm_max_pd(m, _mm_shuffle_pd(m, m, 1));  // the largest, in both halves
    const __m128d eq01 = _mm_cmpeq_pd(h01, top), eq23 = _mm_cmpeq_pd(h23, top);
    const unsigned lanes = unsigned(_mm_movemask_pd(eq01)) | unsigned(_mm_movemask_pd(eq23)) << 2;
    const double value = _mm_cvtsd_f64(top);
    double next = value;               // the largest in two lanes: a tie
    if ((lanes & (lanes - 1)) == 0) {  // one lane: its runner-up and the other lanes' largest
      const __m128d s01 = _mm_or_pd(_mm_and_pd(eq01, r01), _mm_andnot_pd(eq01, h01));
      const __m128d s23 = _mm_or_pd(_mm_and_pd(eq23, r23), _mm_andnot_pd(eq23, h23));
      const __m128d s = _mm_max_pd(s01, s23);
      next = _mm_cvtsd_f64(_mm_max_pd(s, _mm_shuffle_pd(s, s, 1)));
    }
    std::size_t at = static_cast<std::size_t>(std::countr_zero(lanes));
#else
    double h[4] = {lo, lo, lo, lo}, r[4] = {lo, lo, lo, lo};
    for (std::size_t i = 0; i < n; ++i) {
      r[i % 4] = std::max(r[i % 4], std::min(h[i % 4], v[i]));
      h[i % 4] = std::max(h[i % 4], v[i]);
    }
    std::size_t at = 0;
    for (std::size_t k = 1; k < 4; ++k) at = h[k] > h[at] ? k : at;
    const double value = h[at];
    double next = r[at];  // every lane's runner-up is at most its largest
    for (std::size_t k = 0; k < 4; ++k) next = k == at ? next : std::max(next, h[k]);
#endif
    while (v[at] != value) at += 4;
    return {value, static_cast<std::uint32_t>(at), next};
  }
  /// Recomputes layer `l`'s largest g, its holder and the runner-up.
  void refresh_top(std::uint32_t l) noexcept {
    const TopTwo t = top_two(member_g_[l].data(), member_g_[l].size());
    max_g_[l] = t.value;
    top_[l] = t.at;
    next_g_[l] = t.next;
  }
  /// Folds a new resident at index `j` with `g` into layer `l`'s largest and runner-up.
  void note_top(std::uint32_t l, std::uint32_t j, double g) noexcept {
    if (g > max_g_[l]) {
      next_g_[l] = max_g_[l];
      max_g_[l] = g;
      top_[l] = j;
    } else if (g > next_g_[l]) {
      next_g_[l] = g;
    }
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
  std::vector<double> from_;    ///< [layer][from] visits that followed one where `from` was chosen
  std::vector<double> count_;   ///< [layer][expert] decayed selection counts
  std::vector<double> visits_;  ///< [layer] decayed visit count
  std::vector<std::vector<std::uint32_t>> last_;  ///< [layer] experts chosen at its last visit
  std::vector<std::uint32_t> visit_;              ///< experts of the open visit
  std::uint32_t visit_layer_ = 0;
  std::uint64_t visit_token_ = 0;
  bool visit_open_ = false;
  std::vector<std::uint64_t> last_tick_;  ///< [expert] tick of the last demand or prefetch landing
  std::vector<std::vector<std::uint32_t>> members_;  ///< [layer] resident experts, unordered
  std::vector<std::vector<double>> member_g_;        ///< [layer] g of members_, same order
  std::vector<std::uint32_t> pos_;  ///< [expert] index in its layer's members, `none` if absent
  std::vector<const std::int32_t*> rows_;  ///< rerank's scratch: transition rows of last(l)
  std::vector<double> num_;                ///< rerank's scratch: [expert] numerator of p
  bool rerank_avx_ = false;                ///< re-rank with the AVX passes (see bind)
  std::vector<double> max_g_;              ///< [layer] largest g of its residents, −inf if none
  std::vector<double> next_g_;  ///< [layer] largest g of the others than top_ (= max_g_ on a tie)
  std::vector<std::uint32_t> top_;     ///< [layer] index in members_ of a resident holding max_g_
  mutable std::vector<double> bound_;  ///< victim's scratch: [layer] largest E[t] of the layer
  std::vector<double> ramp_;  ///< [j] the layer distance j mod L as a double, L for 0; j < 2L
};
static_assert(CachePolicy<ExpectedNextUsePolicy>);

}  // namespace moekit
