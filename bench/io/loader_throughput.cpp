// Loader throughput: expert-sized blobs read with O_DIRECT from an expert store through
// AsyncLoader<PreadSource> and AsyncLoader<UringSource>, as a fraction of the raw sequential
// O_DIRECT read bandwidth of the same file measured in the same run (large reads, several in
// flight). Target: >= 0.90. Also the latency of one expert load.
//
// The store holds a 2-layer × 2-expert model with hidden 4096, ffn 4779: one expert is ~117 MB
// at f16 and ~33 MB at q4 (Mixtral-matrix-sized blobs). Usage:
//   moekit_bench_loader_throughput [dir=/var/tmp] [rounds=2]
// The store file (~600 MB) is created in `dir` and removed at the end.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "moekit/io/aligned_buffer.hpp"
#include "moekit/io/async_loader.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/uring_source.hpp"

using namespace moekit;
using namespace moekit::io;
using Clock = std::chrono::steady_clock;

namespace {

constexpr ModelShape bench_shape{.n_layers = 2, .n_experts = 2, .top_k = 1, .hidden = 4096, .ffn = 4779};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Raw bandwidth: the whole blob region read front to back in 8 MiB O_DIRECT requests, `depth`
/// threads each owning an interleaved stripe (so `depth` requests are in flight).
double raw_bandwidth(const std::string& path, std::uint64_t begin, std::uint64_t end, unsigned depth) {
  constexpr std::uint64_t chunk = 8u << 20;
  PreadSource src(path, {.direct = true});
  std::vector<std::thread> ts;
  const auto t0 = Clock::now();
  for (unsigned t = 0; t < depth; ++t)
    ts.emplace_back([&, t] {
      AlignedBuffer buf(chunk);
      for (std::uint64_t off = begin + t * chunk; off < end; off += depth * chunk)
        src.read({off, std::min(chunk, end - off)}, buf.span());
    });
  for (auto& t : ts) t.join();
  return static_cast<double>(end - begin) / seconds_since(t0);
}

template <class Source>
double loader_bandwidth(const ExpertStore& store, Source source, unsigned threads, Precision p,
                        std::vector<AlignedBuffer>& bufs, double* one_load_ms) {
  AsyncLoader<Source> loader(store, std::move(source), {.io_threads = threads, .max_outstanding = 16, .verify_checksums = false});
  // One expert alone: latency.
  {
    const auto t0 = Clock::now();
    loader.wait(loader.submit({{0, 0}, p, LoadPriority::on_demand, bufs[0].span()}));
    *one_load_ms = 1e3 * seconds_since(t0);
  }
  std::vector<LoadTicket> tickets;
  std::uint64_t bytes = 0;
  const auto t0 = Clock::now();
  // Every expert, `passes` times (so each measurement moves >= ~0.5 GB), at most 4 in flight.
  const int passes = p == Precision::f16 ? 1 : 4;
  std::size_t i = 0;
  for (int pass = 0; pass < passes; ++pass)
    for (std::uint32_t l = 0; l < bench_shape.n_layers; ++l)
      for (std::uint32_t e = 0; e < bench_shape.n_experts; ++e, ++i) {
        if (tickets.size() >= bufs.size()) loader.wait(tickets[tickets.size() - bufs.size()]);
        tickets.push_back(loader.submit({{l, e}, p, LoadPriority::on_demand, bufs[i % bufs.size()].span()}));
        bytes += store.blob({l, e}, p).bytes;
      }
  for (auto t : tickets) loader.wait(t);
  return static_cast<double>(bytes) / seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/var/tmp";
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 2;
  const std::string path = dir + "/moekit-bench-loader.moestore";
  std::filesystem::remove(path);
  const std::vector<Precision> ps{Precision::f16, Precision::q4};
  std::printf("writing %s ...\n", path.c_str());
  write_expert_store(path, bench_shape, ps,
                     [](ExpertKey k, Precision p) {
                       std::vector<std::byte> v(bench_shape.expert_bytes(p));
                       for (std::size_t i = 0; i < v.size(); i += 4096) v[i] = static_cast<std::byte>(k.expert + i);
                       return v;
                     },
                     {.verify = false});
  auto store = ExpertStore::open(path);
  const auto& blobs = store.manifest().blobs;
  const std::uint64_t begin = blobs.front().offset, end = blobs.back().offset + blobs.back().padded_bytes();
  std::vector<AlignedBuffer> bufs;
  for (int i = 0; i < 4; ++i) bufs.emplace_back(bench_shape.expert_bytes(Precision::f16));

  std::printf("expert bytes: f16 %.1f MB, q4 %.1f MB\n", bench_shape.expert_bytes(Precision::f16) / 1e6,
              bench_shape.expert_bytes(Precision::q4) / 1e6);
  std::printf("%-34s %10s %10s %12s\n", "reader", "GB/s", "of raw", "1 load (ms)");
  bool all_ok = true;
  for (int r = 0; r < rounds; ++r) {
    const double raw = std::max(raw_bandwidth(path, begin, end, 1), raw_bandwidth(path, begin, end, 4));
    std::printf("%-34s %10.2f %10s %12s\n", "raw O_DIRECT 8 MiB sequential", raw / 1e9, "1.00", "-");
    for (Precision p : ps) {
      double ms = 0;
      const double pr = loader_bandwidth(store, PreadSource(path, {.direct = true}), 2, p, bufs, &ms);
      std::printf("%-34s %10.2f %10.2f %12.1f\n", (std::string("pread x2 threads, ") + std::string(name(p))).c_str(),
                  pr / 1e9, pr / raw, ms);
      all_ok = all_ok && pr / raw >= 0.9;
#if defined(MOEKIT_HAS_URING)
      try {
        const double ur = loader_bandwidth(store, UringSource(path, {.direct = true, .queue_depth = 8, .chunk_bytes = 4u << 20, .rings = 2}),
                                           2, p, bufs, &ms);
        std::printf("%-34s %10.2f %10.2f %12.1f\n", (std::string("io_uring x2 QD8 x4MiB, ") + std::string(name(p))).c_str(),
                    ur / 1e9, ur / raw, ms);
        all_ok = all_ok && ur / raw >= 0.9;
      } catch (const Error& e) {
        std::printf("io_uring unavailable: %s\n", e.message().c_str());
      }
#endif
    }
  }
  std::filesystem::remove(path);
  std::printf("target >= 0.90 of raw: %s\n", all_ok ? "met" : "NOT met");
  return 0;
}
