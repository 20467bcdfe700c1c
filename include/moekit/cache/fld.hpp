#pragma once
/// \file FldPolicy: evict the expert whose layer runs farthest in the future (HOBBIT's FLD).
///
/// Layers run in order 0..L-1 for every token, so an expert of layer l_t is next needed
/// `(l_t − l_i + L) mod L` layers after the layer l_i being computed: 0 for the current layer,
/// 1 for the next one, L−1 for the layer just computed (HOBBIT, Tang et al., 2024, §3.3, Eq. 3's
/// FLD term `1 − ((l_t − l_i + L) mod L)/L`). FLD evicts the largest distance. It keeps no state
/// but residency and recency. Victim: farthest layer, then least recently used (cache tick), then
/// smallest (layer, expert).

#include <cstdint>
#include <optional>
#include <vector>

#include "moekit/cache/detail/resident_set.hpp"
#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/model_shape.hpp"

namespace moekit {

/// Layers until layer `of` runs again when layer `now` is being computed, in [0, n_layers).
[[nodiscard]] constexpr std::uint32_t layer_distance(std::uint32_t of, std::uint32_t now,
                                                     std::uint32_t n_layers) noexcept {
  return (of + n_layers - now % n_layers) % n_layers;
}

/// Farthest-layer-distance eviction.
class FldPolicy {
 public:
  void bind(const ModelShape& shape) {
    n_experts_ = shape.n_experts;
    n_layers_ = shape.n_layers;
    last_tick_.assign(shape.expert_count(), 0);
    residents_.reset(shape.expert_count());
  }
  void on_hit(ExpertKey key, const AccessInfo& a) noexcept {
    last_tick_[detail::dense_index(key, n_experts_)] = a.tick;
  }
  void on_insert(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    residents_.insert(i);
    last_tick_[i] = a.tick;
  }
  void on_evict(ExpertKey key) noexcept { residents_.erase(detail::dense_index(key, n_experts_)); }

  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    std::optional<ExpertKey> best;
    std::uint32_t best_d = 0;
    std::uint64_t best_t = 0;
    for (const std::uint32_t i : residents_.items()) {
      const ExpertKey k = detail::dense_key(i, n_experts_);
      if (!q.evictable(k)) continue;
      const std::uint32_t d = layer_distance(k.layer, q.layer, n_layers_);
      const std::uint64_t t = last_tick_[i];
      if (!best || d > best_d || (d == best_d && (t < best_t || (t == best_t && k < *best)))) {
        best = k;
        best_d = d;
        best_t = t;
      }
    }
    return best;
  }

 private:
  std::uint32_t n_experts_ = 0;
  std::uint32_t n_layers_ = 1;
  std::vector<std::uint64_t> last_tick_;
  detail::ResidentSet residents_;
};
static_assert(CachePolicy<FldPolicy>);

}  // namespace moekit
