// Overlap of expert loading and compute: two compute threads run moekit's CPU GEMV (q4 g32,
// 14336 x 4096, Mixtral's w1/w3 shape, cold weights) while AsyncLoader streams q4 experts (~33 MB)
// from an expert store with O_DIRECT (io_uring with moe-run's default config, then pread). Each
// side's rate is compared with the same side running alone, measured in the same run. Target:
// each side loses < 10% (ratio together/alone >= 0.90).
//
// Protocol: every phase runs for --window seconds from a common start; compute rate = GEMVs
// finished / time of the last one, load rate = bytes of loads finished / time of the last one.
// Each repetition runs the phases "compute alone", then for each source "load alone" and
// "both", in an order that rotates between repetitions; ratios are taken within a repetition and
// the table shows medians (and min..max) over --reps repetitions. The block device's read
// requests per GB during the loading phases are reported too (interrupt/completion load).
//
// Usage: moekit_bench_load_compute_overlap [--dir /var/tmp] [--reps 5] [--window 2]
// [--load-cap-gbps G] The store file (~0.6 GB) is created in --dir and removed at the end.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/io_bench_util.hpp"
#include "moekit/io/async_loader.hpp"
#include "moekit/io/uring_source.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/isa.hpp"
#include "moekit/precision/quantize.hpp"

using namespace moekit;
using namespace moekit::io;
using namespace moekit::bench;

