#pragma once
/// \file ResidentSet: the dense indices of the experts a scoring policy currently tracks.
///
/// For policies whose rank of an entry changes with time itself (the cost-aware offline reference:
/// next-use distance × bytes), so no order can be kept between evictions; they scan their
/// residents. O(1) insert/erase and a contiguous array to scan: a victim costs O(residents).

#include <cstdint>
#include <span>
#include <vector>

#include "moekit/cache/detail/dense_index.hpp"

namespace moekit::detail {

/// A set of dense expert indices in [0, size) with swap-remove erase.
class ResidentSet {
 public:
  void reset(std::size_t size) {
    items_.clear();
    items_.reserve(size);
    pos_.assign(size, none);
  }
  void insert(std::uint32_t i) noexcept {
    if (pos_[i] != none) return;
    pos_[i] = static_cast<std::uint32_t>(items_.size());
    items_.push_back(i);  // capacity reserved in reset(): never reallocates
  }
  void erase(std::uint32_t i) noexcept {
    const std::uint32_t p = pos_[i];
    if (p == none) return;
    const std::uint32_t last = items_.back();
    items_[p] = last;
    pos_[last] = p;
    items_.pop_back();
    pos_[i] = none;
  }
  [[nodiscard]] bool contains(std::uint32_t i) const noexcept { return pos_[i] != none; }
  [[nodiscard]] std::span<const std::uint32_t> items() const noexcept { return items_; }
  [[nodiscard]] std::size_t size() const noexcept { return items_.size(); }

 private:
  static constexpr std::uint32_t none = 0xffffffffu;
  std::vector<std::uint32_t> items_;
  std::vector<std::uint32_t> pos_;
};

}  // namespace moekit::detail
