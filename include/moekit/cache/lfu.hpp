#pragma once
/// \file LfuPolicy: evict the least frequently used expert.
///
/// Counts are per expert and survive eviction ("perfect" LFU over the scope). With
/// `CountScope::sequence` they restart at each sequence: HOBBIT (Tang et al., 2024, §3.3) observes
/// that load balancing evens out expert frequencies over a corpus but single sequences prefer
/// particular experts, so only sequence-level counts carry signal. `CountScope::model` never resets.
/// A use by a forward of n tokens counts n. A prefetch insertion is not a use.
/// Victim: fewest uses, then least recently used (cache tick), then smallest (layer, expert).

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "moekit/cache/detail/dense_index.hpp"
#include "moekit/cache/detail/ranked_set.hpp"
#include "moekit/cache/detail/use_records.hpp"
#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/model_shape.hpp"

namespace moekit {

/// Least-frequently-used eviction, per sequence or over the model's lifetime.
class LfuPolicy {
 public:
  /// Run-time knobs.
  struct Config {
    CountScope scope = CountScope::sequence;  ///< when counts restart
  };

  LfuPolicy() = default;
  explicit LfuPolicy(Config cfg) : cfg_(cfg) {}

  void bind(const ModelShape& shape) {
    n_experts_ = shape.n_experts;
    records_.reset(shape.expert_count());
    ranked_.reset(shape.expert_count());
  }
  void begin_sequence() {
    if (cfg_.scope != CountScope::sequence) return;
    records_.clear_counts();
    const auto m = ranked_.members();
    const std::vector<std::uint32_t> members(m.begin(), m.end());
    for (const std::uint32_t i : members) rerank(i);
  }
  void on_hit(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    records_.use(i, a, a.token, a.precision);
    if (ranked_.contains(i)) rerank(i);
  }
  void on_insert(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    if (a.prefetch) records_.touch(i, a);
    else records_.use(i, a, a.token, a.precision);
    rerank(i);
  }
  void on_evict(ExpertKey key) noexcept { ranked_.erase(detail::dense_index(key, n_experts_)); }

  /// The lowest-ranked evictable resident: O(log n) updates keep a heap, and the search expands
  /// only pinned entries.
  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    const auto i = ranked_.first(
        [&](std::uint32_t j) { return q.evictable(detail::dense_key(j, n_experts_)); });
    if (!i) return std::nullopt;
    return detail::dense_key(*i, n_experts_);
  }

  /// Uses of `key` counted in the current scope.
  [[nodiscard]] std::uint64_t uses(ExpertKey key) const noexcept {
    return records_[detail::dense_index(key, n_experts_)].uses;
  }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  Config cfg_{};
  std::uint32_t n_experts_ = 0;
  detail::UseRecords records_;
  // Rank: (count, last tick); the index breaks the remaining ties (smaller (layer, expert)).
  detail::RankedSet<std::pair<std::uint64_t, std::uint64_t>> ranked_;

  void rerank(std::uint32_t i) noexcept {
    ranked_.update(i, {records_[i].uses, records_[i].last_tick});
  }
};
static_assert(CachePolicy<LfuPolicy>);

}  // namespace moekit
