// One typed conformance suite run against every Loader of moekit (like the cache policies'
// property suite): the same requests through each loader, checked against the Loader concept's
// contract. Adding a loader to AllLoaders (with a LoaderSetup) enrols it.

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "moekit/io/async_loader.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/checksum.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/memory_loader.hpp"
#include "moekit/sim/sim_loader.hpp"
#include "support/named_component.hpp"

using namespace moekit;

namespace {

using AllLoaders = std::tuple<MemoryLoader, io::AsyncLoader<io::MemorySource>, sim::SimLoader>;

constexpr ModelShape loader_shape{
    .n_layers = 2, .n_experts = 4, .top_k = 2, .hidden = 64, .ffn = 128};
constexpr Precision loader_precisions[] = {Precision::f16, Precision::q8, Precision::q4};

/// Every expert at every precision of `loader_precisions`, each blob a pattern of its key and
/// precision, at 4 KiB-aligned offsets of one buffer (a store file in memory).
struct ExpertBytes {
  std::vector<std::byte> file;
  std::vector<io::StoreBlob> blobs;

  ExpertBytes() {
    for (std::uint32_t l = 0; l < loader_shape.n_layers; ++l)
      for (std::uint32_t e = 0; e < loader_shape.n_experts; ++e)
        for (Precision p : loader_precisions) {
          io::StoreBlob b{{l, e}, p, file.size(), loader_shape.expert_bytes(p), 0};
          file.resize(file.size() + b.padded_bytes(), std::byte{0});
          for (std::size_t i = 0; i < b.bytes; ++i)
            file[b.offset + i] = std::byte(
                static_cast<unsigned char>(i * 7 + l * 31 + e * 5 + static_cast<unsigned>(p)));
          b.checksum = io::xxh64(std::span<const std::byte>(file).subspan(b.offset, b.bytes));
          blobs.push_back(b);
        }
  }
  [[nodiscard]] const io::StoreBlob& blob(ExpertKey k, Precision p) const {
    for (const io::StoreBlob& b : blobs)
      if (b.key == k && b.precision == p) return b;
    throw Error(ErrorKind::invalid_argument, "no such blob");
  }
  [[nodiscard]] std::span<const std::byte> bytes(ExpertKey k, Precision p) const {
    const io::StoreBlob& b = blob(k, p);
    return std::span<const std::byte>(file).subspan(b.offset, b.bytes);
  }
};

/// How the suite constructs loader `L` over `data` (loaders need not move: a pointer).
template <class L>
struct LoaderSetup;
template <>
struct LoaderSetup<MemoryLoader> {
  static std::unique_ptr<MemoryLoader> make(const ExpertBytes& data) {
    return std::make_unique<MemoryLoader>(
        [&data](ExpertKey k, Precision p) { return data.bytes(k, p); });
  }
};
template <>
struct LoaderSetup<io::AsyncLoader<io::MemorySource>> {
  static std::unique_ptr<io::AsyncLoader<io::MemorySource>> make(const ExpertBytes& data) {
    return std::make_unique<io::AsyncLoader<io::MemorySource>>(
        io::MemorySource(data.file, "conformance"),
        [&data](ExpertKey k, Precision p) { return data.blob(k, p); },
        io::AsyncLoader<io::MemorySource>::Config{
            .io_threads = 2, .max_outstanding = 64, .verify_checksums = true});
  }
};
template <>
struct LoaderSetup<sim::SimLoader> {
  static std::unique_ptr<sim::SimLoader> make(const ExpertBytes&) {
    return std::make_unique<sim::SimLoader>(loader_shape,
                                            sim::LinkModel{.bandwidth_bytes_per_s = 1e9});
  }
};

template <class L>
constexpr bool keeps_bytes_of() {
  if constexpr (requires { L::keeps_bytes; }) return bool(L::keeps_bytes);
  return true;
}

/// One request of the suite and its destination.
struct Load {
  LoadRequest request;
  std::vector<std::byte> dest;
  LoadTicket ticket;
};

/// Every expert at every precision, demands and prefetches alternating.
template <class L>
std::vector<Load> all_loads() {
  std::vector<Load> loads;
  for (std::uint32_t l = 0; l < loader_shape.n_layers; ++l)
    for (std::uint32_t e = 0; e < loader_shape.n_experts; ++e)
      for (Precision p : loader_precisions) {
        Load x;
        x.request = {
            {l, e}, p, loads.size() % 2 ? LoadPriority::prefetch : LoadPriority::on_demand, {}};
        if (keeps_bytes_of<L>()) x.dest.assign(loader_shape.expert_bytes(p) + 64, std::byte{0});
        loads.push_back(std::move(x));
      }
  for (Load& x : loads) x.request.dest = x.dest;
  return loads;
}

}  // namespace

TEST_CASE("every loader says its own name, each a different one", "[io][conformance]") {
  const auto names = test::names_of<AllLoaders>();
  CAPTURE(names);
  CHECK(test::names_distinct(names));
}

TEMPLATE_LIST_TEST_CASE("loaders complete every load with the expert's bytes", "[io][conformance]",
                        AllLoaders) {
  CAPTURE(TestType::name);
  const ExpertBytes data;
  auto loader = LoaderSetup<TestType>::make(data);
  auto loads = all_loads<TestType>();
  for (Load& x : loads) {
    x.ticket = loader->submit(x.request);
    REQUIRE(x.ticket.valid());
  }
  for (std::size_t i = 0; i < loads.size(); ++i)
    for (std::size_t j = 0; j < i; ++j) REQUIRE(loads[i].ticket != loads[j].ticket);
  for (Load& x : loads) {
    CAPTURE(x.request.key.layer, x.request.key.expert, name(x.request.precision));
    REQUIRE_NOTHROW(loader->wait(x.ticket));
    CHECK(loader->poll(x.ticket));          // complete once waited for
    CHECK_FALSE(loader->cancel(x.ticket));  // a finished load cannot be withdrawn
    if constexpr (keeps_bytes_of<TestType>()) {
      const auto want = data.bytes(x.request.key, x.request.precision);
      REQUIRE(std::equal(want.begin(), want.end(), x.dest.begin()));
    }
  }
}

TEMPLATE_LIST_TEST_CASE("loaders withdraw only queued prefetches; the others still complete",
                        "[io][conformance]", AllLoaders) {
  CAPTURE(TestType::name);
  const ExpertBytes data;
  auto loader = LoaderSetup<TestType>::make(data);
  auto loads = all_loads<TestType>();
  for (Load& x : loads) x.ticket = loader->submit(x.request);
  std::vector<bool> cancelled(loads.size(), false);
  for (std::size_t i = 0; i < loads.size(); ++i) {
    cancelled[i] = loader->cancel(loads[i].ticket);
    if (loads[i].request.priority == LoadPriority::on_demand) CHECK_FALSE(cancelled[i]);
  }
  for (std::size_t i = 0; i < loads.size(); ++i) {
    if (cancelled[i]) continue;
    CAPTURE(i);
    REQUIRE_NOTHROW(loader->wait(loads[i].ticket));
    if constexpr (keeps_bytes_of<TestType>()) {
      const auto want = data.bytes(loads[i].request.key, loads[i].request.precision);
      REQUIRE(std::equal(want.begin(), want.end(), loads[i].dest.begin()));
    }
  }
}
