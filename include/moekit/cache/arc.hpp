#pragma once
/// \file ArcPolicy: Adaptive Replacement Cache, one instance per layer (Fate's M4c).
///
/// ARC (Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST'03) keeps two
/// resident lists, T1 (seen once recently) and T2 (seen at least twice), and two ghost lists of
/// evicted ids, B1 and B2. A miss that hits ghost B1 means recency was undervalued and raises the
/// target size `p` of T1 by max(|B2|/|B1|, 1); a B2 ghost hit lowers it by max(|B1|/|B2|, 1).
/// REPLACE evicts LRU(T1) when |T1| > p (or |T1| == p and the incoming id is in B2), else LRU(T2).
/// Fate (Fang et al., 2025, §4.4) runs one ARC per MoE layer with its own capacity c (in slots).
///
/// Mapping onto ExpertCache: each layer is a pool (`pool_of` = layer). The cache calls `victim`
/// when a layer's pool is full; the query's `incoming` key drives REPLACE. The incoming key then
/// enters MRU(T2) if it was a ghost, else MRU(T1); ghost lists are trimmed to |T1|+|B1| <= c and
/// |T1|+|T2|+|B1|+|B2| <= 2c as in the paper. When ARC's preferred list has no evictable (unpinned)
/// entry the victim comes from the other resident list.
///
/// Prefetches (Fate drives ARC by actual router selections only, fate.md §4.1/A10): a prefetch
/// insertion is not an access. ExpertCache announces every insertion through `prepare_insert`
/// before it evicts for it, so ARC knows whether the incoming key is a demand or a prefetch:
/// - a demand miss adapts p once (B1 ghost: p += max(|B2|/|B1|, 1); B2 ghost: p −= max(|B1|/|B2|,
///   1)), before REPLACE, exactly as in the paper;
/// - a prefetch insertion never adapts p. If it must evict, REPLACE treats it as a complete miss
///   (its ghost status is ignored), with the current p. It enters T1 marked "prefetched" and leaves
///   its ghost list, remembering which one;
/// - the first demand hit of a prefetched entry is ARC's access to it: if it had been a B1/B2 ghost
///   that hit adapts p as that ghost hit would have (the ghost list's size counting the entry
///   itself, as when it was still on it) and moves it to MRU(T2); otherwise it goes to MRU(T1) (a
///   first access). A prefetched entry evicted unused becomes a B1 ghost like any T1 entry.
/// Without `prepare_insert` (a caller other than ExpertCache), `victim` assumes a demand.
/// State persists across sequences (Fate's choice); `set_layer_capacities` rebuilds nothing but c.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// Which ARC list an expert is on.
enum class ArcList : std::uint8_t { none, t1, t2, b1, b2 };

/// Per-layer ARC eviction. Standalone it splits the budget evenly over layers; wrap it in
/// `ShallowFavoring<ArcPolicy>` for Fate's allocation.
class ArcPolicy {
 public:
  static constexpr std::string_view name = "arc";
  static constexpr Hooks hooks = Hook::bind | Hook::pool_capacities | Hook::pool_of |
                                 Hook::set_layer_capacities | Hook::prepare_insert;
  void bind(const ModelShape& shape) {
    n_experts_ = shape.n_experts;
    nodes_.assign(shape.expert_count(), Node{});
    layers_.assign(shape.n_layers, Layer{});
  }

  /// Uniform allocation: floor(budget / bytes(sizing)) slots split evenly, leftover slots to the
  /// first layers; every layer is capped at n_experts.
  std::vector<std::size_t> pool_capacities(const ModelShape& shape, std::size_t budget,
                                           Precision sizing) {
    const std::size_t bytes = shape.expert_bytes(sizing);
    std::size_t total = budget / bytes;
    std::vector<std::uint32_t> slots(shape.n_layers, 0);
    const std::size_t each = total / shape.n_layers;
    std::size_t rest = total % shape.n_layers;
    for (auto& s : slots) {
      s = static_cast<std::uint32_t>(std::min<std::size_t>(shape.n_experts, each + (rest ? 1 : 0)));
      if (rest) --rest;
    }
    set_layer_capacities(slots);
    std::vector<std::size_t> caps(slots.size());
    for (std::size_t l = 0; l < slots.size(); ++l) caps[l] = slots[l] * bytes;
    return caps;
  }
  [[nodiscard]] std::uint32_t pool_of(ExpertKey key, Precision) const noexcept { return key.layer; }

  /// Sets each layer's ARC capacity c (slots). Called by the allocation (uniform or Fate's).
  void set_layer_capacities(std::span<const std::uint32_t> slots) {
    MOEKIT_EXPECTS(slots.size() == layers_.size(),
                   "ArcPolicy::set_layer_capacities: one capacity per layer expected");
    for (std::size_t l = 0; l < slots.size(); ++l) {
      layers_[l].c = slots[l];
      layers_[l].p = std::min(layers_[l].p, double(slots[l]));
    }
  }

