#pragma once
/// \file MultiDimPolicy: HOBBIT's sequence-level multidimensional cache (LRU + LFU + LHU + FLD).
///
/// HOBBIT (Tang et al., "HOBBIT: A Mixed Precision Expert Offloading System for Fast MoE
/// Inference", 2024, §3.3, Eq. 3) keeps, per expert and per sequence, the token of its last use R,
/// its use count F and its high-precision use count H, and ranks a cached expert t, while layer l_i
/// is being computed at token T of the sequence, by
///
///   prio(t) = w_lru·R_t/T + w_lfu·F_t/T + w_lhu·H_t/T + w_fld·(1 − ((l_t − l_i + L) mod L)/L)
///
/// with user weights summing to 1; the lowest priority is evicted. Records reset at each sequence
/// (the cache contents are kept). High- and low-precision versions live in separate pools: pool 0
/// holds copies at >= `Config::high` bits, pool 1 the rest. HOBBIT's high pool is "typically
/// larger" than the low one (§3.3), with no ratio given; moekit's default gives the pools slots in
/// the proportion of the paper's high and low decisions on Mixtral (67 % and 30 % of the
/// selections, Fig. 5-b): 67/97 = 69 % of the slots, 90 % of the bytes at f16/q4.
/// Experts predicted for later layers are soft-pinned by ExpertCache, so they are masked from
/// eviction while anything else is evictable. Ties: smaller R, then smaller F, then least recently
/// used (cache tick), then smallest (layer, expert). T counts tokens from `begin_token(n)`; before
/// the first token T is taken as 1.

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/cache/detail/dense_index.hpp"
#include "moekit/cache/detail/ranked_set.hpp"
#include "moekit/cache/detail/use_records.hpp"
#include "moekit/cache/fld.hpp"
#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// HOBBIT's weighted LRU/LFU/LHU/FLD eviction with separate high/low precision pools.
class MultiDimPolicy {
 public:
  static constexpr std::string_view name = "multidim";
  static constexpr Hooks hooks =
      Hook::bind | Hook::pool_capacities | Hook::pool_of | Hook::begin_sequence | Hook::begin_token;
  /// Run-time knobs. The four weights must be >= 0 and sum to 1 (HOBBIT does not publish its
  /// tuned values; equal weights are moekit's default).
  struct Config {
    double w_lru = 0.25;
    double w_lfu = 0.25;
    double w_lhu = 0.25;
    double w_fld = 0.25;
    Precision high = Precision::f16;  ///< copies at >= this many bits go to the high pool (0)
    Precision low = Precision::q4;    ///< precision of the low pool's slots (sizing only)
    /// Share of the slots in the high pool, in [0, 1] (default: HOBBIT's 67 : 30 split of high
    /// and low decisions, see the file comment; 0.5 gives both pools as many slots).
    double high_slot_fraction = 67.0 / 97.0;
    std::size_t high_pool_bytes = 0;  ///< if non-zero: byte split instead of the slot fraction
  };

  MultiDimPolicy() = default;
  explicit MultiDimPolicy(Config cfg) : cfg_(cfg) { validate(cfg_); }

  /// Throws `moekit::Error` naming the first Config field that cannot work.
  static void validate(const Config& c) {
    const double w[] = {c.w_lru, c.w_lfu, c.w_lhu, c.w_fld};
    const char* names[] = {"w_lru", "w_lfu", "w_lhu", "w_fld"};
    for (int i = 0; i < 4; ++i)
      MOEKIT_EXPECTS(std::isfinite(w[i]) && w[i] >= 0.0,
                     std::string("MultiDimPolicy::Config.") + names[i] + " must be >= 0");
    MOEKIT_EXPECTS(std::abs(w[0] + w[1] + w[2] + w[3] - 1.0) <= 1e-9,
                   "MultiDimPolicy::Config: w_lru + w_lfu + w_lhu + w_fld must sum to 1");
    MOEKIT_EXPECTS(c.high != Precision::skip && c.low != Precision::skip,
                   "MultiDimPolicy::Config.high/low must be stored precisions, not skip");
    MOEKIT_EXPECTS(bits(c.low) < bits(c.high),
                   "MultiDimPolicy::Config.low must have fewer bits than Config.high");
    MOEKIT_EXPECTS(c.high_slot_fraction >= 0.0 && c.high_slot_fraction <= 1.0,
                   "MultiDimPolicy::Config.high_slot_fraction must be in [0, 1]");
  }

  void bind(const ModelShape& shape) {
    n_experts_ = shape.n_experts;
    n_layers_ = shape.n_layers;
    records_.reset(shape.expert_count());
    pool_.assign(shape.expert_count(), 0);
    ranked_.assign(2 * std::size_t{n_layers_}, {});
    for (auto& r : ranked_) r.reset(n_experts_);
    min_s_.assign(ranked_.size(), std::numeric_limits<double>::infinity());
    fld_.resize(n_layers_);
    for (std::uint32_t d = 0; d < n_layers_; ++d)
      fld_[d] = cfg_.w_fld * (1.0 - double(d) / double(n_layers_));
    bound_.assign(n_layers_, 0.0);
  }

