// HostReadRing: experts read through a loader into buffers outside the cache, for one run each on
// the CPU (Fiddler's CPU path when the experts are not in host memory).
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/error.hpp"
#include "moekit/io/host_read_ring.hpp"

using namespace moekit;

namespace {

// A loader whose reads land only when waited on (as an asynchronous read would finish later), so
// a test sees whether the ring waits before it hands bytes out or reuses a buffer.
struct DeferredLoader {
  struct Read {
    LoadRequest request;
    bool landed = false;
  };
  std::map<std::uint64_t, Read> reads;
  std::uint64_t next = 1;
  int submits = 0;

  static std::byte fill_of(ExpertKey k, Precision p) {
    return static_cast<std::byte>(1 + k.layer * 16 + k.expert + 8 * static_cast<int>(p));
  }
  LoadTicket submit(const LoadRequest& r) {
    ++submits;
    reads[next] = {r, false};
    return {next++};
  }
  bool poll(LoadTicket t) { return reads.at(t.id).landed; }
  void wait(LoadTicket t) {
    Read& r = reads.at(t.id);
    if (r.landed) return;
    for (std::byte& b : r.request.dest) b = fill_of(r.request.key, r.request.precision);
    r.landed = true;
  }
  bool cancel(LoadTicket) { return false; }
  [[nodiscard]] bool all_landed() const {
    for (const auto& [id, r] : reads)
      if (!r.landed) return false;
    return true;
  }
};
static_assert(Loader<DeferredLoader>);

constexpr std::size_t expert_bytes = 6000;  // not a multiple of the buffers' 4 KiB alignment

io::HostReadRing ring_of(std::uint32_t capacity) {
  return io::HostReadRing(
      capacity, [](Precision p) { return p == Precision::q4 ? expert_bytes / 4 : expert_bytes; });
}

bool holds(std::span<const std::byte> b, ExpertKey k, Precision p) {
  for (std::byte x : b)
    if (x != DeferredLoader::fill_of(k, p)) return false;
  return !b.empty();
}

}  // namespace

TEST_CASE("HostReadRing reads a layer's prepared experts and hands out their bytes once landed",
          "[io][host_read_ring]") {
  DeferredLoader loader;
  io::HostReadRing ring = ring_of(4);
  ring.prepare(loader, {0, 1}, Precision::f16);
  ring.prepare(loader, {0, 3}, Precision::f16);
  ring.prepare(loader, {0, 3}, Precision::f16);  // the same expert twice in one call: one read
  CHECK(loader.submits == 2);
  CHECK(ring.read_bytes() == 2 * expert_bytes);
  const auto a = ring.bytes(loader, {0, 1}, Precision::f16);
  const auto b = ring.bytes(loader, {0, 3}, Precision::f16);
  CHECK(a.size() == expert_bytes);
  CHECK(holds(a, {0, 1}, Precision::f16));
  CHECK(holds(b, {0, 3}, Precision::f16));
  CHECK(loader.all_landed());
}

TEST_CASE("HostReadRing keeps a layer call's bytes until the next call and reuses held experts",
          "[io][host_read_ring]") {
  DeferredLoader loader;
  io::HostReadRing ring = ring_of(2);
  // One layer-1 call: prepared in route, then handed out in resolve.
  ring.prepare(loader, {1, 0}, Precision::f16);
  ring.prepare(loader, {1, 5}, Precision::f16);
  const auto first = ring.bytes(loader, {1, 0}, Precision::f16);
  const auto second = ring.bytes(loader, {1, 5}, Precision::f16);
  // The next call (a one-layer model: the same layer again) needs expert 5 again and a new one.
  // Expert 5 is kept and not read again; the new one takes the other slot, so both of this call's
  // experts are intact when handed out.
  ring.prepare(loader, {1, 6}, Precision::f16);
  ring.prepare(loader, {1, 5}, Precision::f16);
  CHECK(loader.submits == 3);
  CHECK(holds(ring.bytes(loader, {1, 6}, Precision::f16), {1, 6}, Precision::f16));
  CHECK(holds(ring.bytes(loader, {1, 5}, Precision::f16), {1, 5}, Precision::f16));
  CHECK(holds(second, {1, 5}, Precision::f16));       // the same buffer, untouched
  CHECK_FALSE(holds(first, {1, 0}, Precision::f16));  // its slot went to expert 6
  // A precision is part of the identity.
  ring.prepare(loader, {1, 5}, Precision::q4);
  CHECK(loader.submits == 4);
  CHECK(ring.bytes(loader, {1, 5}, Precision::q4).size() == expert_bytes / 4);
}

TEST_CASE("HostReadRing waits for a read still in flight before reusing its buffer",
          "[io][host_read_ring]") {
  DeferredLoader loader;
  io::HostReadRing ring = ring_of(1);
  ring.prepare(loader, {1, 2}, Precision::f16);  // read 1: in flight, never asked for
  CHECK_FALSE(loader.reads.at(1).landed);
  // Takes the only slot: read 1 is finished before read 2 goes into the same buffer.
  CHECK(holds(ring.bytes(loader, {2, 4}, Precision::f16), {2, 4}, Precision::f16));
  CHECK(loader.reads.at(1).landed);
}

TEST_CASE("HostReadRing refuses more experts in one layer call than its slots",
          "[io][host_read_ring]") {
  DeferredLoader loader;
  io::HostReadRing ring = ring_of(2);
  ring.prepare(loader, {0, 0}, Precision::f16);
  ring.prepare(loader, {0, 1}, Precision::f16);
  CHECK_THROWS_AS(ring.prepare(loader, {0, 2}, Precision::f16), Error);
  // Bytes asked for without a prepare are read into the next slot in turn.
  CHECK(holds(ring.bytes(loader, {0, 7}, Precision::f16), {0, 7}, Precision::f16));
  CHECK(ring.held_bytes() >= 2 * expert_bytes);
}