  void on_hit(ExpertKey key, const AccessInfo&) noexcept {
    const std::uint32_t i = index(key);
    Node& n = nodes_[i];
    Layer& L = layers_[key.layer];
    if (n.list == ArcList::t1 && n.prefetched) {  // first real access of a prefetched entry
      n.prefetched = false;
      const ArcList ghost = n.prefetched_ghost;
      n.prefetched_ghost = ArcList::none;
      if (ghost != ArcList::none) adapt(L, ghost, /*self_counted=*/false);
      move_to_front(L, i, ghost != ArcList::none ? ArcList::t2 : ArcList::t1);
    } else if (n.list == ArcList::t1 || n.list == ArcList::t2) {
      move_to_front(L, i, ArcList::t2);
    }
  }

  /// Called by ExpertCache before it evicts for the insertion of `key` (see the file comment).
  void prepare_insert(ExpertKey key, const AccessInfo& a) noexcept {
    if (key.layer >= layers_.size()) return;
    Layer& L = layers_[key.layer];
    L.pending_key = key;
    L.pending_tick = a.tick;
    L.pending_prefetch = a.prefetch;
    L.pending = true;
    if (!a.prefetch) adapt_once(key, a.tick);
  }

  void on_insert(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = index(key);
    Layer& L = layers_[key.layer];
    Node& n = nodes_[i];
    L.pending = false;
    if (a.prefetch) {
      n.prefetched_ghost = n.list == ArcList::b1 || n.list == ArcList::b2 ? n.list : ArcList::none;
      move_to_front(L, i, ArcList::t1);
      n.prefetched = true;
    } else {
      adapt_once(key, a.tick);
      const bool ghost = n.list == ArcList::b1 || n.list == ArcList::b2;
      move_to_front(L, i, ghost ? ArcList::t2 : ArcList::t1);
      n.prefetched = false;
      n.prefetched_ghost = ArcList::none;
    }
    const std::size_t c = L.c;
    while (L.size[t1] + L.size[b1] > c && L.size[b1] > 0) remove(L, L.tail[b1]);
    while (L.size[t1] + L.size[t2] + L.size[b1] + L.size[b2] > 2 * c && L.size[b2] > 0)
      remove(L, L.tail[b2]);
  }

