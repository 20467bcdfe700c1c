#include <catch2/catch.hpp>

// Issue 24, point 1: every blob read from a store is checked against its XXH64. The loader reads a
// blob in pieces (verify_piece: 3/4 of what is left, down to Config::verify_tail), hands each to
// its I/O thread's verifier, which hashes them in order while the next is read and finishes the
// load while the I/O thread reads the next blob. Checked here: the pieces and their order, short
// reads, a damaged byte in the first or the last piece, EIO on either piece's read, several loads
// in the pipeline at once (good and bad ones), and a loader destroyed with loads in it.

#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "io/io_test_util.hpp"
#include "io/store_test_util.hpp"
#include "moekit/io/async_loader.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/fault_injecting_source.hpp"

using namespace moekit;
using namespace moekit::io;
using moekit::test::fake_expert;
using moekit::test::require_error;
using moekit::test::TempDir;
using moekit::test::tiny_shape;

// Named, not anonymous: the io tests compile as one unity translation unit.
namespace verified_load_test {

// The pieces verify_piece cuts `bytes` into.
std::vector<std::uint64_t> pieces_of(std::uint64_t bytes, std::uint64_t tail) {
  std::vector<std::uint64_t> out;
  for (std::uint64_t left = bytes; left > 0;) {
    out.push_back(verify_piece(left, tail));
    left -= out.back();
  }
  return out;
}

// Records every read (offset, bytes) in order, then reads from memory.
class RecordingSource {
 public:
  struct Log {
    std::mutex m;
    std::vector<BlobRange> reads;
  };
  RecordingSource(MemorySource inner, std::shared_ptr<Log> log)
      : inner_(std::move(inner)), log_(std::move(log)) {}
  void read(BlobRange r, std::span<std::byte> dest) const {
    {
      std::lock_guard lock(log_->m);
      log_->reads.push_back(r);
    }
    inner_.read(r, dest);
  }
  [[nodiscard]] const std::string& name() const { return inner_.name(); }

 private:
  MemorySource inner_;
  std::shared_ptr<Log> log_;
};

struct Store {
  TempDir dir;
  std::string path = dir.file("v.moestore");
  std::vector<std::byte> file;
  std::optional<ExpertStore> store;
  Store() {
    const std::vector<Precision> ps{Precision::f16, Precision::q4};
    write_expert_store(path, tiny_shape, ps,
                       [](ExpertKey k, Precision p) { return fake_expert(tiny_shape, k, p); });
    file = moekit::test::read_file(path);
    store = ExpertStore::open(path);
  }
};

template <class Source>
typename AsyncLoader<Source>::Config pieces_config(unsigned io_threads = 1) {
  typename AsyncLoader<Source>::Config c;
  c.io_threads = io_threads;
  c.verify_tail = 4096;  // tiny_shape's f16 blobs (12288 bytes) in two pieces: 8192, 4096
  return c;
}

template <class Loader>
std::vector<std::byte> load_checked(Loader& loader, const StoreBlob& b) {
  std::vector<std::byte> dest(b.bytes);
  loader.wait(loader.submit({b.key, b.precision, LoadPriority::on_demand, dest}));
  return dest;
}

bool is_fake_expert(const std::vector<std::byte>& got, const StoreBlob& b) {
  return got == fake_expert(tiny_shape, b.key, b.precision);
}

}  // namespace verified_load_test

using namespace verified_load_test;

