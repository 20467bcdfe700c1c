#pragma once
/// \file How fast the engine's own loader brings a checkpoint's experts into memory: the link
/// rate an offloaded decode sees (O_DIRECT reads of each expert's covering range, transcoded into
/// the run's layout), which a raw sequential read of a scratch file overstates. moe-calibrate
/// --checkpoint writes it as moe-sim's link bandwidth.

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "moekit/engine/config.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/gguf_model.hpp"
#include "moekit/error.hpp"
#include "moekit/io/aligned_buffer.hpp"
#include "moekit/io/gguf.hpp"

namespace moekit::engine {

/// What loader_read_rate measured.
struct LoaderReadRate {
  double bytes_per_s = 0;     ///< expert bytes at `precision` per second of wall time
  std::uint32_t experts = 0;  ///< experts read (layer-major from layer 0, expert 0)
  moekit::Precision precision{};
  std::string reader;  ///< "io_uring" or "pread"
  /// CPU seconds (user and system, every thread of the process) per byte read: the loader's own
  /// work (system calls, checksums, transcoding) when nothing else in the process runs.
  double cpu_s_per_byte = 0;
};

/// The seconds by which each byte a path reads at `r`'s rate delays kernels running on `threads`
/// of the machine's `cores`: the loader's CPU work first fills the cores the kernels leave free,
/// and what is left over takes its share from each kernel thread (moe-sim's
/// ReadPath::compute_s_per_byte). 0 when the spare cores absorb it.
[[nodiscard]] inline double compute_delay_per_byte(const LoaderReadRate& r, unsigned threads,
                                                   unsigned cores) noexcept {
  if (threads == 0 || !(r.bytes_per_s > 0)) return 0;
  const double spare = cores > threads ? double(cores - threads) : 0.0;
  const double excess = r.cpu_s_per_byte - spare / r.bytes_per_s;
  return excess > 0 ? excess / double(threads) : 0.0;
}

namespace detail {
/// User and system CPU seconds of the whole process so far.
inline double process_cpu_seconds() noexcept {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); };
  return s(u.ru_utime) + s(u.ru_stime);
}
}  // namespace detail

/// Times loads at `p` through `loader` (layer-major from layer 0, expert 0, around again after
/// the last expert), `depth` of them outstanding: `n` of them, or fewer (at least one) when
/// `stop` is set first (read_both_paths: one path reads while the other one does).
inline LoaderReadRate timed_reads(ExpertLoader& loader, const moekit::ModelShape& s,
                                  moekit::Precision p, std::uint32_t n, std::size_t depth,
                                  const std::atomic<bool>* stop = nullptr) {
  n = std::max<std::uint32_t>(n, 1);
  const auto count = static_cast<std::uint32_t>(s.expert_count());
  std::vector<moekit::io::AlignedBuffer> bufs;
  for (std::size_t i = 0; i < depth; ++i) bufs.emplace_back(s.expert_bytes(p));
  std::vector<moekit::LoadTicket> tickets;
  const double cpu0 = detail::process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint32_t i = 0; i < n && !(i > 0 && stop && stop->load(std::memory_order_relaxed));
       ++i) {
    if (tickets.size() >= depth) loader.wait(tickets[tickets.size() - depth]);
    const moekit::ExpertKey k{(i % count) / s.n_experts, (i % count) % s.n_experts};
    tickets.push_back(
        loader.submit({k, p, moekit::LoadPriority::on_demand, bufs[i % depth].span()}));
  }
  for (auto t : tickets) loader.wait(t);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = detail::process_cpu_seconds() - cpu0;
  const auto done = static_cast<std::uint32_t>(tickets.size());
  const double bytes = double(done) * double(s.expert_bytes(p));
  return {bytes / seconds, done, p, loader.kind(), cpu / bytes};
}

/// A loader of one read path with what it reads.
struct ReadPathLoader {
  ExpertLoader loader;
  moekit::ModelShape shape;
  moekit::Precision precision{};
};

