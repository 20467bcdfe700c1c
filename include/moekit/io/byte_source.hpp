#pragma once
/// \file Byte sources: where a loader reads blobs from. Each reads a `BlobRange` completely into
/// a caller buffer or throws a typed `moekit::Error` naming the file and offset.
///
/// - MemorySource: bytes already in memory (tests, RAM-resident stores).
/// - PreadSource: pread(2), optionally with O_DIRECT (page cache bypassed); retries EINTR and
///   short reads; an O_DIRECT read lands in place when the destination is 4 KiB-aligned (only a
///   partial last page goes through a small bounce buffer).
/// - MmapSource: copies out of a read-only mapping (page cache, kernel readahead).
/// The io_uring + O_DIRECT source is in uring_source.hpp.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "moekit/error.hpp"
#include "moekit/io/aligned_buffer.hpp"
#include "moekit/io/detail/posix_file.hpp"

namespace moekit::io {

/// A byte range of a source: `bytes` bytes starting at `offset`.
struct BlobRange {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

/// **ByteSource** — something a loader can read blobs from.
/// 1. `s.read(range, dest)` fills `dest[0, range.bytes)` (dest.size() >= range.bytes) or throws
///    `moekit::Error` (io: the OS failed or the file ended early) naming the file and offset.
/// 2. `s.name()` names the source for messages.
/// Not checked: `read` is safe to call from several threads at once.
template <class S>
concept ByteSource = requires(S& s, const S& cs, BlobRange r, std::span<std::byte> dest) {
  s.read(r, dest);
  { cs.name() } -> std::convertible_to<std::string>;
};

/// The syscall a file source reads with: `(buffer, count, offset) -> ssize_t` (pread's contract).
using ReadCall = std::function<ssize_t(std::byte*, std::size_t, std::uint64_t)>;

/// Reads until at least `need` bytes of `dest` are filled (reading no more than dest.size()),
/// retrying EINTR/EAGAIN and continuing after short reads. Returns the bytes read. Throws
/// `Error(io)` naming `file` and the failing offset on an error or an early end of file.
inline std::size_t read_retrying(const ReadCall& call, std::span<std::byte> dest, std::size_t need,
                                 std::uint64_t offset, const std::string& file) {
  std::size_t done = 0;
  int interrupted = 0;
  while (done < need) {
    const ssize_t n = call(dest.data() + done, dest.size() - done, offset + done);
    if (n < 0) {
      const int err = errno;
      if ((err == EINTR || err == EAGAIN) && ++interrupted < 1000) continue;
      detail::fail_errno("read of " + std::to_string(dest.size() - done) +
                             " bytes failed at offset " + std::to_string(offset + done) + " of",
                         file, err);
    }
    if (n == 0)
      throw Error(ErrorKind::io, "unexpected end of file '" + file + "' at offset " +
                                     std::to_string(offset + done) + " (" +
                                     std::to_string(need - done) + " more bytes expected)");
    done += static_cast<std::size_t>(n);
  }
  return done;
}

namespace detail {

/// Reads `r` into `dest` through `call` on a file opened with O_DIRECT: the 4 KiB-aligned bulk
/// goes straight into `dest` when `dest` is aligned; the rest through an aligned bounce buffer.
inline void read_direct(const ReadCall& call, BlobRange r, std::span<std::byte> dest,
                        const std::string& file) {
  constexpr std::uint64_t page = 4096;
  if (r.offset % page != 0)
    throw Error(ErrorKind::invalid_argument, "O_DIRECT read of '" + file + "' at offset " +
                                                 std::to_string(r.offset) +
                                                 ", not a multiple of 4096");
  std::uint64_t done = 0;
  if (is_aligned(dest.data(), page)) {
    const std::uint64_t bulk = r.bytes / page * page;
    if (bulk > 0) read_retrying(call, dest.first(bulk), bulk, r.offset, file);
    done = bulk;
  }
  if (done < r.bytes) {
    constexpr std::uint64_t bounce_bytes = 4u << 20;
    AlignedBuffer bounce(
        std::min<std::uint64_t>(bounce_bytes, (r.bytes - done + page - 1) / page * page));
    while (done < r.bytes) {
      const std::uint64_t want = std::min<std::uint64_t>(r.bytes - done, bounce.size());
      const std::uint64_t padded = (want + page - 1) / page * page;
      read_retrying(call, bounce.span().first(padded), want, r.offset + done, file);
      std::memcpy(dest.data() + done, bounce.data(), want);
      done += want;
    }
  }
}

}  // namespace detail

/// Reads from bytes in memory (which must outlive the source).
class MemorySource {
 public:
  explicit MemorySource(std::span<const std::byte> bytes, std::string name = "memory")
      : bytes_(bytes), name_(std::move(name)) {}

