#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "io/io_test_util.hpp"
#include "io/store_test_util.hpp"
#include "moekit/cache/lru.hpp"
#include "moekit/io/async_loader.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/uniform.hpp"

using namespace moekit;
using namespace moekit::io;
using moekit::test::fake_expert;
using moekit::test::require_error;
using moekit::test::TempDir;
using moekit::test::tiny_shape;

namespace {

/// Wraps a source; the first read blocks until `open()` (so tests control what is queued while
/// the I/O thread is busy) and every read records its offset. No timing involved.
class GatedSource {
 public:
  struct Shared {
    std::mutex m;
    std::condition_variable cv;
    bool entered = false, open = false;
    std::vector<std::uint64_t> order;
  };
  GatedSource(MemorySource inner, std::shared_ptr<Shared> shared)
      : inner_(std::move(inner)), s_(std::move(shared)) {}
  void read(BlobRange r, std::span<std::byte> dest) const {
    {
      std::unique_lock lock(s_->m);
      s_->order.push_back(r.offset);
      s_->entered = true;
      s_->cv.notify_all();
      s_->cv.wait(lock, [&] { return s_->open; });
    }
    inner_.read(r, dest);
  }
  [[nodiscard]] std::string name() const { return inner_.name(); }

 private:
  MemorySource inner_;
  std::shared_ptr<Shared> s_;
};

struct Fixture {
  TempDir dir;
  std::string path = dir.file("l.moestore");
  std::vector<std::byte> file;
  std::optional<ExpertStore> store;
  Fixture() {
    const std::vector<Precision> ps{Precision::f16, Precision::q4};
    write_expert_store(path, tiny_shape, ps,
                       [](ExpertKey k, Precision p) { return fake_expert(tiny_shape, k, p); });
    file = moekit::test::read_file(path);
    store = ExpertStore::open(path);
  }
};

}  // namespace

TEST_CASE("loader: loads every expert from a pread source, checksums verified", "[io][loader]") {
  Fixture f;
  AsyncLoader<PreadSource> loader(
      *f.store, PreadSource(f.path),
      {.io_threads = 2, .max_outstanding = 4, .verify_checksums = true});
  std::vector<std::vector<std::byte>> bufs;
  std::vector<LoadTicket> tickets;
  std::vector<std::pair<ExpertKey, Precision>> keys;
  for (Precision p : {Precision::f16, Precision::q4})
    for (std::uint32_t l = 0; l < 2; ++l)
      for (std::uint32_t e = 0; e < 3; ++e) {
        bufs.emplace_back(tiny_shape.expert_bytes(p));
        keys.emplace_back(ExpertKey{l, e}, p);
      }
  // More requests than slots: submit reclaims nothing (we wait on all), so wait as we go.
  for (std::size_t i = 0; i < keys.size(); ++i) {
    tickets.push_back(
        loader.submit({keys[i].first, keys[i].second,
                       i % 2 ? LoadPriority::prefetch : LoadPriority::on_demand, bufs[i]}));
    CHECK(tickets.back().valid());
    if (tickets.size() >= 4) loader.wait(tickets[tickets.size() - 4]);
  }
  for (auto t : tickets) loader.wait(t);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CHECK(loader.poll(tickets[i]));
    CHECK(bufs[i] == fake_expert(tiny_shape, keys[i].first, keys[i].second));
  }
  CHECK(loader.bytes_loaded() ==
        6 * (tiny_shape.expert_bytes(Precision::f16) + tiny_shape.expert_bytes(Precision::q4)));
}

