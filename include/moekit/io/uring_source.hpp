#pragma once
/// \file UringSource: reads blobs with io_uring, several chunk reads of one blob in flight, by
/// default with O_DIRECT so the page cache is bypassed and bytes land in place.
///
/// Compiled only when MOEKIT_HAS_URING is defined (CMake sets it when liburing is found).
/// A blob is cut into `chunk_bytes` pieces; up to `queue_depth` are in flight at once; short
/// completions are resubmitted for the remainder, -EINTR/-EAGAIN completions are retried, and on an
/// error every in-flight read is drained before the typed error (file, offset) is thrown, so the
/// kernel never writes into a buffer the caller has been handed back. Rings are not thread-safe:
/// the source keeps a small pool, each guarded by a mutex, so several loader threads can read at
/// once. Destinations that are not 4 KiB-aligned (O_DIRECT) fall back to pread through a bounce
/// buffer; so does the last partial page of a blob.

#if defined(MOEKIT_HAS_URING)

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/io/aligned_buffer.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/detail/posix_file.hpp"

namespace moekit::io {

/// io_uring byte source. Thread-safe; movable.
class UringSource {
 public:
  struct Config {
    bool direct = true;        ///< open with O_DIRECT
    unsigned queue_depth = 8;  ///< chunk reads in flight per blob
    /// Bytes per read request (multiple of 4096). 4 MiB: the largest request this machine's
    /// virtio disk takes (max_sectors_kb); with 8 in flight a q4 expert is one batch. Measured by
    /// bench/io/load_compute_overlap (2 GEMV threads busy, heavily loaded 2-core host): 1 MiB
    /// chunks kept 0.79 of the loading rate, 4 MiB 0.94 (pread 0.90-0.97); alone, both ~= raw.
    std::size_t chunk_bytes = 4u << 20;
    unsigned rings = 2;  ///< rings in the pool (≈ loader I/O threads)
  };

  explicit UringSource(std::string path) : UringSource(std::move(path), Config{}) {}
  UringSource(std::string path, Config config) : state_(std::make_shared<State>()) {
    MOEKIT_EXPECTS(config.queue_depth >= 1 && config.queue_depth <= 4096,
                   "UringSource: queue_depth in [1, 4096]");
    MOEKIT_EXPECTS(config.chunk_bytes >= 4096 && config.chunk_bytes % 4096 == 0 &&
                       config.chunk_bytes <= (1u << 30),
                   "UringSource: chunk_bytes must be a multiple of 4096 up to 1 GiB");
    MOEKIT_EXPECTS(config.rings >= 1, "UringSource: rings must be >= 1");
    state_->path = std::move(path);
    state_->config = config;
    state_->fd =
        detail::FileDescriptor::open(state_->path, O_RDONLY | (config.direct ? O_DIRECT : 0));
    for (unsigned i = 0; i < config.rings; ++i) {
      auto r = std::make_unique<Ring>();
      const int rc = io_uring_queue_init(config.queue_depth, &r->ring, 0);
      if (rc < 0)
        throw Error(ErrorKind::unsupported, "io_uring is not available for '" + state_->path +
                                                "': io_uring_queue_init: " + std::strerror(-rc));
      r->initialised = true;
      state_->rings.push_back(std::move(r));
    }
  }

  void read(BlobRange r, std::span<std::byte> dest) const {
    State& s = *state_;
    if (dest.size() < r.bytes)
      throw Error(ErrorKind::invalid_argument, "read of " + std::to_string(r.bytes) +
                                                   " bytes from '" + s.path + "' into a " +
                                                   std::to_string(dest.size()) + "-byte buffer");
    const int fd = s.fd.get();
    ReadCall pread_call = [fd](std::byte* p, std::size_t n, std::uint64_t off) {
      return ::pread(fd, p, n, static_cast<off_t>(off));
    };
    std::uint64_t bulk = r.bytes;
    if (s.config.direct) {
      if (r.offset % 4096 != 0 || !is_aligned(dest.data(), 4096)) {
        detail::read_direct(pread_call, r, dest, s.path);
        return;
      }
      bulk = r.bytes / 4096 * 4096;
    }
    if (bulk > 0) {
      Ring& ring = pick_ring();
      std::unique_lock lock(ring.m, std::adopt_lock);
      if (ring.broken)
        throw Error(ErrorKind::io,
                    "io_uring ring for '" + s.path + "' failed earlier and is unusable");
      read_chunks(ring, dest.data(), bulk, r.offset);
    }
    if (bulk < r.bytes)
      detail::read_direct(pread_call, {r.offset + bulk, r.bytes - bulk}, dest.subspan(bulk),
                          s.path);
  }

  [[nodiscard]] const std::string& name() const noexcept { return state_->path; }
  [[nodiscard]] const Config& config() const noexcept { return state_->config; }

