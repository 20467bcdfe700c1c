#pragma once
/// \file Where moe-run's routed experts come from: host memory (`HostExperts`) or an expert store
/// (io/expert_store.hpp) read with O_DIRECT through `io::AsyncLoader` — io_uring when the build
/// has liburing and the kernel allows a ring, pread otherwise — straight into the pipeline's
/// 4 KiB-aligned slots. `ExpertLoader` is the one Loader type every preset is instantiated with,
/// so the preset table is compiled once for both paths. Also builds stores from checkpoints
/// (shared by `moe-convert` and the default model's store made at first use).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <variant>
#include <vector>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/aligned_buffer.hpp"
#include "moekit/io/async_loader.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/checkpoint_experts.hpp"
#include "moekit/io/expert_blob.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/io/host_read_ring.hpp"
#include "moekit/io/memory_loader.hpp"
#include "moekit/io/safetensors.hpp"
#include "moekit/io/tensor_names.hpp"
#include "moekit/tools/progress.hpp"
#if defined(MOEKIT_HAS_URING)
#include "moekit/io/uring_source.hpp"
#endif

#include "moekit/engine/config.hpp"
#include "moekit/engine/expert_layout.hpp"
#include "moekit/engine/gguf_model.hpp"
#include "moekit/engine/memory_budget.hpp"
#include "moekit/engine/weights.hpp"

namespace moekit::engine {

/// How the store is read.
struct StoreIo {
  bool direct = true;            ///< O_DIRECT (page cache bypassed)
  bool uring = true;             ///< io_uring when available; pread otherwise
  unsigned io_threads = 2;       ///< AsyncLoader threads
  bool verify_checksums = true;  ///< XXH64 of every loaded blob (moe-run --no-verify: off)
};

/// An O_DIRECT (or buffered) byte source over the store file: io_uring or pread(2).
class DirectSource {
 public:
  DirectSource(const std::string& path, const StoreIo& io) {
#if defined(MOEKIT_HAS_URING)
    if (io.uring) {
      try {
        src_.emplace<moekit::io::UringSource>(
            path, moekit::io::UringSource::Config{.direct = io.direct, .rings = io.io_threads});
        return;
      } catch (const moekit::Error& e) {
        if (e.kind() != moekit::ErrorKind::unsupported) throw;  // only "no io_uring" falls back
      }
    }
#endif
    src_.emplace<moekit::io::PreadSource>(path,
                                          moekit::io::PreadSource::Config{.direct = io.direct});
  }
  void read(moekit::io::BlobRange r, std::span<std::byte> dest) const {
    std::visit(
        [&](const auto& s) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(s)>, std::monostate>) s.read(r, dest);
        },
        src_);
  }
  [[nodiscard]] const std::string& name() const {
    return std::visit(
        [](const auto& s) -> const std::string& {
          if constexpr (std::is_same_v<std::decay_t<decltype(s)>, std::monostate>) {
            static const std::string none = "(none)";
            return none;
          } else {
            return s.name();
          }
        },
        src_);
  }
  /// "io_uring" or "pread".
  [[nodiscard]] const char* kind() const noexcept {
#if defined(MOEKIT_HAS_URING)
    if (std::holds_alternative<moekit::io::UringSource>(src_)) return "io_uring";
#endif
    return "pread";
  }

 private:
#if defined(MOEKIT_HAS_URING)
  std::variant<std::monostate, moekit::io::PreadSource, moekit::io::UringSource> src_;
#else
  std::variant<std::monostate, moekit::io::PreadSource> src_;
#endif
};
static_assert(moekit::io::ByteSource<DirectSource>);

/// The Loader every moe-run pipeline uses: a synchronous copy from host memory, or asynchronous
/// reads from the checkpoint itself (in place, io/checkpoint_experts.hpp) and/or from an expert
/// store holding the precisions the checkpoint lacks. `host_bytes` (Fiddler's CPU execution)
/// points into the HostExperts blobs, or, when the experts are not in host memory, into a
/// HostReadRing the expert is read into through this loader (outside the cache; counted in
/// `host_read_bytes`). Its `matrix_order` says, per precision, where the rows of the blobs it
/// delivers are (the pipeline's WeightView carries it to the kernels).
class ExpertLoader {
 public:
  static constexpr moekit::Hooks hooks =
      moekit::Hook::host_bytes | moekit::Hook::prepare_host_bytes | moekit::Hook::matrix_order;
  using StoreReader = moekit::io::AsyncLoader<DirectSource>;
  using CheckpointSource = moekit::io::CheckpointExpertSource<DirectSource>;
  using CheckpointReader = moekit::io::AsyncLoader<CheckpointSource>;

