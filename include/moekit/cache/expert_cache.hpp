#pragma once
/// \file ExpertCache<Policy>: residency, pools, pins and statistics; the policy only ranks.
///
/// The cache holds at most one copy of each expert. A copy at a higher precision serves a request
/// for a lower one (HOBBIT's cross-precision hit); a request for a higher precision than the
/// resident copy replaces that copy (an upgrade counts as a miss). Capacity is counted in bytes,
/// per pool; a policy may split the budget into pools (HOBBIT's high/low pools, Fate's per-layer
/// budgets) through its optional `pool_capacities`/`pool_of` members.
///
/// Pins: a *hard* pin (needed by the layer being computed) is never evicted, nor is an entry whose
/// load is in flight (`mark_loading` to `mark_loaded`: the cache itself keeps it); a *soft* pin
/// (predicted for a later layer) is evicted only when nothing unpinned is left in the pool.
/// The cache owns the arena behind its slots (`ExpertArena`, when its owner keeps bytes): an
/// entry that leaves the cache releases its slot's buffer.
/// All per-access operations are O(1) plus the policy's own cost, and allocate nothing.
/// Policy hooks are called only when the policy declares them (core/hooks.hpp):
/// `prepare_insert(key, access)` is called by `insert` once the insertion is known to go ahead and
/// before it asks for any victim.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "moekit/cache/expert_arena.hpp"
#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// Counters of an ExpertCache.
struct CacheStats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t inserts = 0;
  std::uint64_t evictions = 0;
  std::uint64_t insert_failures = 0;  ///< no evictable entry could make room
  std::uint64_t bytes_inserted = 0;
  std::uint64_t wasted_prefetches = 0;  ///< prefetched, then evicted or erased unused
  std::uint64_t wasted_prefetch_bytes = 0;
};

/// Why an insertion failed.
enum class InsertStatus : std::uint8_t {
  inserted,
  too_large,   ///< the expert is larger than its pool's whole capacity
  all_pinned,  ///< every resident of the pool is pinned
};

template <class Policy>
class ExpertCache {
  static_assert(assert_cache_policy<Policy>());

 public:
  /// One resident copy.
  struct Entry {
    Precision precision = Precision::skip;  ///< `skip` = not resident
    std::uint32_t pool = 0;
    std::uint32_t slot = 0;
    std::uint32_t hard_pins = 0;
    std::uint32_t soft_pins = 0;
    bool loading = false;            ///< its load has not been seen complete yet: unevictable
    bool prefetched_unused = false;  ///< inserted by a prefetch and not used since
    LoadTicket ticket{};
    std::size_t bytes = 0;

    [[nodiscard]] bool resident() const noexcept { return precision != Precision::skip; }
  };

  /// A pool: a byte capacity shared by the experts assigned to it.
  struct Pool {
    std::size_t capacity_bytes = 0;
    std::size_t used_bytes = 0;
    std::uint32_t entries = 0;
  };

  /// Result of `insert`.
  struct InsertResult {
    InsertStatus status = InsertStatus::inserted;
    std::uint32_t slot = 0;
    [[nodiscard]] bool ok() const noexcept { return status == InsertStatus::inserted; }
  };

  /// `budget_bytes` is split into pools by the policy (one pool by default). `sizing` is the
  /// precision the policy assumes when it converts bytes into expert counts. `arena` holds the
  /// bytes of slots 0..expert_count-1 (and of any further slots its owner hands out itself, as
  /// the pipeline's staging slots); a default arena holds none.
  ExpertCache(const ModelShape& shape, std::size_t budget_bytes, Precision sizing,
              Policy policy = Policy{}, ExpertArena arena = ExpertArena{})
      : shape_(shape),
        policy_(std::move(policy)),
        arena_(std::move(arena)),
        entries_(shape.expert_count()) {
    MOEKIT_EXPECTS(arena_.slots() == 0 || arena_.slots() >= shape.expert_count(),
                   "ExpertCache: the arena needs a buffer per cache slot (n_layers x n_experts)");
    shape_.validate();
    if constexpr (declares<Policy>(Hook::bind)) policy_.bind(shape_);
    std::vector<std::size_t> caps;
    if constexpr (declares<Policy>(Hook::pool_capacities)) {
      caps = policy_.pool_capacities(shape_, budget_bytes, sizing);
    } else {
      caps = {budget_bytes};
    }
    MOEKIT_EXPECTS(!caps.empty(), "cache policy returned no pools");
    pools_.resize(caps.size());
    for (std::size_t i = 0; i < caps.size(); ++i) pools_[i].capacity_bytes = caps[i];
    free_slots_.reserve(shape_.expert_count());
    for (std::size_t i = shape_.expert_count(); i-- > 0;)
      free_slots_.push_back(static_cast<std::uint32_t>(i));
  }