 private:
  struct Ring {
    std::mutex m;
    io_uring ring{};
    bool initialised = false;
    bool broken = false;  ///< a submit/wait failed: SQEs may be left behind; never reuse
    ~Ring() {
      if (initialised) io_uring_queue_exit(&ring);
    }
  };
  struct State {
    std::string path;
    Config config;
    detail::FileDescriptor fd;
    std::vector<std::unique_ptr<Ring>> rings;
    std::atomic<unsigned> next{0};
  };
  struct Chunk {
    std::uint64_t offset;
    std::byte* dest;
    std::uint32_t bytes;
  };

  /// Locks and returns a free ring if one is free, else waits for one.
  Ring& pick_ring() const {
    State& s = *state_;
    const unsigned n = static_cast<unsigned>(s.rings.size());
    const unsigned start = s.next.fetch_add(1, std::memory_order_relaxed) % n;
    for (unsigned i = 0; i < n; ++i) {
      Ring& r = *s.rings[(start + i) % n];
      if (r.m.try_lock()) return r;
    }
    Ring& r = *s.rings[start];
    r.m.lock();
    return r;
  }

  void read_chunks(Ring& owner, std::byte* dest, std::uint64_t bytes, std::uint64_t offset) const {
    const State& s = *state_;
    io_uring& ring = owner.ring;
    std::vector<Chunk> chunks;
    for (std::uint64_t done = 0; done < bytes; done += s.config.chunk_bytes) {
      const auto n =
          static_cast<std::uint32_t>(std::min<std::uint64_t>(s.config.chunk_bytes, bytes - done));
      chunks.push_back({offset + done, dest + done, n});
    }
    std::vector<std::size_t> pending;
    for (std::size_t i = chunks.size(); i-- > 0;) pending.push_back(i);  // back() = next to submit
    unsigned inflight = 0;
    std::string error;  // first failure; in-flight reads are drained before it is thrown
    int retries = 0;
    while (inflight > 0 || (!pending.empty() && error.empty())) {
      unsigned queued = 0;
      while (error.empty() && !pending.empty() && inflight + queued < s.config.queue_depth) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        if (sqe == nullptr) break;
        const Chunk& c = chunks[pending.back()];
        io_uring_prep_read(sqe, s.fd.get(), c.dest, c.bytes, c.offset);
        io_uring_sqe_set_data64(sqe, pending.back());
        pending.pop_back();
        ++queued;
      }
      if (queued > 0) {
        int rc;
        do {
          rc = io_uring_submit(&ring);
        } while (rc == -EINTR || rc == -EAGAIN);
        if (rc < 0) {
          // Nothing of this batch was accepted: forget it (the SQEs stay unsubmitted in the ring,
          // so drain what is in flight and report).
          error = "io_uring_submit failed for '" + s.path + "': " + std::strerror(-rc);
          owner.broken = true;
        } else {
          inflight += static_cast<unsigned>(rc);
        }
      }
      if (inflight == 0) break;
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        // Should not happen with in-flight reads; the ring is retired so that it is never reused.
        owner.broken = true;
        throw Error(ErrorKind::io,
                    "io_uring_wait_cqe failed for '" + s.path + "': " + std::strerror(-rc));
      }
      // Reap every completion that is ready before refilling the queue: one wake-up per batch,
      // not per chunk, so a loader thread that is scheduled late still finds the queue busy.
      do {
        const std::size_t idx = static_cast<std::size_t>(io_uring_cqe_get_data64(cqe));
        const int res = cqe->res;
        io_uring_cqe_seen(&ring, cqe);
        --inflight;
        Chunk& c = chunks[idx];
        if (res == -EINTR || res == -EAGAIN) {
          if (++retries > 1000 && error.empty())
            error = "too many interrupted reads of '" + s.path + "'";
          pending.push_back(idx);
        } else if (res < 0) {
          if (error.empty())
            error = "read of " + std::to_string(c.bytes) + " bytes failed at offset " +
                    std::to_string(c.offset) + " of '" + s.path + "': " + std::strerror(-res);
        } else if (res == 0) {
          if (error.empty())
            error = "unexpected end of file '" + s.path + "' at offset " +
                    std::to_string(c.offset) + " (" + std::to_string(c.bytes) +
                    " more bytes expected)";
        } else if (static_cast<std::uint32_t>(res) < c.bytes) {  // short read: resubmit the rest
          c.offset += static_cast<std::uint32_t>(res);
          c.dest += res;
          c.bytes -= static_cast<std::uint32_t>(res);
          pending.push_back(idx);
        }
      } while (inflight > 0 && io_uring_peek_cqe(&ring, &cqe) == 0);
    }
    if (!error.empty()) throw Error(ErrorKind::io, error);
  }

  std::shared_ptr<State> state_;
};

static_assert(ByteSource<UringSource>);

}  // namespace moekit::io

#endif  // MOEKIT_HAS_URING
