// Experts read in place from a GGUF checkpoint (io/checkpoint_experts.hpp) through the loader
// moe-run uses (AsyncLoader, 2 I/O threads by default, O_DIRECT), as a fraction of the raw
// sequential O_DIRECT read of the same file measured in the same run; and the transcoding alone
// (Q4_0/Q8_0 into moekit rows or blocked panels, one thread, from memory), as a fraction of memcpy
// of the same bytes. Separates what the disk costs from what the conversion costs.
//
// Usage: moekit_bench_checkpoint_read [--gguf FILE] [--reps 3] [--experts N] [--io-threads 2]
//                                     [--depth 4] [--staging-mib 8]
// --depth: loads outstanding at once (1: a decode step waiting on one missed expert);
// --staging-mib: bytes each loader thread reads at once (CheckpointExpertSource::Config).
// FILE defaults to build/real-shape-models/mixtral-4L-q4_0.gguf, written by
// `scripts/make_real_shape_model.sh --arch mixtral --layers 4 --format gguf-q4_0` (3.4 GB).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "io/io_bench_util.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/gguf_model.hpp"
#include "moekit/io/async_loader.hpp"
#include "moekit/io/checkpoint_experts.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/io/gguf_transcode.hpp"
#if defined(MOEKIT_HAS_URING)
#include "moekit/io/uring_source.hpp"
#endif

using namespace moekit;
using namespace moekit::io;
using namespace moekit::bench;