TEST_CASE("loader: on-demand requests go before queued prefetches; queued prefetches cancel",
          "[io][loader]") {
  Fixture f;
  auto shared = std::make_shared<GatedSource::Shared>();
  AsyncLoader<GatedSource> loader(
      *f.store, GatedSource(MemorySource(f.file, "mem"), shared),
      {.io_threads = 1, .max_outstanding = 8, .verify_checksums = true});
  auto buf = [](Precision p) { return std::vector<std::byte>(tiny_shape.expert_bytes(p)); };
  auto b0 = buf(Precision::f16), b1 = buf(Precision::f16), b2 = buf(Precision::f16),
       b3 = buf(Precision::q4), b4 = buf(Precision::q4);
  const auto blocker = loader.submit({{0, 0}, Precision::f16, LoadPriority::on_demand, b0});
  {
    std::unique_lock lock(shared->m);
    shared->cv.wait(lock, [&] { return shared->entered; });  // the only I/O thread is now busy
  }
  const auto p1 = loader.submit({{0, 1}, Precision::f16, LoadPriority::prefetch, b1});
  const auto p2 = loader.submit({{0, 2}, Precision::f16, LoadPriority::prefetch, b2});
  const auto d1 = loader.submit({{1, 0}, Precision::q4, LoadPriority::on_demand, b3});
  const auto p3 = loader.submit({{1, 1}, Precision::q4, LoadPriority::prefetch, b4});
  CHECK_FALSE(loader.poll(d1));
  CHECK(loader.cancel(p2));        // queued prefetch: withdrawn
  CHECK_FALSE(loader.cancel(p2));  // only once
  CHECK_FALSE(loader.cancel(d1));  // on-demand loads are never cancelled
  CHECK_FALSE(loader.cancel(blocker));
  CHECK(loader.poll(p2));
  {
    std::lock_guard lock(shared->m);
    shared->open = true;
  }
  shared->cv.notify_all();
  loader.wait(blocker);
  loader.wait(d1);
  loader.wait(p1);
  loader.wait(p3);
  loader.wait(p2);                 // cancelled: returns at once
  CHECK_FALSE(loader.cancel(p1));  // finished
  const auto& s = *f.store;
  std::lock_guard lock(shared->m);
  CHECK(shared->order == std::vector<std::uint64_t>{s.blob({0, 0}, Precision::f16).offset,
                                                    s.blob({1, 0}, Precision::q4).offset,
                                                    s.blob({0, 1}, Precision::f16).offset,
                                                    s.blob({1, 1}, Precision::q4).offset});
  CHECK(b2 == buf(Precision::f16));  // never written
  CHECK(b3 == fake_expert(tiny_shape, {1, 0}, Precision::q4));
  CHECK(b1 == fake_expert(tiny_shape, {0, 1}, Precision::f16));
}

TEST_CASE("loader: load errors are rethrown by wait with file and offset", "[io][loader]") {
  Fixture f;
  SECTION("checksum mismatch") {
    auto bad_locator = [&](ExpertKey k, Precision p) {
      StoreBlob b = f.store->blob(k, p);
      b.checksum ^= 1;
      return b;
    };
    AsyncLoader<MemorySource> loader(MemorySource(f.file, "mem"), bad_locator,
                                     {.io_threads = 1, .verify_checksums = true});
    std::vector<std::byte> dest(tiny_shape.expert_bytes(Precision::q4));
    auto t = loader.submit({{1, 2}, Precision::q4, LoadPriority::on_demand, dest});
    require_error(
        [&] { loader.wait(t); }, ErrorKind::checksum,
        {"layer 1", "expert 2", "q4", std::to_string(f.store->blob({1, 2}, Precision::q4).offset)});
    loader.wait(t);  // finished with: returns
  }
  SECTION("short file") {
    std::vector<std::byte> cut(f.file.begin(), f.file.begin() + 8192);
    AsyncLoader<MemorySource> loader(*f.store, MemorySource(cut, "cut"), {.io_threads = 1});
    std::vector<std::byte> dest(tiny_shape.expert_bytes(Precision::f16));
    auto t = loader.submit({{1, 2}, Precision::f16, LoadPriority::prefetch, dest});
    require_error([&] { loader.wait(t); }, ErrorKind::io, {"'cut'", "offset"});
  }
  SECTION("bad requests are refused at submit") {
    AsyncLoader<MemorySource> loader(*f.store, MemorySource(f.file, "mem"), {.io_threads = 1});
    std::vector<std::byte> small(10);
    require_error(
        [&] {
          (void)loader.submit({{0, 0}, Precision::f16, LoadPriority::on_demand, small});
        },
        ErrorKind::invalid_argument, {"10 bytes", "needs"});
    std::vector<std::byte> dest(tiny_shape.expert_bytes(Precision::q8));
    require_error(
        [&] {
          (void)loader.submit({{0, 0}, Precision::q8, LoadPriority::on_demand, dest});
        },
        ErrorKind::invalid_argument, {"q8"});
  }
}

TEST_CASE("loader: finished loads nobody waits on are reclaimed, so submit never starves",
          "[io][loader]") {
  Fixture f;
  AsyncLoader<MemorySource> loader(*f.store, MemorySource(f.file, "mem"),
                                   {.io_threads = 2, .max_outstanding = 2});
  std::vector<std::vector<std::byte>> bufs(
      40, std::vector<std::byte>(tiny_shape.expert_bytes(Precision::q4)));
  std::vector<LoadTicket> tickets;
  for (std::size_t i = 0; i < bufs.size(); ++i)
    tickets.push_back(
        loader.submit({{static_cast<std::uint32_t>(i % 2), static_cast<std::uint32_t>(i % 3)},
                       Precision::q4,
                       LoadPriority::prefetch,
                       bufs[i]}));
  for (auto t : tickets) loader.wait(t);  // old ones were reclaimed: wait returns at once
  for (std::size_t i = 0; i < bufs.size(); ++i)
    CHECK(bufs[i] ==
          fake_expert(tiny_shape,
                      {static_cast<std::uint32_t>(i % 2), static_cast<std::uint32_t>(i % 3)},
                      Precision::q4));
}

