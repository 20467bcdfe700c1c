#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io/io_test_util.hpp"
#include "moekit/cache/expert_arena.hpp"
#include "moekit/io/aligned_buffer.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/uring_source.hpp"

using namespace moekit;
using namespace moekit::io;
using moekit::test::TempDir;

namespace io_memory_test {

constexpr std::size_t mib = std::size_t{1} << 20;

/// The VmFlags of the mapping that holds `p` ("" when not found).
std::string vm_flags_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> lo >> dash >> hi && dash == '-' &&
        line.find(' ') != std::string::npos && line.find(':') > line.find(' ')) {
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

bool kernel_has_thp() {
  return std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled");
}

std::vector<std::byte> pseudo_random(std::size_t n) {
  std::vector<std::byte> v(n);
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<std::byte>(x >> 24);
  }
  return v;
}

}  // namespace io_memory_test

using namespace io_memory_test;

TEST_CASE("io memory: buffers of 2 MiB and more are huge-page aligned and marked for THP",
          "[io][memory]") {
  AlignedBuffer big(5 * mib + 1);
  CHECK(big.size() == 5 * mib + 4096);
  CHECK(is_aligned(big.data(), AlignedBuffer::huge_page_bytes));
  CHECK(std::all_of(big.data(), big.data() + big.size(),
                    [](std::byte b) { return b == std::byte{0}; }));
  if (kernel_has_thp()) CHECK(vm_flags_of(big.data()).find(" hg") != std::string::npos);

  // Below 2 MiB: the heap, 4 KiB alignment as before, no huge-page marking needed.
  AlignedBuffer small(AlignedBuffer::huge_page_bytes - 4096);
  CHECK(is_aligned(small.data(), 4096));
  CHECK(!AlignedBuffer::uses_huge_pages(small.size()));

  // Alignments above 2 MiB are honoured too; moving keeps ownership (freed once, by munmap).
  AlignedBuffer wide(3 * mib, 4 * mib);
  CHECK(is_aligned(wide.data(), 4 * mib));
  std::byte* const p = wide.data();
  AlignedBuffer moved(std::move(wide));
  CHECK(moved.data() == p);
  CHECK(wide.data() == nullptr);
  moved = AlignedBuffer(2 * mib);
  CHECK(is_aligned(moved.data(), AlignedBuffer::huge_page_bytes));
}

TEST_CASE("io memory: O_DIRECT reads into huge-page buffers are exact (pread and io_uring)",
          "[io][memory]") {
  TempDir dir;
  const auto path = dir.file("big.bin");
  const std::size_t bytes = 7 * mib + 1234;  // several 4 MiB requests and a partial last page
  const auto want = pseudo_random(bytes + 3 * 4096);
  moekit::test::write_file(path, want);

  auto check_source = [&](const auto& source) {
    for (const std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{3 * 4096}}) {
      AlignedBuffer buf(bytes);
      REQUIRE(is_aligned(buf.data(), AlignedBuffer::huge_page_bytes));
      source.read({offset, bytes}, buf.span());
      CHECK(std::equal(want.begin() + static_cast<std::ptrdiff_t>(offset),
                       want.begin() + static_cast<std::ptrdiff_t>(offset + bytes), buf.data()));
    }
  };
  check_source(PreadSource(path, {.direct = true}));
#if defined(MOEKIT_HAS_URING)
  try {
    check_source(UringSource(path, {.direct = true}));
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported) throw;
    WARN("io_uring unavailable here, not checked: " << e.message());
  }
#endif
}

TEST_CASE("io memory: the expert arena puts large slot buffers on huge pages", "[io][memory]") {
  moekit::ExpertArena arena(3, 64 * mib);
  const auto big = arena.acquire(0, 3 * mib + 100);
  CHECK(big.size() == 3 * mib + 100);
  CHECK(is_aligned(big.data(), AlignedBuffer::huge_page_bytes));
  if (kernel_has_thp()) CHECK(vm_flags_of(big.data()).find(" hg") != std::string::npos);
  std::fill(big.begin(), big.end(), std::byte{7});  // the whole span is writable

  const auto small = arena.acquire(1, 5000);
  CHECK(is_aligned(small.data(), 4096));
  std::fill(small.begin(), small.end(), std::byte{1});

  // Reuse after release keeps the buffer; a size change reallocates (the old one is unmapped).
  arena.release(0);
  CHECK(arena.acquire(0, 3 * mib + 200).data() == big.data());
  arena.release(0);
  const auto bigger = arena.acquire(0, 9 * mib);
  CHECK(is_aligned(bigger.data(), AlignedBuffer::huge_page_bytes));
  std::fill(bigger.begin(), bigger.end(), std::byte{9});
  CHECK(arena.held_bytes() == 9 * mib + 8192);
}

// Fate's q2 misses and q4 upgrades share slots: a slot reusing a larger buffer for a smaller load
// held more than the cache accounted (bench/RESULTS.md, "Fate's memory").
TEST_CASE("expert arena: a slot holds a buffer of its load's size, taken from an idle slot",
          "[io][memory]") {
  const std::size_t q4 = 4 * 4096, q2 = 2 * 4096;
  moekit::ExpertArena arena(4, 64 * q4);
  const auto a = arena.acquire(0, q4);
  (void)arena.acquire(1, q4);
  arena.release(0);
  CHECK(arena.acquire(2, q2).size() == q2);  // slot 0's idle q4 buffer is not taken for a q2 load
  CHECK(arena.held_bytes() == 2 * q4 + q2);
  CHECK(arena.acquire(3, q4).data() == a.data());  // ... but for a q4 load of another slot
  CHECK(arena.held_bytes() == 2 * q4 + q2);
  arena.release(1);
  (void)arena.acquire(1, q2);  // a smaller load: a buffer of its size, the old one unmapped
  CHECK(arena.held_bytes() == q4 + 2 * q2);
  CHECK(arena.peak_bytes() == 2 * q4 + q2);
}
