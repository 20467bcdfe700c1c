#pragma once
/// \file PrefetchList and ResidencyView: the predictor's output buffer and its window on the cache.

#include <cstddef>
#include <span>

#include "moekit/core/expert_key.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/core/precision.hpp"

namespace moekit {

/// Fixed-capacity output buffer for a predictor (no allocation on the per-layer path).
class PrefetchList {
 public:
  explicit PrefetchList(std::span<Prefetch> storage) noexcept : buf_(storage) {}

  /// Appends `p`; returns false (and drops it) when the buffer is full.
  bool push(const Prefetch& p) noexcept {
    if (n_ == buf_.size()) return false;
    buf_[n_++] = p;
    return true;
  }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return buf_.size(); }
  [[nodiscard]] bool full() const noexcept { return n_ == buf_.size(); }
  void clear() noexcept { n_ = 0; }
  [[nodiscard]] std::span<const Prefetch> items() const noexcept { return buf_.first(n_); }
  [[nodiscard]] std::span<Prefetch> items() noexcept { return buf_.first(n_); }

 private:
  std::span<Prefetch> buf_;
  std::size_t n_ = 0;
};

/// Read-only view of what the cache holds, for predictors that look at residency (HOBBIT walks
/// forward while predicted experts are resident).
class ResidencyView {
 public:
  using Fn = bool (*)(const void*, ExpertKey, Precision) noexcept;
  constexpr ResidencyView(const void* owner, Fn fn) noexcept : owner_(owner), fn_(fn) {}
  /// True when `key` is resident (or loading) at a precision that satisfies `want`.
  [[nodiscard]] bool resident(ExpertKey key, Precision want) const noexcept {
    return fn_(owner_, key, want);
  }

 private:
  const void* owner_;
  Fn fn_;
};

}  // namespace moekit
