#pragma once
/// \file LhuPolicy: evict the least *high-precision* used expert (HOBBIT's LHU).
///
/// HOBBIT (Tang et al., 2024, §3.3, Fig. 11) caches experts at two precisions: a miss on a
/// high-precision request costs a full load, a miss on a low-precision one a fraction of it. So the
/// experts worth keeping are the ones used at high precision: LHU counts only uses whose requested
/// precision is at least `Config::high`; low-precision uses do not count. Counts are per expert,
/// survive eviction and restart per sequence (`CountScope::sequence`, HOBBIT's choice) or never.
/// A request served by a higher-precision copy counts at the precision it asked for: a low request
/// or a skip served by a resident high copy is not a high use (the paper updates H only for
/// high-precision experts; the pipeline reports the asked precision, `skip` included).
/// Victim: fewest high uses, then least recently used (cache tick), then smallest (layer, expert).

#include <cstdint>
#include <string_view>

#include "moekit/cache/detail/use_count_policy.hpp"
#include "moekit/core/concepts.hpp"

namespace moekit {

/// Least-high-precision-used eviction.
class LhuPolicy : public detail::UseCountPolicy<detail::CountedUses::high_precision> {
 public:
  static constexpr std::string_view name = "lhu";
  /// Run-time knobs.
  struct Config {
    CountScope scope = CountScope::sequence;  ///< when counts restart
    Precision high = Precision::f16;          ///< uses at >= this many bits count as high
  };

  LhuPolicy() : LhuPolicy(Config{}) {}
  explicit LhuPolicy(Config cfg) : UseCountPolicy(cfg.scope, cfg.high), cfg_(cfg) {}

  /// High-precision uses of `key` counted in the current scope.
  [[nodiscard]] std::uint64_t high_uses(ExpertKey key) const noexcept { return counted(key); }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  Config cfg_{};
};
static_assert(CachePolicy<LhuPolicy>);

}  // namespace moekit
