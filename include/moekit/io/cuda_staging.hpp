#pragma once
/// \file Host→device copies of expert blobs through pinned staging buffers (double buffering).
///
/// A blob is read from a ByteSource in slot-sized chunks into pinned host buffers ("slots") and
/// each chunk is copied to device memory asynchronously. While the copy out of one slot runs, the
/// next chunk is read into the other slot; a slot is refilled only after the copy recorded behind
/// it has completed. This is the usual pinned double-buffer pattern (the DMA engine needs
/// page-locked memory for a truly asynchronous cudaMemcpyAsync; O_DIRECT can read into it).
///
/// - StagingCopyEngine (concept): the copy side — slots, `copy_async`, `wait_slot`, `synchronize`.
/// - staging_plan(): which chunk of a blob goes through which slot, in order (pure function).
/// - StagingPipeline<Engine>: runs plans against a ByteSource; all slot bookkeeping lives here,
///   so it is tested on the CPU with a fake engine (tests/io/cuda_staging_test.cpp).
/// - CudaCopyEngine: the CUDA model — cudaHostAlloc'ed slots, one stream, one event per slot,
///   cudaMemcpyAsync. It is compiled with nvcc for sm_80/sm_90 (kernels/cuda_staging.cu) but has
///   never been run: the machines moekit is developed on have no GPU.
///   It is real in translation units compiled by nvcc or with MOEKIT_CUDA_RUNTIME defined (and
///   CUDA::cudart linked); elsewhere the type still exists and its constructor throws
///   Error(unsupported) saying moekit was built without CUDA.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/io/byte_source.hpp"

#if defined(__CUDACC__) || defined(MOEKIT_CUDA_RUNTIME)
#define MOEKIT_IO_HAS_CUDA_RUNTIME 1
#include <cuda_runtime_api.h>
#else
#define MOEKIT_IO_HAS_CUDA_RUNTIME 0
#endif

namespace moekit::io {

/// **StagingCopyEngine** — pinned host slots and an ordered asynchronous copy queue.
/// 1. `e.slot_count()` slots (>= 1), each `e.slot_bytes()` bytes (a multiple of 4096) and
///    4096-aligned; `e.slot(i)` is slot i's memory (host-writable while no copy from it is
///    pending).
/// 2. `e.copy_async(i, dst, n)` enqueues a copy of the first n bytes of slot i to device address
///    `dst` and records slot i's completion marker behind it; copies run in submission order.
/// 3. `e.wait_slot(i)` blocks until the last copy enqueued from slot i has finished.
/// 4. `e.synchronize()` blocks until every enqueued copy has finished.
/// Not checked: errors are thrown as moekit::Error; `synchronize` is safe to call after a failure;
/// single-threaded use (one engine per I/O thread).
template <class E>
concept StagingCopyEngine = requires(E& e, const E& ce, std::size_t i, void* dst, std::size_t n) {
  { ce.slot_count() } -> std::convertible_to<std::size_t>;
  { ce.slot_bytes() } -> std::convertible_to<std::size_t>;
  { e.slot(i) } -> std::same_as<std::span<std::byte>>;
  e.copy_async(i, dst, n);
  e.wait_slot(i);
  e.synchronize();
};

/// One chunk of a staged blob: bytes [source_offset, +bytes) of the source go through `slot` to
/// bytes [dest_offset, +bytes) of the destination.
struct StagingStep {
  std::size_t slot = 0;
  std::uint64_t source_offset = 0;
  std::uint64_t dest_offset = 0;
  std::uint64_t bytes = 0;
  friend bool operator==(const StagingStep&, const StagingStep&) = default;
};

/// The chunks of `range`, `slot_bytes` each (the last may be shorter), assigned to slots round
/// robin starting at `first_slot`. With >= 2 slots consecutive chunks never share a slot, so
/// reading chunk k+1 overlaps the copy of chunk k. Throws Error(invalid_argument) when
/// `slot_bytes` is not a positive multiple of 4096 (O_DIRECT chunk offsets must stay aligned),
/// `slots` is 0 or `first_slot >= slots`.
inline std::vector<StagingStep> staging_plan(BlobRange range, std::size_t slot_bytes,
                                             std::size_t slots, std::size_t first_slot = 0) {
  MOEKIT_EXPECTS(slot_bytes > 0 && slot_bytes % 4096 == 0,
                 "staging_plan: slot_bytes (" + std::to_string(slot_bytes) +
                     ") must be a positive multiple of 4096");
  MOEKIT_EXPECTS(slots >= 1 && first_slot < slots,
                 "staging_plan: need slots >= 1 and first_slot < slots (got " +
                     std::to_string(slots) + ", " + std::to_string(first_slot) + ")");
  std::vector<StagingStep> plan;
  plan.reserve(static_cast<std::size_t>((range.bytes + slot_bytes - 1) / slot_bytes));
  std::size_t slot = first_slot;
  for (std::uint64_t done = 0; done < range.bytes; done += slot_bytes) {
    plan.push_back(
        {slot, range.offset + done, done, std::min<std::uint64_t>(slot_bytes, range.bytes - done)});
    slot = (slot + 1) % slots;
  }
  return plan;
}

/// Moves blobs from a ByteSource to device memory through an engine's slots. Single-threaded:
/// use one pipeline (and engine) per I/O thread. The destination of a `load` holds the blob
/// once `synchronize()` returns (or, for CudaCopyEngine, for any later work on its stream).
template <StagingCopyEngine Engine>
class StagingPipeline {
 public:
  /// `engine` must outlive the pipeline.
  explicit StagingPipeline(Engine& engine) : engine_(engine), pending_(engine.slot_count(), false) {
    MOEKIT_EXPECTS(engine.slot_count() >= 1, "StagingPipeline: the copy engine has no slots");
    MOEKIT_EXPECTS(engine.slot_bytes() > 0 && engine.slot_bytes() % 4096 == 0,
                   "StagingPipeline: slot_bytes (" + std::to_string(engine.slot_bytes()) +
                       ") must be a positive multiple of 4096");
  }
  StagingPipeline(const StagingPipeline&) = delete;
  StagingPipeline& operator=(const StagingPipeline&) = delete;