  static ExpertLoader host(const HostExperts& experts) {
    ExpertLoader l;
    l.host_ = &experts;
    l.memory_ = std::make_unique<moekit::MemoryLoader>(
        [&experts](moekit::ExpertKey k, moekit::Precision p) { return experts.bytes(k, p); });
    return l;
  }
  static ExpertLoader store(std::shared_ptr<const moekit::io::ExpertStore> store,
                            const StoreIo& io) {
    ExpertLoader l;
    l.attach_store(std::move(store), io);
    return l;
  }
  /// Experts at the checkpoint's precision read in place; other precisions from `extras` (may be
  /// null when the run needs none).
  static ExpertLoader checkpoint(std::shared_ptr<const moekit::io::CheckpointExperts> experts,
                                 moekit::MatrixOrder order, const StoreIo& io,
                                 std::shared_ptr<const moekit::io::ExpertStore> extras) {
    ExpertLoader l;
    std::vector<DirectSource> files;
    for (const std::string& f : experts->files()) files.push_back(open_direct(f, io));
    l.kind_ = files.front().kind();
    l.shape_ = experts->shape();
    l.file_precision_ = experts->precision();
    l.file_order_ = order;
    auto src = std::make_shared<CheckpointSource>(experts, std::move(files),
                                                  typename CheckpointSource::Config{order});
    typename CheckpointReader::Config c{};
    // Each thread reads a chunk, then transcodes it: twice the threads keep as many reads in
    // flight as the store's loader does (bench/RESULTS.md, "Models larger than memory").
    c.io_threads = 2 * io.io_threads;
    c.verify_checksums = false;  // a checkpoint records no checksums of its tensors
    l.file_reader_ = std::make_unique<CheckpointReader>(
        *src, [src](moekit::ExpertKey k, moekit::Precision p) { return src->blob(k, p); }, c);
    if (extras) l.attach_store(std::move(extras), io);
    return l;
  }

  moekit::LoadTicket submit(const moekit::LoadRequest& r) {
    if (memory_) return memory_->submit(r);
    if (file_reader_ && r.precision == file_precision_) return file_reader_->submit(r);
    if (!reader_)
      throw moekit::Error(moekit::ErrorKind::unsupported,
                          "experts are read in place at " +
                              std::string(moekit::name(file_precision_)) + " and no store holds " +
                              std::string(moekit::name(r.precision)));
    const moekit::LoadTicket t = reader_->submit(r);
    return file_reader_ ? moekit::LoadTicket{t.id | store_tag} : t;
  }
  bool poll(moekit::LoadTicket t) {
    if (memory_) return memory_->poll(t);
    return is_file(t) ? file_reader_->poll(t) : reader_->poll(untag(t));
  }
  void wait(moekit::LoadTicket t) {
    if (memory_)
      memory_->wait(t);
    else if (is_file(t))
      file_reader_->wait(t);
    else
      reader_->wait(untag(t));
  }
  bool cancel(moekit::LoadTicket t) {
    if (memory_) return memory_->cancel(t);
    return is_file(t) ? file_reader_->cancel(t) : reader_->cancel(untag(t));
  }

  /// An expert about to run on the CPU: when the experts are not in host memory, its read starts.
  void prepare_host_bytes(moekit::ExpertKey k, moekit::Precision p) {
    if (!host_) ring().prepare(*this, k, p);
  }
  /// The expert's bytes in host memory, for experts run on the CPU without entering the cache.
  [[nodiscard]] std::span<const std::byte> host_bytes(moekit::ExpertKey k, moekit::Precision p) {
    if (host_) return host_->bytes(k, p);
    return ring().bytes(*this, k, p);
  }
  /// Where the rows of the quantized blobs this loader delivers at `p` are: the host experts',
  /// the checkpoint reader's, or the store's matrix_order (f32/bf16/f16: always rows). The
  /// bytes of `host_bytes` come from the same place, so they are in the same order.
  [[nodiscard]] moekit::MatrixOrder matrix_order(moekit::Precision p) const noexcept {
    if (!moekit::is_quantized(p)) return moekit::MatrixOrder::rows;
    if (host_) return host_->order();
    if (file_reader_ && p == file_precision_) return file_order_;
    return store_ ? store_->manifest().order_of(p) : moekit::MatrixOrder::rows;
  }
  /// Bytes read for `host_bytes` (0 when the experts are in host memory).
  [[nodiscard]] std::uint64_t host_read_bytes() const noexcept {
    return ring_ ? ring_->read_bytes() : 0;
  }