TEST_CASE("loader: many producers at once (run under TSan to check races)", "[io][loader]") {
  Fixture f;
  AsyncLoader<MmapSource> loader(*f.store, MmapSource(f.path),
                                 {.io_threads = 2, .max_outstanding = 8, .verify_checksums = true});
  std::vector<std::thread> producers;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 3; ++t)
    producers.emplace_back([&, t] {
      std::vector<std::byte> buf(tiny_shape.expert_bytes(Precision::f16));
      for (int i = 0; i < 30; ++i) {
        const ExpertKey k{static_cast<std::uint32_t>(i % 2),
                          static_cast<std::uint32_t>((i + t) % 3)};
        const auto pr = (i + t) % 3 == 0 ? LoadPriority::prefetch : LoadPriority::on_demand;
        auto ticket = loader.submit({k, Precision::f16, pr, buf});
        if (pr == LoadPriority::prefetch && loader.cancel(ticket)) continue;
        loader.wait(ticket);
        if (buf != fake_expert(tiny_shape, k, Precision::f16)) ++mismatches;
      }
    });
  for (auto& p : producers) p.join();
  CHECK(mismatches == 0);
}

TEST_CASE("loader: a bandwidth cap still delivers every byte", "[io][loader]") {
  Fixture f;
  // 64 MB/s: the 12 KiB blob passes in well under a millisecond; only correctness is checked here.
  AsyncLoader<MemorySource> loader(*f.store, MemorySource(f.file, "mem"),
                                   {.io_threads = 1,
                                    .bandwidth_bytes_per_s = 64e6,
                                    .throttle_chunk = 4096,
                                    .verify_checksums = true});
  std::vector<std::byte> dest(tiny_shape.expert_bytes(Precision::f16));
  auto t = loader.submit({{1, 1}, Precision::f16, LoadPriority::on_demand, dest});
  loader.wait(t);
  CHECK(dest == fake_expert(tiny_shape, {1, 1}, Precision::f16));
}

namespace {
// An AsyncLoader owned through a pointer (AsyncLoader does not move), as the engine's loader is.
struct OwnedGatedLoader {
  std::unique_ptr<AsyncLoader<GatedSource>> l;
  LoadTicket submit(const LoadRequest& r) { return l->submit(r); }
  bool poll(LoadTicket t) { return l->poll(t); }
  void wait(LoadTicket t) { l->wait(t); }
  bool cancel(LoadTicket t) { return l->cancel(t); }
};
}  // namespace

TEST_CASE("loader: a pipeline destroyed with a load in flight frees its memory only after the load",
          "[io][loader][pipeline]") {
  // A pipeline unwound by an exception between route and resolve used to free the arena before
  // its loader's thread had finished writing into it (a crash in moe-run --preset hobbit). The
  // gate opens only once the pipeline is being destroyed, so the write lands during destruction.
  // Experts of 6 MiB: the arena maps them (io_memory.hpp), so a write after the unmap faults
  // even without a sanitizer.
  constexpr ModelShape shape{
      .n_layers = 1, .n_experts = 2, .top_k = 2, .hidden = 1024, .ffn = 1024};
  TempDir dir;
  const std::string path = dir.file("big.moestore");
  const std::vector<Precision> f16{Precision::f16};
  write_expert_store(path, shape, f16,
                     [&](ExpertKey k, Precision p) { return fake_expert(shape, k, p); });
  const auto store = ExpertStore::open(path);
  const auto file = moekit::test::read_file(path);
  auto shared = std::make_shared<GatedSource::Shared>();
  std::thread opener;
  {
    OwnedGatedLoader loader{std::make_unique<AsyncLoader<GatedSource>>(
        store, GatedSource(MemorySource(file, "mem"), shared),
        AsyncLoader<GatedSource>::Config{.io_threads = 1, .max_outstanding = 4})};
    OffloadPipeline<UniformScorer, NoPredictor, LruPolicy, OwnedGatedLoader, OnDemandScheduler> p(
        shape, {.expert_budget_bytes = 2 * shape.expert_bytes(Precision::f16)}, std::move(loader));
    const std::uint32_t experts[] = {0, 1};
    const float weights[] = {0.5f, 0.5f};
    const GateView g{.n_tokens = 1, .k = 2, .n_experts = 2, .experts = experts, .weights = weights};
    (void)p.route(LayerContext{0, shape.n_layers, 0, Phase::decode, 0, 1}, g);
    {
      std::unique_lock lock(shared->m);
      shared->cv.wait(lock, [&] { return shared->entered; });  // the load is being read
    }
    opener = std::thread([shared] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the destructor start
      std::lock_guard lock(shared->m);
      shared->open = true;
      shared->cv.notify_all();
    });
  }  // ~OffloadPipeline with the load still in flight
  opener.join();
  CHECK(shared->open);
}
