#pragma once
// Every cache policy of moekit, as a type list for typed tests, and how to construct each one for a
// model shape and (for the offline ones) the demand sequence it will see (`PolicySetup`).
// Adding a policy to AllPolicies enrols it in tests/cache/policy_properties_test.cpp; one that is
// not default-constructible, or expects less than the defaults say, adds a PolicySetup too.

#include <span>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "moekit/cache/arc.hpp"
#include "moekit/cache/belady.hpp"
#include "moekit/cache/edgemoe.hpp"
#include "moekit/cache/expected_next_use.hpp"
#include "moekit/cache/fld.hpp"
#include "moekit/cache/lfu.hpp"
#include "moekit/cache/lhu.hpp"
#include "moekit/cache/lru.hpp"
#include "moekit/cache/multidim.hpp"
#include "moekit/cache/shallow_favoring.hpp"
#include "moekit/cache/static_popularity.hpp"
#include "moekit/presets/nextuse_fit.hpp"

namespace moekit::test {

/// ExpectedNextUse with the nextuse-fit preset's constants (presets/nextuse_fit.hpp).
struct FittedNextUsePolicy : ExpectedNextUsePolicy {
  static constexpr std::string_view name = "expected-next-use-fitted";
  FittedNextUsePolicy() : ExpectedNextUsePolicy(presets::NextUseFitSpec::fitted) {}
};

/// All policies. ShallowFavoring<LruPolicy> checks the allocation wrapper with another inner.
using AllPolicies = std::tuple<LruPolicy, LfuPolicy, LhuPolicy, FldPolicy, MultiDimPolicy,
                               ArcPolicy, ShallowFavoringArcPolicy, ShallowFavoring<LruPolicy>,
                               EdgeMoePolicy, StaticPopularityPolicy, BeladyPolicy,
                               CostAwareBeladyPolicy, ExpectedNextUsePolicy, FittedNextUsePolicy>;

/// Per-(layer, expert) use counts of a demand sequence (a profile for the popularity policies).
inline std::vector<double> counts_of(const ModelShape& shape,
                                     std::span<const FutureAccess> future) {
  std::vector<double> c(shape.expert_count(), 0.0);
  for (const FutureAccess& f : future) c[shape.index(f.key)] += 1.0;
  return c;
}

/// How the suites construct a policy and what they may expect of it beyond the concept. The
/// defaults fit an online policy with a default constructor; a policy that differs specialises
/// `PolicySetup` below.
struct DefaultPolicySetup {
  /// The policy names a victim whenever an evictable entry exists in the pool.
  static constexpr bool always_finds_victim = true;
  /// The policy accepts any demand (an offline policy refuses demands outside its future).
  static constexpr bool accepts_unforeseen_demands = true;
};

/// `PolicySetup<P>::make(shape, future)` constructs `P` for `shape`; offline policies get
/// `future`, the demands of the run.
template <class P>
struct PolicySetup : DefaultPolicySetup {
  static P make(const ModelShape&, std::span<const FutureAccess>) { return P{}; }
};
template <>
struct PolicySetup<BeladyPolicy> : DefaultPolicySetup {
  static constexpr bool accepts_unforeseen_demands = false;
  static BeladyPolicy make(const ModelShape&, std::span<const FutureAccess> future) {
    BeladyPolicy::Config cfg;
    for (const FutureAccess& f : future) cfg.future.push_back(f.key);
    return BeladyPolicy(std::move(cfg));
  }
};
template <>
struct PolicySetup<CostAwareBeladyPolicy> : DefaultPolicySetup {
  static constexpr bool accepts_unforeseen_demands = false;
  static CostAwareBeladyPolicy make(const ModelShape&, std::span<const FutureAccess> future) {
    return CostAwareBeladyPolicy({.future = {future.begin(), future.end()}});
  }
};
template <>
struct PolicySetup<StaticPopularityPolicy> : DefaultPolicySetup {
  static constexpr bool always_finds_victim = false;  // a static placement never evicts
  static StaticPopularityPolicy make(const ModelShape& shape,
                                     std::span<const FutureAccess> future) {
    return StaticPopularityPolicy({.counts = counts_of(shape, future)});
  }
};
template <class Inner>
struct PolicySetup<ShallowFavoring<Inner>> : DefaultPolicySetup {
  static ShallowFavoring<Inner> make(const ModelShape&, std::span<const FutureAccess>) {
    return ShallowFavoring<Inner>({.shallow_layers = 1});
  }
};

/// Constructs policy `P` for `shape`; offline policies get `future` (the demands of the run).
template <class P>
P make_policy(const ModelShape& shape, std::span<const FutureAccess> future) {
  return PolicySetup<P>::make(shape, future);
}

}  // namespace moekit::test