  /// "memory", "io_uring" or "pread".
  [[nodiscard]] const char* kind() const noexcept { return kind_; }

 private:
  /// Set on tickets of the store reader when a checkpoint reader is present too (AsyncLoader
  /// tickets keep bit 31 clear: slot indices stay below 2^31).
  static constexpr std::uint64_t store_tag = std::uint64_t{1} << 31;

  ExpertLoader() = default;
  moekit::io::HostReadRing& ring() {
    if (!ring_)
      ring_ = std::make_unique<moekit::io::HostReadRing>(
          shape_.n_experts, [s = shape_](moekit::Precision p) { return s.expert_bytes(p); });
    return *ring_;
  }
  [[nodiscard]] bool is_file(moekit::LoadTicket t) const noexcept {
    return file_reader_ && (!reader_ || (t.id & store_tag) == 0);
  }
  [[nodiscard]] moekit::LoadTicket untag(moekit::LoadTicket t) const noexcept {
    return {t.id & ~store_tag};
  }

  static DirectSource open_direct(const std::string& path, const StoreIo& io) {
    try {
      return DirectSource(path, io);
    } catch (const moekit::Error& e) {
      if (!io.direct) throw;
      throw moekit::Error(e.kind(), e.message() +
                                        " (opened with O_DIRECT; a filesystem without "
                                        "it, such as tmpfs, needs --no-direct)");
    }
  }
  void attach_store(std::shared_ptr<const moekit::io::ExpertStore> store, const StoreIo& io) {
    DirectSource src = open_direct(store->path(), io);
    if (!file_reader_) kind_ = src.kind();
    store_ = store;
    if (!file_reader_) shape_ = store->shape();
    typename StoreReader::Config c{};
    c.io_threads = io.io_threads;
    c.verify_checksums = io.verify_checksums;
    reader_ = std::make_unique<StoreReader>(
        std::move(src),
        [store](moekit::ExpertKey k, moekit::Precision p) { return store->blob(k, p); }, c);
  }

  // Declared first, destroyed last: the readers below finish their reads into it first.
  std::unique_ptr<moekit::io::HostReadRing> ring_;
  moekit::ModelShape shape_{};
  const HostExperts* host_ = nullptr;
  std::unique_ptr<moekit::MemoryLoader> memory_;
  std::shared_ptr<const moekit::io::ExpertStore> store_;
  std::unique_ptr<StoreReader> reader_;
  std::unique_ptr<CheckpointReader> file_reader_;
  moekit::Precision file_precision_ = moekit::Precision::f32;
  moekit::MatrixOrder file_order_ = moekit::MatrixOrder::rows;
  const char* kind_ = "memory";
};
static_assert(moekit::Loader<ExpertLoader>);

/// What the experts of a run are backed by; makes as many loaders as the run needs (the
/// calibration pass and the pipeline each get their own).
struct ExpertBacking {
  const HostExperts* host = nullptr;                     ///< in-memory path
  std::shared_ptr<const moekit::io::ExpertStore> store;  ///< store path, or the extra precisions
  StoreIo io{};
  /// In place: the checkpoint's experts at their own precision, `checkpoint_order` their rows.
  std::shared_ptr<const moekit::io::CheckpointExperts> checkpoint = nullptr;
  moekit::MatrixOrder checkpoint_order = moekit::MatrixOrder::rows;

