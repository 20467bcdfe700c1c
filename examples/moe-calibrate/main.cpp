// moe-calibrate: measures this machine and writes the `this_machine` hardware JSON that
// sim/hardware.hpp reads (moe-sim --hardware this_machine --hardware-file FILE).
//
// What it measures (all on the CPU; this is the model of a CPU-only machine, where "device" is
// the CPU running the project's kernels on experts cached in RAM and "link" is the expert store's
// read path, see the schema comment in sim/hardware.hpp):
//  * streaming memory read bandwidth (all threads, buffers rotating over > 4x a large LLC) —
//    reported in `source`, for reference;
//  * disk read bandwidth with O_DIRECT on a temporary file of --disk-size bytes created in
//    --disk-dir with O_EXCL (never overwrites; deleted afterwards) → link.bandwidth_bytes_per_s;
//    the median 4 KiB O_DIRECT read → link.latency_s; with --checkpoint, the rate moe-run's own
//    loader reads that file's experts in place with as many reads in flight as it keeps (two per
//    --io-threads) → link.bandwidth_bytes_per_s, and that count → link.reads_in_flight (a store:
//    one per --io-threads); the rate of one read at a time → link.read_bandwidth_bytes_per_s;
//    with --store (an expert store of that checkpoint), the same two rates of moe-run's store
//    loader (one read per --io-threads) → link.store, the checkpoint's precision → link.in_place,
//    and both read at once by their own loaders → link.disk_bandwidth_bytes_per_s (their cap
//    together); each path's loader CPU time per byte (the process's user and system time while it
//    reads alone) beyond what the cores --threads leaves free absorb, per kernel thread →
//    link.compute_s_per_byte and link.store.compute_s_per_byte (how much a byte read while the
//    kernels run delays them);
//  * the project's fused expert FFN (precision/expert_ffn.hpp) per stored precision for one
//    expert of --hidden × --ffn, run as moe-run runs it at -t --threads: the activations
//    --activations resolves to for that precision (auto: int8 for quantized experts on AVX2 or
//    better, engine/activations.hpp) and the quantized matrices in the --expert-layout order
//    (auto: engine/expert_layout.hpp's table for this core). The batch slope (Theil-Sen slope over
//    1, 2, 4, …, 32 tokens at --slope-precision, each count timed on cold copies of the expert)
//    → flops_per_s; the call overhead = the median call of a tiny (64 × 64) f32 expert; weight
//    rate = expert bytes / (one token's time − call overhead) → weight_bytes_per_s[p], and
//    fixed_includes_first_token: a decode call costs the measured one-token time, a batch of n
//    adds n − 1 slopes. "timed" records the activations and layout of each precision, the
//    threads and the ISA.
// "cpu" gets the same numbers as "device"; layer_overhead_s = the call overhead [choice]. The
// file says host_is_device and experts_after_all_loads (moe-run's engine on a CPU-only machine).

#include <fcntl.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "moekit/core/precision.hpp"
#include "moekit/engine/activations.hpp"
#include "moekit/engine/expert_layout.hpp"
#include "moekit/engine/line_fit.hpp"
#include "moekit/engine/loader_read_rate.hpp"
#include "moekit/engine/memory_budget.hpp"
#include "moekit/error.hpp"
#include "moekit/io/aligned_buffer.hpp"
#include "moekit/io/expert_blob.hpp"
#include "moekit/io/output_file.hpp"
#include "moekit/precision/expert_ffn.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/isa.hpp"
#include "moekit/precision/panels.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "moekit/sim/hardware.hpp"
#include "moekit/tools/progress.hpp"

namespace fs = std::filesystem;
using namespace moekit;
using Clock = std::chrono::steady_clock;

