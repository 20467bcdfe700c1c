#pragma once
/// \file LfuPolicy: evict the least frequently used expert.
///
/// Counts are per expert and survive eviction ("perfect" LFU over the scope). With
/// `CountScope::sequence` they restart at each sequence: HOBBIT (Tang et al., 2024, §3.3) observes
/// that load balancing evens out expert frequencies over a corpus but single sequences prefer
/// particular experts, so only sequence-level counts carry signal. `CountScope::model` never
/// resets. A use by a forward of n tokens counts n. A prefetch insertion is not a use. Victim:
/// fewest uses, then least recently used (cache tick), then smallest (layer, expert).

#include <cstdint>
#include <string_view>

#include "moekit/cache/detail/use_count_policy.hpp"
#include "moekit/core/concepts.hpp"

namespace moekit {

/// Least-frequently-used eviction, per sequence or over the model's lifetime.
class LfuPolicy : public detail::UseCountPolicy<detail::CountedUses::all> {
 public:
  static constexpr std::string_view name = "lfu";
  /// Run-time knobs.
  struct Config {
    CountScope scope = CountScope::sequence;  ///< when counts restart
  };

  LfuPolicy() : LfuPolicy(Config{}) {}
  explicit LfuPolicy(Config cfg) : UseCountPolicy(cfg.scope, Precision::f32), cfg_(cfg) {}

  /// Uses of `key` counted in the current scope.
  [[nodiscard]] std::uint64_t uses(ExpertKey key) const noexcept { return counted(key); }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  Config cfg_{};
};
static_assert(CachePolicy<LfuPolicy>);

}  // namespace moekit