  [[nodiscard]] ExpertLoader make_loader() const {
    if (host) return ExpertLoader::host(*host);
    if (checkpoint) return ExpertLoader::checkpoint(checkpoint, checkpoint_order, io, store);
    return ExpertLoader::store(store, io);
  }
  [[nodiscard]] std::vector<moekit::Precision> precisions() const {
    if (host) return host->precisions();
    std::vector<moekit::Precision> out;
    if (checkpoint) out.push_back(checkpoint->precision());
    if (store)
      for (moekit::Precision p : store->manifest().precisions) out.push_back(p);
    return out;
  }
  /// Where the rows of the quantized blobs are: the host experts', the checkpoint reader's, or
  /// the store's matrix_order (a store of extra precisions is built in the checkpoint's order).
  [[nodiscard]] moekit::MatrixOrder order() const noexcept {
    if (host) return host->order();
    if (checkpoint) return checkpoint_order;
    return store ? store->manifest().order : moekit::MatrixOrder::rows;
  }
  [[nodiscard]] bool holds(moekit::Precision p) const {
    for (moekit::Precision q : precisions())
      if (q == p) return true;
    return false;
  }
  /// One expert's bytes in host memory (read from the store or the checkpoint; measurements).
  [[nodiscard]] std::vector<std::byte> read_expert(moekit::ExpertKey k, moekit::Precision p) const {
    if (host) {
      const auto b = host->bytes(k, p);
      return {b.begin(), b.end()};
    }
    if (checkpoint && p == checkpoint->precision()) {
      moekit::io::AlignedBuffer out(checkpoint->shape().expert_bytes(p));
      ExpertLoader l = make_loader();
      l.wait(l.submit({k, p, moekit::LoadPriority::on_demand, out.span()}));
      const auto b = out.span().first(checkpoint->shape().expert_bytes(p));
      return {b.begin(), b.end()};
    }
    const moekit::io::StoreBlob& b = store->blob(k, p);
    std::vector<std::byte> out(b.bytes);
    moekit::io::PreadSource(store->path()).read({b.offset, b.bytes}, out);
    return out;
  }
};

/// The routed experts of the checkpoint `cfg` was read from — GGUF file `gguf`, else the Hugging
/// Face directory `hf_dir` — where they lie (io/checkpoint_experts.hpp), or null when their type
/// has no exact in-place path (types mixed other than K-quants among themselves: converted once
/// into a store instead).
inline std::shared_ptr<const moekit::io::CheckpointExperts> locate_checkpoint_experts(
    const ModelConfig& cfg, const std::filesystem::path& hf_dir, const moekit::io::GgufFile* gguf) {
  namespace io = moekit::io;
  const moekit::ModelShape shape = cfg.shape();
  try {
    if (gguf) {  // GGUF numbers the MoE layers as its blocks
      std::vector<std::uint32_t> layers(shape.n_layers);
      for (std::uint32_t l = 0; l < shape.n_layers; ++l) layers[l] = l;
      return std::make_shared<const io::CheckpointExperts>(io::CheckpointExperts::locate(
          *gguf, io_architecture(cfg.arch), io::TensorFormat::gguf, shape, layers));
    }
    return std::make_shared<const io::CheckpointExperts>(io::CheckpointExperts::locate(
        io::SafetensorsModel::open(hf_dir), io_architecture(cfg.arch),
        io::TensorFormat::hugging_face, shape, moe_decoder_layers(cfg)));
  } catch (const moekit::Error& e) {
    if (e.kind() != moekit::ErrorKind::unsupported) throw;
    return nullptr;
  }
}

/// True when `p` starts with the expert store's magic (io/expert_store.hpp).
inline bool is_expert_store(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  return in.gcount() == 8 && std::equal(magic, magic + 8, moekit::io::store_magic);
}

// ---- building stores from checkpoints ---------------------------------------------------------

/// A fingerprint of a checkpoint directory's weight files (names, sizes, modification times),
/// recorded in a store's meta so a store built from an older checkpoint is noticed.
inline std::string checkpoint_fingerprint(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> parts;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto n = e.path().filename().string();
    if (!e.is_regular_file() || (e.path().extension() != ".safetensors" && n != "config.json"))
      continue;
    const auto t =
        std::chrono::duration_cast<std::chrono::nanoseconds>(e.last_write_time().time_since_epoch())
            .count();
    parts.push_back(n + ":" + std::to_string(e.file_size()) + ":" + std::to_string(t));
  }
  std::sort(parts.begin(), parts.end());
  std::string s;
  for (const auto& p : parts) s += p + ";";
  return s;
}

