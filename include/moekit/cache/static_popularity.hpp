#pragma once
/// \file StaticPopularityPolicy: Fiddler's static placement of the most popular experts.
///
/// Fiddler (Kamahori et al., "Fiddler: CPU-GPU Orchestration for Fast Inference of Mixture-of-
/// Experts Models", 2024, §3.2 and App. C) profiles how many tokens each (layer, expert) receives
/// on calibration data, sorts all experts by that count and places as many as fit in fast memory;
/// nothing is evicted or promoted at run time. Here the budget holds N = floor(budget /
/// bytes(sizing)) experts; the N most popular (ties: smaller layer, then smaller expert) form pool
/// 0, which gets the whole budget, so a placed expert is never evicted. **Non-placed experts** map
/// to pool 1 of capacity 0: `ExpertCache::insert` refuses them (`InsertStatus::too_large`) and the
/// pipeline serves them outside the cache (its transient staging slots, or the CPU under Fiddler's
/// scheduler); they never displace a placed expert. Placed experts become resident on first use
/// (or when the engine preloads `placement()` at start-up, as Fiddler does). `victim` always
/// answers `nullopt`: a placed expert inserted above the sizing precision may therefore not fit.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// Static popularity placement (never evicts).
class StaticPopularityPolicy {
 public:
  static constexpr std::string_view name = "static-popularity";
  static constexpr Hooks hooks = Hook::bind | Hook::pool_capacities | Hook::pool_of;
  /// Run-time knobs.
  struct Config {
    /// Tokens routed to each (layer, expert), row-major [n_layers × n_experts] (a profile, e.g.
    /// counted from a routing trace). Required.
    std::vector<double> counts{};
  };

  StaticPopularityPolicy() = default;
  explicit StaticPopularityPolicy(Config cfg) : cfg_(std::move(cfg)) {}

  void bind(const ModelShape& shape) {
    n_experts_ = shape.n_experts;
    MOEKIT_EXPECTS(cfg_.counts.size() == shape.expert_count(),
                   "StaticPopularityPolicy::Config.counts must hold n_layers × n_experts counts");
    for (const double c : cfg_.counts)
      MOEKIT_EXPECTS(c >= 0.0, "StaticPopularityPolicy::Config.counts must be >= 0");
    order_.resize(shape.expert_count());
    std::iota(order_.begin(), order_.end(), 0u);
    std::stable_sort(order_.begin(), order_.end(), [&](std::uint32_t a, std::uint32_t b) {
      return cfg_.counts[a] > cfg_.counts[b];  // stable: ties keep (layer, expert) order
    });
    placed_.assign(shape.expert_count(), false);
  }

  /// Pool 0 = the placed experts (whole budget), pool 1 = everything else (no bytes).
  std::vector<std::size_t> pool_capacities(const ModelShape& shape, std::size_t budget,
                                           Precision sizing) {
    const std::size_t n = std::min(budget / shape.expert_bytes(sizing), order_.size());
    std::fill(placed_.begin(), placed_.end(), false);
    for (std::size_t r = 0; r < n; ++r) placed_[order_[r]] = true;
    n_placed_ = n;
    return {budget, 0};
  }
  [[nodiscard]] std::uint32_t pool_of(ExpertKey key, Precision) const noexcept {
    return placed(key) ? 0u : 1u;
  }

  void on_hit(ExpertKey, const AccessInfo&) noexcept {}
  void on_insert(ExpertKey, const AccessInfo&) noexcept {}
  void on_evict(ExpertKey) noexcept {}
  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery&) const noexcept {
    return std::nullopt;
  }

  [[nodiscard]] bool placed(ExpertKey key) const noexcept {
    const std::size_t i = std::size_t{key.layer} * n_experts_ + key.expert;
    return i < placed_.size() && placed_[i];
  }
  /// The placed experts, most popular first.
  [[nodiscard]] std::vector<ExpertKey> placement() const {
    std::vector<ExpertKey> out;
    for (std::size_t r = 0; r < n_placed_; ++r)
      out.push_back(ExpertKey{order_[r] / n_experts_, order_[r] % n_experts_});
    return out;
  }
  /// Fiddler's expected hit rate of the placement: Σ counts(placed) / Σ counts.
  [[nodiscard]] double expected_hit_rate() const noexcept {
    double all = 0.0, in = 0.0;
    for (std::size_t i = 0; i < cfg_.counts.size(); ++i) {
      all += cfg_.counts[i];
      if (placed_[i]) in += cfg_.counts[i];
    }
    return all > 0.0 ? in / all : 0.0;
  }

 private:
  Config cfg_{};
  std::uint32_t n_experts_ = 0;
  std::vector<std::uint32_t> order_;
  std::vector<bool> placed_;
  std::size_t n_placed_ = 0;
};
static_assert(CachePolicy<StaticPopularityPolicy>);

}  // namespace moekit