  /// Evicted data keeps its id as a ghost: T1 → B1, T2 → B2.
  void on_evict(ExpertKey key) noexcept {
    const std::uint32_t i = index(key);
    Layer& L = layers_[key.layer];
    Node& n = nodes_[i];
    n.prefetched = false;
    n.prefetched_ghost = ArcList::none;
    if (n.list == ArcList::t1)
      move_to_front(L, i, ArcList::b1);
    else if (n.list == ArcList::t2)
      move_to_front(L, i, ArcList::b2);
  }

  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) noexcept {
    const ExpertKey x = q.incoming;
    if (x.layer >= layers_.size()) return std::nullopt;
    const Layer& L = layers_[x.layer];
    const bool prefetch =
        L.pending && L.pending_key == x && L.pending_tick == q.tick && L.pending_prefetch;
    if (!prefetch) adapt_once(x, q.tick);  // a no-op when prepare_insert already adapted
    // A prefetch is not an access: REPLACE sees it as a complete miss, whatever its ghost status.
    const ArcList xl = prefetch ? ArcList::none : nodes_[index(x)].list;
    bool from_t1;
    if (xl != ArcList::b1 && xl != ArcList::b2 && L.size[t1] + L.size[b1] >= L.c &&
        L.size[t1] >= L.c) {
      from_t1 = true;  // complete miss with T1 full: evict LRU(T1) (its ghost is trimmed later)
    } else {
      const double t1s = double(L.size[t1]);
      from_t1 = L.size[t1] >= 1 && ((xl == ArcList::b2 && t1s == L.p) || t1s > L.p);
    }
    if (auto v = lru_evictable(L, from_t1 ? t1 : t2, q)) return v;
    return lru_evictable(L, from_t1 ? t2 : t1, q);
  }

  // ---- inspection (tests, benchmarks) ---------------------------------------------------------
  [[nodiscard]] ArcList list_of(ExpertKey key) const noexcept { return nodes_[index(key)].list; }
  [[nodiscard]] std::size_t list_size(std::uint32_t layer, ArcList l) const noexcept {
    return l == ArcList::none ? 0 : layers_[layer].size[slot(l)];
  }
  /// ARC's adaptive target size of T1 for `layer`.
  [[nodiscard]] double target(std::uint32_t layer) const noexcept { return layers_[layer].p; }
  [[nodiscard]] std::uint32_t capacity(std::uint32_t layer) const noexcept {
    return layers_[layer].c;
  }
  /// Keys of `list` of `layer`, MRU first.
  [[nodiscard]] std::vector<ExpertKey> keys(std::uint32_t layer, ArcList l) const {
    std::vector<ExpertKey> out;
    if (l == ArcList::none) return out;
    for (std::uint32_t i = layers_[layer].head[slot(l)]; i != none; i = nodes_[i].next)
      out.push_back(ExpertKey{i / n_experts_, i % n_experts_});
    return out;
  }

 private:
  static constexpr std::uint32_t none = 0xffffffffu;
  enum : std::size_t { t1 = 0, t2 = 1, b1 = 2, b2 = 3 };
  struct Node {
    std::uint32_t prev = none, next = none;
    ArcList list = ArcList::none;
    bool prefetched = false;                   ///< inserted by a prefetch, not accessed since
    ArcList prefetched_ghost = ArcList::none;  ///< ghost list it left when it was prefetched
  };
  struct Layer {
    std::uint32_t head[4] = {none, none, none, none};  ///< MRU ends
    std::uint32_t tail[4] = {none, none, none, none};  ///< LRU ends
    std::size_t size[4] = {0, 0, 0, 0};
    double p = 0.0;
    std::uint32_t c = 0;
    ExpertKey adapted_key{};  ///< the insertion whose ghost hit was already applied
    std::uint64_t adapted_tick = 0;
    bool adapted = false;
    ExpertKey pending_key{};  ///< the insertion announced by prepare_insert
    std::uint64_t pending_tick = 0;
    bool pending = false;
    bool pending_prefetch = false;
  };

  static constexpr std::size_t slot(ArcList l) noexcept { return std::size_t(l) - 1; }
  [[nodiscard]] std::uint32_t index(ExpertKey k) const noexcept {
    return k.layer * n_experts_ + k.expert;
  }

  void adapt_once(ExpertKey x, std::uint64_t tick) noexcept {
    Layer& L = layers_[x.layer];
    if (L.adapted && L.adapted_key == x && L.adapted_tick == tick) return;
    L.adapted = true;
    L.adapted_key = x;
    L.adapted_tick = tick;
    adapt(L, nodes_[index(x)].list, /*self_counted=*/true);
  }
  /// ARC's adaptation for a ghost hit on `ghost`. `self_counted`: the hit entry is still on its
  /// ghost list (a demand miss); otherwise (the first hit of a prefetched ghost) it is counted in.
  static void adapt(Layer& L, ArcList ghost, bool self_counted) noexcept {
    const double extra = self_counted ? 0.0 : 1.0;
    if (ghost == ArcList::b1) {
      const double s1 = double(L.size[b1]) + extra, s2 = double(L.size[b2]);
      L.p = std::min(double(L.c), L.p + std::max(s2 / s1, 1.0));
    } else if (ghost == ArcList::b2) {
      const double s1 = double(L.size[b1]), s2 = double(L.size[b2]) + extra;
      L.p = std::max(0.0, L.p - std::max(s1 / s2, 1.0));
    }
  }

  [[nodiscard]] std::optional<ExpertKey> lru_evictable(const Layer& L, std::size_t list,
                                                       const EvictionQuery& q) const noexcept {
    for (std::uint32_t i = L.tail[list]; i != none; i = nodes_[i].prev) {
      const ExpertKey k{i / n_experts_, i % n_experts_};
      if (q.evictable(k)) return k;
    }
    return std::nullopt;
  }

  void remove(Layer& L, std::uint32_t i) noexcept {
    Node& n = nodes_[i];
    if (n.list == ArcList::none) return;
    const std::size_t s = slot(n.list);
    if (n.prev != none)
      nodes_[n.prev].next = n.next;
    else
      L.head[s] = n.next;
    if (n.next != none)
      nodes_[n.next].prev = n.prev;
    else
      L.tail[s] = n.prev;
    --L.size[s];
    n.prev = n.next = none;
    n.list = ArcList::none;
  }
  void move_to_front(Layer& L, std::uint32_t i, ArcList to) noexcept {
    remove(L, i);
    Node& n = nodes_[i];
    const std::size_t s = slot(to);
    n.list = to;
    n.prev = none;
    n.next = L.head[s];
    if (L.head[s] != none) nodes_[L.head[s]].prev = i;
    L.head[s] = i;
    if (L.tail[s] == none) L.tail[s] = i;
    ++L.size[s];
  }

  std::uint32_t n_experts_ = 0;
  std::vector<Node> nodes_;
  std::vector<Layer> layers_;
};
static_assert(CachePolicy<ArcPolicy>);

}  // namespace moekit