/// Writes the expert store of the Hugging Face checkpoint `dir` (config `cfg`) at `precisions`
/// to `out`; the manifest's meta records the checkpoint (`checkpoint_dir`, absolute, and its
/// fingerprint) so `moe-run -m <store>` finds the dense part. Options as write_expert_store's.
inline moekit::io::ExpertStoreWriteReport build_store_from_checkpoint(
    const ModelConfig& cfg, const std::filesystem::path& dir,
    std::span<const moekit::Precision> precisions, const std::filesystem::path& out,
    moekit::io::ExpertStoreWriteOptions options) {
  const auto model = moekit::io::SafetensorsModel::open(dir);
  check_tensor_census(cfg, model.names(), dir.string());
  const moekit::ModelShape shape = cfg.shape();
  const auto layers = moe_decoder_layers(cfg);
  const auto arch = io_architecture(cfg.arch);
  // The writer asks precision-major, so each expert is read (and dequantized) once per precision:
  // cheap next to quantizing, and memory stays at one expert.
  auto encode = [&](moekit::ExpertKey k, moekit::Precision p) {
    const ExpertF32 e = read_expert_f32(model, arch, moekit::io::TensorFormat::hugging_face,
                                        layers.at(k.layer), k.expert, shape);
    return moekit::io::encode_expert_blob(shape, e.w1, e.w3, e.w2, p);
  };
  options.meta["checkpoint_dir"] = std::filesystem::absolute(dir).lexically_normal().string();
  options.meta["checkpoint_fingerprint"] = checkpoint_fingerprint(dir);
  options.meta["tool"] = "moe-run/moe-convert";
  options.meta["blob_layout"] =
      "[w1 gate][w3 up][w2 down], precision/ formats, rows as matrix_order says";
  return moekit::io::write_expert_store(out.string(), shape, precisions, encode, options);
}

/// A store found in, or built into, a cache directory.
struct CachedStore {
  std::shared_ptr<const moekit::io::ExpertStore> store;
  bool built = false;  ///< built (or rebuilt) by this call
};

/// Bytes of a store of `shape` at `precisions` (header page and 4 KiB-padded blobs; the
/// manifest, a few bytes per blob, is left out).
inline std::uint64_t store_file_bytes(const moekit::ModelShape& shape,
                                      std::span<const moekit::Precision> precisions) {
  constexpr std::uint64_t a = moekit::io::store_alignment;
  std::uint64_t n = a;
  for (moekit::Precision p : precisions)
    n += shape.expert_count() * ((shape.expert_bytes(p) + a - 1) / a * a);
  return n;
}

/// Refuses, before writing, a store the disk holding `out` has no room for, naming the flags
/// that avoid it.
inline void check_disk_space(const std::filesystem::path& out, std::uint64_t bytes) {
  std::error_code ec;
  const auto space = std::filesystem::space(out.parent_path(), ec);
  if (ec || space.available >= bytes) return;
  throw moekit::Error(moekit::ErrorKind::io,
                      "the expert store " + out.string() + " needs " + format_bytes(bytes) +
                          ", and the disk holding " + out.parent_path().string() + " has " +
                          format_bytes(space.available) +
                          " free (run at the checkpoint's own "
                          "type, --precision auto, with a preset that needs no other precision, or "
                          "give --store FILE on a disk with room)");
}

/// On a terminal: the bytes of the store written so far (its blobs are of one size per
/// precision: the share of blobs done), their rate and the time left, on one line.
inline std::function<void(std::size_t, std::size_t)> store_progress(std::uint64_t bytes) {
  auto bar = std::make_shared<moekit::tools::Progress>("  store", bytes,
                                                       moekit::tools::ProgressUnit::bytes, false);
  return [bar, bytes](std::size_t done, std::size_t total) {
    const double share = total ? double(done) / double(total) : 1.0;
    bar->update(static_cast<std::uint64_t>(share * double(bytes)),
                std::to_string(done) + "/" + std::to_string(total) + " experts");
    if (done == total) bar->finish();
  };
}

/// Experts a store build encodes at once: one per core, at most 4, as each holds its expert in
/// f32 while it is encoded (a Mixtral-8x7B expert: 704 MB). The checkpoint readers behind the
/// engine's encoders only read mapped files, so they are safe to call concurrently.
inline unsigned store_encode_threads() {
  return std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
}

