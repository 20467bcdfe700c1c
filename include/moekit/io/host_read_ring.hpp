#pragma once
/// \file HostReadRing: host buffers outside the expert cache for experts that run once on the CPU
/// (Fiddler's CPU path) when the experts are not held in host memory.
///
/// Fiddler assumes host memory holds every expert, so running a missing expert on the CPU costs no
/// copy. When the model is larger than memory, its experts live on disk; the CPU path then reads
/// the expert through the loader like any other load (counted, and kept out of the page cache by
/// O_DIRECT) into one of these buffers, runs it and drops it, never entering the cache.
///
/// Lifetime: OffloadPipeline prepares every CPU-run expert of a layer call in `route`, then asks
/// for their bytes in `resolve`. A `prepare` after bytes were handed out starts a new layer call:
/// the last call's bytes are done with, and its slots are reused from the first. An expert still
/// held from an earlier call is kept (moved among this call's slots) rather than read again. A
/// slot whose read is in flight is waited on before it is reused. Bytes asked for without a
/// `prepare` are read into the next slot in turn, and stay valid for `capacity` such requests.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/core/expert_key.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/aligned_buffer.hpp"

namespace moekit::io {

class HostReadRing {
 public:
  /// `capacity`: experts one layer may run on the CPU at once (its expert count); `bytes_of`:
  /// an expert's bytes at a precision.
  HostReadRing(std::uint32_t capacity, std::function<std::size_t(Precision)> bytes_of)
      : slots_(capacity), bytes_of_(std::move(bytes_of)) {
    MOEKIT_EXPECTS(capacity > 0, "HostReadRing: capacity must be > 0");
  }

  /// Starts reading `k` at `p` through `loader` (nothing when this layer call holds it already).
  template <Loader L>
  void prepare(L& loader, ExpertKey k, Precision p) {
    if (handed_out_) handed_out_ = false, next_ = 0;  // a new layer call
    const std::size_t j = find(k, p);
    if (j < next_) return;  // prepared in this call already
    if (next_ == slots_.size())
      throw Error(ErrorKind::invalid_argument,
                  "HostReadRing: more experts in one layer call than its " +
                      std::to_string(slots_.size()) + " slots");
    if (j != npos) {  // held from an earlier call: keep it among this call's slots
      std::swap(slots_[j], slots_[next_++]);
      return;
    }
    stage(loader, k, p);
  }

  /// The expert's bytes, once its read is done (read now when it was not prepared).
  template <Loader L>
  std::span<const std::byte> bytes(L& loader, ExpertKey k, Precision p) {
    std::size_t j = find(k, p);
    if (j == npos) {
      if (next_ == slots_.size()) next_ = 0;
      j = next_;
      stage(loader, k, p);
    }
    handed_out_ = true;
    Slot& s = slots_[j];
    finish(loader, s);
    return s.buffer.span().first(s.bytes);
  }

  /// Bytes read into the ring so far.
  [[nodiscard]] std::uint64_t read_bytes() const noexcept { return read_bytes_; }
  /// Bytes the ring holds now (its buffers grow to the largest expert each slot has read).
  [[nodiscard]] std::uint64_t held_bytes() const noexcept {
    std::uint64_t b = 0;
    for (const Slot& s : slots_) b += s.buffer.size();
    return b;
  }

 private:
  struct Slot {
    AlignedBuffer buffer;
    ExpertKey key{};
    Precision precision = Precision::f32;
    std::size_t bytes = 0;
    LoadTicket ticket{};
    bool staged = false;   ///< holds (or is reading) `key` at `precision`
    bool pending = false;  ///< the read has not been waited on
  };

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  [[nodiscard]] std::size_t find(ExpertKey k, Precision p) const noexcept {
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].staged && slots_[i].key == k && slots_[i].precision == p) return i;
    return npos;
  }
  /// Reads `k` at `p` into slot `next_` (waiting first for the read it may still have in flight).
  template <Loader L>
  void stage(L& loader, ExpertKey k, Precision p) {
    Slot& s = slots_[next_++];
    finish(loader, s);
    s.staged = false;
    const std::size_t n = bytes_of_(p);
    if (s.buffer.size() < n) s.buffer = AlignedBuffer(n);
    s.ticket = loader.submit({k, p, LoadPriority::on_demand, s.buffer.span().first(n)});
    s.key = k;
    s.precision = p;
    s.bytes = n;
    s.staged = true;
    s.pending = true;
    read_bytes_ += n;
  }
  template <Loader L>
  static void finish(L& loader, Slot& s) {
    if (!s.pending) return;
    s.pending = false;
    try {
      loader.wait(s.ticket);
    } catch (...) {
      s.staged = false;  // the bytes are not there: a later request reads again
      throw;
    }
  }

  std::vector<Slot> slots_;
  std::function<std::size_t(Precision)> bytes_of_;
  std::size_t next_ = 0;     ///< the slot the next staged expert takes
  bool handed_out_ = false;  ///< bytes were handed out since the last `prepare`
  std::uint64_t read_bytes_ = 0;
};

}  // namespace moekit::io