  /// Pool 0 (high) and pool 1 (low). `sizing` is not used: the pools are sized by
  /// `Config::high` and `Config::low`. The low pool gets every byte the high pool does not.
  [[nodiscard]] std::vector<std::size_t> pool_capacities(const ModelShape& shape,
                                                         std::size_t budget, Precision) const {
    const std::size_t bh = shape.expert_bytes(cfg_.high), bl = shape.expert_bytes(cfg_.low);
    std::size_t high_bytes = cfg_.high_pool_bytes;
    if (high_bytes == 0) {
      const double s = cfg_.high_slot_fraction;
      const double per_slot = s * double(bh) + (1.0 - s) * double(bl);
      const double slots = std::floor(double(budget) / per_slot);
      high_bytes = static_cast<std::size_t>(std::floor(s * slots + 0.5)) * bh;
    }
    MOEKIT_EXPECTS(high_bytes <= budget,
                   "MultiDimPolicy::Config.high_pool_bytes exceeds the cache budget");
    return {high_bytes, budget - high_bytes};
  }
  [[nodiscard]] std::uint32_t pool_of(ExpertKey, Precision p) const noexcept {
    return bits(p) >= bits(cfg_.high) ? 0u : 1u;
  }

  void begin_sequence() {
    records_.clear_counts();
    token_ = 0;
    for (std::uint32_t pool = 0; pool < 2; ++pool)
      for (std::uint32_t l = 0; l < n_layers_; ++l) {
        const auto m = set(pool, l).members();
        const std::vector<std::uint32_t> members(m.begin(), m.end());
        for (const std::uint32_t e : members) rerank({l, e});
      }
  }
  void begin_token(std::uint32_t n) noexcept { token_ += n; }

  void on_hit(ExpertKey key, const AccessInfo& a) noexcept {
    records_.use(detail::dense_index(key, n_experts_), a, token_, cfg_.high);
    rerank(key);
  }
  /// A prefetch landing is not a use: its records are updated when its layer runs.
  void on_insert(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    if (a.prefetch)
      records_.touch(i, a);
    else
      records_.use(i, a, token_, cfg_.high);
    set(pool_[i], key.layer).erase(key.expert);
    sync_min(pool_[i], key.layer);
    pool_[i] = static_cast<std::uint8_t>(pool_of(key, a.precision));
    rerank(key);
  }
  void on_evict(ExpertKey key) noexcept {
    const std::uint32_t pool = pool_[detail::dense_index(key, n_experts_)];
    set(pool, key.layer).erase(key.expert);
    sync_min(pool, key.layer);
  }

