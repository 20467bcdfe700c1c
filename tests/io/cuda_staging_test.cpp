// Host→device staging: the slot plan and the pipeline's ordering, run on the CPU with a fake copy
// engine whose copies run late (deferred) or on another thread (threaded), so that a slot refilled
// before its copy finished shows up as corrupted destination bytes and as a recorded hazard.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/io_test_util.hpp"
#include "moekit/io/aligned_buffer.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/checksum.hpp"
#include "moekit/io/cuda_staging.hpp"

using namespace moekit;
using namespace moekit::io;
using moekit::test::require_error;
using moekit::test::TempDir;

namespace {

constexpr std::size_t page = 4096;

/// A copy engine on host memory. "Device" addresses are host pointers. Copies are queued in
/// order; in deferred mode they run only when the host waits (the latest a real stream could run
/// them), in threaded mode a worker runs them after random delays. Each copy remembers a checksum
/// of the slot bytes at enqueue time: if the slot changes before the copy runs, it is a hazard.
class FakeCopyEngine {
 public:
  enum class Mode { deferred, threaded };

  FakeCopyEngine(std::size_t slots, std::size_t slot_bytes, Mode mode, std::uint64_t seed = 1)
      : mode_(mode), rng_(seed) {
    for (std::size_t i = 0; i < slots; ++i) slots_.emplace_back(slot_bytes);
    last_seq_.assign(slots, 0);
    if (mode_ == Mode::threaded) worker_ = std::thread([this] { work(); });
  }
  ~FakeCopyEngine() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  std::size_t slot_count() const { return slots_.size(); }
  std::size_t slot_bytes() const { return slots_.empty() ? 0 : slots_[0].size(); }
  std::span<std::byte> slot(std::size_t i) { return slots_.at(i).span(); }

  void copy_async(std::size_t i, void* dst, std::size_t n) {
    REQUIRE(n <= slot_bytes());
    std::lock_guard lock(m_);
    log.push_back("copy " + std::to_string(i));
    queue_.push_back(
        {++enqueued_, i, static_cast<std::byte*>(dst), n, xxh64(slots_[i].span().first(n))});
    last_seq_[i] = enqueued_;
    max_in_flight = std::max(max_in_flight, queue_.size());
    cv_.notify_all();
  }
  void wait_slot(std::size_t i) {
    std::unique_lock lock(m_);
    log.push_back("wait " + std::to_string(i));
    drain_until(lock, last_seq_[i]);
  }
  void synchronize() {
    std::unique_lock lock(m_);
    log.push_back("sync");
    drain_until(lock, enqueued_);
  }
  /// Copies enqueued and not yet run.
  std::size_t in_flight() {
    std::lock_guard lock(m_);
    return queue_.size();
  }
  void note(std::string s) {
    std::lock_guard lock(m_);
    log.push_back(std::move(s));
  }

  std::vector<std::string> log;  // guarded by m_ while copies may run
  std::size_t hazards = 0;       // copies whose slot changed before they ran
  std::size_t max_in_flight = 0;

 private:
  struct Copy {
    std::uint64_t seq;
    std::size_t slot;
    std::byte* dst;
    std::size_t bytes;
    std::uint64_t checksum;
  };

  // Requires m_. Runs (deferred) or waits for (threaded) every copy up to `seq`.
  void drain_until(std::unique_lock<std::mutex>& lock, std::uint64_t seq) {
    if (mode_ == Mode::deferred) {
      while (completed_ < seq) run_front();
    } else {
      done_cv_.wait(lock, [&] { return completed_ >= seq; });
    }
  }
  // Requires m_.
  void run_front() {
    const Copy c = queue_.front();
    queue_.pop_front();
    const auto src = slots_[c.slot].span().first(c.bytes);
    if (xxh64(src) != c.checksum) ++hazards;
    std::memcpy(c.dst, src.data(), c.bytes);
    completed_ = c.seq;
  }
  void work() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const auto delay =
          std::chrono::microseconds(std::uniform_int_distribution<int>(0, 300)(rng_));
      lock.unlock();
      std::this_thread::sleep_for(delay);  // the "DMA" takes a while; the host keeps going
      lock.lock();
      run_front();
      done_cv_.notify_all();
    }
  }

  Mode mode_;
  std::mt19937_64 rng_;
  std::vector<AlignedBuffer> slots_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::deque<Copy> queue_;
  std::vector<std::uint64_t> last_seq_;
  std::uint64_t enqueued_ = 0, completed_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

static_assert(StagingCopyEngine<FakeCopyEngine>);

