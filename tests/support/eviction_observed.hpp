#pragma once
// A cache policy that reports each eviction: how the cache suites see the victims (ExpertCache has
// no eviction listener; the policy's `on_evict` is where an eviction shows).

#include <functional>
#include <utility>

#include "moekit/core/expert_key.hpp"

namespace moekit::test {

/// `P` that reports each eviction to `observe` (after the policy, before the cache forgets the
/// entry, which still shows its pins and pool): how the suites see the victims.
template <class P>
struct EvictionObserved : P {
  std::function<void(ExpertKey)> observe;
  explicit EvictionObserved(P p) : P(std::move(p)) {}
  void on_evict(ExpertKey key) {
    P::on_evict(key);
    if (observe) observe(key);
  }
};

}  // namespace moekit::test
