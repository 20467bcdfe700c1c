#pragma once
// Every cache policy of moekit, as a type list for typed tests, and a factory that constructs each
// one for a model shape and (for the offline ones) the demand sequence it will see.
// Adding a policy here enrols it in tests/cache/policy_properties_test.cpp.

#include <span>
#include <type_traits>
#include <utility>
#include <string_view>
#include <tuple>
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
  FittedNextUsePolicy() : ExpectedNextUsePolicy(presets::NextUseFitSpec::fitted) {}
};

/// All policies. ShallowFavoring<LruPolicy> checks the allocation wrapper with another inner.
using AllPolicies =
    std::tuple<LruPolicy, LfuPolicy, LhuPolicy, FldPolicy, MultiDimPolicy, ArcPolicy,
               ShallowFavoringArcPolicy, ShallowFavoring<LruPolicy>, EdgeMoePolicy,
               StaticPopularityPolicy, BeladyPolicy, CostAwareBeladyPolicy, ExpectedNextUsePolicy,
               FittedNextUsePolicy>;

/// What the property suite may expect of a policy beyond the concept.
template <class P>
struct PolicyTraits {
  /// The policy names a victim whenever an evictable entry exists in the pool.
  static constexpr bool always_finds_victim = true;
};
template <>
struct PolicyTraits<StaticPopularityPolicy> {
  static constexpr bool always_finds_victim = false;  // a static placement never evicts
};

/// Per-(layer, expert) use counts of a demand sequence (a profile for the popularity policies).
inline std::vector<double> counts_of(const ModelShape& shape,
                                     std::span<const FutureAccess> future) {
  std::vector<double> c(shape.expert_count(), 0.0);
  for (const FutureAccess& f : future) c[shape.index(f.key)] += 1.0;
  return c;
}

/// Constructs policy `P` for `shape`; offline policies get `future` (the demands of the run).
template <class P>
P make_policy(const ModelShape& shape, std::span<const FutureAccess> future) {
  if constexpr (std::is_same_v<P, BeladyPolicy>) {
    BeladyPolicy::Config cfg;
    for (const FutureAccess& f : future) cfg.future.push_back(f.key);
    return BeladyPolicy(std::move(cfg));
  } else if constexpr (std::is_same_v<P, CostAwareBeladyPolicy>) {
    return CostAwareBeladyPolicy({.future = {future.begin(), future.end()}});
  } else if constexpr (std::is_same_v<P, StaticPopularityPolicy>) {
    return StaticPopularityPolicy({.counts = counts_of(shape, future)});
  } else if constexpr (std::is_same_v<P, ShallowFavoringArcPolicy> ||
                       std::is_same_v<P, ShallowFavoring<LruPolicy>>) {
    return P({.shallow_layers = 1});
  } else {
    (void)shape, (void)future;
    return P{};
  }
}

/// A readable name for reports.
template <class P>
constexpr std::string_view policy_name() {
  if constexpr (std::is_same_v<P, LruPolicy>) return "lru";
  else if constexpr (std::is_same_v<P, LfuPolicy>) return "lfu";
  else if constexpr (std::is_same_v<P, LhuPolicy>) return "lhu";
  else if constexpr (std::is_same_v<P, FldPolicy>) return "fld";
  else if constexpr (std::is_same_v<P, MultiDimPolicy>) return "multidim";
  else if constexpr (std::is_same_v<P, ArcPolicy>) return "arc";
  else if constexpr (std::is_same_v<P, ShallowFavoringArcPolicy>) return "shallow-arc";
  else if constexpr (std::is_same_v<P, ShallowFavoring<LruPolicy>>) return "shallow-lru";
  else if constexpr (std::is_same_v<P, EdgeMoePolicy>) return "edgemoe";
  else if constexpr (std::is_same_v<P, StaticPopularityPolicy>) return "static-popularity";
  else if constexpr (std::is_same_v<P, BeladyPolicy>) return "belady";
  else if constexpr (std::is_same_v<P, CostAwareBeladyPolicy>) return "cost-aware-belady";
  else if constexpr (std::is_same_v<P, ExpectedNextUsePolicy>) return "expected-next-use";
  else if constexpr (std::is_same_v<P, FittedNextUsePolicy>) return "expected-next-use-fitted";
  else return "?";
}

}  // namespace moekit::test