/// A MemorySource that notes each read in the engine's log.
struct LoggingSource {
  MemorySource inner;
  FakeCopyEngine* engine;
  void read(BlobRange r, std::span<std::byte> dest) const {
    engine->note("read " + std::to_string(r.offset));
    inner.read(r, dest);
  }
  const std::string& name() const { return inner.name(); }
};

std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 g(seed);
  for (auto& b : v) b = static_cast<std::byte>(g());
  return v;
}

}  // namespace

TEST_CASE("staging_plan: slot-sized chunks, round robin from first_slot", "[io][staging]") {
  const std::uint64_t mib = 1u << 20;
  const auto plan = staging_plan({8192, 10 * mib + 123}, 4 * mib, 2, 1);
  REQUIRE(plan.size() == 3);
  CHECK(plan[0] == StagingStep{1, 8192, 0, 4 * mib});
  CHECK(plan[1] == StagingStep{0, 8192 + 4 * mib, 4 * mib, 4 * mib});
  CHECK(plan[2] == StagingStep{1, 8192 + 8 * mib, 8 * mib, 2 * mib + 123});
  CHECK(staging_plan({0, 0}, page, 2).empty());
  CHECK(staging_plan({0, page}, page, 3, 2) == std::vector<StagingStep>{{2, 0, 0, page}});
  // Three slots: consecutive chunks use 0, 1, 2, 0, ...
  const auto three = staging_plan({0, 7 * page}, page, 3);
  for (std::size_t i = 0; i < three.size(); ++i) CHECK(three[i].slot == i % 3);
  require_error(
      [] {
        (void)staging_plan({0, 1}, 1000, 2);
      },
      ErrorKind::invalid_argument, {"slot_bytes", "4096"});
  require_error(
      [] {
        (void)staging_plan({0, 1}, page, 0);
      },
      ErrorKind::invalid_argument, {"slots"});
  require_error(
      [] {
        (void)staging_plan({0, 1}, page, 2, 2);
      },
      ErrorKind::invalid_argument, {"first_slot"});
}

TEST_CASE(
    "StagingPipeline: reads chunk k+1 while chunk k's copy is pending, waits only for the slot it "
    "reuses",
    "[io][staging]") {
  FakeCopyEngine engine(2, page, FakeCopyEngine::Mode::deferred);
  const auto src_bytes = pattern(3 * page, 7);
  LoggingSource src{MemorySource(src_bytes), &engine};
  std::vector<std::byte> dst(src_bytes.size());
  StagingPipeline pipe(engine);
  pipe.load(src, {0, src_bytes.size()}, dst.data());
  CHECK(engine.in_flight() == 2);  // load returns with copies still queued: no full sync
  pipe.synchronize();
  CHECK(engine.log == std::vector<std::string>{"read 0", "copy 0", "read 4096", "copy 1", "wait 0",
                                               "read 8192", "copy 0", "sync"});
  CHECK(engine.max_in_flight == 2);
  CHECK(engine.hazards == 0);
  CHECK(dst == src_bytes);
  CHECK(pipe.bytes_staged() == src_bytes.size());

  // The round robin continues across loads: the next blob starts in slot 1, whose copy is done.
  engine.log.clear();
  pipe.load(src, {page, page}, dst.data());
  pipe.load(src, {0, page}, dst.data() + page);
  pipe.synchronize();
  CHECK(engine.log == std::vector<std::string>{"read 4096", "copy 1", "read 0", "copy 0", "sync"});
}

TEST_CASE(
    "StagingPipeline: every blob size arrives intact, deferred and threaded engines, 1 to 3 slots",
    "[io][staging]") {
  const auto src_bytes = pattern(40 * page + 777, 11);
  MemorySource src(src_bytes);
  for (auto mode : {FakeCopyEngine::Mode::deferred, FakeCopyEngine::Mode::threaded})
    for (std::size_t slots : {1u, 2u, 3u}) {
      INFO("mode " << static_cast<int>(mode) << ", slots " << slots);
      FakeCopyEngine engine(slots, 2 * page, mode, slots);
      StagingPipeline pipe(engine);
      std::vector<std::byte> dst(src_bytes.size());
      // Sizes around the slot size and the page, at page-aligned offsets (as in the store).
      std::uint64_t at = 0;
      const std::vector<std::uint64_t> sizes{
          1, page - 1, page, 2 * page - 1, 2 * page, 2 * page + 1, 5 * page + 3, 0, 9 * page};
      std::vector<std::pair<std::uint64_t, std::uint64_t>> blobs;
      for (std::uint64_t n : sizes) {
        blobs.push_back({at, n});
        at += (n + page - 1) / page * page;
      }
      REQUIRE(at <= src_bytes.size());
      for (auto [off, n] : blobs) pipe.load(src, {off, n}, dst.data() + off);
      pipe.synchronize();
      CHECK(engine.hazards == 0);
      CHECK(engine.in_flight() == 0);
      for (auto [off, n] : blobs)
        CHECK(std::memcmp(dst.data() + off, src_bytes.data() + off, n) == 0);
    }
}