namespace {

constexpr std::size_t rows = 14336, cols = 4096;
constexpr Precision weight_precision = Precision::q4;
constexpr QuantScheme weight_scheme{32, false};
constexpr std::size_t copies_per_thread = 4;  // 4 × ~30 MiB per thread: far beyond the LLC

/// Weights for one compute thread: several copies of one matrix, used in rotation (cold).
struct ComputeState {
  std::vector<std::vector<std::byte>> mats;
  std::vector<float> x = std::vector<float>(cols, 0.5f), y = std::vector<float>(rows);
};

struct PhaseResult {
  double gemv_per_s[2] = {0, 0};
  double gemv_per_cpu_s[2] = {0, 0};  ///< GEMVs per second of the thread's own CPU time
  double load_bytes_per_s = 0;
  double other_cpu_s = 0;  ///< process CPU time not spent by the compute threads (the loading)
  double block_requests = 0,
         block_bytes = 0;  ///< read requests the disk completed, bytes they read
};

double cpu_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// Read requests completed and sectors read by the block device holding `path` (its
/// /sys/dev/block/MAJ:MIN/stat; zeros when unavailable). Other processes' reads count too.
struct BlockReads {
  double requests = 0, sectors = 0;
};
BlockReads block_reads(const std::string& path) {
  struct stat st {};
  BlockReads r;
  if (::stat(path.c_str(), &st) != 0) return r;
  std::ifstream f("/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" +
                  std::to_string(minor(st.st_dev)) + "/stat");
  double merges = 0;
  f >> r.requests >> merges >> r.sectors;
  return f ? r : BlockReads{};
}

/// A loader plus the buffers it fills; built once per source, outside the timed windows.
struct LoadSide {
  std::string label;
  std::function<void(double window, Clock::time_point t0, double& rate)> run;
};

template <class Source>
LoadSide make_load_side(std::string label, const ExpertStore& store, Source source,
                        double cap_bytes_per_s) {
  auto loader = std::make_shared<AsyncLoader<Source>>(
      store, std::move(source),
      typename AsyncLoader<Source>::Config{.io_threads = 2,
                                           .bandwidth_bytes_per_s = cap_bytes_per_s,
                                           .throttle_chunk = 4u << 20,
                                           .verify_checksums = false});
  auto bufs = std::make_shared<std::vector<AlignedBuffer>>();
  const ModelShape shape = store.manifest().shape;
  for (int i = 0; i < 4; ++i) bufs->emplace_back(shape.expert_bytes(weight_precision));
  return {std::move(label),
          [loader, bufs, shape, &store](double window, Clock::time_point t0, double& rate) {
            std::vector<std::pair<LoadTicket, std::uint64_t>> tickets;
            std::size_t next = 0, waited = 0;
            std::uint64_t bytes = 0;
            double last = 0;
            const std::size_t n = std::size_t{shape.n_layers} * shape.n_experts;
            for (;;) {
              const bool open = seconds_since(t0) < window;
              if (open && tickets.size() - waited < bufs->size()) {
                const ExpertKey k{static_cast<std::uint32_t>((next % n) / shape.n_experts),
                                  static_cast<std::uint32_t>(next % shape.n_experts)};
                tickets.push_back({loader->submit({k, weight_precision, LoadPriority::on_demand,
                                                   (*bufs)[next % bufs->size()].span()}),
                                   store.blob(k, weight_precision).bytes});
                ++next;
                continue;
              }
              if (waited == tickets.size()) break;
              loader->wait(tickets[waited].first);
              const double t = seconds_since(t0);
              if (t <= window) bytes += tickets[waited].second, last = t;
              ++waited;
            }
            rate = last > 0 ? static_cast<double>(bytes) / last : 0;
          }};
}

PhaseResult run_phase(std::vector<ComputeState>& compute, const LoadSide* load, bool with_compute,
                      double window, const std::string& store_path) {
  PhaseResult r;
  const BlockReads disk0 = block_reads(store_path);
  std::atomic<bool> go{false};
  Clock::time_point t0;
  double compute_cpu[2] = {0, 0};
  std::vector<std::thread> threads;
  if (with_compute)
    for (std::size_t t = 0; t < 2; ++t)
      threads.emplace_back([&, t] {
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        ComputeState& s = compute[t];
        const double cpu0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
        std::size_t done = 0;
        double last = 0;
        for (double now = 0; now < window; now = seconds_since(t0)) {
          const auto& m = s.mats[done % s.mats.size()];
          gemv(MatrixView{m.data(), rows, cols, weight_precision, weight_scheme}, s.x, s.y);
          ++done;
          last = seconds_since(t0);
        }
        r.gemv_per_s[t] = static_cast<double>(done) / last;
        compute_cpu[t] = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - cpu0;
        r.gemv_per_cpu_s[t] = static_cast<double>(done) / compute_cpu[t];
      });
  const double process0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  t0 = Clock::now();
  go.store(true, std::memory_order_release);
  if (load != nullptr) load->run(window, t0, r.load_bytes_per_s);
  for (auto& t : threads) t.join();
  r.other_cpu_s =
      cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process0 - compute_cpu[0] - compute_cpu[1];
  const BlockReads disk1 = block_reads(store_path);
  r.block_requests = disk1.requests - disk0.requests;
  r.block_bytes = 512 * (disk1.sectors - disk0.sectors);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const Flags flags{argc, argv,
                    "[--dir /var/tmp] [--reps 5] [--window 2] [--load-cap-gbps G] [--uring-qd N "
                    "--uring-chunk-kib K]"};
  flags.check(
      {"--dir", "--reps", "--window", "--load-cap-gbps", "--uring-qd", "--uring-chunk-kib"});
  // Caps the loading rate (0: as fast as the disk goes), to compare interference at equal bytes/s.
  const double load_cap = 1e9 * std::max(0.0, std::atof(flags.get("--load-cap-gbps", "0").c_str()));
#if defined(MOEKIT_HAS_URING)
  UringSource::Config uring_config{.direct = true, .rings = 2};  // moe-run's
  uring_config.queue_depth = static_cast<unsigned>(
      std::atoi(flags.get("--uring-qd", std::to_string(uring_config.queue_depth)).c_str()));
  uring_config.chunk_bytes =
      1024u *
      static_cast<std::size_t>(std::atol(
          flags.get("--uring-chunk-kib", std::to_string(uring_config.chunk_bytes / 1024)).c_str()));
#endif
  const std::string dir = flags.get("--dir", "/var/tmp");
  const int reps = std::max(1, std::atoi(flags.get("--reps", "5").c_str()));
  const double window = std::max(0.2, std::atof(flags.get("--window", "2").c_str()));

  TempStore temp(dir, "moekit-bench-overlap.moestore", bench_shape(4));
  auto store = ExpertStore::open(temp.path());

  std::vector<ComputeState> compute(2);
  {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.f, 0.02f);
    std::vector<float> w(rows * cols);
    for (auto& v : w) v = d(rng);
    const auto enc = encode_matrix<float>(w, rows, cols, weight_precision, weight_scheme);
    for (auto& s : compute) s.mats.assign(copies_per_thread, enc);
  }
  std::printf(
      "compute: 2 threads x GEMV %s g32 %zux%zu (%.1f MiB, %zu rotating copies each), ISA %s\n",
      std::string(name(weight_precision)).c_str(), rows, cols,
      compute[0].mats[0].size() / 1048576.0, copies_per_thread,
      std::string(name(detect_isa())).c_str());
  std::printf(
      "load: q4 experts of %.1f MB, O_DIRECT, AsyncLoader 2 I/O threads, 4 loads outstanding%s; "
      "window %.1f s, %d repetitions\n",
      temp.shape().expert_bytes(weight_precision) / 1e6,
      load_cap > 0
          ? (", capped at " + std::to_string(load_cap / 1e9).substr(0, 4) + " GB/s in 4 MiB reads")
                .c_str()
          : "",
      window, reps);