namespace {

// Bytes of expert copies a timing cycles through, so every call reads cold weights (as in MoE
// decode): more than 4x the last-level cache of large server CPUs.
constexpr std::size_t rotation = 256u << 20;

[[noreturn]] void bad_flag(const std::string& flag, const std::string& why) {
  throw moekit::Error(ErrorKind::invalid_argument, flag + ": " + why);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// "1GiB", "256MiB", "1e9" → bytes.
std::size_t parse_size(const std::string& flag, const std::string& s) {
  std::string num = s, unit;
  while (!num.empty() && std::isalpha(static_cast<unsigned char>(num.back())))
    unit.insert(unit.begin(), num.back()), num.pop_back();
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 1;
  if (unit == "kib")
    scale = 1024.0;
  else if (unit == "mib")
    scale = 1048576.0;
  else if (unit == "gib")
    scale = 1073741824.0;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (!unit.empty() && unit != "b")
    bad_flag(flag, "unknown unit '" + unit + "'");
  double v = 0;
  try {
    std::size_t used = 0;
    v = std::stod(num, &used);
    if (used != num.size()) throw 0;
  } catch (...) {
    bad_flag(flag, "cannot read '" + s + "' (e.g. 1GiB, 256MiB)");
  }
  if (!(v > 0) || !std::isfinite(v)) bad_flag(flag, "must be > 0");
  return static_cast<std::size_t>(v * scale);
}

// ---- memory
// ---------------------------------------------------------------------------------------

float stream_sum(const float* p, std::size_t n) {
  float a[8] = {};
  for (std::size_t i = 0; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];  // vectorised by the compiler
  float s = 0;
  for (float x : a) s += x;
  return s;
}

/// Streaming read bandwidth (bytes/s) over `copies` buffers of `bytes` each, all threads.
double memory_bandwidth(ThreadPool& pool, std::size_t bytes, std::size_t copies, int reps) {
  const std::size_t n = bytes / sizeof(float);
  std::vector<std::vector<float>> bufs(copies, std::vector<float>(n, 1.0f));
  std::atomic<float> sink{0};
  std::vector<double> t;
  for (int r = -1; r < reps; ++r) {
    const float* p = bufs[static_cast<std::size_t>(r + 1) % copies].data();
    const auto t0 = Clock::now();
    pool.parallel_for(
        0, n, (n / pool.size() + 1023) / 1024 * 1024,
        [&](std::size_t b, std::size_t e) { sink.store(sink.load() + stream_sum(p + b, e - b)); });
    if (r >= 0) t.push_back(seconds_since(t0));  // r = -1: warm-up
  }
  return double(n * sizeof(float)) / median(t);
}

// ---- disk -------------------------------------------------------------------------------------

/// A temporary file created with O_EXCL, removed on destruction.
class TempFile {
 public:
  explicit TempFile(const fs::path& dir) {
    if (!fs::is_directory(dir)) bad_flag("--disk-dir", "'" + dir.string() + "' is not a directory");
    for (int i = 0; i < 100 && fd_ < 0; ++i) {
      path_ =
          dir / ("moe-calibrate-" + std::to_string(::getpid()) + "-" + std::to_string(i) + ".tmp");
      fd_ = ::open(path_.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);  // never an existing file
      if (fd_ < 0 && errno != EEXIST)
        throw moekit::Error(ErrorKind::io, "--disk-dir: cannot create '" + path_.string() +
                                               "': " + std::strerror(errno));
    }
    if (fd_ < 0) throw moekit::Error(ErrorKind::io, "--disk-dir: no free temporary file name");
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  [[nodiscard]] const fs::path& path() const noexcept { return path_; }

  /// Writes `size` bytes of incompressible data and syncs them to the disk.
  void fill(std::size_t size) {
    std::vector<std::uint64_t> chunk((8u << 20) / 8);
    std::mt19937_64 g(42);
    tools::Progress progress("disk: writing", size, tools::ProgressUnit::bytes, false);
    for (std::size_t done = 0; done < size; progress.update(done)) {
      for (auto& x : chunk) x = g();
      const std::size_t n = std::min(size - done, chunk.size() * 8);
      const ssize_t w = ::write(fd_, chunk.data(), n);
      if (w <= 0)
        throw moekit::Error(ErrorKind::io, "writing '" + path_.string() +
                                               "': " + std::strerror(errno) +
                                               " (disk full? lower --disk-size)");
      done += static_cast<std::size_t>(w);
    }
    if (::fsync(fd_) != 0)
      throw moekit::Error(ErrorKind::io, "fsync '" + path_.string() + "': " + std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
  }

 private:
  fs::path path_;
  int fd_ = -1;
};

struct DiskResult {
  double bandwidth = 0, latency = 0;
};

/// The read chunk of the disk measurement: --disk-size is a whole number of them.
constexpr std::size_t disk_chunk = 4u << 20;

/// Refuses a --disk-dir in memory (tmpfs, ramfs): newer kernels accept O_DIRECT there, and the
/// "disk" measured would be RAM.
void check_disk_dir(const std::string& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0)
    bad_flag("--disk-dir", "cannot use '" + dir + "': " + std::strerror(errno));
  constexpr long tmpfs_magic = 0x01021994, ramfs_magic = static_cast<long>(0x858458f6);
  if (static_cast<long>(s.f_type) == tmpfs_magic || static_cast<long>(s.f_type) == ramfs_magic)
    bad_flag("--disk-dir", "'" + dir +
                               "' is in memory (tmpfs/ramfs), not on a disk: use a directory on "
                               "the disk the expert store lives on");
}

DiskResult disk_read(const fs::path& dir, std::size_t size) {
  constexpr std::size_t align = 4096, chunk = disk_chunk;
  TempFile f(dir);
  std::printf("disk: writing %s to %s ...\n", engine::format_bytes(size).c_str(), f.path().c_str());
  std::fflush(stdout);
  f.fill(size);
  const int fd = ::open(f.path().c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0)
    throw moekit::Error(ErrorKind::unsupported,
                        "--disk-dir: O_DIRECT open of '" + f.path().string() + "' failed (" +
                            std::strerror(errno) +
                            "); tmpfs and some file systems refuse it: use a directory on the "
                            "disk the expert store lives on");
  io::AlignedBuffer buf(chunk, align);
  DiskResult r;
  const auto t0 = Clock::now();
  for (std::size_t off = 0; off < size; off += chunk) {
    const ssize_t n = ::pread(fd, buf.data(), chunk, static_cast<off_t>(off));
    if (n != static_cast<ssize_t>(chunk)) {
      ::close(fd);
      throw moekit::Error(ErrorKind::io, "O_DIRECT read of '" + f.path().string() +
                                             "' failed: " + std::strerror(errno));
    }
  }
  r.bandwidth = double(size) / seconds_since(t0);
  std::mt19937_64 g(7);
  std::vector<double> lat;
  for (int i = 0; i < 64; ++i) {
    const off_t off = static_cast<off_t>((g() % (size / align)) * align);
    const auto t1 = Clock::now();
    if (::pread(fd, buf.data(), align, off) != static_cast<ssize_t>(align)) break;
    lat.push_back(seconds_since(t1));
  }
  ::close(fd);
  r.latency = lat.empty() ? 0.0 : median(lat);
  return r;
}

// ---- kernels ----------------------------------------------------------------------------------

/// How moe-run runs an expert at one precision: the activation type and the order of the
/// quantized matrices (--activations / --expert-layout, both auto by default).
struct KernelChoice {
  bool int8 = false;
  MatrixOrder order = MatrixOrder::rows;
};

/// An expert blob (w1, w3, w2 back to back, io/expert_blob.hpp) in the order moe-run reads it.
struct Expert {
  std::vector<std::byte> blob;
  ModelShape shape;
  Precision p;
  KernelChoice kernel;
  [[nodiscard]] ExpertWeights view() const { return io::expert_view(shape, blob, p, kernel.order); }
  [[nodiscard]] std::size_t bytes() const { return blob.size(); }
};

Expert make_expert(std::size_t hidden, std::size_t ffn, Precision p, KernelChoice kernel,
                   unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  const ModelShape shape{.n_layers = 1,
                         .n_experts = 1,
                         .top_k = 1,
                         .hidden = static_cast<std::uint32_t>(hidden),
                         .ffn = static_cast<std::uint32_t>(ffn)};
  std::vector<std::byte> rows;  // io::encode_expert_blob's layout, one matrix in floats at a time
  rows.reserve(shape.expert_bytes(p));
  for (auto [r, c] : {std::pair{ffn, hidden}, std::pair{ffn, hidden}, std::pair{hidden, ffn}}) {
    std::vector<float> w(r * c);
    for (auto& v : w) v = d(g);
    const auto enc = encode_matrix<float>(w, r, c, p, shape.quant);
    rows.insert(rows.end(), enc.begin(), enc.end());
  }
  if (is_quantized(p) && in_panels(kernel.order))
    rows = io::expert_blob_in_panels(shape, p, rows, kernel.order);
  return Expert{std::move(rows), shape, p, kernel};
}

/// Seconds of CPU time the calling thread has used.
double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

/// Median seconds of one expert_ffn call over `n` tokens, rotating over copies of `e` whose
/// total exceeds `rotation` bytes (cold weights, as in MoE decode), with the activations of
/// `e.kernel` (moe-run's MoeLayer: KernelOptions::int8_activations, the pool of -t threads).
/// A one-thread pool runs the call on this thread alone: timed by its CPU clock, which other
/// processes sharing the cores do not inflate (memory stalls count, as on a quiet machine).
double time_expert(const Expert& e, std::size_t n, ThreadPool& pool, std::size_t rotation,
                   int reps) {
  const bool cpu_clock = pool.size() == 1;
  const std::size_t copies =
      std::max<std::size_t>(2, rotation / std::max<std::size_t>(1, e.bytes()));
  std::vector<Expert> cs(copies, e);
  const std::size_t hidden = e.shape.hidden;
  std::vector<float> x(n * hidden, 0.5f), out(n * hidden, 0.0f);
  KernelOptions opts{std::nullopt, &pool};
  opts.int8_activations = e.kernel.int8;
  std::vector<double> t;
  for (int r = -static_cast<int>(copies); r < reps; ++r) {
    const Expert& c = cs[static_cast<std::size_t>(r + static_cast<int>(copies)) % copies];
    const auto t0 = Clock::now();
    const double c0 = cpu_clock ? thread_cpu_seconds() : 0.0;
    expert_ffn(c.view(), x, n, out, 1.0f, opts);
    if (r >= 0) t.push_back(cpu_clock ? thread_cpu_seconds() - c0 : seconds_since(t0));
  }
  return median(t);
}

struct Options {
  std::string out = "this_machine.json", disk_dir = ".", disk_size = "1GiB", checkpoint, store;
  std::uint32_t checkpoint_experts = 32;
  std::size_t hidden = 4096, ffn = 14336;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  unsigned io_threads = 2;
  std::string activations = "auto", expert_layout = "auto", slope_precision = "q4";
  int reps = 9;
  /// Share of decode steps moe-run runs on all threads [choice, see the flag's help].
  double decode_team_fraction = 1.0;
  bool force = false;
};

void add_flags(CLI::App& app, Options& o) {
  app.add_option("--out", o.out, "hardware JSON to write (default this_machine.json)");
  app.add_flag("--force", o.force, "overwrite --out if it exists");
  app.add_option("--disk-dir", o.disk_dir,
                 "directory for the temporary O_DIRECT test file (default .; put it on the "
                 "expert store's disk)");
  app.add_option("--disk-size", o.disk_size, "size of the temporary file (default 1GiB)");
  app.add_option("--checkpoint", o.checkpoint,
                 "GGUF file or Hugging Face directory whose experts moe-run reads in place: the "
                 "link is the rate moe-run's loader reads them at (O_DIRECT, transcoded into its "
                 "layout), not the raw read of the scratch file");
  app.add_option("--checkpoint-experts", o.checkpoint_experts,
                 "experts --checkpoint reads (default 32; --store reads as many)");
  app.add_option("--store", o.store,
                 "with --checkpoint: an expert store of it (moe-run builds one under its cache "
                 "directory for the precisions the file lacks): link.store is the rate moe-run's "
                 "store loader reads it at, beside the checkpoint's own precision read in place");
  app.add_option("--hidden", o.hidden, "expert hidden size (default 4096, Mixtral-8x7B)");
  app.add_option("--ffn", o.ffn, "expert ffn size (default 14336, Mixtral-8x7B)");
  app.add_option("--threads", o.threads,
                 "kernel threads: moe-run's -t of the runs to simulate (default: all cores, as "
                 "moe-run's)");
  app.add_option("--io-threads", o.io_threads,
                 "moe-run's --io-threads (default 2): the reads its loader keeps in flight");
  app.add_option("--activations", o.activations,
                 "moe-run's --activations: auto (default), f32 or int8");
  app.add_option("--expert-layout", o.expert_layout,
                 "moe-run's --expert-layout: auto (default), rows, panels or blocked-panels");
  app.add_option("--slope-precision", o.slope_precision,
                 "precision whose batch slope (1..32 tokens) gives flops_per_s (default q4)");
  app.add_option("--reps", o.reps, "timed repetitions per measurement (median; default 9)");
  app.add_option("--decode-team-fraction", o.decode_team_fraction,
                 "share of decode steps moe-run runs on all --threads, written beside the "
                 "one-thread rates (default 1: its StepChooser times decode steps without "
                 "their load waits, and a quiet machine runs them on all threads; moe-run "
                 "--json says decode_steps_on_all_threads)")
      ->check(CLI::Range(0.0, 1.0));
}

/// The kernel moe-run runs an expert at `p` with: int8 activations as `--activations` resolves
/// for that precision (engine/activations.hpp), and the quantized matrices in the order of
/// `--expert-layout` (auto: engine/expert_layout.hpp's table for this core); float experts in
/// rows with float activations.
KernelChoice kernel_for(const Options& o, Precision p) {
  const auto mode = engine::parse_activation_mode(o.activations);
  if (!mode) bad_flag("--activations", "'" + o.activations + "' (auto, f32 or int8)");
  const Precision one[] = {p};
  KernelChoice k;
  k.int8 = engine::resolve_int8_activations(*mode, std::span<const Precision>(one),
                                            std::min(o.hidden, o.ffn));
  if (!is_quantized(p) || !panels_supported(QuantScheme{})) return k;
  if (o.expert_layout == "auto") {
    k.order = engine::auto_expert_order(detect_core(), k.int8);
  } else {
    const auto order = engine::parse_layout_word(o.expert_layout);
    if (!order)
      bad_flag("--expert-layout", "'" + o.expert_layout + "' (auto, " + engine::layout_words + ")");
    k.order = *order;
  }
  return k;
}

/// --slope-precision: one of the formats moekit quantizes into.
Precision slope_precision(const Options& o) {
  const auto p = parse_precision(o.slope_precision);
  if (!p || std::find(std::begin(all_precisions), std::end(all_precisions), *p) ==
                std::end(all_precisions))
    bad_flag("--slope-precision", "'" + o.slope_precision + "' (f32, bf16, f16, q8, q4 or q2)");
  return *p;
}

/// The per-token slope over 1..32 tokens at `p` (Fiddler's calibration, fiddler.md §2.1, fitted
/// as Theil–Sen: one count hit by a neighbour's burst does not move it, a least-squares line
/// can tip below zero), each count timed on cold copies of the expert (time_expert rotates them).
double batch_slope(const Options& o, Precision p, ThreadPool& pool, std::size_t rotation,
                   tools::Progress& progress, std::size_t& done) {
  const Expert e = make_expert(o.hidden, o.ffn, p, kernel_for(o, p), 3);
  std::vector<double> ns, ts;
  for (std::size_t n : {1, 2, 4, 8, 16, 32}) {
    progress.update(done++, std::string(name(p)) + " x " + std::to_string(n) + " tokens");
    const double t = time_expert(e, n, pool, rotation, o.reps);
    progress.clear();
    ns.push_back(double(n)), ts.push_back(t);
    std::printf("  %s x %2zu tokens: %9.3f ms\n", std::string(name(p)).c_str(), n, t * 1e3);
  }
  const double per_token = engine::theil_sen_slope(ns, ts);
  if (!(per_token > 0))
    throw moekit::Error(ErrorKind::internal,
                        "the expert calls did not get slower with more tokens (Theil-Sen slope "
                        "over 1..32 tokens <= 0); rerun with more --reps on a quieter machine");
  return per_token;
}

void one_token_rates(const Options& o, ThreadPool& pool, double overhead, sim::ProcessorModel& p,
                     sim::TimedKernels* timed, tools::Progress& progress, std::size_t& done);

/// The CPU's expert kernels, each precision timed as moe-run runs it (kernel_for): the batch
/// slope at --slope-precision → flops_per_s; per precision, the weight rate from one token's time
/// less the call overhead. A one-token call (decode: a GEMV) and the slope of a batch (prefill:
/// the GEMM) are different kernels, so the file says fixed_includes_first_token: the model's
/// decode call costs the measured time, a batch of n adds n − 1 slopes. `timed` records what ran.
sim::ProcessorModel measure_kernels(const Options& o, ThreadPool& pool, double overhead,
                                    sim::TimedKernels& timed) {
  const Precision slope_p = slope_precision(o);
  sim::ProcessorModel cpu;
  cpu.call_overhead_s = overhead;
  // Results on stdout; progress on stderr (a terminal only), erased before each result.
  tools::Progress progress("kernels", std::size(all_precisions) + 6, tools::ProgressUnit::items,
                           false);
  std::size_t done = 0;
  const double per_token = batch_slope(o, slope_p, pool, rotation, progress, done);
  cpu.flops_per_s = 6.0 * double(o.hidden) * double(o.ffn) / per_token;
  std::printf(
      "  batch slope (Theil-Sen, 1..32 tokens, %s): %.3f ms per extra token → %.1f "
      "GFLOP/s\n",
      o.slope_precision.c_str(), per_token * 1e3, cpu.flops_per_s / 1e9);
  timed.threads = o.threads;
  timed.isa = std::string(name(detect_isa()));
  one_token_rates(o, pool, overhead, cpu, &timed, progress, done);
  return cpu;
}

/// Per precision, the weight rate of a one-token call on `pool` (the time less the call
/// overhead) into `p.weight_bytes_per_s`; `timed` (when set) records the kernels run.
void one_token_rates(const Options& o, ThreadPool& pool, double overhead, sim::ProcessorModel& p,
                     sim::TimedKernels* timed, tools::Progress& progress, std::size_t& done) {
  for (Precision q : all_precisions) {
    if (q == Precision::skip) continue;
    progress.update(done++, std::string(name(q)));
    const KernelChoice kc = kernel_for(o, q);
    const Expert e = make_expert(o.hidden, o.ffn, q, kc, 2);
    const double t = time_expert(e, 1, pool, rotation, o.reps);
    const double rate = double(e.bytes()) / std::max(t - overhead, t * 1e-3);
    progress.clear();
    const auto i = static_cast<std::size_t>(q);
    p.weight_bytes_per_s[i] = rate;
    const std::string acts = kc.int8 ? "int8" : "f32";
    const std::string layout = is_quantized(q) ? engine::layout_word(kc.order) : "rows";
    if (timed) timed->activations[i] = acts, timed->layout[i] = layout;
    std::printf("  %-5s %8.1f MiB  %9.3f ms  %7.2f GB/s  (%s activations, %s, %u threads)\n",
                std::string(name(q)).c_str(), double(e.bytes()) / 1048576.0, t * 1e3, rate / 1e9,
                acts.c_str(), layout.c_str(), pool.size());
    std::fflush(stdout);
  }
}

/// The device on a one-thread pool: moe-run's decode steps its StepChooser runs on the caller
/// alone. The per-token rate is the all-thread one's (a one-token decode call pays none of it).
sim::ProcessorModel measure_solo(const Options& o, double overhead,
                                 const sim::ProcessorModel& team) {
  ThreadPool one(1);
  sim::ProcessorModel solo = team;
  tools::Progress progress("kernels, one thread", std::size(all_precisions),
                           tools::ProgressUnit::items, false);
  std::size_t done = 0;
  one_token_rates(o, one, overhead, solo, nullptr, progress, done);
  return solo;
}

/// Reads moe-run's loader keeps in flight: its checkpoint reader runs two threads per
/// --io-threads (ExpertLoader::checkpoint, engine/expert_source.hpp), its store reader one.
std::uint32_t reads_in_flight(const Options& o) {
  return o.checkpoint.empty() ? o.io_threads : 2 * o.io_threads;
}

/// Checks the flags before any measurement (the output path included: the directory exists and
/// is writable, the target is not a directory or device, and an existing file is replaced only
/// with --force, written atomically at the end); returns the disk measurement's size.
std::size_t check_flags(const Options& o) {
  if (o.hidden == 0 || o.ffn == 0) bad_flag("--hidden/--ffn", "must be > 0");
  if (o.hidden % 32 || o.ffn % 32)
    bad_flag("--hidden/--ffn", "must be multiples of 32 (q4/q2 groups)");
  if (o.threads == 0 || o.threads > 1024) bad_flag("--threads", "must be in [1, 1024]");
  if (o.reps < 1) bad_flag("--reps", "must be >= 1");
  if (o.io_threads == 0 || o.io_threads > 256) bad_flag("--io-threads", "must be in [1, 256]");
  if (!o.store.empty() && o.checkpoint.empty())
    bad_flag("--store", "needs --checkpoint (the store is the second read path beside it)");
  if (!o.store.empty() && !fs::is_regular_file(o.store))
    bad_flag("--store", "'" + o.store + "' is not a file");
  (void)kernel_for(o, Precision::q4);  // --activations and --expert-layout, before measuring
  (void)slope_precision(o);
  const std::size_t asked = parse_size("--disk-size", o.disk_size);
  if (asked < disk_chunk)
    bad_flag("--disk-size",
             "'" + o.disk_size + "' is below the 4MiB read chunk of the measurement");
  check_disk_dir(o.disk_dir);
  moekit::io::check_output_path(o.out, o.force, "--out");
  return asked / disk_chunk * disk_chunk;  // whole chunks: what is measured
}

/// How much each byte a path reads delays the kernels (link.compute_s_per_byte): its loader's
/// CPU time per byte, beyond what the cores that --threads leaves free absorb.
double compute_delay(const engine::LoaderReadRate& r, const Options& o) {
  return engine::compute_delay_per_byte(r, o.threads,
                                        std::max(1u, std::thread::hardware_concurrency()));
}
std::string loader_cpu_text(const engine::LoaderReadRate& r, const Options& o) {
  char t[256];
  std::snprintf(t, sizeof t,
                "the loader's CPU %.3f s per GB read (%.2f cores at that rate), so a GB read "
                "while the kernels run on %u threads delays them %.3f s",
                r.cpu_s_per_byte * 1e9, r.cpu_s_per_byte * r.bytes_per_s, o.threads,
                compute_delay(r, o) * 1e9);
  return t;
}

/// The expert store's read path (--store): moe-run's store loader with its reads in flight (one
/// per --io-threads) and one at a time.
sim::ReadPath measure_store(const Options& o, const DiskResult& disk) {
  const engine::StoreIo io{.io_threads = o.io_threads};
  const auto all = engine::store_read_rate(o.store, o.checkpoint_experts, io, o.io_threads);
  const auto one = engine::store_read_rate(o.store, o.checkpoint_experts, io, 1);
  std::printf(
      "store: %u experts at %s read by moe-run's store loader (%s, checksums verified): %.2f GB/s "
      "with %u reads in flight (%.2f of the raw read), %.2f GB/s one read at a time; %s\n",
      all.experts, std::string(name(all.precision)).c_str(), all.reader.c_str(),
      all.bytes_per_s / 1e9, o.io_threads, all.bytes_per_s / disk.bandwidth, one.bytes_per_s / 1e9,
      loader_cpu_text(all, o).c_str());
  return {.bandwidth_bytes_per_s = all.bytes_per_s,
          .latency_s = disk.latency,
          .reads_in_flight = o.io_threads,
          .read_bandwidth_bytes_per_s = std::min(one.bytes_per_s, all.bytes_per_s),
          .compute_s_per_byte = compute_delay(all, o)};
}

/// Both read paths at once (--store): the checkpoint's experts read in place while the store's
/// are read, each by its own loader as in moe-run: the disk's rate under both
/// (link.disk_bandwidth_bytes_per_s), which each path alone overstates when they share the disk.
double measure_both_paths(const Options& o, const DiskResult& disk) {
  const engine::StoreIo io{.io_threads = o.io_threads};
  const auto both = engine::read_both_paths(o.checkpoint, o.store, o.checkpoint_experts, io,
                                            reads_in_flight(o), o.io_threads);
  std::printf(
      "both paths at once: %.2f GB/s in place (%u experts) + %.2f GB/s from the store (%u "
      "experts) = %.2f GB/s (%.2f of the raw read)\n",
      both.in_place.bytes_per_s / 1e9, both.in_place.experts, both.store.bytes_per_s / 1e9,
      both.store.experts, both.bytes_per_s / 1e9, both.bytes_per_s / disk.bandwidth);
  return both.bytes_per_s;
}

/// The hardware file's "source": what each part was measured on.
std::string source_text(const Options& o, const std::optional<engine::LoaderReadRate>& in_place,
                        std::size_t dsize, double mem, bool solo) {
  char link[512];
  if (in_place)
    std::snprintf(link, sizeof link, "moe-run's loader reading %u experts of '%s' in place",
                  in_place->experts, o.checkpoint.c_str());
  else
    std::snprintf(link, sizeof link, "O_DIRECT read of a %s file in '%s'",
                  engine::format_bytes(dsize).c_str(), o.disk_dir.c_str());
  char src[1024];
  std::snprintf(src, sizeof src,
                "moe-calibrate: link = %s [measured]; "
                "%u reads in flight (moe-run's loader at --io-threads %u); "
                "device = cpu = moekit's CPU expert_ffn as moe-run runs it (activations %s, "
                "layout %s: see \"timed\"), %u threads, ISA %s, expert %zux%zu "
                "[measured]; memory streaming read %.2f GB/s [measured, reference]; "
                "layer_overhead_s = call overhead [choice]",
                link, reads_in_flight(o), o.io_threads, o.activations.c_str(),
                o.expert_layout.c_str(), o.threads, std::string(name(detect_isa())).c_str(),
                o.hidden, o.ffn, mem / 1e9);
  std::string text = src;
  if (!o.store.empty())
    text += "; link.store = moe-run's store loader reading '" + o.store + "' (" +
            std::to_string(o.io_threads) +
            " reads in flight) [measured]; link.disk_bandwidth_bytes_per_s = both paths read at "
            "once by their own loaders, the cap on the two together [measured]";
  if (solo)
    text +=
        "; solo = the same kernels on one thread, timed by its CPU clock [measured]; "
        "decode_team_fraction " +
        std::to_string(o.decode_team_fraction) + " [choice: --decode-team-fraction]";
  return text;
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{
      "moe-calibrate: measure this machine and write the `this_machine` hardware JSON "
      "for moe-sim --hardware this_machine --hardware-file FILE"};
  add_flags(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::size_t dsize = check_flags(o);
  ThreadPool pool(o.threads);
  const double mem = memory_bandwidth(pool, 64u << 20, 4, o.reps);
  std::printf("memory: streaming read %.2f GB/s (%u threads)\n", mem / 1e9, o.threads);

  const DiskResult disk = disk_read(o.disk_dir, dsize);
  std::printf("disk: O_DIRECT sequential read %.2f GB/s, 4 KiB read latency %.1f us\n",
              disk.bandwidth / 1e9, disk.latency * 1e6);

  std::optional<engine::LoaderReadRate> in_place, one_read;
  if (!o.checkpoint.empty()) {
    if (!fs::exists(o.checkpoint))
      bad_flag("--checkpoint", "'" + o.checkpoint + "' does not exist");
    const engine::StoreIo io{.io_threads = o.io_threads};
    in_place = engine::loader_read_rate(o.checkpoint, o.checkpoint_experts, io, reads_in_flight(o));
    one_read = engine::loader_read_rate(o.checkpoint, o.checkpoint_experts, io, 1);
    std::printf(
        "checkpoint: %u experts at %s read in place by moe-run's loader (%s): %.2f GB/s with %u "
        "reads in flight (%.2f of the raw read), %.2f GB/s one read at a time; %s\n",
        in_place->experts, std::string(name(in_place->precision)).c_str(), in_place->reader.c_str(),
        in_place->bytes_per_s / 1e9, reads_in_flight(o), in_place->bytes_per_s / disk.bandwidth,
        one_read->bytes_per_s / 1e9, loader_cpu_text(*in_place, o).c_str());
  }

  const double overhead = time_expert(make_expert(64, 64, Precision::f32, KernelChoice{}, 1), 1,
                                      pool, 0, std::max(o.reps, 31));
  std::printf("kernels (ISA %s): call overhead %.1f us; expert %zux%zu:\n",
              std::string(name(detect_isa())).c_str(), overhead * 1e6, o.hidden, o.ffn);
  sim::TimedKernels timed;
  const sim::ProcessorModel cpu = measure_kernels(o, pool, overhead, timed);
  std::optional<sim::ProcessorModel> solo;
  if (o.threads > 1) {
    std::printf("kernels on one thread (decode steps moe-run runs on the caller alone):\n");
    solo = measure_solo(o, overhead, cpu);
  }

  sim::HardwareModel h;
  h.name = "this_machine";
  h.source = source_text(o, in_place, dsize, mem, solo.has_value());
  h.link = {.bandwidth_bytes_per_s = in_place ? in_place->bytes_per_s : disk.bandwidth,
            .latency_s = disk.latency,
            .reads_in_flight = reads_in_flight(o),
            .read_bandwidth_bytes_per_s =
                one_read ? std::min(one_read->bytes_per_s, in_place->bytes_per_s) : 0.0,
            .compute_s_per_byte = in_place ? compute_delay(*in_place, o) : 0.0};
  if (!o.store.empty()) {
    h.link.store = measure_store(o, disk);
    h.link.in_place = in_place->precision;
    h.link.disk_bandwidth_bytes_per_s = measure_both_paths(o, disk);
  }
  h.device = h.cpu = cpu;
  h.layer_overhead_s = overhead;
  h.host_holds_experts = false;         // CPU-only: the expert cache is this host's memory
  h.host_is_device = true;              // ... and the host CPU runs every expert, one after another
  h.experts_after_all_loads = true;     // moe-run's MoeLayer resolves the whole plan first
  h.fixed_includes_first_token = true;  // the rates are one-token calls (measure_kernels)
  h.timed = timed;
  h.solo = solo;
  if (solo) h.decode_team_fraction = o.decode_team_fraction;
  sim::write_hardware_json(h, o.out, o.force);
  std::printf("wrote %s (use: moe-sim --hardware this_machine --hardware-file %s)\n", o.out.c_str(),
              o.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const moekit::Error& e) {
    std::fprintf(stderr, "moe-calibrate: %s\n", e.message().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-calibrate: %s\n", e.what());
    return 2;
  }
}