TEST_CASE("verify: pieces are 3/4 of what is left in multiples of 4096 down to the tail",
          "[io][loader][verify]") {
  constexpr std::uint64_t tail = 2u << 20;
  for (const std::uint64_t bytes :
       {std::uint64_t{1}, std::uint64_t{4096}, tail - 1, tail, tail + 1, tail + 4096,
        std::uint64_t{33'030'144}, std::uint64_t{33'030'144} + 100, std::uint64_t{117'440'512}}) {
    CAPTURE(bytes);
    const auto pieces = pieces_of(bytes, tail);
    CHECK(std::accumulate(pieces.begin(), pieces.end(), std::uint64_t{0}) == bytes);
    CHECK(pieces.back() <= tail);
    std::uint64_t left = bytes;
    for (std::size_t i = 0; i + 1 < pieces.size(); ++i) {
      CHECK(pieces[i] % 4096 == 0);
      CHECK(pieces[i] >= tail);
      // the rest takes at least a third of its read time (or it is the tail)
      CHECK(pieces[i] <= std::max(tail, left / 4 * 3));
      left -= pieces[i];
    }
  }
  CHECK(pieces_of(33'030'144, tail).size() == 3);   // a q4 expert of the bench
  CHECK(pieces_of(117'440'512, tail).size() == 4);  // an f16 one
  // the loader's default: one boundary for q4, two for f16 (bench/RESULTS.md)
  const std::uint64_t default_tail = AsyncLoader<MemorySource>::Config{}.verify_tail;
  CHECK(pieces_of(33'030'144, default_tail).size() == 2);
  CHECK(pieces_of(117'440'512, default_tail).size() == 3);
  CHECK(pieces_of(12288, 4096) == std::vector<std::uint64_t>{8192, 4096});
  CHECK(pieces_of(12288, 0) == std::vector<std::uint64_t>{12288});  // 0: one read
  CHECK(pieces_of(100, 4096) == std::vector<std::uint64_t>{100});
}

TEST_CASE("verify: each blob is read in its pieces in order and every load checks out",
          "[io][loader][verify]") {
  Store s;
  auto log = std::make_shared<RecordingSource::Log>();
  AsyncLoader<RecordingSource> loader(*s.store, RecordingSource(MemorySource(s.file, "mem"), log),
                                      pieces_config<RecordingSource>());
  for (const StoreBlob& b : s.store->manifest().blobs) {
    log->reads.clear();
    CHECK(is_fake_expert(load_checked(loader, b), b));
    std::vector<BlobRange> want;
    std::uint64_t at = b.offset;
    for (std::uint64_t n : pieces_of(b.bytes, 4096)) {
      want.push_back({at, n});
      at += n;
    }
    std::lock_guard lock(log->m);
    REQUIRE(log->reads.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CHECK(log->reads[i].offset == want[i].offset);
      CHECK(log->reads[i].bytes == want[i].bytes);
    }
  }
  CHECK(loader.bytes_loaded() ==
        std::accumulate(s.store->manifest().blobs.begin(), s.store->manifest().blobs.end(),
                        std::uint64_t{0},
                        [](std::uint64_t a, const StoreBlob& b) { return a + b.bytes; }));
}

TEST_CASE(
    "verify: a damaged byte in the first or the last piece fails that load naming store, "
    "layer, expert and precision; the next loads check out",
    "[io][loader][verify]") {
  Store s;
  const StoreBlob target = s.store->blob({1, 2}, Precision::f16);
  REQUIRE(pieces_of(target.bytes, 4096).size() == 2);
  for (const std::uint64_t at :
       {std::uint64_t{0}, std::uint64_t{8191}, std::uint64_t{8192}, target.bytes - 1}) {
    DYNAMIC_SECTION("byte " << at << " of the blob flipped") {
      std::vector<std::byte> damaged = s.file;
      damaged[target.offset + at] ^= std::byte{0x20};
      AsyncLoader<MemorySource> loader(*s.store, MemorySource(damaged, s.path),
                                       pieces_config<MemorySource>());
      require_error([&] { (void)load_checked(loader, target); }, ErrorKind::checksum,
                    {s.path, "layer 1", "expert 2", "f16", std::to_string(target.offset)});
      for (const StoreBlob& b : s.store->manifest().blobs)
        if (b.key != target.key || b.precision != target.precision)
          CHECK(is_fake_expert(load_checked(loader, b), b));
    }
  }
}

TEST_CASE("verify: short reads are continued within each piece and the load checks out",
          "[io][loader][verify][faults]") {
  Store s;
  for (const std::size_t k : {std::size_t{1}, std::size_t{1000}, std::size_t{5000}}) {
    CAPTURE(k);
    FaultInjectingSource src(s.path, {.short_read_bytes = k});
    AsyncLoader<FaultInjectingSource> loader(*s.store, src, pieces_config<FaultInjectingSource>());
    for (const StoreBlob& b : s.store->manifest().blobs)
      CHECK(is_fake_expert(load_checked(loader, b), b));
  }
}