  std::vector<LoadSide> sides;
#if defined(MOEKIT_HAS_URING)
  try {
    sides.push_back(
        make_load_side("io_uring", store, UringSource(temp.path(), uring_config), load_cap));
    std::printf("io_uring: QD %u x %zu KiB chunks per blob\n", uring_config.queue_depth,
                uring_config.chunk_bytes / 1024);
  } catch (const Error& e) {
    std::printf("io_uring unavailable: %s\n", e.message().c_str());
  }
#endif
  sides.push_back(
      make_load_side("pread", store, PreadSource(temp.path(), {.direct = true}), load_cap));

  // Phases of one repetition: -1 = compute alone; 2i = side i alone; 2i+1 = side i with compute.
  std::vector<int> phases{-1};
  for (int i = 0; i < static_cast<int>(sides.size()); ++i)
    phases.push_back(2 * i), phases.push_back(2 * i + 1);
  // Per source, per repetition: wall-clock ratios (together / alone) and the CPU-time view.
  std::map<std::string, std::vector<double>> compute_ratio, worst_thread_ratio, load_ratio,
      per_cpu_ratio, io_share, estimate;
  std::vector<double> compute_alone_all, alone_other_cpu;
  std::map<std::string, std::vector<double>> load_alone_all;
  std::map<std::string, BlockReads> disk;  // per source, all its phases: requests and bytes
  for (int rep = 0; rep < reps; ++rep) {
    std::map<int, PhaseResult> res;
    for (std::size_t j = 0; j < phases.size(); ++j) {
      const int ph = phases[(j + static_cast<std::size_t>(rep)) % phases.size()];
      const LoadSide* side = ph < 0 ? nullptr : &sides[static_cast<std::size_t>(ph / 2)];
      res[ph] = run_phase(compute, side, ph < 0 || ph % 2 == 1, window, temp.path());
    }
    const PhaseResult& alone = res[-1];
    const double alone_sum = alone.gemv_per_s[0] + alone.gemv_per_s[1];
    compute_alone_all.push_back(alone_sum);
    alone_other_cpu.push_back(alone.other_cpu_s);
    std::printf("rep %d: compute alone %.1f GEMV/s (%.1f + %.1f)", rep, alone_sum,
                alone.gemv_per_s[0], alone.gemv_per_s[1]);
    for (std::size_t i = 0; i < sides.size(); ++i) {
      const PhaseResult& la = res[static_cast<int>(2 * i)];
      const PhaseResult& both = res[static_cast<int>(2 * i + 1)];
      const std::string& s = sides[i].label;
      const double cr = (both.gemv_per_s[0] + both.gemv_per_s[1]) / alone_sum;
      const double wr = std::min(both.gemv_per_s[0] / alone.gemv_per_s[0],
                                 both.gemv_per_s[1] / alone.gemv_per_s[1]);
      const double lr = both.load_bytes_per_s / la.load_bytes_per_s;
      // CPU-time view, insensitive to how much CPU other processes leave us: GEMVs per second of
      // the compute thread's own CPU time (cache/memory interference), and the CPU the loading
      // burns, which on an otherwise idle 2-core machine is taken from the two compute threads.
      const double pc = std::min(both.gemv_per_cpu_s[0] / alone.gemv_per_cpu_s[0],
                                 both.gemv_per_cpu_s[1] / alone.gemv_per_cpu_s[1]);
      const double share = both.other_cpu_s / (2 * window);
      compute_ratio[s].push_back(cr), worst_thread_ratio[s].push_back(wr),
          load_ratio[s].push_back(lr);
      per_cpu_ratio[s].push_back(pc), io_share[s].push_back(share),
          estimate[s].push_back(pc * (1 - share));
      load_alone_all[s].push_back(la.load_bytes_per_s);
      disk[s].requests += la.block_requests + both.block_requests;
      disk[s].sectors += (la.block_bytes + both.block_bytes) / 512;
      std::printf(
          " | %s: load alone %.2f GB/s, together: load %.2f, compute %.2f (per CPU-s %.2f, loader "
          "CPU %.1f%%)",
          s.c_str(), la.load_bytes_per_s / 1e9, lr, cr, pc, 100 * share);
    }
    std::printf("\n");
  }

