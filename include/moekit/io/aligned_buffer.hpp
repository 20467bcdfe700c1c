#pragma once
/// \file AlignedBuffer: an owned byte buffer whose address and size are multiples of an
/// alignment (4096 by default), as O_DIRECT reads require.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <span>
#include <utility>

#include "moekit/error.hpp"

namespace moekit::io {

/// Owned, zero-initialised, aligned bytes. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  /// `size` is rounded up to a multiple of `alignment` (a power of two, >= sizeof(void*)).
  explicit AlignedBuffer(std::size_t size, std::size_t alignment = 4096) : alignment_(alignment) {
    MOEKIT_EXPECTS(alignment >= sizeof(void*) && (alignment & (alignment - 1)) == 0,
                   "AlignedBuffer: alignment must be a power of two >= sizeof(void*)");
    size_ = (size + alignment - 1) / alignment * alignment;
    if (size_ > 0) {
      data_ = static_cast<std::byte*>(std::aligned_alloc(alignment, size_));
      if (data_ == nullptr) throw std::bad_alloc();
      for (std::size_t i = 0; i < size_; ++i) data_[i] = std::byte{0};
    }
  }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), alignment_(o.alignment_) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      alignment_ = o.alignment_;
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data_); }

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