  // ---- queries ----------------------------------------------------------------------------------
  [[nodiscard]] const ModelShape& shape() const noexcept { return shape_; }
  [[nodiscard]] const Entry& entry(ExpertKey key) const noexcept {
    return entries_[shape_.index(key)];
  }
  [[nodiscard]] bool resident(ExpertKey key) const noexcept { return entry(key).resident(); }
  /// Resident at a precision that serves `want`.
  [[nodiscard]] bool resident_at(ExpertKey key, Precision want) const noexcept {
    const Entry& e = entry(key);
    return e.resident() && satisfies(e.precision, want);
  }
  /// Pinned, hard or soft, or loading.
  [[nodiscard]] bool pinned(ExpertKey key) const noexcept {
    const Entry& e = entry(key);
    return e.hard_pins > 0 || e.soft_pins > 0 || e.loading;
  }
  /// The memory behind the slots.
  [[nodiscard]] ExpertArena& arena() noexcept { return arena_; }
  [[nodiscard]] const ExpertArena& arena() const noexcept { return arena_; }
  [[nodiscard]] std::uint32_t pool_of(ExpertKey key, Precision p) const noexcept {
    if constexpr (declares<Policy>(Hook::pool_of)) {
      return static_cast<std::uint32_t>(policy_.pool_of(key, p));
    } else {
      (void)key, (void)p;
      return 0;
    }
  }
  [[nodiscard]] const std::vector<Pool>& pools() const noexcept { return pools_; }
  [[nodiscard]] std::size_t capacity_bytes() const noexcept {
    std::size_t c = 0;
    for (const Pool& p : pools_) c += p.capacity_bytes;
    return c;
  }
  [[nodiscard]] std::size_t used_bytes() const noexcept {
    std::size_t c = 0;
    for (const Pool& p : pools_) c += p.used_bytes;
    return c;
  }
  [[nodiscard]] std::size_t resident_count() const noexcept {
    std::size_t c = 0;
    for (const Pool& p : pools_) c += p.entries;
    return c;
  }
  [[nodiscard]] const CacheStats& stats() const noexcept { return stats_; }
  [[nodiscard]] Policy& policy() noexcept { return policy_; }
  [[nodiscard]] const Policy& policy() const noexcept { return policy_; }
  [[nodiscard]] std::uint64_t tick() const noexcept { return tick_; }
  [[nodiscard]] std::uint64_t token() const noexcept { return token_; }

  // ---- events -----------------------------------------------------------------------------------
  /// A new sequence: policies with per-sequence records reset them (HOBBIT, LFU-per-sequence).
  void begin_sequence() {
    if constexpr (declares<Policy>(Hook::begin_sequence)) policy_.begin_sequence();
  }
  /// `n` new tokens enter the model (at layer 0).
  void begin_token(std::uint32_t n = 1) {
    token_ += n;
    if constexpr (declares<Policy>(Hook::begin_token)) policy_.begin_token(n);
  }

  /// Fills the fields the cache owns in `a` (tick, token).
  [[nodiscard]] AccessInfo access(Precision p, std::uint32_t layer, std::uint32_t n_tokens = 1,
                                  bool prefetch = false) noexcept {
    AccessInfo a;
    a.precision = p;
    a.layer = layer;
    a.n_layers = shape_.n_layers;
    a.tick = ++tick_;
    a.token = token_;
    a.n_tokens = n_tokens;
    a.n_tokens_asking = n_tokens;
    a.prefetch = prefetch;
    return a;
  }

  /// Records a demand hit on a resident `key`.
  void on_hit(ExpertKey key, const AccessInfo& a) {
    Entry& e = at(key);
    e.prefetched_unused = false;
    ++stats_.hits;
    policy_.on_hit(key, a);
  }
  /// Records a demand miss (statistics only; `insert` does the work).
  void count_miss() noexcept { ++stats_.misses; }