  /// Reads `range` of `source` chunk by chunk into the slots and enqueues each chunk's copy to
  /// `device_dst` (+ its offset in the blob). Returns once the last copy is enqueued: only slots
  /// are waited for, never the whole queue. On an error (read or copy) every enqueued copy is
  /// waited for, then the error is rethrown; the pipeline stays usable.
  template <ByteSource Source>
  void load(const Source& source, BlobRange range, void* device_dst) {
    MOEKIT_EXPECTS(device_dst != nullptr || range.bytes == 0,
                   "StagingPipeline::load: null destination");
    const auto plan = staging_plan(range, engine_.slot_bytes(), engine_.slot_count(), next_slot_);
    try {
      for (const StagingStep& s : plan) {
        if (pending_[s.slot]) {  // the slot's previous chunk may still be in flight
          engine_.wait_slot(s.slot);
          pending_[s.slot] = false;
        }
        source.read({s.source_offset, s.bytes}, engine_.slot(s.slot));
        engine_.copy_async(s.slot, static_cast<std::byte*>(device_dst) + s.dest_offset,
                           static_cast<std::size_t>(s.bytes));
        pending_[s.slot] = true;
        next_slot_ = (s.slot + 1) % engine_.slot_count();
      }
    } catch (...) {
      synchronize();
      throw;
    }
    bytes_staged_ += range.bytes;
  }

  /// Blocks until every enqueued copy has finished; all slots are free afterwards.
  void synchronize() {
    engine_.synchronize();
    std::fill(pending_.begin(), pending_.end(), false);
  }

  /// Bytes of completed `load` calls (enqueued; see synchronize()).
  [[nodiscard]] std::uint64_t bytes_staged() const noexcept { return bytes_staged_; }
  [[nodiscard]] Engine& engine() noexcept { return engine_; }

