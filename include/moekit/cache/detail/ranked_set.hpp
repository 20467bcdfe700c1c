#pragma once
/// \file RankedSet: residents ordered by a policy's eviction rank, with O(log n) updates.
///
/// A policy whose rank of an entry does not depend on the query (LFU's count, or a per-layer
/// partial score) keeps its residents here. It is an indexed binary min-heap: `update` and `erase`
/// are O(log n) and allocate nothing after `reset`. `first(pred)` returns the lowest-ranked member
/// satisfying `pred` by a best-first walk of the heap that expands only members failing `pred`
/// (pinned entries, which are few), so it costs O(pinned · log) rather than O(members). `walk`
/// visits a subtree-closed part of the heap for policies whose exact score is only monotone in the
/// rank (equal ranks-to-be after rounding must still be tie-broken by the score's own rules), and
/// `rerank_all` re-ranks every member at once in O(n) (Floyd's heap construction).

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace moekit::detail {

/// Ids in [0, size) ordered by a `Rank` (operator<); equal ranks are ordered by id, so the order
/// is total and deterministic.
template <class Rank>
class RankedSet {
 public:
  void reset(std::size_t size) {
    heap_.clear();
    heap_.reserve(size);
    pos_.assign(size, none);
    rank_.assign(size, Rank{});
  }
  /// Inserts `i` or moves it to its new rank.
  void update(std::uint32_t i, const Rank& r) noexcept {
    rank_[i] = r;
    if (pos_[i] == none) {
      pos_[i] = static_cast<std::uint32_t>(heap_.size());
      heap_.push_back(i);  // capacity reserved in reset()
    }
    sift_down(sift_up(pos_[i]));
  }
  void erase(std::uint32_t i) noexcept {
    const std::uint32_t p = pos_[i];
    if (p == none) return;
    const std::uint32_t last = heap_.back();
    heap_.pop_back();
    pos_[i] = none;
    if (last == i) return;
    heap_[p] = last;
    pos_[last] = p;
    sift_down(sift_up(p));
  }
  [[nodiscard]] bool contains(std::uint32_t i) const noexcept { return pos_[i] != none; }
  [[nodiscard]] std::size_t size() const noexcept { return heap_.size(); }
  /// Number of ids the set was reset for (0 before the first `reset`).
  [[nodiscard]] std::size_t capacity() const noexcept { return pos_.size(); }
  /// Rank of member `i`.
  [[nodiscard]] const Rank& rank(std::uint32_t i) const noexcept { return rank_[i]; }
  /// Rank of the lowest member (the set must not be empty).
  [[nodiscard]] const Rank& min_rank() const noexcept { return rank_[heap_[0]]; }
  /// Members in heap order (not sorted).
  [[nodiscard]] std::span<const std::uint32_t> members() const noexcept { return heap_; }

  /// Depth-first walk from the lowest member: calls `expand(id)` on a member and descends into its
  /// heap children only when it returns true. Every member ranks at or above its heap parent, so a
  /// caller whose score is monotone in the rank can prune a subtree at its first member that is
  /// worse than its best so far.
  template <class Expand>
  void walk(Expand&& expand) const {
    if (heap_.empty()) return;
    // Each level leaves at most one pending sibling: the stack stays below depth + 2 entries.
    std::array<std::uint32_t, 72> stack;
    std::size_t n = 0;
    stack[n++] = 0;
    while (n > 0) {
      const std::uint32_t p = stack[--n];
      if (!expand(heap_[p])) continue;
      for (std::uint32_t c = 2 * p + 2; c >= 2 * p + 1; --c)
        if (c < heap_.size()) stack[n++] = c;
    }
  }

  /// Sets the rank of every member to `fn(id)` and restores the heap in O(members).
  template <class Fn>
  void rerank_all(Fn&& fn) noexcept {
    for (const std::uint32_t i : heap_) rank_[i] = fn(i);
    for (std::size_t p = heap_.size() / 2; p-- > 0;) sift_down(static_cast<std::uint32_t>(p));
  }

  /// The lowest-ranked member for which `pred(id)` holds.
  template <class Pred>
  [[nodiscard]] std::optional<std::uint32_t> first(Pred&& pred) const {
    if (heap_.empty()) return std::nullopt;
    if (pred(heap_[0])) return heap_[0];     // the usual case: the minimum is not pinned
    std::array<std::uint32_t, 64> frontier;  // heap positions still to look at
    std::size_t n = 0;
    frontier[n++] = 0;
    while (n > 0) {
      std::size_t b = 0;
      for (std::size_t j = 1; j < n; ++j)
        if (less(heap_[frontier[j]], heap_[frontier[b]])) b = j;
      const std::uint32_t p = frontier[b];
      frontier[b] = frontier[--n];
      if (pred(heap_[p])) return heap_[p];
      for (std::uint32_t c = 2 * p + 1; c <= 2 * p + 2 && c < heap_.size(); ++c) {
        if (n == frontier.size()) return first_by_scan(pred);  // very many rejected: scan
        frontier[n++] = c;
      }
    }
    return std::nullopt;
  }

 private:
  static constexpr std::uint32_t none = 0xffffffffu;

  [[nodiscard]] bool less(std::uint32_t a, std::uint32_t b) const noexcept {
    if (rank_[a] < rank_[b]) return true;
    if (rank_[b] < rank_[a]) return false;
    return a < b;
  }
  template <class Pred>
  [[nodiscard]] std::optional<std::uint32_t> first_by_scan(Pred& pred) const {
    std::optional<std::uint32_t> best;
    for (const std::uint32_t i : heap_)
      if ((!best || less(i, *best)) && pred(i)) best = i;
    return best;
  }
  std::uint32_t sift_up(std::uint32_t p) noexcept {
    while (p > 0) {
      const std::uint32_t parent = (p - 1) / 2;
      if (!less(heap_[p], heap_[parent])) break;
      swap_at(p, parent);
      p = parent;
    }
    return p;
  }
  void sift_down(std::uint32_t p) noexcept {
    for (;;) {
      std::uint32_t m = p;
      const std::uint32_t l = 2 * p + 1, r = l + 1;
      if (l < heap_.size() && less(heap_[l], heap_[m])) m = l;
      if (r < heap_.size() && less(heap_[r], heap_[m])) m = r;
      if (m == p) return;
      swap_at(p, m);
      p = m;
    }
  }
  void swap_at(std::uint32_t a, std::uint32_t b) noexcept {
    std::swap(heap_[a], heap_[b]);
    pos_[heap_[a]] = a;
    pos_[heap_[b]] = b;
  }

  std::vector<std::uint32_t> heap_;
  std::vector<std::uint32_t> pos_;
  std::vector<Rank> rank_;
};

}  // namespace moekit::detail