/// moe-run's in-place loader of checkpoint `path` (a GGUF file or a Hugging Face directory) with
/// `io`, into moe-run's layout for int8 activations (blocked panels; rows for float experts).
/// Throws moekit::Error naming the path when its experts have no exact in-place type (types
/// mixed other than K-quants among themselves).
inline ReadPathLoader checkpoint_path_loader(const std::filesystem::path& path,
                                             const StoreIo& io = {}) {
  std::optional<moekit::io::GgufFile> gguf;
  if (std::filesystem::is_regular_file(path)) gguf.emplace(path.string());
  const ModelConfig cfg = gguf ? gguf_config(*gguf) : load_config(path);
  auto experts = locate_checkpoint_experts(cfg, path, gguf ? &*gguf : nullptr);
  if (!experts)
    throw moekit::Error(moekit::ErrorKind::unsupported,
                        "'" + path.string() + "': its experts' type has no exact in-place read");
  const moekit::ModelShape s = experts->shape();  // K-quants: the blob's size (its kquant)
  const moekit::Precision p = experts->precision();
  const moekit::MatrixOrder order =
      moekit::bits(p) <= 8 ? moekit::MatrixOrder::blocked_panels4 : moekit::MatrixOrder::rows;
  return {ExpertLoader::checkpoint(experts, order, io, nullptr), s, p};
}

/// moe-run's loader of expert store `path` at its first precision with `io` (checksums verified
/// as `io` says, as moe-run reads them): the second read path of a run whose checkpoint lacks a
/// precision.
inline ReadPathLoader store_path_loader(const std::filesystem::path& path, const StoreIo& io = {}) {
  auto store =
      std::make_shared<const moekit::io::ExpertStore>(moekit::io::ExpertStore::open(path.string()));
  const moekit::ModelShape s = store->manifest().shape;
  const moekit::Precision p = store->precisions().front();
  return {ExpertLoader::store(store, io), s, p};
}

/// Reads `n` experts of checkpoint `path` in place (checkpoint_path_loader), `depth` loads
/// outstanding.
inline LoaderReadRate loader_read_rate(const std::filesystem::path& path, std::uint32_t n,
                                       const StoreIo& io = {}, std::size_t depth = 4) {
  ReadPathLoader r = checkpoint_path_loader(path, io);
  return timed_reads(r.loader, r.shape, r.precision, n, depth);
}

/// Reads `n` experts of expert store `path` (store_path_loader), `depth` loads outstanding.
inline LoaderReadRate store_read_rate(const std::filesystem::path& path, std::uint32_t n,
                                      const StoreIo& io = {}, std::size_t depth = 2) {
  ReadPathLoader r = store_path_loader(path, io);
  return timed_reads(r.loader, r.shape, r.precision, n, depth);
}

/// What read_both_paths measured: each path's share and their sum.
struct BothPathsReadRate {
  LoaderReadRate in_place, store;  ///< their cpu_s_per_byte 0: both paths read in one process
  double bytes_per_s = 0;          ///< both paths' bytes per second of the same wall time
};

/// Both read paths at once, as a run that loads from a checkpoint and its store reads them: `n`
/// experts in place (`depth` outstanding) while the store's loader reads (`store_depth`
/// outstanding) until they are done, on threads of their own. The sum is the disk's rate under
/// both (moe-sim's link.disk_bandwidth_bytes_per_s), which each path alone overstates when the
/// disk or the CPU's conversion is shared (bench/RESULTS.md, "Both read paths measured at once…").
inline BothPathsReadRate read_both_paths(const std::filesystem::path& checkpoint,
                                         const std::filesystem::path& store, std::uint32_t n,
                                         const StoreIo& io, std::size_t depth,
                                         std::size_t store_depth) {
  ReadPathLoader a = checkpoint_path_loader(checkpoint, io);
  ReadPathLoader b = store_path_loader(store, io);
  std::atomic<bool> stop{false};
  BothPathsReadRate r;
  std::exception_ptr failed;
  std::atomic<bool> begun{false};
  std::thread reader([&] {
    begun = true;  // the in-place reads start once this thread runs: the two overlap
    try {
      r.store = timed_reads(b.loader, b.shape, b.precision, ~std::uint32_t{0}, store_depth, &stop);
    } catch (...) {
      failed = std::current_exception();
    }
  });
  while (!begun) std::this_thread::yield();
  try {
    r.in_place = timed_reads(a.loader, a.shape, a.precision, n, depth);
  } catch (...) {
    stop = true;
    reader.join();
    throw;
  }
  stop = true;
  reader.join();
  if (failed) std::rethrow_exception(failed);
  r.bytes_per_s = r.in_place.bytes_per_s + r.store.bytes_per_s;
  r.in_place.cpu_s_per_byte = r.store.cpu_s_per_byte = 0;  // the process's CPU: not per path
  return r;
}

}  // namespace moekit::engine