TEST_CASE(
    "verify: EIO on the first or the last piece's read fails that load naming file and "
    "offset; the loader goes on",
    "[io][loader][verify][faults]") {
  Store s;
  const StoreBlob first = s.store->manifest().blobs.front();
  REQUIRE(pieces_of(first.bytes, 4096) == std::vector<std::uint64_t>{8192, 4096});
  for (const std::uint64_t call : {1u, 2u}) {
    DYNAMIC_SECTION("EIO on read " << call) {
      FaultInjectingSource src(s.path, {.eio_on_call = call});
      AsyncLoader<FaultInjectingSource> loader(*s.store, src,
                                               pieces_config<FaultInjectingSource>());
      const std::uint64_t failing = first.offset + (call == 1 ? 0 : 8192);
      require_error([&] { (void)load_checked(loader, first); }, ErrorKind::io,
                    {s.path, "offset " + std::to_string(failing), "Input/output error"});
      if (call == 1) CHECK(src.calls() == 1);  // no piece is read after a failed one
      for (const StoreBlob& b : s.store->manifest().blobs)
        CHECK(is_fake_expert(load_checked(loader, b), b));
    }
  }
}

TEST_CASE("verify: many loads in the pipeline at once (good and damaged) each get their outcome",
          "[io][loader][verify]") {
  Store s;
  const auto& blobs = s.store->manifest().blobs;
  // Every third blob's recorded checksum is wrong: those loads fail, the ones around them do not.
  auto locate = [&](ExpertKey k, Precision p) {
    StoreBlob b = s.store->blob(k, p);
    const auto i = static_cast<std::size_t>(
        std::find_if(blobs.begin(), blobs.end(),
                     [&](const StoreBlob& x) { return x.key == k && x.precision == p; }) -
        blobs.begin());
    if (i % 3 == 1) b.checksum ^= 1;
    return b;
  };
  for (const unsigned threads : {1u, 2u}) {
    CAPTURE(threads);
    auto config = pieces_config<MemorySource>(threads);
    config.max_outstanding = blobs.size();  // failed loads keep their slots until waited on
    AsyncLoader<MemorySource> loader(MemorySource(s.file, "mem"), locate, config);
    for (int round = 0; round < 3; ++round) {
      std::vector<std::vector<std::byte>> dest(blobs.size());
      std::vector<LoadTicket> tickets;
      for (std::size_t i = 0; i < blobs.size(); ++i) {
        dest[i].resize(blobs[i].bytes);
        tickets.push_back(
            loader.submit({blobs[i].key, blobs[i].precision, LoadPriority::prefetch, dest[i]}));
      }
      for (std::size_t i = 0; i < blobs.size(); ++i) {
        CAPTURE(i);
        if (i % 3 == 1) {
          require_error([&] { loader.wait(tickets[i]); }, ErrorKind::checksum,
                        {"layer " + std::to_string(blobs[i].key.layer),
                         "expert " + std::to_string(blobs[i].key.expert)});
        } else {
          loader.wait(tickets[i]);
          CHECK(is_fake_expert(dest[i], blobs[i]));
        }
      }
    }
  }
}

TEST_CASE("verify: a loader destroyed with loads in its pipeline finishes the started ones first",
          "[io][loader][verify]") {
  Store s;
  const auto& blobs = s.store->manifest().blobs;
  std::vector<std::vector<std::byte>> dest(blobs.size());
  for (std::size_t i = 0; i < blobs.size(); ++i) dest[i].resize(blobs[i].bytes);
  for (int round = 0; round < 20; ++round) {
    {
      AsyncLoader<MemorySource> loader(*s.store, MemorySource(s.file, "mem"),
                                       pieces_config<MemorySource>(2));
      for (std::size_t i = 0; i < blobs.size(); ++i)
        (void)loader.submit({blobs[i].key, blobs[i].precision, LoadPriority::on_demand, dest[i]});
    }  // queued loads are cancelled (never read); started ones end before this returns
    for (std::size_t i = 0; i < blobs.size(); ++i) {
      const bool untouched = std::all_of(dest[i].begin(), dest[i].end(),
                                         [](std::byte x) { return x == std::byte{0}; });
      CHECK((untouched || is_fake_expert(dest[i], blobs[i])));
    }
    for (auto& d : dest) std::fill(d.begin(), d.end(), std::byte{0});
  }
}
