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

#include "moekit/cache/detail/resident_set.hpp"
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
    residents_.reset(shape.expert_count());
  }
  void begin_sequence() noexcept {
    if (cfg_.scope == CountScope::sequence) records_.clear_counts();
  }
  void on_hit(ExpertKey key, const AccessInfo& a) noexcept {
    records_.use(detail::dense_index(key, n_experts_), a, a.token, cfg_.high);
  }
  void on_insert(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    residents_.insert(i);
    if (a.prefetch) records_.touch(i, a);
    else records_.use(i, a, a.token, cfg_.high);
  }
  void on_evict(ExpertKey key) noexcept { residents_.erase(detail::dense_index(key, n_experts_)); }

  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    std::optional<ExpertKey> best;
    const detail::UseRecord* rb = nullptr;
    for (const std::uint32_t i : residents_.items()) {
      const ExpertKey k = detail::dense_key(i, n_experts_);
      if (!q.evictable(k)) continue;
      const detail::UseRecord& r = records_[i];
      if (!best || r.high_uses < rb->high_uses ||
          (r.high_uses == rb->high_uses &&
           (r.last_tick < rb->last_tick || (r.last_tick == rb->last_tick && k < *best)))) {
        best = k;
        rb = &r;
      }
    }
    return best;
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
  detail::ResidentSet residents_;
};
static_assert(CachePolicy<LhuPolicy>);

}  // namespace moekit