namespace {

// Loads the first `n` experts (layer-major) through an AsyncLoader over the checkpoint, at most
// `bufs.size()` outstanding; file bytes per second.
template <class File>
double in_place_rate(const std::shared_ptr<const CheckpointExperts>& experts, File file,
                     MatrixOrder order, std::uint32_t n, std::vector<AlignedBuffer>& bufs,
                     unsigned io_threads, std::uint64_t staging) {
  using Source = CheckpointExpertSource<File>;
  std::vector<File> files;
  files.push_back(std::move(file));
  auto src =
      std::make_shared<Source>(experts, std::move(files), typename Source::Config{order, staging});
  AsyncLoader<Source> loader(
      *src, [src](ExpertKey k, Precision p) { return src->blob(k, p); },
      {.io_threads = io_threads, .max_outstanding = 16, .verify_checksums = false});
  const ModelShape& s = experts->shape();
  const Precision p = experts->precision();
  std::vector<LoadTicket> tickets;
  const auto t0 = Clock::now();
  for (std::uint32_t i = 0; i < n; ++i) {
    if (tickets.size() >= bufs.size()) loader.wait(tickets[tickets.size() - bufs.size()]);
    const ExpertKey k{i / s.n_experts, i % s.n_experts};
    tickets.push_back(loader.submit({k, p, LoadPriority::on_demand, bufs[i % bufs.size()].span()}));
  }
  for (auto t : tickets) loader.wait(t);
  return double(n) * double(s.expert_bytes(p)) / seconds_since(t0);
}

// One thread transcoding expert (0, 0)'s matrices from memory into `order`; and memcpy of the
// same bytes. Bytes per second of each.
std::pair<double, double> transcode_rate(const GgufFile& g, const CheckpointExperts& e,
                                         MatrixOrder order) {
  std::vector<std::vector<std::byte>> src, dst;
  for (const TensorLocation& m : e.matrices({0, 0})) {
    const auto bytes = g.mapped_bytes().subspan(m.offset, m.bytes);
    src.emplace_back(bytes.begin(), bytes.end());
    dst.emplace_back(m.bytes);
  }
  double t_transcode = 1e30, t_copy = 1e30, bytes = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    for (std::size_t i = 0; i < 3; ++i) {
      const TensorLocation& m = e.matrices({0, 0})[i];
      transcode_matrix(m.dtype, src[i], m.rows, m.cols, dst[i], order);
    }
    t_transcode = std::min(t_transcode, seconds_since(t0));
    t0 = Clock::now();
    for (std::size_t i = 0; i < 3; ++i) std::memcpy(dst[i].data(), src[i].data(), src[i].size());
    t_copy = std::min(t_copy, seconds_since(t0));
  }
  for (const auto& b : src) bytes += double(b.size());
  return {bytes / t_transcode, bytes / t_copy};
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const Flags flags{
      argc, argv,
      "[--gguf FILE] [--reps 3] [--experts N] [--io-threads 2] [--depth 4] [--staging-mib 8]"};
  flags.check({"--gguf", "--reps", "--experts", "--io-threads", "--depth", "--staging-mib"});
  const std::uint64_t staging =
      std::uint64_t(std::max(1, std::atoi(flags.get("--staging-mib", "8").c_str()))) << 20;
  const int depth = std::max(1, std::atoi(flags.get("--depth", "4").c_str()));
  const auto io_threads =
      static_cast<unsigned>(std::max(1, std::atoi(flags.get("--io-threads", "2").c_str())));
  const std::string path = flags.get(
      "--gguf", std::string(MOEKIT_SOURCE_DIR) + "/build/real-shape-models/mixtral-4L-q4_0.gguf");
  if (!std::filesystem::exists(path)) {
    std::printf(
        "skipped: %s does not exist (scripts/make_real_shape_model.sh --arch mixtral "
        "--layers 4 --format gguf-q4_0 writes it)\n",
        path.c_str());
    return 0;
  }
  const int reps = std::max(1, std::atoi(flags.get("--reps", "3").c_str()));
  const GgufFile g(path);
  const engine::ModelConfig cfg = engine::gguf_config(g);
  const auto experts = engine::locate_checkpoint_experts(cfg, {}, &g);
  if (!experts) {
    std::printf("skipped: %s's experts have no exact in-place type\n", path.c_str());
    return 0;
  }
  const ModelShape shape = experts->shape();  // K-quants: sized as their blob (shape.kquant)
  const auto n = static_cast<std::uint32_t>(
      std::min<std::size_t>(shape.expert_count(), std::atoi(flags.get("--experts", "16").c_str())));
  const Precision p = experts->precision();
  std::vector<AlignedBuffer> bufs;
  for (int i = 0; i < depth; ++i) bufs.emplace_back(shape.expert_bytes(p));
  const std::uint64_t begin = experts->matrices({0, 0})[0].offset / 4096 * 4096;
  const std::uint64_t end = std::min<std::uint64_t>(
      std::filesystem::file_size(path), begin + std::uint64_t{n} * shape.expert_bytes(p));
  std::printf("%s: %u experts of %.1f MB at %s (%s in the file), %d outstanding; %d repetitions\n",
              path.c_str(), n, shape.expert_bytes(p) / 1e6, std::string(name(p)).c_str(),
              std::string(name(experts->dtype())).c_str(), depth, reps);
  std::printf("%-44s %8s %8s\n", "reader", "GB/s", "of raw");
  for (int r = 0; r < reps; ++r) {
    const double raw =
        std::max(raw_bandwidth(path, begin, end, 1), raw_bandwidth(path, begin, end, 4));
    std::printf("%-44s %8.2f %8.2f\n", "raw O_DIRECT 8 MiB sequential (best of QD1/4)", raw / 1e9,
                1.0);
    for (MatrixOrder order : {MatrixOrder::rows, MatrixOrder::blocked_panels4}) {
      const std::string o = order == MatrixOrder::rows ? "rows" : "blocked panels";
      const double pr = in_place_rate(experts, PreadSource(path, {.direct = true}), order, n, bufs,
                                      io_threads, staging);
      std::printf("%-44s %8.2f %8.2f\n",
                  ("in place, pread x" + std::to_string(io_threads) + ", " + o).c_str(), pr / 1e9,
                  pr / raw);
#if defined(MOEKIT_HAS_URING)
      const double ur = in_place_rate(experts, UringSource(path, {.direct = true, .rings = 2}),
                                      order, n, bufs, io_threads, staging);
      std::printf("%-44s %8.2f %8.2f\n",
                  ("in place, io_uring x" + std::to_string(io_threads) + ", " + o).c_str(),
                  ur / 1e9, ur / raw);
#endif
    }
  }
  for (MatrixOrder order : {MatrixOrder::rows, MatrixOrder::blocked_panels4}) {
    const auto [t, c] = transcode_rate(g, *experts, order);
    std::printf("transcode alone, 1 thread, %-16s %6.2f GB/s = %.2f of memcpy (%.2f GB/s)\n",
                order == MatrixOrder::rows ? "rows:" : "blocked panels:", t / 1e9, t / c, c / 1e9);
  }
  return 0;
}