  auto range = [](const std::vector<double>& v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f..%.2f", *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()));
    return std::string(b);
  };
  std::printf(
      "\ncompute alone: %.1f GEMV/s (2 threads, median); CPU outside the compute threads when not "
      "loading: %.3f s per window\n",
      median(compute_alone_all), median(alone_other_cpu));
  std::printf("\nmeasured (wall clock), medians over repetitions [min..max]:\n");
  std::printf("%-9s %11s %22s %22s %22s\n", "source", "load alone", "load kept",
              "compute kept (2 thr)", "worst thread kept");
  bool ok = true, ok_cpu = true;
  for (const LoadSide& side : sides) {
    const auto& s = side.label;
    const double lk = median(load_ratio[s]), ck = median(compute_ratio[s]),
                 wk = median(worst_thread_ratio[s]);
    ok = ok && lk >= 0.9 && wk >= 0.9;
    ok_cpu = ok_cpu && lk >= 0.9 && median(estimate[s]) >= 0.9;
    char la[32];
    std::snprintf(la, sizeof la, "%.2f GB/s", median(load_alone_all[s]) / 1e9);
    std::printf("%-9s %11s %8.2f [%s] %8.2f [%s] %8.2f [%s]\n", s.c_str(), la, lk,
                range(load_ratio[s]).c_str(), ck, range(compute_ratio[s]).c_str(), wk,
                range(worst_thread_ratio[s]).c_str());
  }
  std::printf(
      "\nCPU-time view: worst thread's GEMVs per CPU-second kept; share of 2 cores the loading "
      "used;\n"
      "estimate of compute kept on an idle 2-core machine = per-CPU-s kept x (1 - share):\n");
  std::printf("%-9s %22s %22s %22s\n", "source", "per CPU-s kept", "loader CPU share",
              "estimate kept");
  for (const LoadSide& side : sides) {
    const auto& s = side.label;
    std::printf("%-9s %8.2f [%s] %8.3f [%s] %8.2f [%s]\n", s.c_str(), median(per_cpu_ratio[s]),
                range(per_cpu_ratio[s]).c_str(), median(io_share[s]), range(io_share[s]).c_str(),
                median(estimate[s]), range(estimate[s]).c_str());
  }
  // Work the loading causes outside this process: every block request costs an interrupt and a
  // completion on some CPU (and on virtio without indirect descriptors, kblockd restarts), so
  // fewer, larger requests per GB interfere less (io/detail/io_memory.hpp).
  std::printf(
      "\nblock device (all reads while each source loaded; other processes' reads included):\n");
  std::printf("%-9s %22s %22s\n", "source", "read requests per GB", "mean request (KiB)");
  for (const LoadSide& side : sides) {
    const BlockReads& d = disk[side.label];
    const double gb = 512 * d.sectors / 1e9;
    std::printf("%-9s %22.0f %22.0f\n", side.label.c_str(), gb > 0 ? d.requests / gb : 0.0,
                d.requests > 0 ? 512 * d.sectors / d.requests / 1024 : 0.0);
  }
  std::printf(
      "target (each side keeps >= 0.90), wall clock: %s; with the CPU-time estimate for compute: "
      "%s\n",
      ok ? "met" : "NOT met", ok_cpu ? "met" : "NOT met");
  return 0;
}
