#pragma once
/// \file AlignedBuffer: an owned byte buffer whose address and size are multiples of an
/// alignment (4096 by default), as O_DIRECT reads require. Buffers of 2 MiB or more are
/// huge-page aligned and marked for transparent huge pages (io/detail/io_memory.hpp: larger
/// block requests, far fewer interrupts per byte read).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

#include "moekit/error.hpp"
#include "moekit/io/detail/io_memory.hpp"

namespace moekit::io {

/// Owned, zero-initialised, aligned bytes. Move-only.
class AlignedBuffer {
 public:
  /// Buffers of at least this many bytes are mapped on a boundary of it and marked for
  /// transparent huge pages (io/detail/io_memory.hpp says why); smaller ones come from the heap.
  static constexpr std::size_t huge_page_bytes = detail::huge_page_bytes;
  /// True when a buffer of `bytes` is mapped so.
  [[nodiscard]] static constexpr bool uses_huge_pages(std::size_t bytes) noexcept {
    return detail::uses_huge_pages(bytes);
  }

  AlignedBuffer() = default;
  /// `size` is rounded up to a multiple of `alignment` (a power of two, >= sizeof(void*)).
  explicit AlignedBuffer(std::size_t size, std::size_t alignment = 4096) : alignment_(alignment) {
    MOEKIT_EXPECTS(alignment >= sizeof(void*) && (alignment & (alignment - 1)) == 0,
                   "AlignedBuffer: alignment must be a power of two >= sizeof(void*)");
    size_ = (size + alignment - 1) / alignment * alignment;
    if (size_ > 0) {
      data_ = detail::allocate_io_memory(size_, alignment);
      std::memset(data_, 0, size_);  // also faults the pages in now, not during the first read
    }
  }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        alignment_(o.alignment_) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      detail::free_io_memory(data_, size_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      alignment_ = o.alignment_;
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { detail::free_io_memory(data_, size_); }

  [[nodiscard]] std::byte* data() noexcept { return data_; }
  [[nodiscard]] const std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
  [[nodiscard]] std::span<std::byte> span() noexcept { return {data_, size_}; }
  [[nodiscard]] std::span<const std::byte> span() const noexcept { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t alignment_ = 4096;
};

/// True when `p` is a multiple of `alignment`.
inline bool is_aligned(const void* p, std::size_t alignment) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

}  // namespace moekit::io