 private:
  Engine& engine_;
  std::vector<bool> pending_;  // slot i has a copy enqueued that nobody waited for
  std::size_t next_slot_ = 0;  // round robin continues across loads
  std::uint64_t bytes_staged_ = 0;
};

/// Run-time knobs of CudaCopyEngine.
struct CudaCopyEngineConfig {
  std::size_t slots = 2;  ///< pinned staging buffers (2 = double buffering)
  std::size_t slot_bytes =
      8u << 20;     ///< per slot, a multiple of 4096 (8 MiB: large O_DIRECT reads)
  int device = -1;  ///< CUDA device; -1: the calling thread's current device
};

#if MOEKIT_IO_HAS_CUDA_RUNTIME
// Distinct inline namespaces keep the CUDA and the CUDA-less definitions apart (no ODR clash
// when both kinds of translation unit end up in one program).
inline namespace with_cuda_runtime {

/// Pinned slots + one non-blocking stream + one event per slot. Not copyable or movable (the
/// stream and events are owned). NOT RUN in moekit's CI: compiled only (no GPU).
class CudaCopyEngine {
 public:
  using Config = CudaCopyEngineConfig;
  static constexpr bool available = true;

  explicit CudaCopyEngine(Config c = {}) : config_(c) {
    MOEKIT_EXPECTS(c.slots >= 1, "CudaCopyEngine: slots must be >= 1");
    MOEKIT_EXPECTS(c.slot_bytes > 0 && c.slot_bytes % 4096 == 0,
                   "CudaCopyEngine: slot_bytes (" + std::to_string(c.slot_bytes) +
                       ") must be a positive multiple of 4096");
    try {
      if (c.device >= 0) check(cudaSetDevice(c.device), "cudaSetDevice");
      check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
            "cudaStreamCreateWithFlags");
      for (std::size_t i = 0; i < c.slots; ++i) {
        void* p = nullptr;
        // Portable: usable from any device's stream; page-aligned, so O_DIRECT reads land in place.
        check(cudaHostAlloc(&p, c.slot_bytes, cudaHostAllocPortable), "cudaHostAlloc");
        host_.push_back(static_cast<std::byte*>(p));
        cudaEvent_t ev = nullptr;
        check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        events_.push_back(ev);
      }
    } catch (...) {
      release();
      throw;
    }
  }
  CudaCopyEngine(const CudaCopyEngine&) = delete;
  CudaCopyEngine& operator=(const CudaCopyEngine&) = delete;
  /// Waits for the copies in flight (they read the slots), then frees everything.
  ~CudaCopyEngine() { release(); }

  [[nodiscard]] std::size_t slot_count() const noexcept { return host_.size(); }
  [[nodiscard]] std::size_t slot_bytes() const noexcept { return config_.slot_bytes; }
  [[nodiscard]] std::span<std::byte> slot(std::size_t i) {
    MOEKIT_EXPECTS(i < host_.size(), "CudaCopyEngine::slot: no slot " + std::to_string(i));
    return {host_[i], config_.slot_bytes};
  }
  void copy_async(std::size_t i, void* device_dst, std::size_t bytes) {
    MOEKIT_EXPECTS(i < host_.size() && bytes <= config_.slot_bytes,
                   "CudaCopyEngine::copy_async: slot " + std::to_string(i) + ", " +
                       std::to_string(bytes) + " bytes");
    check(cudaMemcpyAsync(device_dst, host_[i], bytes, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync");
    check(cudaEventRecord(events_[i], stream_), "cudaEventRecord");
  }
  void wait_slot(std::size_t i) {
    MOEKIT_EXPECTS(i < events_.size(), "CudaCopyEngine::wait_slot: no slot " + std::to_string(i));
    check(cudaEventSynchronize(events_[i]), "cudaEventSynchronize");
  }
  void synchronize() { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  /// The stream the copies run on: kernels launched on it run after the copies enqueued before.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

 private:
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw Error(ErrorKind::io, std::string("CudaCopyEngine: ") + what + " failed: " +
                                     cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }
  void release() noexcept {
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    for (cudaEvent_t ev : events_) (void)cudaEventDestroy(ev);
    for (std::byte* p : host_) (void)cudaFreeHost(p);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    events_.clear();
    host_.clear();
    stream_ = nullptr;
  }

  Config config_;
  cudaStream_t stream_ = nullptr;
  std::vector<std::byte*> host_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace with_cuda_runtime
#else
inline namespace without_cuda_runtime {

/// This build has no CUDA runtime: the type exists so that code naming it compiles, and every
/// constructor throws Error(unsupported). `available` is false.
class CudaCopyEngine {
 public:
  using Config = CudaCopyEngineConfig;
  static constexpr bool available = false;

  explicit CudaCopyEngine(Config = {}) { unavailable(); }
  CudaCopyEngine(const CudaCopyEngine&) = delete;
  CudaCopyEngine& operator=(const CudaCopyEngine&) = delete;

  // Unreachable (no object can be constructed); they exist to model StagingCopyEngine.
  [[nodiscard]] std::size_t slot_count() const { unavailable(); }
  [[nodiscard]] std::size_t slot_bytes() const { unavailable(); }
  [[nodiscard]] std::span<std::byte> slot(std::size_t) { unavailable(); }
  void copy_async(std::size_t, void*, std::size_t) { unavailable(); }
  void wait_slot(std::size_t) { unavailable(); }
  void synchronize() { unavailable(); }

 private:
  [[noreturn]] static void unavailable() {
    throw Error(ErrorKind::unsupported,
                "CudaCopyEngine: moekit was built without CUDA (compile with nvcc, or define "
                "MOEKIT_CUDA_RUNTIME and link CUDA::cudart, e.g. through moekit::cuda)");
  }
};

}  // namespace without_cuda_runtime
#endif

static_assert(StagingCopyEngine<CudaCopyEngine>, "CudaCopyEngine must model StagingCopyEngine");

}  // namespace moekit::io
