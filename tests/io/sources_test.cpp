#include <catch2/catch.hpp>

#include <cerrno>
#include <vector>

#include "io/io_test_util.hpp"
#include "io/store_test_util.hpp"
#include "moekit/io/aligned_buffer.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/token_bucket.hpp"
#include "moekit/io/uring_source.hpp"

using namespace moekit;
using namespace moekit::io;
using moekit::test::fake_expert;
using moekit::test::require_error;
using moekit::test::TempDir;
using moekit::test::tiny_shape;

namespace {

std::string make_store(const TempDir& dir) {
  const auto path = dir.file("src.moestore");
  const std::vector<Precision> ps{Precision::f16, Precision::q4};
  write_expert_store(path, tiny_shape, ps,
                     [](ExpertKey k, Precision p) { return fake_expert(tiny_shape, k, p); });
  return path;
}

/// Reads every blob through `source` into an aligned and a deliberately misaligned buffer.
template <class Source>
void check_reads_all_blobs(const Source& source, const ExpertStore& store) {
  for (const auto& b : store.manifest().blobs) {
    const auto want = fake_expert(tiny_shape, b.key, b.precision);
    AlignedBuffer aligned(b.bytes);
    source.read({b.offset, b.bytes}, aligned.span());
    CHECK(std::equal(want.begin(), want.end(), aligned.data()));
    AlignedBuffer raw(b.bytes + 4096);
    auto misaligned = raw.span().subspan(8, b.bytes);
    source.read({b.offset, b.bytes}, misaligned);
    CHECK(std::equal(want.begin(), want.end(), misaligned.begin()));
  }
}

}  // namespace

TEST_CASE("sources: memory, pread, pread+O_DIRECT and mmap read every blob exactly",
          "[io][sources]") {
  TempDir dir;
  const auto path = make_store(dir);
  auto store = ExpertStore::open(path);
  const auto file = moekit::test::read_file(path);
  check_reads_all_blobs(MemorySource(file, "mem"), store);
  check_reads_all_blobs(PreadSource(path), store);
  check_reads_all_blobs(PreadSource(path, {.direct = true}), store);
  check_reads_all_blobs(MmapSource(path), store);
}

#if defined(MOEKIT_HAS_URING)
TEST_CASE("sources: io_uring with and without O_DIRECT reads every blob exactly",
          "[io][sources][uring]") {
  TempDir dir;
  const auto path = make_store(dir);
  auto store = ExpertStore::open(path);
  try {
    // Tiny chunks and depth so one blob takes several rounds of in-flight reads.
    check_reads_all_blobs(
        UringSource(path, {.direct = true, .queue_depth = 2, .chunk_bytes = 4096, .rings = 2}),
        store);
    check_reads_all_blobs(
        UringSource(path, {.direct = false, .queue_depth = 4, .chunk_bytes = 8192, .rings = 1}),
        store);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported) throw;
    WARN("io_uring unavailable here, test not run: " << e.message());
    return;
  }
  // Reading past the end is a typed error naming the file (after draining in-flight reads).
  UringSource src(path, {.direct = false});
  std::vector<std::byte> buf(8192);
  const auto size = std::filesystem::file_size(path);
  require_error([&] { src.read({size - 4096, 8192}, buf); }, ErrorKind::io, {path, "end of file"});
}
#endif

TEST_CASE("sources: reads past the end or into small buffers give typed errors", "[io][sources]") {
  TempDir dir;
  const auto path = make_store(dir);
  const auto size = std::filesystem::file_size(path);
  std::vector<std::byte> buf(8192);
  require_error(
      [&] {
        PreadSource(path).read({size - 100, 200}, buf);
      },
      ErrorKind::io, {path, "end of file", "offset"});
  require_error(
      [&] {
        MmapSource(path).read({size - 100, 200}, buf);
      },
      ErrorKind::io, {path, "offset"});
  require_error(
      [&] {
        MemorySource(buf, "m").read({8000, 200}, buf);
      },
      ErrorKind::io, {"'m'", "offset 8000"});
  require_error(
      [&] {
        PreadSource(path).read({0, 9000}, buf);
      },
      ErrorKind::invalid_argument, {path, "9000"});
  require_error(
      [&] {
        PreadSource(path, {.direct = true}).read({100, 10}, buf);
      },
      ErrorKind::invalid_argument, {"4096"});
  require_error([&] { PreadSource(dir.file("absent")); }, ErrorKind::io, {"absent"});
}

TEST_CASE("sources: EINTR and short reads are retried; EIO and early EOF are typed errors",
          "[io][sources]") {
  std::vector<std::byte> backing(10000);
  for (std::size_t i = 0; i < backing.size(); ++i) backing[i] = static_cast<std::byte>(i * 31);
  int calls = 0;
  // A device that interrupts every other call and returns at most 333 bytes at a time.
  io::ReadCall flaky = [&](std::byte* p, std::size_t n, std::uint64_t off) -> ssize_t {
    if (++calls % 2 == 0) {
      errno = EINTR;
      return -1;
    }
    const std::size_t k = std::min<std::size_t>({n, 333, backing.size() - off});
    std::memcpy(p, backing.data() + off, k);
    return static_cast<ssize_t>(k);
  };
  std::vector<std::byte> out(5000);
  CHECK(io::read_retrying(flaky, out, out.size(), 1234, "flaky") == 5000);
  CHECK(std::equal(out.begin(), out.end(), backing.begin() + 1234));
  CHECK(calls > 20);

  io::ReadCall eio = [](std::byte*, std::size_t, std::uint64_t) -> ssize_t {
    errno = EIO;
    return -1;
  };
  require_error([&] { io::read_retrying(eio, out, out.size(), 4096, "disk.bin"); }, ErrorKind::io,
                {"disk.bin", "offset 4096", "Input/output error"});
  io::ReadCall eof = [](std::byte*, std::size_t, std::uint64_t) -> ssize_t { return 0; };
  require_error([&] { io::read_retrying(eof, out, out.size(), 77, "short.bin"); }, ErrorKind::io,
                {"short.bin", "end of file", "offset 77"});
}

TEST_CASE("aligned buffer: address and size are multiples of the alignment", "[io][sources]") {
  AlignedBuffer b(5000);
  CHECK(is_aligned(b.data(), 4096));
  CHECK(b.size() == 8192);
  AlignedBuffer c(100, 512);
  CHECK(c.size() == 512);
  CHECK(is_aligned(c.data(), 512));
  require_error([] { AlignedBuffer bad(10, 3); }, ErrorKind::invalid_argument, {"power of two"});
}

TEST_CASE("token bucket: paces bytes to the configured rate (clock injected, no sleeping)",
          "[io][sources]") {
  using namespace std::chrono;
  const TokenBucket::Clock::time_point t0{};
  TokenBucket b(1000.0, 500.0, t0);                          // 1000 B/s, 500 B burst
  CHECK(b.reserve(500, t0) == nanoseconds{0});               // the burst passes at once
  CHECK(b.reserve(1000, t0) == nanoseconds{1'000'000'000});  // then 1000 B cost 1 s
  // Half a second later 500 tokens have accrued: the debt is 500, so 0.5 s for the next 0 bytes.
  CHECK(b.reserve(0, t0 + milliseconds(500)) == nanoseconds{500'000'000});
  // Long idle refills only up to the burst.
  CHECK(b.reserve(600, t0 + seconds(100)) == nanoseconds{100'000'000});
  require_error([] { TokenBucket bad(0, 1); }, ErrorKind::invalid_argument, {"bytes_per_second"});
}