  /// Makes `key` resident at precision `a.precision`, evicting as needed. A resident copy at a
  /// lower precision is replaced. The new entry's slot is returned.
  InsertResult insert(ExpertKey key, const AccessInfo& a) {
    MOEKIT_EXPECTS(shape_.contains(key), "ExpertCache::insert: key outside the model shape");
    MOEKIT_EXPECTS(a.precision != Precision::skip, "ExpertCache::insert: `skip` is not a format");
    Entry& e = at(key);
    if (e.resident()) {
      if (e.hard_pins > 0 || e.loading) return fail(InsertStatus::all_pinned);
      evict(key);
    }
    const std::uint32_t pool = pool_of(key, a.precision);
    MOEKIT_EXPECTS(pool < pools_.size(), "cache policy's pool_of returned an unknown pool");
    const std::size_t bytes = shape_.expert_bytes(a.precision);
    Pool& p = pools_[pool];
    if (bytes > p.capacity_bytes) return fail(InsertStatus::too_large);
    // Lets a policy tell a demand from a prefetch before it names victims (ARC adapts only on
    // demands); EvictionQuery does not carry the access.
    if constexpr (declares<Policy>(Hook::prepare_insert)) policy_.prepare_insert(key, a);
    while (p.used_bytes + bytes > p.capacity_bytes) {
      std::optional<ExpertKey> v = pick_victim(pool, key, a, /*allow_soft=*/false);
      if (!v) v = pick_victim(pool, key, a, /*allow_soft=*/true);
      if (!v) return fail(InsertStatus::all_pinned);
      evict(*v);
    }
    e.precision = a.precision;
    e.pool = pool;
    e.slot = free_slots_.back();
    free_slots_.pop_back();
    e.bytes = bytes;
    e.hard_pins = e.soft_pins = 0;
    e.loading = false;
    e.prefetched_unused = a.prefetch;
    e.ticket = {};
    p.used_bytes += bytes;
    ++p.entries;
    ++stats_.inserts;
    stats_.bytes_inserted += bytes;
    policy_.on_insert(key, a);
    return {InsertStatus::inserted, e.slot};
  }

  /// Raises resident `key` (neither hard-pinned nor loading) to the more precise `a.precision` in
  /// place, its slot kept: a lazy upgrade (cache/lazy_upgrade.hpp), not an access, so the policy
  /// is told only of the evictions that make room in its pool. Returns false, changing nothing,
  /// when no room can be made or the new precision belongs to another pool.
  bool upgrade(ExpertKey key, const AccessInfo& a) {
    Entry& e = at(key);
    if (!e.resident() || e.hard_pins > 0 || e.loading || !satisfies(a.precision, e.precision) ||
        pool_of(key, a.precision) != e.pool)
      return false;
    const std::size_t bytes = shape_.expert_bytes(a.precision);
    Pool& p = pools_[e.pool];
    if (bytes - e.bytes > p.capacity_bytes - std::min(p.capacity_bytes, p.used_bytes)) {
      ++e.hard_pins;  // not its own victim
      while (p.used_bytes - e.bytes + bytes > p.capacity_bytes) {
        std::optional<ExpertKey> v = pick_victim(e.pool, key, a, /*allow_soft=*/false);
        if (!v) v = pick_victim(e.pool, key, a, /*allow_soft=*/true);
        if (!v) {
          --e.hard_pins;
          return false;
        }
        evict(*v);
      }
      --e.hard_pins;
    }
    p.used_bytes += bytes - e.bytes;
    stats_.bytes_inserted += bytes - e.bytes;
    e.bytes = bytes;
    e.precision = a.precision;
    return true;
  }

  /// Removes `key` (it must be neither hard-pinned nor loading). Used for evictions and upgrades;
  /// a prefetched copy never used counts as wasted.
  void evict(ExpertKey key) { remove(key, /*count_unused_prefetch=*/true); }

  /// The load of `key` (loading, not hard-pinned) was withdrawn before it moved any bytes: the
  /// entry leaves the cache, not counted as a wasted prefetch.
  void cancel_load(ExpertKey key) {
    Entry& e = at(key);
    if (!e.loading)
      detail::fail(ErrorKind::internal, "ExpertCache::cancel_load: the expert is not loading");
    e.loading = false;
    e.ticket = {};
    remove(key, /*count_unused_prefetch=*/false);
  }

