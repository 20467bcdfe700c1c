#pragma once
/// \file LazyUpgrade: low-precision cache entries raised to the cache's precision in the
/// background, while the link is idle.
///
/// Fate (Fang et al., 2025, §4.5, §5.3; design spec fate.md §2.7, A11, A12) caches int4 experts
/// but loads a mispredicted expert at int2 for speed. Such a copy is admitted as is and serves the
/// request that loaded it (and later ones) until an int4 re-fetch of the same expert, issued only
/// when no other load is pending, replaces it in place. An entry evicted (or already upgraded)
/// before its turn is skipped.
///
/// This class is the bookkeeping: the queue of entries to upgrade, first admitted first, and the
/// one upgrade in flight, loading into its own arena slot (`slot`). The pipeline
/// (`PipelineConfig::upgrade_precision`) drives it.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "moekit/core/expert_key.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/core/precision.hpp"

namespace moekit {

/// Entries waiting for an upgrade to `target`, and the one in flight.
class LazyUpgrade {
 public:
  LazyUpgrade() = default;
  /// Upgrades to `target` (`skip`: none), loading into arena slot `slot`; room for `reserve` keys.
  LazyUpgrade(Precision target, std::uint32_t slot, std::size_t reserve)
      : target_(target), slot_(slot) {
    queue_.reserve(reserve);
  }

  [[nodiscard]] bool enabled() const noexcept { return target_ != Precision::skip; }
  [[nodiscard]] Precision target() const noexcept { return target_; }
  [[nodiscard]] std::uint32_t slot() const noexcept { return slot_; }
  /// True when an entry at `p` should be upgraded.
  [[nodiscard]] bool below_target(Precision p) const noexcept {
    return enabled() && p != Precision::skip && bits(p) < bits(target_);
  }

  /// Queues `key` unless it is already waiting.
  void request(ExpertKey key) {
    for (std::size_t i = head_; i < queue_.size(); ++i)
      if (queue_[i] == key) return;
    if (head_ > 0 && queue_.size() == queue_.capacity()) {  // reuse the taken front
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
    queue_.push_back(key);
  }
  /// The oldest request not yet taken, or nothing.
  std::optional<ExpertKey> next() noexcept {
    if (head_ == queue_.size()) {
      queue_.clear();
      head_ = 0;
      return std::nullopt;
    }
    return queue_[head_++];
  }
  [[nodiscard]] std::size_t waiting() const noexcept { return queue_.size() - head_; }

  [[nodiscard]] bool busy() const noexcept { return ticket_.valid(); }
  [[nodiscard]] ExpertKey key() const noexcept { return key_; }
  [[nodiscard]] LoadTicket ticket() const noexcept { return ticket_; }
  void start(ExpertKey key, LoadTicket t) noexcept { key_ = key, ticket_ = t; }
  void finish() noexcept { ticket_ = {}; }
  /// Forgets every request (a new sequence keeps the cache, and its entries' requests).
  void clear() noexcept {
    queue_.clear();
    head_ = 0;
  }

 private:
  Precision target_ = Precision::skip;
  std::uint32_t slot_ = 0;
  std::vector<ExpertKey> queue_;
  std::size_t head_ = 0;
  ExpertKey key_{};
  LoadTicket ticket_{};
};

}  // namespace moekit
