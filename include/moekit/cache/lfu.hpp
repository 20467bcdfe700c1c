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

#include "moekit/cache/detail/resident_set.hpp"
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
    residents_.reset(shape.expert_count());
  }
  void begin_sequence() noexcept {
    if (cfg_.scope == CountScope::sequence) records_.clear_counts();
  }
  void on_hit(ExpertKey key, const AccessInfo& a) noexcept {
    records_.use(detail::dense_index(key, n_experts_), a, a.token, a.precision);
  }
  void on_insert(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    residents_.insert(i);
    if (a.prefetch) records_.touch(i, a);
    else records_.use(i, a, a.token, a.precision);
  }
  void on_evict(ExpertKey key) noexcept { residents_.erase(detail::dense_index(key, n_experts_)); }

  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    std::optional<ExpertKey> best;
    const detail::UseRecord* rb = nullptr;
    for (const std::uint32_t i : residents_.items()) {
      const ExpertKey k = detail::dense_key(i, n_experts_);
      if (!q.evictable(k)) continue;
      const detail::UseRecord& r = records_[i];
      if (!best || r.uses < rb->uses ||
          (r.uses == rb->uses &&
           (r.last_tick < rb->last_tick || (r.last_tick == rb->last_tick && k < *best)))) {
        best = k;
        rb = &r;
      }
    }
    return best;
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
  detail::ResidentSet residents_;
};
static_assert(CachePolicy<LfuPolicy>);

}  // namespace moekit