  /// Within one layer Eq. 3 orders entries like S = w_lru·R + w_lfu·F + w_lhu·H (T and the FLD
  /// term are common), so each (pool, layer) keeps a heap on S and the lowest S of a layer bounds
  /// its priorities. The layer with the lowest bound is searched first; any other layer is searched
  /// only when its bound does not exceed the best priority found, so a victim usually costs one
  /// pass over the layers' bounds (no division, no modulo) and O(1 + pinned) heap entries. Inside
  /// a layer the heap is walked while Eq. 3 (as computed, in doubles) can still tie or win, so ties
  /// follow the documented order even when two different S round to the same priority.
  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    Best best;
    if (q.pool >= 2 || n_layers_ == 0) return std::nullopt;
    const double inv_t = 1.0 / (token_ == 0 ? 1.0 : double(token_));
    const std::uint32_t cur = q.layer % n_layers_;
    std::uint32_t first = n_layers_;
    double first_bound = 0.0, second_bound = std::numeric_limits<double>::infinity();
    const double* min_s = &min_s_[std::size_t{q.pool} * n_layers_];
    for (std::uint32_t l = 0, d = (n_layers_ - cur) % n_layers_; l < n_layers_;
         ++l, d = d + 1 == n_layers_ ? 0 : d + 1) {
      const double b = min_s[l] * inv_t + fld_[d];  // +inf for an empty layer
      bound_[l] = b;
      if (first == n_layers_ || b < first_bound) {
        if (first != n_layers_) second_bound = first_bound;
        first = l, first_bound = b;
      } else if (b < second_bound) {
        second_bound = b;
      }
    }
    if (first == n_layers_ || first_bound == std::numeric_limits<double>::infinity())
      return std::nullopt;
    search_layer(q, first, (first + n_layers_ - cur) % n_layers_, inv_t, best);
    if (best.key && best.p < second_bound) return best.key;  // no other layer can tie or win
    for (std::uint32_t l = 0, d = (n_layers_ - cur) % n_layers_; l < n_layers_;
         ++l, d = d + 1 == n_layers_ ? 0 : d + 1) {
      if (l == first || min_s[l] == std::numeric_limits<double>::infinity() ||
          (best.key && bound_[l] > best.p))
        continue;
      search_layer(q, l, d, inv_t, best);
    }
    return best.key;
  }

  /// Eq. 3 for `key` while layer `current_layer` runs (higher = keep).
  [[nodiscard]] double priority(ExpertKey key, std::uint32_t current_layer) const noexcept {
    return priority_of(records_[detail::dense_index(key, n_experts_)], key.layer, current_layer);
  }
  [[nodiscard]] std::uint64_t sequence_token() const noexcept { return token_; }
  [[nodiscard]] const detail::UseRecord& record(ExpertKey key) const noexcept {
    return records_[detail::dense_index(key, n_experts_)];
  }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  [[nodiscard]] double weighted(const detail::UseRecord& r) const noexcept {
    return cfg_.w_lru * double(r.last_token) + cfg_.w_lfu * double(r.uses) +
           cfg_.w_lhu * double(r.high_uses);
  }
  /// w_fld · (1 − d/L) for a layer d layers ahead (tabulated at bind: no division per victim).
  [[nodiscard]] double fld_term(std::uint32_t d) const noexcept { return fld_[d]; }

  /// The best victim so far: lowest priority, then smaller R, F, last tick, (layer, expert).
  struct Best {
    std::optional<ExpertKey> key;
    double p = 0.0;
    const detail::UseRecord* r = nullptr;
  };
  /// Offers every evictable entry of layer `l` (d layers ahead) that may beat or tie `best`.
  void search_layer(const EvictionQuery& q, std::uint32_t l, std::uint32_t d, double inv_t,
                    Best& best) const noexcept {
    const auto& heap = set(q.pool, l);
    const double fld = fld_[d];
    heap.walk([&](std::uint32_t e) {
      // Children have S >= their parent's, hence priorities >= (rounding is monotone).
      const double p = heap.rank(e).s * inv_t + fld;
      if (best.key && p > best.p) return false;
      const ExpertKey k{l, e};
      if (!q.evictable(k)) return true;
      const detail::UseRecord& r = records_[detail::dense_index(k, n_experts_)];
      if (!best.key || p < best.p || before_on_tie(r, k, *best.r, *best.key)) best = {k, p, &r};
      return true;
    });
  }
  [[nodiscard]] static bool before_on_tie(const detail::UseRecord& a, ExpertKey ka,
                                          const detail::UseRecord& b, ExpertKey kb) noexcept {
    if (a.last_token != b.last_token) return a.last_token < b.last_token;
    if (a.uses != b.uses) return a.uses < b.uses;
    if (a.last_tick != b.last_tick) return a.last_tick < b.last_tick;
    return ka < kb;
  }
  [[nodiscard]] double priority_of(const detail::UseRecord& r, std::uint32_t layer,
                                   std::uint32_t current) const noexcept {
    const double inv_t = 1.0 / (token_ == 0 ? 1.0 : double(token_));
    return weighted(r) * inv_t + fld_term(layer_distance(layer, current, n_layers_));
  }

  Config cfg_{};
  std::uint32_t n_experts_ = 0;
  std::uint32_t n_layers_ = 1;
  std::uint64_t token_ = 0;
  detail::UseRecords records_;
  std::vector<std::uint8_t> pool_;     ///< pool of each resident
  std::vector<double> fld_;            ///< [d] the FLD term of a layer d layers ahead
  mutable std::vector<double> bound_;  ///< victim's scratch: [layer] lowest priority in the pool
  /// [pool · n_layers + layer] lowest S of that heap, +inf if empty: the victim's first pass reads
  /// this one contiguous array instead of chasing every heap's storage.
  std::vector<double> min_s_;
  /// Rank inside one (pool, layer): (w_lru·R + w_lfu·F + w_lhu·H, R, F, last tick); the expert id
  /// breaks the remaining ties.
  struct Rank {
    double s;
    std::uint64_t r, f, tick;
    friend bool operator<(const Rank& a, const Rank& b) noexcept {
      if (a.s != b.s) return a.s < b.s;
      if (a.r != b.r) return a.r < b.r;
      if (a.f != b.f) return a.f < b.f;
      return a.tick < b.tick;
    }
  };
  std::vector<detail::RankedSet<Rank>> ranked_;  ///< [pool · n_layers + layer], indexed by expert

  [[nodiscard]] detail::RankedSet<Rank>& set(std::uint32_t pool, std::uint32_t layer) noexcept {
    return ranked_[std::size_t{pool} * n_layers_ + layer];
  }
  [[nodiscard]] const detail::RankedSet<Rank>& set(std::uint32_t pool,
                                                   std::uint32_t layer) const noexcept {
    return ranked_[std::size_t{pool} * n_layers_ + layer];
  }
  void rerank(ExpertKey key) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    const detail::UseRecord& r = records_[i];
    const Rank rank{weighted(r), r.last_token, r.uses, r.last_tick};
    set(pool_[i], key.layer).update(key.expert, rank);
    sync_min(pool_[i], key.layer);
  }
  /// Mirrors the lowest S of a (pool, layer) heap into `min_s_` (+inf when empty).
  void sync_min(std::uint32_t pool, std::uint32_t layer) noexcept {
    const auto& heap = set(pool, layer);
    min_s_[std::size_t{pool} * n_layers_ + layer] =
        heap.size() == 0 ? std::numeric_limits<double>::infinity() : heap.min_rank().s;
  }
};
static_assert(CachePolicy<MultiDimPolicy>);

}  // namespace moekit
