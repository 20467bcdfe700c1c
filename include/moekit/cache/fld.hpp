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
#include <string_view>
#include <vector>

#include "moekit/cache/detail/dense_index.hpp"
#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/model_shape.hpp"

namespace moekit {

/// Layers until layer `of` runs again when layer `now` is being computed, in [0, n_layers).
[[nodiscard]] constexpr std::uint32_t layer_distance(std::uint32_t of, std::uint32_t now,
                                                     std::uint32_t n_layers) noexcept {
  return (of + n_layers - now % n_layers) % n_layers;
}

/// Farthest-layer-distance eviction. One recency list per layer: `victim` visits layers from the
/// farthest and takes the least recently used evictable entry, so it costs O(layers + pinned).
class FldPolicy {
 public:
  static constexpr std::string_view name = "fld";
  static constexpr Hooks hooks = Hook::bind;
  void bind(const ModelShape& shape) {
    n_experts_ = shape.n_experts;
    n_layers_ = shape.n_layers;
    links_.assign(shape.expert_count(), Link{});
    head_.assign(shape.n_layers, none);
    tail_.assign(shape.n_layers, none);
  }
  void on_hit(ExpertKey key, const AccessInfo&) noexcept { touch(key); }
  void on_insert(ExpertKey key, const AccessInfo&) noexcept { touch(key); }
  void on_evict(ExpertKey key) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    if (links_[i].linked) unlink(key.layer, i);
  }

  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    for (std::uint32_t d = n_layers_; d-- > 0;) {
      const std::uint32_t layer = (q.layer % n_layers_ + d) % n_layers_;
      for (std::uint32_t i = tail_[layer]; i != none; i = links_[i].prev) {
        const ExpertKey k = detail::dense_key(i, n_experts_);
        if (q.evictable(k)) return k;
      }
    }
    return std::nullopt;
  }

 private:
  static constexpr std::uint32_t none = 0xffffffffu;
  struct Link {
    std::uint32_t prev = none, next = none;
    bool linked = false;
  };

  void touch(ExpertKey key) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    const std::uint32_t l = key.layer;
    if (links_[i].linked) unlink(l, i);
    Link& n = links_[i];
    n.prev = none;
    n.next = head_[l];
    n.linked = true;
    if (head_[l] != none) links_[head_[l]].prev = i;
    head_[l] = i;
    if (tail_[l] == none) tail_[l] = i;
  }
  void unlink(std::uint32_t l, std::uint32_t i) noexcept {
    Link& n = links_[i];
    if (n.prev != none)
      links_[n.prev].next = n.next;
    else
      head_[l] = n.next;
    if (n.next != none)
      links_[n.next].prev = n.prev;
    else
      tail_[l] = n.prev;
    n = Link{};
  }

  std::uint32_t n_experts_ = 0;
  std::uint32_t n_layers_ = 1;
  std::vector<Link> links_;
  std::vector<std::uint32_t> head_, tail_;  ///< per layer: most / least recently used
};
static_assert(CachePolicy<FldPolicy>);

}  // namespace moekit