TEST_CASE(
    "FakeCopyEngine: a slot refilled before its copy ran is caught (the checks above can fail)",
    "[io][staging]") {
  FakeCopyEngine engine(2, page, FakeCopyEngine::Mode::deferred);
  std::vector<std::byte> dst(page);
  std::memset(engine.slot(0).data(), 1, page);
  engine.copy_async(0, dst.data(), page);
  std::memset(engine.slot(0).data(), 2, page);  // what a pipeline without wait_slot would do
  engine.synchronize();
  CHECK(engine.hazards == 1);
  CHECK(dst[0] == std::byte{2});
}

TEST_CASE(
    "StagingPipeline: a failed read waits for the enqueued copies, names the file and offset, "
    "and leaves the pipeline usable",
    "[io][staging]") {
  const auto src_bytes = pattern(5 * page, 3);
  MemorySource short_src(std::span<const std::byte>(src_bytes).first(2 * page + 10), "short.bin");
  MemorySource full(src_bytes);
  FakeCopyEngine engine(2, page, FakeCopyEngine::Mode::deferred);
  StagingPipeline pipe(engine);
  std::vector<std::byte> dst(src_bytes.size());
  require_error(
      [&] {
        pipe.load(short_src, {0, 5 * page}, dst.data());
      },
      ErrorKind::io, {"short.bin", "offset 8192"});
  CHECK(engine.in_flight() == 0);
  CHECK(std::memcmp(dst.data(), src_bytes.data(), 2 * page) == 0);  // the chunks before arrived
  CHECK(pipe.bytes_staged() == 0);
  pipe.load(full, {0, src_bytes.size()}, dst.data());
  pipe.synchronize();
  CHECK(dst == src_bytes);
  CHECK(engine.hazards == 0);
}

TEST_CASE("StagingPipeline: O_DIRECT reads of a file land in the slots", "[io][staging]") {
  TempDir dir;
  const auto bytes = pattern(9 * page, 5);
  moekit::test::write_file(dir.file("blobs.bin"), bytes);
  PreadSource src(dir.file("blobs.bin"), {.direct = true});
  FakeCopyEngine engine(2, 2 * page, FakeCopyEngine::Mode::threaded, 9);
  StagingPipeline pipe(engine);
  std::vector<std::byte> dst(bytes.size());
  pipe.load(src, {page, 5 * page + 100}, dst.data());
  pipe.load(src, {0, page}, dst.data() + 7 * page);
  pipe.synchronize();
  CHECK(std::memcmp(dst.data(), bytes.data() + page, 5 * page + 100) == 0);
  CHECK(std::memcmp(dst.data() + 7 * page, bytes.data(), page) == 0);
  CHECK(engine.hazards == 0);
}

TEST_CASE("StagingPipeline: bad engines and destinations are refused", "[io][staging]") {
  FakeCopyEngine none(0, page, FakeCopyEngine::Mode::deferred);
  require_error([&] { StagingPipeline p(none); }, ErrorKind::invalid_argument, {"no slots"});
  struct OddEngine : FakeCopyEngine {  // slots whose size would misalign O_DIRECT chunk offsets
    using FakeCopyEngine::FakeCopyEngine;
    std::size_t slot_bytes() const { return 1000; }
  };
  OddEngine odd(2, page, FakeCopyEngine::Mode::deferred);
  require_error([&] { StagingPipeline p(odd); }, ErrorKind::invalid_argument,
                {"slot_bytes (1000)", "4096"});
  FakeCopyEngine ok(2, page, FakeCopyEngine::Mode::deferred);
  StagingPipeline p(ok);
  std::vector<std::byte> b(page);
  MemorySource src(b);
  require_error(
      [&] {
        p.load(src, {0, page}, nullptr);
      },
      ErrorKind::invalid_argument, {"null destination"});
  p.load(src, {0, 0}, nullptr);  // nothing to copy: allowed
}

TEST_CASE("CudaCopyEngine: without CUDA it exists and says the build has no CUDA",
          "[io][staging]") {
  if constexpr (!CudaCopyEngine::available) {
    require_error([] { CudaCopyEngine e({.slots = 2, .slot_bytes = 1u << 20}); },
                  ErrorKind::unsupported, {"built without CUDA"});
  } else {
    WARN(
        "CudaCopyEngine is the CUDA one in this build; it needs a GPU and is not run by this test");
    SUCCEED();
  }
}
