#pragma once
/// \file LhuPolicy: evict the least *high-precision* used expert (HOBBIT's LHU).
///
/// HOBBIT (Tang et al., 2024, §3.3, Fig. 11) caches experts at two precisions: a miss on a
/// high-precision request costs a full load, a miss on a low-precision one a fraction of it. So the
/// experts worth keeping are the ones used at high precision: LHU counts only uses whose requested
/// precision is at least `Config::high`; low-precision uses do not count. Counts are per expert,
/// survive eviction and restart per sequence (`CountScope::sequence`, HOBBIT's choice) or never.
/// A request served by a higher-precision copy counts at the precision it asked for.
/// Victim: fewest high uses, then least recently used (cache tick), then smallest (layer, expert).

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

/// Least-high-precision-used eviction.
class LhuPolicy {
 public:
  /// Run-time knobs.
  struct Config {
    CountScope scope = CountScope::sequence;  ///< when counts restart
    Precision high = Precision::f16;          ///< uses at >= this many bits count as high
  };

  LhuPolicy() = default;
  explicit LhuPolicy(Config cfg) : cfg_(cfg) {}

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
    records_.use(i, a, a.token, cfg_.high);
    if (ranked_.contains(i)) rerank(i);
  }
  void on_insert(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    if (a.prefetch) records_.touch(i, a);
    else records_.use(i, a, a.token, cfg_.high);
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

  /// High-precision uses of `key` counted in the current scope.
  [[nodiscard]] std::uint64_t high_uses(ExpertKey key) const noexcept {
    return records_[detail::dense_index(key, n_experts_)].high_uses;
  }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  Config cfg_{};
  std::uint32_t n_experts_ = 0;
  detail::UseRecords records_;
  // Rank: (count, last tick); the index breaks the remaining ties (smaller (layer, expert)).
  detail::RankedSet<std::pair<std::uint64_t, std::uint64_t>> ranked_;

  void rerank(std::uint32_t i) noexcept {
    ranked_.update(i, {records_[i].high_uses, records_[i].last_tick});
  }
};
static_assert(CachePolicy<LhuPolicy>);

}  // namespace moekit
