#pragma once
/// \file FaultInjectingSource: a pread(2) byte source that misbehaves on purpose, to test what
/// the loaders do when a disk does (issue 24, "Fuzzing and faults"). It reads a real file through
/// the same retry loop as PreadSource (read_retrying / detail::read_direct), with faults injected
/// at the system call below it:
///
/// - `eio_on_call = n`: read(2) call n (1-based) fails with EIO. Outcome: that load fails with
///   Error(io) naming the file, the offset and "Input/output error"; later loads succeed.
/// - `short_read_bytes = k`: every call returns at most k bytes (a page under O_DIRECT).
///   Outcome: the exact bytes (short reads are continued).
/// - `truncate_on_call = n`, `truncate_to = m`: before call n the file is truncated to m bytes, on
///   disk. Outcome: reads past m fail with Error(io) "unexpected end of file" naming the file and
///   offset; reads below m give the exact bytes.
/// - `delay_per_call`, `bytes_per_second`: every call sleeps first (a slow disk). Outcome: the
///   exact bytes, later; never a hang.
///
/// Thread-safe (the call counter is atomic); models ByteSource. For tests and fault drills only:
/// moe-run never builds one.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "moekit/error.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/detail/posix_file.hpp"

namespace moekit::io {

/// The faults a FaultInjectingSource injects; the default injects none.
struct FaultPlan {
  std::uint64_t eio_on_call = 0;       ///< this read(2) call (1-based) fails with `error`; 0: never
  int error = EIO;                     ///< errno of the failing call
  std::size_t short_read_bytes = 0;    ///< every call returns at most this many bytes; 0: no limit
  std::uint64_t truncate_on_call = 0;  ///< before this call the file is truncated; 0: never
  std::uint64_t truncate_to = 0;       ///< ... to this many bytes
  std::chrono::microseconds delay_per_call{0};  ///< slow disk: latency of every call
  double bytes_per_second = 0;                  ///< slow disk: bandwidth of every call; 0: no cap
};

/// A pread(2) source over `path` that injects the faults of a FaultPlan.
class FaultInjectingSource {
 public:
  FaultInjectingSource(std::string path, FaultPlan plan, PreadSource::Config config = {})
      : state_(std::make_shared<State>()) {
    state_->path = std::move(path);
    state_->plan = plan;
    state_->direct = config.direct;
    state_->fd =
        detail::FileDescriptor::open(state_->path, O_RDONLY | (config.direct ? O_DIRECT : 0));
  }

  void read(BlobRange r, std::span<std::byte> dest) const {
    State& s = *state_;
    if (dest.size() < r.bytes)
      throw Error(ErrorKind::invalid_argument, "read of " + std::to_string(r.bytes) +
                                                   " bytes from '" + s.path + "' into a " +
                                                   std::to_string(dest.size()) + "-byte buffer");
    const ReadCall call = [&s](std::byte* p, std::size_t n, std::uint64_t off) {
      return s.faulty_pread(p, n, off);
    };
    if (s.direct)
      detail::read_direct(call, r, dest, s.path);
    else
      read_retrying(call, dest.first(r.bytes), r.bytes, r.offset, s.path);
  }
  [[nodiscard]] const std::string& name() const noexcept { return state_->path; }
  /// read(2) calls made so far (the numbering of FaultPlan's `*_on_call`).
  [[nodiscard]] std::uint64_t calls() const noexcept { return state_->calls.load(); }

 private:
  struct State {
    std::string path;
    FaultPlan plan;
    bool direct = false;
    detail::FileDescriptor fd;
    std::atomic<std::uint64_t> calls{0};

    ssize_t faulty_pread(std::byte* p, std::size_t n, std::uint64_t off) {
      const std::uint64_t call = ++calls;
      if (plan.truncate_on_call == call &&
          ::truncate(path.c_str(), static_cast<off_t>(plan.truncate_to)) != 0)
        detail::fail_errno("FaultInjectingSource: cannot truncate", path, errno);
      if (plan.eio_on_call == call) {
        errno = plan.error;
        return -1;
      }
      if (plan.short_read_bytes > 0 && n > plan.short_read_bytes) {
        // O_DIRECT needs whole pages: the shortest read it may make is one page
        const std::size_t unit = direct ? std::size_t{4096} : std::size_t{1};
        n = std::max(unit, plan.short_read_bytes / unit * unit);
      }
      const ssize_t got = ::pread(fd.get(), p, n, static_cast<off_t>(off));
      if (got > 0) slow_down(static_cast<std::size_t>(got));
      return got;
    }

    void slow_down(std::size_t bytes) const {
      auto wait = std::chrono::duration<double>(plan.delay_per_call);
      if (plan.bytes_per_second > 0)
        wait += std::chrono::duration<double>(static_cast<double>(bytes) / plan.bytes_per_second);
      if (wait.count() > 0) std::this_thread::sleep_for(wait);
    }
  };
  std::shared_ptr<State> state_;
};

static_assert(ByteSource<FaultInjectingSource>);

}  // namespace moekit::io