namespace detail {

/// The precision set of a cached store: `need` without repeats, most precise first. Only what
/// the run reads: a store of every precision "just in case" would be several times the model.
inline std::vector<moekit::Precision> cached_precisions(std::vector<moekit::Precision> need) {
  std::sort(need.begin(), need.end(), [](moekit::Precision a, moekit::Precision b) {
    return moekit::bits(a) != moekit::bits(b) ? moekit::bits(a) > moekit::bits(b) : a < b;
  });
  need.erase(std::unique(need.begin(), need.end()), need.end());
  return need;
}

/// The cache file `<cache_dir>/<stem>-<precisions>[-<layout word>].moestore` (no word for rows)
/// for shape `shape` with its
/// quantized experts in `order`, reused when its meta's checkpoint_fingerprint equals `fp`, else
/// (re)built by `build(precisions, out, options)`.
template <class Build>
CachedStore cached_store_file(const moekit::ModelShape& shape, const std::string& stem,
                              const std::string& fp, std::vector<moekit::Precision> need,
                              const std::filesystem::path& cache_dir, bool quiet,
                              const std::string& from, moekit::MatrixOrder order, Build build) {
  namespace fs = std::filesystem;
  need = cached_precisions(std::move(need));
  std::string tag, list;
  for (moekit::Precision p : need) {
    tag += '-';
    tag += moekit::name(p);
    if (!list.empty()) list += ',';
    list += moekit::name(p);
  }
  std::string suffix = moekit::in_panels(order) ? std::string("-") + layout_word(order) : "";
  // A codec other than the default (EdgeMoE's per-channel one) gets a file of its own.
  if (shape.quant != moekit::QuantScheme{})
    suffix += (shape.quant.group_size ? "-g" + std::to_string(shape.quant.group_size)
                                      : std::string("-channel")) +
              (shape.quant.zero_point ? "z" : "");
  const fs::path out = cache_dir / (stem + tag + suffix + ".moestore");
  bool stale = false;
  if (fs::exists(out)) {
    try {
      auto st = std::make_shared<moekit::io::ExpertStore>(
          moekit::io::ExpertStore::open(out.string(), shape));
      if (st->manifest().meta.value("checkpoint_fingerprint", std::string()) == fp &&
          st->manifest().order == order)
        return {std::move(st), false};
      stale = true;
    } catch (const moekit::Error&) {
      stale = true;  // our cache file, unreadable (e.g. an older format): rebuilt below
    }
  }
  fs::create_directories(out.parent_path());
  const std::uint64_t bytes = store_file_bytes(shape, need);
  check_disk_space(out, bytes);
  if (!quiet)
    std::fprintf(stderr, "building the expert store %s (%s, %s) from %s%s...\n", out.c_str(),
                 list.c_str(), format_bytes(bytes).c_str(), from.c_str(),
                 stale ? " (checkpoint changed)" : "");
  moekit::io::ExpertStoreWriteOptions wo;
  wo.overwrite = stale;
  wo.order = order;
  wo.encode_threads = store_encode_threads();
  if (!quiet && ::isatty(::fileno(stderr))) wo.progress = store_progress(bytes);
  build(std::span<const moekit::Precision>(need), out, wo);
  return {
      std::make_shared<moekit::io::ExpertStore>(moekit::io::ExpertStore::open(out.string(), shape)),
      true};
}

}  // namespace detail

/// The store of checkpoint `dir` in `cache_dir` holding `need` (one file per precision set, named
/// `<model>-<precisions>.moestore`, precisions most precise first). Used as is when its recorded
/// checkpoint fingerprint matches `dir`'s; built when missing; rebuilt (only this cache file is
/// replaced) when the checkpoint changed or the file is unreadable.
inline CachedStore cached_store(const ModelConfig& cfg, const std::filesystem::path& dir,
                                std::vector<moekit::Precision> need,
                                const std::filesystem::path& cache_dir, bool quiet,
                                moekit::MatrixOrder order = moekit::MatrixOrder::rows) {
  return detail::cached_store_file(cfg.shape(), dir.filename().string(),
                                   checkpoint_fingerprint(dir), std::move(need), cache_dir, quiet,
                                   dir.string(), order, [&](auto ps, const auto& out, auto wo) {
                                     build_store_from_checkpoint(cfg, dir, ps, out, wo);
                                   });
}

