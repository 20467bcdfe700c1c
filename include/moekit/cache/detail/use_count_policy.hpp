#pragma once
/// \file The machinery LFU and LHU share: per-expert use counts ranked in a heap.
///
/// Victim: fewest counted uses, then least recently used (cache tick), then smallest
/// (layer, expert). Counts belong to the expert and survive eviction; with `CountScope::sequence`
/// they restart at each sequence. A use by a forward of n tokens counts n; a prefetch insertion is
/// not a use.

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "moekit/cache/detail/dense_index.hpp"
#include "moekit/cache/detail/ranked_set.hpp"
#include "moekit/cache/detail/use_records.hpp"
#include "moekit/core/cache_events.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/model_shape.hpp"

namespace moekit::detail {

/// Which uses a counting policy ranks by.
enum class CountedUses : std::uint8_t {
  all,             ///< every use (LFU)
  high_precision,  ///< uses that asked for at least the `high` precision (HOBBIT's LHU)
};

template <CountedUses Counted>
class UseCountPolicy {
 public:
  static constexpr Hooks hooks = Hook::bind | Hook::begin_sequence;
  void bind(const ModelShape& shape) {
    n_experts_ = shape.n_experts;
    records_.reset(shape.expert_count());
    ranked_.reset(shape.expert_count());
  }
  void begin_sequence() {
    if (scope_ != CountScope::sequence) return;
    records_.clear_counts();
    const auto m = ranked_.members();
    const std::vector<std::uint32_t> members(m.begin(), m.end());
    for (const std::uint32_t i : members) rerank(i);
  }
  void on_hit(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = dense_index(key, n_experts_);
    records_.use(i, a, a.token, high_);
    if (ranked_.contains(i)) rerank(i);
  }
  void on_insert(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = dense_index(key, n_experts_);
    if (a.prefetch)
      records_.touch(i, a);
    else
      records_.use(i, a, a.token, high_);
    rerank(i);
  }
  void on_evict(ExpertKey key) noexcept { ranked_.erase(dense_index(key, n_experts_)); }

  /// The lowest-ranked evictable resident: O(log n) updates keep a heap, and the search expands
  /// only pinned entries.
  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    const auto i =
        ranked_.first([&](std::uint32_t j) { return q.evictable(dense_key(j, n_experts_)); });
    if (!i) return std::nullopt;
    return dense_key(*i, n_experts_);
  }

 protected:
  UseCountPolicy(CountScope scope, Precision high) noexcept : scope_(scope), high_(high) {}

  /// Counted uses of `key` in the current scope.
  [[nodiscard]] std::uint64_t counted(ExpertKey key) const noexcept {
    return count(dense_index(key, n_experts_));
  }

 private:
  [[nodiscard]] std::uint64_t count(std::uint32_t i) const noexcept {
    return Counted == CountedUses::all ? records_[i].uses : records_[i].high_uses;
  }
  void rerank(std::uint32_t i) noexcept { ranked_.update(i, {count(i), records_[i].last_tick}); }

  CountScope scope_;
  Precision high_;
  std::uint32_t n_experts_ = 0;
  UseRecords records_;
  // Rank: (count, last tick); the index breaks the remaining ties (smaller (layer, expert)).
  RankedSet<std::pair<std::uint64_t, std::uint64_t>> ranked_;
};

}  // namespace moekit::detail
