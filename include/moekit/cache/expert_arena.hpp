#pragma once
/// \file ExpertArena: the memory behind cache slots (and the transient staging slots), and a
/// source of load destinations for anything that submits reads to a Loader itself.
///
/// One 4 KiB-aligned buffer per slot id (aligned so O_DIRECT reads land in place; buffers of
/// 2 MiB or more are huge-page aligned and marked for transparent huge pages, so a load's block
/// requests are larger and far fewer: io/detail/io_memory.hpp). A buffer is kept when its slot
/// is released and reused when the slot is handed out again (the cache hands slots out
/// last-freed-first), so a steady workload allocates nothing after warm-up. A slot holds a buffer
/// of exactly its load's size: when the size changes (another precision), the slot takes an idle
/// buffer of that size from another slot, or a new one. (Reusing a larger buffer for a smaller
/// load made the memory held exceed what the cache accounts, a q4 buffer serving a q2 entry:
/// bench/RESULTS.md, "Fate's memory".) Released
/// buffers are freed once the arena holds more than its limit, so the memory held stays within the
/// limit plus what is live.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "moekit/io/detail/io_memory.hpp"

namespace moekit {

/// Reusable, 4 KiB-aligned buffers, one per slot id, held within a byte limit (plus one expert).
class ExpertArena {
 public:
  static constexpr std::size_t alignment = 4096;

  ExpertArena() = default;
  ExpertArena(std::size_t slots, std::size_t limit_bytes) : buffers_(slots), limit_(limit_bytes) {}

  /// A buffer of at least `bytes` for `slot`.
  std::span<std::byte> acquire(std::uint32_t slot, std::size_t bytes) {
    Buffer& b = buffers_[slot];
    const std::size_t cap = round_up(bytes);
    if (b.capacity != cap) {
      reset(b);  // its contents are dead: the slot is being (re)filled
      const auto idle = std::find_if(buffers_.begin(), buffers_.end(),
                                     [&](const Buffer& x) { return !x.live && x.capacity == cap; });
      if (idle != buffers_.end()) {
        std::swap(b, *idle);  // *idle gets b's empty buffer
      } else {
        trim(cap);
        b.data = std::unique_ptr<std::byte, IoDelete>(
            io::detail::allocate_io_memory(cap, alignment), IoDelete{cap});
        b.capacity = cap;
        held_ += cap;
        peak_ = std::max(peak_, held_);
      }
    }
    b.live = true;
    return {b.data.get(), bytes};
  }
  /// The slot's contents are no longer needed; its buffer may be reused or freed.
  void release(std::uint32_t slot) noexcept {
    Buffer& b = buffers_[slot];
    b.live = false;
    if (held_ > limit_) reset(b);
  }
  /// Slots `a` and `b` exchange their buffers (a staged expert handed to a cache slot, no copy);
  /// a load writing into either keeps writing into the same memory.
  void swap(std::uint32_t a, std::uint32_t b) noexcept { std::swap(buffers_[a], buffers_[b]); }
  [[nodiscard]] std::span<std::byte> bytes(std::uint32_t slot, std::size_t n) const noexcept {
    return {buffers_[slot].data.get(), n};
  }
  [[nodiscard]] std::size_t held_bytes() const noexcept { return held_; }
  /// The most it has held at once: what a memory limit must leave it.
  [[nodiscard]] std::size_t peak_bytes() const noexcept { return peak_; }
  /// Slot ids it has buffers for (0: a default arena, for loaders that keep no bytes).
  [[nodiscard]] std::size_t slots() const noexcept { return buffers_.size(); }
  [[nodiscard]] std::size_t limit_bytes() const noexcept { return limit_; }

 private:
  struct IoDelete {
    std::size_t bytes;  // no default member initialiser: GCC 12 then deletes Buffer() here
    void operator()(std::byte* p) const noexcept { io::detail::free_io_memory(p, bytes); }
  };
  struct Buffer {
    std::unique_ptr<std::byte, IoDelete> data;
    std::size_t capacity = 0;
    bool live = false;
  };
  static std::size_t round_up(std::size_t n) noexcept {
    return (n + alignment - 1) / alignment * alignment;
  }
  void reset(Buffer& b) noexcept {
    held_ -= b.capacity;
    b.data.reset();
    b.capacity = 0;
  }
  // Frees idle buffers until `incoming` more bytes fit under the limit.
  void trim(std::size_t incoming) noexcept {
    for (Buffer& b : buffers_) {
      if (held_ + incoming <= limit_) return;
      if (!b.live && b.capacity > 0) reset(b);
    }
  }

  std::vector<Buffer> buffers_;
  std::size_t limit_ = 0;
  std::size_t held_ = 0, peak_ = 0;
};

}  // namespace moekit
