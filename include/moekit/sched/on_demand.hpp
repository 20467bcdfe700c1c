#pragma once
/// \file OnDemandScheduler: every expert runs on the device, misses are loaded, in plan order.

#include <span>
#include <string_view>

#include "moekit/core/concepts.hpp"

namespace moekit {

/// Places every non-skipped expert on the device; resident experts first so compute can start
/// while the misses load.
struct OnDemandScheduler {
  static constexpr std::string_view name = "on-demand";
  void schedule(const LayerContext&, std::span<ExpertPlan> plans) const noexcept {
    // Stable partition by hand (std::stable_partition may allocate).
    std::size_t w = 0;
    for (std::size_t r = 0; r < plans.size(); ++r) {
      if (plans[r].hit) {
        ExpertPlan p = plans[r];
        for (std::size_t j = r; j > w; --j) plans[j] = plans[j - 1];
        plans[w++] = p;
      }
    }
  }
};
static_assert(Scheduler<OnDemandScheduler>);

}  // namespace moekit
