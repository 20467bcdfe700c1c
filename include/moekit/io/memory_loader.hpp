#pragma once
/// \file MemoryLoader: "loads" experts by copying them from host memory, synchronously.
///
/// For engines whose whole expert set sits in RAM (the slow tier is host memory, as for a GPU
/// cache fed over PCIe) and for tests. The copy happens inside `submit`, so every ticket is
/// complete on return and `cancel` never finds a queued load.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string_view>
#include <utility>

#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// Copies an expert's bytes from a host-memory source into the destination slot.
class MemoryLoader {
 public:
  static constexpr std::string_view name = "memory";
  static constexpr Hooks hooks = Hook::host_bytes;
  /// Returns the bytes of `key` at `precision` in host memory (must outlive the loader).
  using Source = std::function<std::span<const std::byte>(ExpertKey, Precision)>;

  explicit MemoryLoader(Source source) : source_(std::move(source)) {
    MOEKIT_EXPECTS(static_cast<bool>(source_), "MemoryLoader: empty source function");
  }

  LoadTicket submit(const LoadRequest& r) {
    const std::span<const std::byte> src = source_(r.key, r.precision);
    if (!r.dest.empty()) {
      MOEKIT_EXPECTS(r.dest.size() >= src.size(),
                     "MemoryLoader: destination smaller than the expert's bytes");
      std::memcpy(r.dest.data(), src.data(), src.size());
    }
    bytes_ += src.size();
    return LoadTicket{++next_};
  }
  [[nodiscard]] bool poll(LoadTicket) const noexcept { return true; }
  void wait(LoadTicket) const noexcept {}
  [[nodiscard]] bool cancel(LoadTicket) const noexcept { return false; }
  /// The expert's bytes in host memory, for experts run on the CPU without a copy.
  [[nodiscard]] std::span<const std::byte> host_bytes(ExpertKey key, Precision p) const {
    return source_(key, p);
  }
  [[nodiscard]] std::uint64_t bytes_copied() const noexcept { return bytes_; }

 private:
  Source source_;
  std::uint64_t next_ = 0;
  std::uint64_t bytes_ = 0;
};
static_assert(Loader<MemoryLoader>);

}  // namespace moekit