/// A fingerprint of one file (name, size, modification time), as checkpoint_fingerprint.
inline std::string file_fingerprint(const std::filesystem::path& f) {
  const auto t = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::filesystem::last_write_time(f).time_since_epoch())
                     .count();
  return f.filename().string() + ":" + std::to_string(std::filesystem::file_size(f)) + ":" +
         std::to_string(t) + ";";
}

/// The expert shape of a GGUF model: gguf_config's (one reading of the metadata, so the store
/// built from a file always fits the model read from it; a second copy of these rules once lost
/// Qwen2-MoE's shared expert). Throws `Error(invalid_format)` naming the key.
inline moekit::ModelShape gguf_shape(const moekit::io::GgufFile& g) {
  return gguf_config(g).shape();
}

/// Writes the expert store of GGUF file `path` (experts as the stacked `_exps` tensors or
/// per-expert tensors; F32/F16/BF16/Q8_0/Q4_0 and the K-quants Q2_K..Q6_K) at `precisions` to
/// `out`. At the precision the file's type maps onto exactly (Q4_0 → q4, Q8_0 → q8, as the
/// in-place reader does: io/gguf_transcode.hpp) the experts are moved, not re-rounded, so the store
/// holds the very values the in-place path reads; other precisions are dequantized, then encoded.
inline moekit::io::ExpertStoreWriteReport build_store_from_gguf(
    const std::filesystem::path& path, std::span<const moekit::Precision> precisions,
    const std::filesystem::path& out, moekit::io::ExpertStoreWriteOptions options) {
  const moekit::io::GgufFile g(path.string());
  const moekit::ModelShape shape = gguf_shape(g);
  const auto arch = moekit::io::parse_architecture(g.architecture());
  if (!arch)
    throw moekit::Error(
        moekit::ErrorKind::unsupported,
        "GGUF '" + g.path() + "': general.architecture '" + g.architecture() +
            "' is not an MoE architecture moekit reads (llama/mixtral, qwen2moe, olmoe)");
  const ExpertBacking exact{nullptr, nullptr, StoreIo{.direct = false},
                            locate_checkpoint_experts(gguf_config(g), {}, &g),
                            moekit::MatrixOrder::rows};
  auto encode = [&](moekit::ExpertKey k, moekit::Precision p) {
    if (exact.checkpoint && exact.checkpoint->precision() == p) return exact.read_expert(k, p);
    const ExpertF32 e =
        read_expert_f32(g, *arch, moekit::io::TensorFormat::gguf, k.layer, k.expert, shape);
    return moekit::io::encode_expert_blob(shape, e.w1, e.w3, e.w2, p);
  };
  options.meta["gguf"] = std::filesystem::absolute(path).lexically_normal().string();
  options.meta["checkpoint_fingerprint"] = file_fingerprint(path);
  options.meta["tool"] = "moe-convert";
  options.meta["blob_layout"] =
      "[w1 gate][w3 up][w2 down], precision/ formats, rows as matrix_order says";
  return moekit::io::write_expert_store(out.string(), shape, precisions, encode, options);
}

/// The store of GGUF file `path` in `cache_dir`, as cached_store: `<stem>-<hash of the absolute
/// path>-<precisions>.moestore`, rebuilt when the file changed.
inline CachedStore cached_gguf_store(const std::filesystem::path& path,
                                     std::vector<moekit::Precision> need,
                                     const std::filesystem::path& cache_dir, bool quiet,
                                     moekit::MatrixOrder order = moekit::MatrixOrder::rows) {
  const std::string abs = std::filesystem::absolute(path).lexically_normal().string();
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(std::hash<std::string>{}(abs)));
  const moekit::ModelShape shape = gguf_shape(moekit::io::GgufFile(path.string()));
  return detail::cached_store_file(
      shape, path.stem().string() + "-" + std::string(hash, 8), file_fingerprint(path),
      std::move(need), cache_dir, quiet, path.string(), order,
      [&](auto ps, const auto& out, auto wo) { build_store_from_gguf(path, ps, out, wo); });
}

}  // namespace moekit::engine
