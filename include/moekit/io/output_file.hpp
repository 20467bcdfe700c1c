#pragma once
/// \file Output files written whole or not at all: `check_output_path` refuses, before any work,
/// a path that cannot be written (missing or read-only directory, a directory, a device or other
/// non-regular file — even with overwrite — or an existing file without it);
/// `write_file_atomically` writes a temporary file beside the target, syncs it and renames it
/// over the target, so a failed or interrupted write (a full disk) leaves the old file, or
/// nothing, and never a truncated one. Without overwrite the rename refuses a file that appeared
/// meanwhile (RENAME_NOREPLACE).

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "moekit/error.hpp"

namespace moekit::io {

namespace detail {

inline std::string output_prefix(std::string_view flag) {
  return flag.empty() ? std::string() : std::string(flag) + ": ";
}

/// The directory a file `path` goes into ("." for a bare name).
inline std::filesystem::path output_directory(const std::filesystem::path& path) {
  const auto dir = path.parent_path();
  return dir.empty() ? std::filesystem::path(".") : dir;
}

}  // namespace detail

/// Throws `Error(invalid_argument)`, prefixed with `flag` ("--out", or "" for none), unless a file
/// can be written at `path`: the name is not empty and does not end in '/', its directory exists
/// and is writable, and `path` is absent — or, with `overwrite`, a regular file. `force_hint`
/// says how to allow overwriting in the refusal.
inline void check_output_path(const std::filesystem::path& path, bool overwrite,
                              std::string_view flag = "",
                              std::string_view force_hint = "pass --force") {
  namespace fs = std::filesystem;
  const std::string pre = detail::output_prefix(flag), p = path.string();
  auto refuse = [&](const std::string& why) {
    moekit::detail::fail(ErrorKind::invalid_argument, pre + "'" + p + "' " + why);
  };
  if (p.empty()) moekit::detail::fail(ErrorKind::invalid_argument, pre + "empty file name");
  if (p.back() == '/' || !path.has_filename()) refuse("names a directory, not a file");
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st)) {
    if (fs::is_directory(st)) refuse("is a directory");
    if (!fs::is_regular_file(st))
      refuse(
          "exists and is not a regular file (a device, pipe or socket); refusing to replace it "
          "even with --force");
    if (!overwrite) refuse("exists; refusing to overwrite it (" + std::string(force_hint) + ")");
  }
  const fs::path dir = detail::output_directory(path);
  if (!fs::is_directory(dir, ec))
    refuse("cannot be written: the directory '" + dir.string() + "' does not exist");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    refuse("cannot be written: the directory '" + dir.string() + "' is not writable (" +
           std::strerror(errno) + ")");
}

/// Writes `data` to `path` through a temporary file in the same directory and a rename; on any
/// failure the temporary file is removed and `path` is as it was. Refusals as
/// check_output_path's; `Error(io)` naming `flag`, the path and the system's reason on a failed
/// write (e.g. "No space left on device").
inline void write_file_atomically(const std::filesystem::path& path,
                                  std::span<const std::byte> data, bool overwrite,
                                  std::string_view flag = "",
                                  std::string_view force_hint = "pass --force") {
  check_output_path(path, overwrite, flag, force_hint);
  const std::string pre = detail::output_prefix(flag), p = path.string();
  static std::atomic<unsigned> counter{0};
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 100; ++attempt) {
    tmp = (detail::output_directory(path) /
           ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
            std::to_string(counter.fetch_add(1))))
              .string();
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0)
    moekit::detail::fail(ErrorKind::io, pre + "cannot create a temporary file beside '" + p +
                                            "': " + std::strerror(errno));
  auto fail_io = [&](const std::string& what, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    moekit::detail::fail(ErrorKind::io, pre + what + " '" + p + "': " + std::strerror(err));
  };
  for (std::size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_io("write error on", n < 0 ? errno : ENOSPC);
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail_io("write error (fsync) on", errno);
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) fail_io("write error (close) on", errno);
  int rc;
  if (overwrite) {
    rc = ::rename(tmp.c_str(), p.c_str());
  } else {
    rc = ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, p.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {  // no RENAME_NOREPLACE here
      rc = ::link(tmp.c_str(), p.c_str());
      if (rc == 0) ::unlink(tmp.c_str());
    }
  }
  if (rc != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    if (err == EEXIST)
      moekit::detail::fail(
          ErrorKind::invalid_argument,
          pre + "'" + p + "' exists; refusing to overwrite it (" + std::string(force_hint) + ")");
    moekit::detail::fail(ErrorKind::io,
                         pre + "cannot rename '" + tmp + "' to '" + p + "': " + std::strerror(err));
  }
}

/// write_file_atomically of a string's bytes.
inline void write_text_atomically(const std::filesystem::path& path, std::string_view text,
                                  bool overwrite, std::string_view flag = "",
                                  std::string_view force_hint = "pass --force") {
  write_file_atomically(path, std::as_bytes(std::span<const char>(text.data(), text.size())),
                        overwrite, flag, force_hint);
}

}  // namespace moekit::io
