#pragma once
/// \file LruPolicy: evict the least recently used expert.
///
/// An intrusive doubly linked list over the model's dense expert indices: hit, insert and evict are
/// O(1); `victim` walks from the cold end past entries the query does not allow (pinned, other
/// pool).

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/model_shape.hpp"

namespace moekit {

/// Least-recently-used eviction over all resident experts (one global recency order).
class LruPolicy {
 public:
  static constexpr std::string_view name = "lru";
  static constexpr Hooks hooks = Hook::bind;
  /// Sizes the recency list for `shape`; ExpertCache calls it on construction.
  void bind(const ModelShape& shape) {
    n_experts_ = shape.n_experts;
    links_.assign(shape.expert_count(), Link{});
    head_ = tail_ = none;
  }

  void on_hit(ExpertKey key, const AccessInfo&) noexcept { touch(index(key)); }
  void on_insert(ExpertKey key, const AccessInfo&) noexcept { touch(index(key)); }
  void on_evict(ExpertKey key) noexcept {
    const std::uint32_t i = index(key);
    if (links_[i].linked) unlink(i);
  }
  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    for (std::uint32_t i = tail_; i != none; i = links_[i].prev) {
      const ExpertKey k{i / n_experts_, i % n_experts_};
      if (q.evictable(k)) return k;
    }
    return std::nullopt;
  }

 private:
  static constexpr std::uint32_t none = 0xffffffffu;
  struct Link {
    std::uint32_t prev = none, next = none;
    bool linked = false;
  };

  [[nodiscard]] std::uint32_t index(ExpertKey k) const noexcept {
    return k.layer * n_experts_ + k.expert;
  }
  void touch(std::uint32_t i) noexcept {
    if (links_[i].linked) unlink(i);
    Link& l = links_[i];
    l.prev = none;
    l.next = head_;
    l.linked = true;
    if (head_ != none) links_[head_].prev = i;
    head_ = i;
    if (tail_ == none) tail_ = i;
  }
  void unlink(std::uint32_t i) noexcept {
    Link& l = links_[i];
    if (l.prev != none)
      links_[l.prev].next = l.next;
    else
      head_ = l.next;
    if (l.next != none)
      links_[l.next].prev = l.prev;
    else
      tail_ = l.prev;
    l = Link{};
  }

  std::uint32_t n_experts_ = 0;
  std::vector<Link> links_;
  std::uint32_t head_ = none, tail_ = none;
};
static_assert(CachePolicy<LruPolicy>);

}  // namespace moekit
