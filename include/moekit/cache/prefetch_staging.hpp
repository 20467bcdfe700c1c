#pragma once
/// \file PrefetchStaging: a bounded area outside the cache where prefetched experts wait.
///
/// Fate (Fang et al., 2025, §4.1 steps 7–8; design spec fate.md §2.6, A10, A16) keeps prefetched
/// experts out of its per-layer ARC caches: they wait in staging slots; ARC sees only the true
/// routing. When the layer they were predicted for runs, a used prefetch is served from its slot
/// and admitted to the cache through the normal (demand) path, its buffer handed to the cache slot
/// without a copy; an unused one is freed (its load withdrawn if it has not started). A layer whose
/// pool has no slot is still served from staging. Slots are bounded (`capacity`); a prefetch that
/// finds none free is dropped.
///
/// This class is the bookkeeping: which expert waits in which slot, under which load, in which
/// state. The pipeline (`PipelineConfig::prefetch_staging_slots`) drives it; slot `i` is arena slot
/// `first_slot + i`.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "moekit/core/expert_key.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/core/precision.hpp"

namespace moekit {

/// Staged prefetches, one per slot.
class PrefetchStaging {
 public:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);

  enum class State : std::uint8_t {
    free,
    waiting,  ///< issued for a later layer, not yet asked for
    serving,  ///< asked for by its layer and not admitted to the cache: freed when the layer ends
    orphan,   ///< not asked for, but its load could not be withdrawn: freed once it completes
  };
  struct Slot {
    ExpertKey key{};
    Precision precision = Precision::skip;
    LoadTicket ticket{};
    std::size_t bytes = 0;
    State state = State::free;
  };

  PrefetchStaging() = default;
  /// `slots` staging slots, the first at arena slot id `first_slot`.
  PrefetchStaging(std::uint32_t slots, std::uint32_t first_slot)
      : slots_(slots), first_(first_slot) {}

  [[nodiscard]] bool enabled() const noexcept { return !slots_.empty(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return slots_.size(); }
  [[nodiscard]] std::uint32_t slot_id(std::size_t i) const noexcept {
    return first_ + static_cast<std::uint32_t>(i);
  }
  [[nodiscard]] Slot& operator[](std::size_t i) noexcept { return slots_[i]; }
  [[nodiscard]] const Slot& operator[](std::size_t i) const noexcept { return slots_[i]; }

  /// The slot where `key` waits (or serves) at a precision that serves `want`, or `none`.
  [[nodiscard]] std::size_t find(ExpertKey key, Precision want) const noexcept {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if ((s.state == State::waiting || s.state == State::serving) && s.key == key &&
          satisfies(s.precision, want))
        return i;
    }
    return none;
  }
  /// A free slot, or `none`.
  [[nodiscard]] std::size_t free_slot() const noexcept {
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].state == State::free) return i;
    return none;
  }
  /// Slots not free (waiting, serving or orphaned).
  [[nodiscard]] std::size_t used() const noexcept {
    std::size_t n = 0;
    for (const Slot& s : slots_) n += s.state != State::free;
    return n;
  }
  void stage(std::size_t i, ExpertKey key, Precision p, LoadTicket t, std::size_t bytes) noexcept {
    slots_[i] = Slot{key, p, t, bytes, State::waiting};
  }
  void free(std::size_t i) noexcept { slots_[i] = Slot{}; }

 private:
  std::vector<Slot> slots_;
  std::uint32_t first_ = 0;
};

}  // namespace moekit
