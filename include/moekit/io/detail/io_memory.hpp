#pragma once
/// \file Memory that O_DIRECT reads land in. Buffers of 2 MiB or more are mapped on a 2 MiB
/// boundary and marked MADV_HUGEPAGE, so the kernel can back them with transparent huge pages;
/// smaller ones come from the heap.
///
/// Why: the block layer cuts a direct read into requests at the destination's physical
/// segments. With 4 KiB pages a request holds at most `max_segments` pages (254 on the virtio
/// disk here, < 1 MiB; the synchronous pread path then splits each 1 MiB bio into 254 + 2 pages,
/// ~0.5 MiB per request). Each request costs an interrupt, a completion softirq and, on a virtio
/// ring without indirect descriptors (a 254-page request fills its 256 slots), a queue restart in
/// a nice -20 kblockd worker — all on the interrupt CPU, beside the compute threads and outside
/// the loader's own CPU time. With 2 MiB pages a request reaches the device's maximum (4 MiB)
/// in a few segments: far fewer interrupts and kblockd work, and a faster load (measured in
/// bench/RESULTS.md, "Loaders").

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "moekit/error.hpp"

namespace moekit::io::detail {

inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

/// True when a buffer of `bytes` is mapped on a huge-page boundary (and freed with munmap).
[[nodiscard]] constexpr bool uses_huge_pages(std::size_t bytes) noexcept {
  return bytes >= huge_page_bytes;
}

/// `bytes` (> 0) of uninitialised memory aligned to `alignment` (a power of two); from a fresh
/// mapping, aligned to at least 2 MiB and MADV_HUGEPAGE-marked when `uses_huge_pages(bytes)`.
/// Throws std::bad_alloc. Free with `free_io_memory(p, bytes)`.
[[nodiscard]] inline std::byte* allocate_io_memory(std::size_t bytes, std::size_t alignment) {
  MOEKIT_EXPECTS(
      bytes > 0 && alignment >= sizeof(void*) && (alignment & (alignment - 1)) == 0,
      "allocate_io_memory: bytes must be > 0 and alignment a power of two >= sizeof(void*)");
  if (!uses_huge_pages(bytes)) {
    // aligned_alloc wants a size that is a multiple of the alignment.
    auto* p = static_cast<std::byte*>(
        std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment));
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  // Over-map by one alignment unit, then unmap the unaligned head and the tail.
  const std::size_t align = alignment > huge_page_bytes ? alignment : huge_page_bytes;
  const std::size_t len = (bytes + 4095) / 4096 * 4096;
  const std::size_t total = len + align;
  void* raw = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (base + align - 1) / align * align;
  if (aligned > base) ::munmap(raw, aligned - base);
  if (base + total > aligned + len)
    ::munmap(reinterpret_cast<void*>(aligned + len), base + total - aligned - len);
  // Only a hint: without THP (EINVAL) the buffer simply stays on 4 KiB pages.
  (void)::madvise(reinterpret_cast<void*>(aligned), len, MADV_HUGEPAGE);
  return reinterpret_cast<std::byte*>(aligned);
}

/// Frees what `allocate_io_memory(bytes, ·)` returned (nullptr is ignored).
inline void free_io_memory(std::byte* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if (uses_huge_pages(bytes))
    ::munmap(p, (bytes + 4095) / 4096 * 4096);
  else
    std::free(p);
}

}  // namespace moekit::io::detail
