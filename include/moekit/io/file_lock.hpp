#pragma once
/// \file OutputLock: one writer per output file. A second process writing the same file (two
/// `moe-convert -o same`, which would both encode for minutes and then race on the rename) is
/// refused at once. The lock is flock(2) on `<path>.lock`, removed when the writer is done; a
/// writer that dies leaves the file but not the lock (the kernel drops it), so the next run
/// proceeds.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "moekit/error.hpp"

namespace moekit::io {

/// Holds the lock on `<path>.lock` for its lifetime. Move-only.
class OutputLock {
 public:
  /// Takes the lock or throws `Error(io)` naming `flag` (may be empty) and `path` when another
  /// process holds it.
  explicit OutputLock(const std::string& path, std::string_view flag = "")
      : lock_path_(path + ".lock") {
    const std::string pre = flag.empty() ? std::string() : std::string(flag) + ": ";
    // The holder unlinks the file before releasing it; a lock taken on such an unlinked file is
    // stale, so take it again on the path's current file.
    for (int attempt = 0; attempt < 16; ++attempt) {
      fd_ = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd_ < 0)
        moekit::detail::fail(ErrorKind::io, pre + "cannot create the lock file '" + lock_path_ +
                                                "': " + std::strerror(errno));
      if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        ::close(fd_);
        fd_ = -1;
        if (err == EWOULDBLOCK)
          moekit::detail::fail(ErrorKind::io, pre + "another process is writing '" + path +
                                                  "' (it holds '" + lock_path_ +
                                                  "'); refusing to write it concurrently");
        moekit::detail::fail(ErrorKind::io,
                             pre + "cannot lock '" + lock_path_ + "': " + std::strerror(err));
      }
      struct stat held {
      }, now{};
      if (::fstat(fd_, &held) == 0 && ::stat(lock_path_.c_str(), &now) == 0 &&
          held.st_ino == now.st_ino && held.st_dev == now.st_dev)
        return;
      ::close(fd_);
      fd_ = -1;
    }
    moekit::detail::fail(ErrorKind::io,
                         pre + "cannot lock '" + lock_path_ + "' (it keeps changing)");
  }
  OutputLock(OutputLock&& o) noexcept
      : lock_path_(std::move(o.lock_path_)), fd_(std::exchange(o.fd_, -1)) {}
  OutputLock& operator=(OutputLock&&) = delete;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;
  /// Removes the lock file, then releases the lock.
  ~OutputLock() {
    if (fd_ < 0) return;
    ::unlink(lock_path_.c_str());
    ::close(fd_);
  }

  [[nodiscard]] const std::string& lock_path() const noexcept { return lock_path_; }

 private:
  std::string lock_path_;
  int fd_ = -1;
};

}  // namespace moekit::io
