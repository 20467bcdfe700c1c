#pragma once
/// \file ReadyFirstScheduler: Fate's compute reordering — ready experts first, the busiest first.
///
/// Fate (Fang et al., "Accurate Expert Predictions in MoE Inference via Cross-Layer Gate", 2025,
/// §4.3, Fig. 6): experts already resident run first so their compute hides the loads still in
/// flight; then experts whose prefetch is in flight, in transfer order; then the mispredicted
/// misses, whose on-demand loads start now. Within the ready and missing groups the expert with
/// more tokens goes first (ties: smaller id). Every expert runs on the device.

#include <cstdint>
#include <span>
#include <string_view>

#include "moekit/core/concepts.hpp"

namespace moekit {

struct ReadyFirstScheduler {
  static constexpr std::string_view name = "ready-first";
  void schedule(const LayerContext&, std::span<ExpertPlan> plans) const noexcept {
    // Insertion sort by (group, tokens desc, id): at most one entry per expert of the layer.
    for (std::size_t i = 1; i < plans.size(); ++i) {
      const ExpertPlan p = plans[i];
      std::size_t j = i;
      for (; j > 0 && before(p, plans[j - 1]); --j) plans[j] = plans[j - 1];
      plans[j] = p;
    }
  }

 private:
  static int group(const ExpertPlan& p) noexcept {
    if (p.placement == Placement::skipped) return 3;
    if (p.hit && !p.in_flight) return 0;  // ready
    if (p.hit) return 1;                  // its prefetch is in flight
    return 2;                             // missing: loads on demand
  }
  static bool before(const ExpertPlan& a, const ExpertPlan& b) noexcept {
    const int ga = group(a), gb = group(b);
    if (ga != gb) return ga < gb;
    if (ga == 1) return a.ticket.id < b.ticket.id;  // transfer-queue order
    if (a.n_tokens != b.n_tokens) return a.n_tokens > b.n_tokens;
    return a.key.expert < b.key.expert;
  }
};
static_assert(Scheduler<ReadyFirstScheduler>);

}  // namespace moekit