  void read(BlobRange r, std::span<std::byte> dest) const {
    if (dest.size() < r.bytes)
      throw Error(ErrorKind::invalid_argument, "read of " + std::to_string(r.bytes) +
                                                   " bytes from '" + name_ + "' into a " +
                                                   std::to_string(dest.size()) + "-byte buffer");
    if (r.offset > bytes_.size() || r.bytes > bytes_.size() - r.offset)
      throw Error(ErrorKind::io, "read of " + std::to_string(r.bytes) + " bytes at offset " +
                                     std::to_string(r.offset) + " runs past the end of '" + name_ +
                                     "' (" + std::to_string(bytes_.size()) + " bytes)");
    std::memcpy(dest.data(), bytes_.data() + r.offset, r.bytes);
  }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 private:
  std::span<const std::byte> bytes_;
  std::string name_;
};

/// Reads a file with pread(2); `direct` opens it with O_DIRECT (bypassing the page cache).
/// Thread-safe (pread has no shared file position). Movable.
class PreadSource {
 public:
  struct Config {
    bool direct = false;  ///< O_DIRECT: offsets must be 4096-aligned (store blobs are)
  };

  explicit PreadSource(std::string path) : PreadSource(std::move(path), Config{}) {}
  PreadSource(std::string path, Config config) : path_(std::move(path)), config_(config) {
    fd_ = std::make_shared<detail::FileDescriptor>(
        detail::FileDescriptor::open(path_, O_RDONLY | (config_.direct ? O_DIRECT : 0)));
  }

  void read(BlobRange r, std::span<std::byte> dest) const {
    if (dest.size() < r.bytes)
      throw Error(ErrorKind::invalid_argument, "read of " + std::to_string(r.bytes) +
                                                   " bytes from '" + path_ + "' into a " +
                                                   std::to_string(dest.size()) + "-byte buffer");
    const int fd = fd_->get();
    ReadCall call = [fd](std::byte* p, std::size_t n, std::uint64_t off) {
      return ::pread(fd, p, n, static_cast<off_t>(off));
    };
    if (config_.direct)
      detail::read_direct(call, r, dest, path_);
    else
      read_retrying(call, dest.first(r.bytes), r.bytes, r.offset, path_);
  }
  [[nodiscard]] const std::string& name() const noexcept { return path_; }
  [[nodiscard]] bool direct() const noexcept { return config_.direct; }

 private:
  std::string path_;
  Config config_;
  std::shared_ptr<detail::FileDescriptor> fd_;
};

/// Copies out of a read-only mapping of the whole file. Thread-safe. Movable.
class MmapSource {
 public:
  explicit MmapSource(std::string path)
      : map_(std::make_shared<detail::MappedFile>(std::move(path))) {}

  void read(BlobRange r, std::span<std::byte> dest) const {
    const auto bytes = map_->bytes();
    if (dest.size() < r.bytes)
      throw Error(ErrorKind::invalid_argument, "read of " + std::to_string(r.bytes) +
                                                   " bytes from '" + name() + "' into a " +
                                                   std::to_string(dest.size()) + "-byte buffer");
    if (r.offset > bytes.size() || r.bytes > bytes.size() - r.offset)
      throw Error(ErrorKind::io, "read of " + std::to_string(r.bytes) + " bytes at offset " +
                                     std::to_string(r.offset) + " runs past the end of '" + name() +
                                     "'");
    std::memcpy(dest.data(), bytes.data() + r.offset, r.bytes);
  }
  [[nodiscard]] const std::string& name() const noexcept { return map_->path(); }
  /// The mapped bytes (zero-copy access for CPU execution of experts).
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return map_->bytes(); }

 private:
  std::shared_ptr<detail::MappedFile> map_;
};

static_assert(ByteSource<MemorySource>);
static_assert(ByteSource<PreadSource>);
static_assert(ByteSource<MmapSource>);

}  // namespace moekit::io
