#include <catch2/catch.hpp>

// Issue 24, "Fuzzing and faults": the loaders under an EIO on the n-th read, short reads, a store
// truncated while it is being read, and a slow disk (FaultInjectingSource), plus the real sources
// (pread, pread + O_DIRECT, io_uring) on a store truncated between loads. Each fault's documented
// outcome (fault_injecting_source.hpp): a typed error naming the file and the offset, or the exact
// bytes; never a hang, never other bytes.

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/io_test_util.hpp"
#include "io/store_test_util.hpp"
#include "moekit/io/async_loader.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/fault_injecting_source.hpp"
#if defined(MOEKIT_HAS_URING)
#include "moekit/io/uring_source.hpp"
#endif

using namespace moekit;
using namespace moekit::io;
using moekit::test::fake_expert;
using moekit::test::require_error;
using moekit::test::TempDir;
using moekit::test::tiny_shape;

namespace {

const std::vector<Precision> faulty_store_precisions{Precision::f16, Precision::q4};

// Writes a store of tiny_shape at f16 and q4 to `path`: 12 blobs of 12288 or 3456 bytes.
void write_faulty_store(const std::string& path, bool overwrite = false) {
  write_expert_store(path, tiny_shape, faulty_store_precisions,
                     [](ExpertKey k, Precision p) { return fake_expert(tiny_shape, k, p); },
                     {.overwrite = overwrite});
}

std::string faulty_store_file(const TempDir& dir) {
  const auto path = dir.file("faults.moestore");
  write_faulty_store(path);
  return path;
}

// One I/O thread: blob i of the manifest is read by read(2) calls in the order they are loaded.
template <class Source>
using SerialLoader = AsyncLoader<Source>;
template <class Source>
typename SerialLoader<Source>::Config serial_config() {
  typename SerialLoader<Source>::Config c;
  c.io_threads = 1;
  return c;
}

// Loads `b` through `loader` into a fresh buffer; returns it (rethrows the load's error).
template <class Loader>
std::vector<std::byte> load_blob(Loader& loader, const StoreBlob& b) {
  std::vector<std::byte> dest(b.bytes);
  loader.wait(loader.submit({b.key, b.precision, LoadPriority::on_demand, dest}));
  return dest;
}

bool holds_expert(const std::vector<std::byte>& got, const StoreBlob& b) {
  const auto want = fake_expert(tiny_shape, b.key, b.precision);
  return got.size() == want.size() && std::memcmp(got.data(), want.data(), want.size()) == 0;
}

// O_DIRECT needs a file system that takes it (tmpfs does not).
bool direct_io_works(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

}  // namespace

TEST_CASE("faults: EIO on the n-th read fails that load naming file and offset; the rest load",
          "[io][faults]") {
  TempDir dir;
  const auto path = faulty_store_file(dir);
  const ExpertStore store = ExpertStore::open(path);
  const auto& blobs = store.manifest().blobs;
  REQUIRE(blobs.size() == 12);
  for (const std::uint64_t n : {1u, 5u, 12u}) {
    DYNAMIC_SECTION("EIO on read " << n) {
      FaultInjectingSource src(path, {.eio_on_call = n});
      SerialLoader<FaultInjectingSource> loader(store, src, serial_config<FaultInjectingSource>());
      for (std::size_t i = 0; i < blobs.size(); ++i) {
        const StoreBlob& b = blobs[i];
        if (i + 1 == n) {
          require_error([&] { (void)load_blob(loader, b); }, ErrorKind::io,
                        {path, "offset " + std::to_string(b.offset), "Input/output error"});
        } else {
          CHECK(holds_expert(load_blob(loader, b), b));  // the loader goes on after the error
        }
      }
      CHECK(src.calls() == blobs.size());
    }
  }
}

TEST_CASE("faults: short reads are continued and give the exact bytes", "[io][faults]") {
  TempDir dir;
  const auto path = faulty_store_file(dir);
  const ExpertStore store = ExpertStore::open(path);
  SECTION("buffered, 1000 and 1 bytes per read") {
    for (const std::size_t k : {std::size_t{1000}, std::size_t{1}}) {
      FaultInjectingSource src(path, {.short_read_bytes = k});
      AsyncLoader<FaultInjectingSource> loader(store, src, {});
      std::uint64_t bytes = 0;
      for (const auto& b : store.manifest().blobs) {
        CHECK(holds_expert(load_blob(loader, b), b));
        bytes += b.bytes;
      }
      CHECK(src.calls() >= bytes / k);  // the reads really were short
    }
  }
  SECTION("O_DIRECT, one page per read") {
    if (!direct_io_works(path)) {
      WARN("O_DIRECT is not supported on " << dir.path() << "; not run");
      return;
    }
    FaultInjectingSource src(path, {.short_read_bytes = 4096}, {.direct = true});
    AsyncLoader<FaultInjectingSource> loader(store, src, {});
    for (const auto& b : store.manifest().blobs) CHECK(holds_expert(load_blob(loader, b), b));
    CHECK(src.calls() > store.manifest().blobs.size());
  }
}

TEST_CASE("faults: a store truncated while it is read: loads beyond the end name file and offset",
          "[io][faults]") {
  TempDir dir;
  const auto path = faulty_store_file(dir);
  const ExpertStore store = ExpertStore::open(path);
  const auto& blobs = store.manifest().blobs;
  // Cut in the middle of blob 6 before read 4: blobs 0-5 lie below the new end, 6 straddles it.
  const StoreBlob& cut = blobs[6];
  const std::uint64_t cut_at = cut.offset + cut.bytes / 2;
  for (std::size_t i = 0; i < 6; ++i) REQUIRE(blobs[i].offset + blobs[i].bytes <= cut_at);
  FaultInjectingSource src(path, {.truncate_on_call = 4, .truncate_to = cut_at});
  SerialLoader<FaultInjectingSource> loader(store, src, serial_config<FaultInjectingSource>());
  for (std::size_t i = 0; i < blobs.size(); ++i) {
    const StoreBlob& b = blobs[i];
    if (i < 6) {
      CHECK(holds_expert(load_blob(loader, b), b));
    } else {
      // blob 6 is read up to the cut; the others start past it
      const std::uint64_t at = i == 6 ? cut_at : b.offset;
      require_error([&] { (void)load_blob(loader, b); }, ErrorKind::io,
                    {path, "unexpected end of file", "offset " + std::to_string(at)});
    }
  }
  CHECK(std::filesystem::file_size(path) == cut_at);
}

TEST_CASE("faults: the real sources on a store truncated between loads: a typed error, no hang",
          "[io][faults]") {
  TempDir dir;
  const auto path = faulty_store_file(dir);
  const ExpertStore store = ExpertStore::open(path);
  const auto& blobs = store.manifest().blobs;
  const StoreBlob& first = blobs.front();
  const StoreBlob& last = blobs.back();
  // Each source opens the file, loads a blob, then the file loses its last blob and a half.
  auto check = [&](auto source) {
    using Source = decltype(source);
    AsyncLoader<Source> loader(store, std::move(source), {});
    CHECK(holds_expert(load_blob(loader, last), last));
    REQUIRE(::truncate(path.c_str(), static_cast<off_t>(last.offset - 1000)) == 0);
    CHECK(holds_expert(load_blob(loader, first), first));
    require_error([&] { (void)load_blob(loader, last); }, ErrorKind::io, {path, "offset"});
    // put it back for the next source
    write_faulty_store(path, /*overwrite=*/true);
  };
  SECTION("pread") { check(PreadSource(path)); }
  SECTION("pread + O_DIRECT") {
    if (direct_io_works(path)) check(PreadSource(path, {.direct = true}));
  }
#if defined(MOEKIT_HAS_URING)
  SECTION("io_uring + O_DIRECT") {
    try {
      UringSource probe(path, {.direct = direct_io_works(path)});
    } catch (const Error& e) {
      WARN("io_uring is not available here: " << e.message());
      return;
    }
    check(UringSource(path, {.direct = direct_io_works(path)}));
  }
#endif
}

TEST_CASE("faults: a slow disk gives the exact bytes, later, and never hangs", "[io][faults]") {
  TempDir dir;
  const auto path = faulty_store_file(dir);
  const ExpertStore store = ExpertStore::open(path);
  // 2 ms per call and 4 MB/s: the 94 KB of the store take >= 24 ms + 12 x 2 ms on one thread.
  FaultInjectingSource src(path, {.short_read_bytes = 8192,
                                  .delay_per_call = std::chrono::milliseconds(2),
                                  .bytes_per_second = 4e6});
  AsyncLoader<FaultInjectingSource> loader(store, src, {.io_threads = 2});
  const auto start = std::chrono::steady_clock::now();
  // everything in flight at once, on-demand and prefetch mixed, then waited on in reverse
  std::vector<std::vector<std::byte>> dest;
  std::vector<LoadTicket> tickets;
  for (const auto& b : store.manifest().blobs) dest.emplace_back(b.bytes);
  for (std::size_t i = 0; i < dest.size(); ++i) {
    const StoreBlob& b = store.manifest().blobs[i];
    tickets.push_back(loader.submit(
        {b.key, b.precision, i % 2 ? LoadPriority::prefetch : LoadPriority::on_demand, dest[i]}));
  }
  for (std::size_t i = dest.size(); i-- > 0;) {
    loader.wait(tickets[i]);
    CHECK(holds_expert(dest[i], store.manifest().blobs[i]));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds >= 0.012);  // the delays acted (two threads: half of the serial time)
  CHECK(seconds < 30);      // and did not turn into a hang
}