  void pin_hard(ExpertKey key) noexcept { ++at(key).hard_pins; }
  void unpin_hard(ExpertKey key) noexcept {
    Entry& e = at(key);
    if (e.hard_pins > 0) --e.hard_pins;
  }
  void pin_soft(ExpertKey key) noexcept { ++at(key).soft_pins; }
  void unpin_soft(ExpertKey key) noexcept {
    Entry& e = at(key);
    if (e.soft_pins > 0) --e.soft_pins;
  }
  /// Marks `key` as loading under `ticket` (its bytes are not usable until `mark_loaded`).
  void mark_loading(ExpertKey key, LoadTicket ticket) noexcept {
    Entry& e = at(key);
    e.loading = true;
    e.ticket = ticket;
  }
  void mark_loaded(ExpertKey key) noexcept {
    Entry& e = at(key);
    e.loading = false;
    e.ticket = {};
  }

  /// Checks every invariant; throws `Error(internal)` naming the broken one. For tests.
  void check_invariants() const {
    std::vector<std::size_t> used(pools_.size(), 0);
    std::vector<std::uint32_t> count(pools_.size(), 0);
    std::vector<bool> slot_seen(shape_.expert_count(), false);
    for (const Entry& e : entries_) {
      if (!e.resident()) continue;
      if (e.pool >= pools_.size()) detail::fail(ErrorKind::internal, "entry in unknown pool");
      if (e.slot >= slot_seen.size() || slot_seen[e.slot])
        detail::fail(ErrorKind::internal, "slot out of range or used twice");
      slot_seen[e.slot] = true;
      used[e.pool] += e.bytes;
      ++count[e.pool];
    }
    for (std::size_t i = 0; i < pools_.size(); ++i) {
      if (used[i] != pools_[i].used_bytes || count[i] != pools_[i].entries)
        detail::fail(ErrorKind::internal, "pool accounting disagrees with its entries");
      if (used[i] > pools_[i].capacity_bytes)
        detail::fail(ErrorKind::internal, "pool over capacity");
    }
  }

 private:
  Entry& at(ExpertKey key) noexcept { return entries_[shape_.index(key)]; }

  InsertResult fail(InsertStatus s) noexcept {
    ++stats_.insert_failures;
    return {s, 0};
  }

  // The entry leaves the cache: pool accounting, statistics, the policy, its slot and the slot's
  // buffer.
  void remove(ExpertKey key, bool count_unused_prefetch) {
    Entry& e = at(key);
    if (!e.resident()) return;
    if (e.hard_pins > 0)
      detail::fail(ErrorKind::internal, "ExpertCache: attempt to evict a hard-pinned expert");
    if (e.loading)
      detail::fail(ErrorKind::internal, "ExpertCache: attempt to evict an expert still loading");
    Pool& p = pools_[e.pool];
    p.used_bytes -= e.bytes;
    --p.entries;
    if (e.prefetched_unused && count_unused_prefetch) {
      ++stats_.wasted_prefetches;
      stats_.wasted_prefetch_bytes += e.bytes;
    }
    free_slots_.push_back(e.slot);
    ++stats_.evictions;
    policy_.on_evict(key);
    if (arena_.slots() != 0) arena_.release(e.slot);
    e = Entry{};
  }

  struct PredicateState {
    const ExpertCache* cache;
    std::uint32_t pool;
    bool allow_soft;
  };
  static bool evictable_fn(const void* owner, ExpertKey key) noexcept {
    const auto* s = static_cast<const PredicateState*>(owner);
    if (!s->cache->shape_.contains(key)) return false;
    const Entry& e = s->cache->entry(key);
    return e.resident() && e.pool == s->pool && e.hard_pins == 0 && !e.loading &&
           (s->allow_soft || e.soft_pins == 0);
  }

  std::optional<ExpertKey> pick_victim(std::uint32_t pool, ExpertKey incoming, const AccessInfo& a,
                                       bool allow_soft) {
    const PredicateState state{this, pool, allow_soft};
    EvictionQuery q{.pool = pool,
                    .incoming = incoming,
                    .incoming_precision = a.precision,
                    .layer = a.layer,
                    .n_layers = shape_.n_layers,
                    .tick = a.tick,
                    .evictable = EvictablePredicate(&state, &evictable_fn)};
    std::optional<ExpertKey> v = policy_.victim(q);
    if (v && !evictable_fn(&state, *v))
      detail::fail(ErrorKind::internal,
                   "cache policy named a victim that is not resident, unpinned and in the pool");
    return v;
  }

  ModelShape shape_;
  Policy policy_;
  ExpertArena arena_;
  std::vector<Entry> entries_;
  std::vector<Pool> pools_;
  std::vector<std::uint32_t> free_slots_;
  CacheStats stats_{};
  std::uint64_t tick_ = 0;
  std::uint64_t token_ = 0;
};

}  // namespace moekit
