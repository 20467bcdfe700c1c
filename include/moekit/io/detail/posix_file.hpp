#pragma once
/// \file RAII file descriptors and read-only memory maps, with errors that name the file.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "moekit/error.hpp"

namespace moekit::io::detail {

/// Throws `Error(io)` "<what> '<path>': <strerror(err)>".
[[noreturn]] inline void fail_errno(std::string_view what, const std::string& path, int err,
                                    source_location where = source_location::current()) {
  throw Error(ErrorKind::io, std::string(what) + " '" + path + "': " + std::strerror(err), where);
}

/// An owned file descriptor; closes on destruction. Move-only.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(FileDescriptor&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  /// Opens `path` with `flags`; throws `Error(io)` naming the file on failure.
  static FileDescriptor open(const std::string& path, int flags, mode_t mode = 0644) {
    int fd;
    do {
      fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) fail_errno("cannot open", path, errno);
    return FileDescriptor(fd);
  }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// Size in bytes of an open file; throws `Error(io)` naming `path`.
inline std::uint64_t file_size(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_errno("cannot stat", path, errno);
  return static_cast<std::uint64_t>(st.st_size);
}

/// A whole file mapped read-only (MAP_SHARED: pages come from the page cache, no copy).
/// An empty file maps to an empty span. Move-only.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(std::string path) : path_(std::move(path)) {
    FileDescriptor fd = FileDescriptor::open(path_, O_RDONLY);
    size_ = file_size(fd.get(), path_);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd.get(), 0);
      if (p == MAP_FAILED) fail_errno("cannot mmap", path_, errno);
      data_ = static_cast<const std::byte*>(p);
    }
  }
  MappedFile(MappedFile&& o) noexcept
      : path_(std::move(o.path_)),
        data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  MappedFile& operator=(MappedFile&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() { unmap(); }

  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  void unmap() noexcept {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Writes all of `data` at the file position, retrying EINTR and short writes.
inline void write_all(int fd, std::span<const std::byte> data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno("cannot write", path, errno);
    }
    data = data.subspan(static_cast<std::size_t>(n));
  }
}

/// Writes all of `data` at `offset`, retrying EINTR and short writes.
inline void pwrite_all(int fd, std::span<const std::byte> data, std::uint64_t offset,
                       const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno("cannot write at offset " + std::to_string(offset) + " of", path, errno);
    }
    data = data.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
}

}  // namespace moekit::io::detail
