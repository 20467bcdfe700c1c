#pragma once
/// \file How fast the engine's own loader brings a checkpoint's experts into memory: the link
/// rate an offloaded decode sees (O_DIRECT reads of each expert's covering range, transcoded into
/// the run's layout), which a raw sequential read of a scratch file overstates. moe-calibrate
/// --checkpoint writes it as moe-sim's link bandwidth.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
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
};

/// Times `n` loads at `p` through `loader` (layer-major from layer 0, expert 0), `depth` of
/// them outstanding.
inline LoaderReadRate timed_reads(ExpertLoader& loader, const moekit::ModelShape& s,
                                  moekit::Precision p, std::uint32_t n, std::size_t depth) {
  n = std::clamp<std::uint32_t>(n, 1, static_cast<std::uint32_t>(s.expert_count()));
  std::vector<moekit::io::AlignedBuffer> bufs;
  for (std::size_t i = 0; i < depth; ++i) bufs.emplace_back(s.expert_bytes(p));
  std::vector<moekit::LoadTicket> tickets;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint32_t i = 0; i < n; ++i) {
    if (tickets.size() >= depth) loader.wait(tickets[tickets.size() - depth]);
    const moekit::ExpertKey k{i / s.n_experts, i % s.n_experts};
    tickets.push_back(
        loader.submit({k, p, moekit::LoadPriority::on_demand, bufs[i % depth].span()}));
  }
  for (auto t : tickets) loader.wait(t);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {double(n) * double(s.expert_bytes(p)) / seconds, n, p, loader.kind()};
}

/// Reads `n` experts of checkpoint `path` (a GGUF file or a Hugging Face directory) in place
/// through ExpertLoader::checkpoint with `io`, `depth` loads outstanding, into `order` (quantized
/// experts: blocked panels, moe-run's layout for int8 activations). Throws moekit::Error naming
/// the path when its experts have no exact in-place type (types mixed other than K-quants among
/// themselves).
inline LoaderReadRate loader_read_rate(const std::filesystem::path& path, std::uint32_t n,
                                       const StoreIo& io = {}, std::size_t depth = 4) {
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
  ExpertLoader loader = ExpertLoader::checkpoint(experts, order, io, nullptr);
  return timed_reads(loader, s, p, n, depth);
}

/// Reads `n` experts of expert store `path` at its first precision through ExpertLoader::store
/// with `io` (checksums verified as `io` says, as moe-run reads them), `depth` loads
/// outstanding: the rate of the second read path of a run whose checkpoint lacks a precision.
inline LoaderReadRate store_read_rate(const std::filesystem::path& path, std::uint32_t n,
                                      const StoreIo& io = {}, std::size_t depth = 2) {
  auto store =
      std::make_shared<const moekit::io::ExpertStore>(moekit::io::ExpertStore::open(path.string()));
  const moekit::ModelShape s = store->manifest().shape;
  const moekit::Precision p = store->precisions().front();
  ExpertLoader loader = ExpertLoader::store(store, io);
  return timed_reads(loader, s, p, n, depth);
}

}  // namespace moekit::engine
