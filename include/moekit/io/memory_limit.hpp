#pragma once
/// \file How much memory this process may use: the memory cgroup it runs in (v1 or v2, the
/// tightest of its cgroup and their ancestors) less what is charged there and cannot be
/// reclaimed, and the kernel's MemAvailable. Every file is read below a root directory (default
/// "/"), so tests can build fake /proc and /sys trees.
///
/// Missing and malformed files:
/// - A missing file is a limit that does not exist (no memory controller on that hierarchy, no
///   cgroup support, a kernel without MemAvailable): that value is unknown.
/// - A malformed file that could *raise* the estimate if guessed (/proc/self/cgroup, mountinfo, a
///   limit, a cgroup's usage, MemTotal, MemAvailable) throws `Error(invalid_format)` naming the
///   file: a guess there could size a budget above the real limit, and the kernel would kill the
///   process mid-run; an error asks for an explicit size instead.
/// - A malformed value that can only *lower* the estimate or only informs (the reclaimable page
///   cache in memory.stat, RSS and peak RSS in /proc/self/status) is read as unknown; an unknown
///   page cache counts as not reclaimable.

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/io/detail/posix_file.hpp"

namespace moekit::io {

/// The memory limit of one cgroup and what is charged to it.
struct CgroupMemory {
  int version = 2;          ///< 1 or 2
  std::string path;         ///< in its hierarchy, as /proc/self/cgroup writes it: "/user.slice/x"
  std::string limit_file;   ///< memory.max, memory.high (v2) or memory.limit_in_bytes (v1)
  std::uint64_t limit = 0;  ///< bytes
  std::uint64_t usage = 0;  ///< bytes charged: memory.current / memory.usage_in_bytes
  /// Page cache the kernel can drop before it would kill: memory.stat file − shmem (v2),
  /// total_cache − total_shmem (v1); tmpfs and shared memory are not droppable without swap.
  std::optional<std::uint64_t> reclaimable_cache;

  /// Bytes this cgroup can still grow by: limit − (usage − reclaimable cache), at least 0.
  [[nodiscard]] std::uint64_t headroom() const noexcept {
    const std::uint64_t cache = std::min(reclaimable_cache.value_or(0), usage);
    const std::uint64_t held = usage - cache;
    return limit > held ? limit - held : 0;
  }
  /// "cgroup v1 memory.limit_in_bytes of /user.slice/x".
  [[nodiscard]] std::string describe() const {
    return "cgroup v" + std::to_string(version) + " " + limit_file + " of " + path;
  }
};

/// What this process may use, as far as the kernel tells; every field may be unknown.
struct MemoryLimits {
  /// The binding cgroup limit: among this process's memory cgroups and their ancestors, the one
  /// with the least headroom (a parent with a larger limit can still bind when siblings use it).
  std::optional<CgroupMemory> cgroup;
  std::optional<std::uint64_t> mem_available;  ///< /proc/meminfo MemAvailable, bytes
  std::optional<std::uint64_t> mem_total;      ///< /proc/meminfo MemTotal, bytes
  std::optional<std::uint64_t> rss;            ///< this process's VmRSS, bytes
  std::optional<std::uint64_t> peak_rss;       ///< this process's VmHWM, bytes
  /// Address space left under `ulimit -v` (RLIMIT_AS − VmSize), bytes; unknown when unlimited.
  /// Allocations beyond it fail with std::bad_alloc whatever memory the machine has.
  std::optional<std::uint64_t> address_space_left;

  /// Bytes this process can still allocate without being killed or swapping:
  /// min(cgroup headroom, MemAvailable); unknown when both are.
  ///
  /// Why both: the cgroup limit is the hard wall (the OOM killer acts on the cgroup even when
  /// the machine has free memory), while MemAvailable sees the rest of the machine (a cgroup
  /// limit larger than what other processes leave free does not make that memory exist).
  /// Why the page cache is subtracted from the usage: the checkpoint and store files read
  /// through the page cache are charged to the cgroup but dropped under pressure; counting them
  /// as used would shrink the budget for memory the kernel hands back. MemAvailable already
  /// counts reclaimable cache as available.
  /// Call it before loading the model: memory already allocated counts as used.
  [[nodiscard]] std::optional<std::uint64_t> usable_bytes() const noexcept {
    std::optional<std::uint64_t> out;
    if (cgroup) out = cgroup->headroom();
    if (mem_available) out = out ? std::min(*out, *mem_available) : *mem_available;
    if (address_space_left) out = out ? std::min(*out, *address_space_left) : *address_space_left;
    return out;
  }
  /// What bounds `usable_bytes()`: "ulimit -v (RLIMIT_AS)", the cgroup's `describe()`,
  /// "MemAvailable", or "unknown".
  [[nodiscard]] std::string source() const {
    const auto usable = usable_bytes();
    if (address_space_left && usable == address_space_left) return "ulimit -v (RLIMIT_AS)";
    if (cgroup && (!mem_available || cgroup->headroom() <= *mem_available))
      return cgroup->describe();
    return mem_available ? "MemAvailable" : "unknown";
  }
};

namespace detail {

/// Throws `Error(invalid_format)` "memory limits: '<file>' <what>".
[[noreturn]] inline void memory_file_malformed(const std::filesystem::path& file,
                                               std::string_view what) {
  throw Error(ErrorKind::invalid_format,
              "memory limits: '" + file.string() + "' " + std::string(what));
}

/// The whole of a small (proc/sys) file; nullopt when it does not exist. Other failures throw
/// `Error(io)` naming the file. Reads until EOF: proc and sys files report a size of 0.
inline std::optional<std::string> read_proc_file(const std::filesystem::path& file) {
  int fd;
  do {
    fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    fail_errno("cannot open", file.string(), errno);
  }
  const FileDescriptor owned(fd);
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("cannot read", file.string(), errno);
    if (n == 0) return text;
    text.append(buf, static_cast<std::size_t>(n));
  }
}

inline std::string_view trim_spaces(std::string_view s) noexcept {
  const auto first = s.find_first_not_of(" \t\n");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\n") - first + 1);
}

/// A decimal count with nothing else but surrounding white space; nullopt otherwise.
inline std::optional<std::uint64_t> parse_count(std::string_view s) noexcept {
  s = trim_spaces(s);
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

/// The lines of `text`, without their '\n'.
inline std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
  }
  return lines;
}

/// Fields of `line` separated by runs of `sep`.
inline std::vector<std::string_view> split_fields(std::string_view line, char sep) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    if (line[i] == sep) {
      ++i;
      continue;
    }
    const auto end = std::min(line.find(sep, i), line.size());
    out.push_back(line.substr(i, end - i));
    i = end;
  }
  return out;
}

/// The value of `key` in a "key: value kB" file (/proc/meminfo, /proc/self/status), in bytes.
/// nullopt when the key is absent; `malformed` when present but not "<count> kB".
inline std::optional<std::uint64_t> kib_field(std::string_view text, std::string_view key,
                                              bool& malformed) {
  for (std::string_view line : split_lines(text)) {
    if (!line.starts_with(key) || line.substr(key.size(), 1) != ":") continue;
    std::string_view value = trim_spaces(line.substr(key.size() + 1));
    const bool kib = value.ends_with(" kB");
    const auto count = kib ? parse_count(value.substr(0, value.size() - 3)) : std::nullopt;
    if (!count || *count > (UINT64_MAX >> 10)) {
      malformed = true;
      return std::nullopt;
    }
    return *count << 10;
  }
  return std::nullopt;
}

/// MemTotal and MemAvailable from `<root>/proc/meminfo` (missing file: unknown).
inline void read_meminfo(const std::filesystem::path& root, MemoryLimits& out) {
  const auto file = root / "proc/meminfo";
  const auto text = read_proc_file(file);
  if (!text) return;
  for (auto [key, field] :
       {std::pair{"MemTotal", &out.mem_total}, std::pair{"MemAvailable", &out.mem_available}}) {
    bool malformed = false;
    *field = kib_field(*text, key, malformed);
    if (malformed) memory_file_malformed(file, std::string("has an unreadable ") + key + " line");
  }
}

/// VmRSS and VmHWM from `<root>/proc/self/status`; malformed or missing: unknown. With an
/// address-space limit `rlimit_as` (bytes), what is left of it after VmSize (unknown VmSize: the
/// whole limit, as an upper bound).
inline void read_process_rss(const std::filesystem::path& root, MemoryLimits& out,
                             std::optional<std::uint64_t> rlimit_as) {
  const auto text = read_proc_file(root / "proc/self/status");
  bool malformed = false;
  if (text) {
    out.rss = kib_field(*text, "VmRSS", malformed);
    out.peak_rss = kib_field(*text, "VmHWM", malformed);
  }
  if (!rlimit_as) return;
  const auto size = text ? kib_field(*text, "VmSize", malformed) : std::nullopt;
  out.address_space_left = *rlimit_as - std::min(*rlimit_as, size.value_or(0));
}

/// This process's RLIMIT_AS (`ulimit -v`) in bytes; nullopt when unlimited.
inline std::optional<std::uint64_t> address_space_limit() noexcept {
  rlimit r{};
  if (::getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return static_cast<std::uint64_t>(r.rlim_cur);
}

/// A memory cgroup of this process, as /proc/self/cgroup names it.
struct CgroupMembership {
  int version = 2;
  std::string path;  ///< "/user.slice/x", relative to its hierarchy's root
};

/// This process's memory cgroups: the v1 line whose controllers include "memory" and the v2 line
/// "0::/path". No file (no cgroup support): none.
inline std::vector<CgroupMembership> read_process_cgroups(const std::filesystem::path& root) {
  const auto file = root / "proc/self/cgroup";
  const auto text = read_proc_file(file);
  std::vector<CgroupMembership> out;
  if (!text) return out;
  for (std::string_view line : split_lines(*text)) {
    if (trim_spaces(line).empty()) continue;
    const auto c1 = line.find(':');
    const auto c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos || !line.substr(c2 + 1).starts_with('/'))
      memory_file_malformed(
          file, "has a line that is not 'id:controllers:/path': '" + std::string(line) + "'");
    const std::string_view id = line.substr(0, c1), controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const std::string path(line.substr(c2 + 1));
    const auto names = split_fields(controllers, ',');
    if (id == "0" && controllers.empty())
      out.push_back({2, path});
    else if (std::find(names.begin(), names.end(), "memory") != names.end())
      out.push_back({1, path});
  }
  return out;
}

/// A mounted cgroup hierarchy that can hold memory limits: v2, or v1 with the memory controller.
struct CgroupMount {
  int version = 2;
  std::string root;         ///< the hierarchy's directory mounted there ("/" unless namespaced)
  std::string mount_point;  ///< absolute, in this process's mount namespace
};

/// A mountinfo path with its octal escapes ("\040" for a space) decoded.
inline std::string unescape_mount_path(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const bool octal = s[i] == '\\' && i + 3 < s.size() &&
                       std::all_of(s.begin() + i + 1, s.begin() + i + 4,
                                   [](char c) { return c >= '0' && c <= '7'; });
    if (!octal) {
      out += s[i];
      continue;
    }
    out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
    i += 3;
  }
  return out;
}

/// The cgroup mounts of `<root>/proc/self/mountinfo` (missing file: none).
inline std::vector<CgroupMount> read_cgroup_mounts(const std::filesystem::path& root) {
  const auto file = root / "proc/self/mountinfo";
  const auto text = read_proc_file(file);
  std::vector<CgroupMount> out;
  if (!text) return out;
  for (std::string_view line : split_lines(*text)) {
    if (trim_spaces(line).empty()) continue;
    const auto f = split_fields(line, ' ');
    const auto dash = std::find(f.begin(), f.end(), "-");
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    if (dash - f.begin() < 6 || f.end() - dash < 4)
      memory_file_malformed(file,
                            "has a line that is not a mount entry: '" + std::string(line) + "'");
    const std::string_view fstype = dash[1];
    const auto options = split_fields(dash[3], ',');
    const bool v1_memory =
        fstype == "cgroup" && std::find(options.begin(), options.end(), "memory") != options.end();
    if (fstype == "cgroup2" || v1_memory)
      out.push_back({v1_memory ? 1 : 2, unescape_mount_path(f[3]), unescape_mount_path(f[4])});
  }
  return out;
}

/// `path` relative to the hierarchy directory `mount_root`, or nullopt when outside it.
inline std::optional<std::string> path_below(const std::string& path,
                                             const std::string& mount_root) {
  if (mount_root == "/") return path;
  if (path == mount_root) return std::string("/");
  if (path.starts_with(mount_root) && path[mount_root.size()] == '/')
    return path.substr(mount_root.size());
  return std::nullopt;
}

/// The "key count" lines of a memory.stat; nullopt when any line is not one (the file is then
/// unknown as a whole: a half-read file could pair a cache size with a missing shmem size).
inline std::optional<std::vector<std::pair<std::string_view, std::uint64_t>>> parse_memory_stat(
    std::string_view text) {
  std::vector<std::pair<std::string_view, std::uint64_t>> out;
  for (std::string_view line : split_lines(text)) {
    if (trim_spaces(line).empty()) continue;
    const auto f = split_fields(line, ' ');
    const auto value = f.size() == 2 ? parse_count(f[1]) : std::nullopt;
    if (!value) return std::nullopt;
    out.emplace_back(f[0], *value);
  }
  return out;
}

/// Droppable page cache of `<dir>/memory.stat`: the first of `cache_keys` present, less shared
/// memory (the first of `shmem_keys`, 0 when none is). nullopt (nothing reclaimable) when the
/// file or the cache key is missing or the file is malformed.
inline std::optional<std::uint64_t> reclaimable_cache(
    const std::filesystem::path& dir, std::initializer_list<std::string_view> cache_keys,
    std::initializer_list<std::string_view> shmem_keys) {
  const auto text = read_proc_file(dir / "memory.stat");
  const auto stat = text ? parse_memory_stat(*text) : std::nullopt;
  if (!stat) return std::nullopt;
  auto first_of =
      [&](std::initializer_list<std::string_view> keys) -> std::optional<std::uint64_t> {
    for (std::string_view key : keys)
      for (const auto& [name, value] : *stat)
        if (name == key) return value;
    return std::nullopt;
  };
  const auto cache = first_of(cache_keys);
  if (!cache) return std::nullopt;
  const std::uint64_t shmem = first_of(shmem_keys).value_or(0);
  return *cache > shmem ? *cache - shmem : 0;
}

/// v1 writes "no limit" as the largest page-aligned signed value; anything this large is none.
inline constexpr std::uint64_t v1_no_limit_threshold = std::uint64_t{1} << 62;

/// The tightest limit set on the cgroup directory `dir` (hierarchy path `path`), or nullopt.
inline std::optional<CgroupMemory> read_cgroup_level(const std::filesystem::path& dir, int version,
                                                     const std::string& path) {
  const char* usage_file = version == 2 ? "memory.current" : "memory.usage_in_bytes";
  std::optional<CgroupMemory> best;
  static constexpr const char* v2_limit_files[] = {"memory.max", "memory.high"};
  static constexpr const char* v1_limit_files[] = {"memory.limit_in_bytes"};
  const auto limit_files = version == 2 ? std::span<const char* const>(v2_limit_files)
                                        : std::span<const char* const>(v1_limit_files);
  for (const char* limit_file : limit_files) {
    const auto file = dir / limit_file;
    const auto text = read_proc_file(file);
    if (!text || (version == 2 && trim_spaces(*text) == "max")) continue;
    const auto limit = parse_count(*text);
    if (!limit)
      memory_file_malformed(file, "holds '" + std::string(trim_spaces(*text)) +
                                      "', not a byte count" + (version == 2 ? " or 'max'" : ""));
    if (version == 1 && *limit >= v1_no_limit_threshold) continue;
    CgroupMemory level{version, path, limit_file, *limit, 0, std::nullopt};
    const auto usage_path = dir / usage_file;
    const auto usage_text = read_proc_file(usage_path);
    const auto usage = usage_text ? parse_count(*usage_text) : std::nullopt;
    if (!usage)
      memory_file_malformed(usage_path, usage_text
                                            ? "is not a byte count"
                                            : "is missing next to " + std::string(limit_file));
    level.usage = *usage;
    level.reclaimable_cache =
        version == 2 ? reclaimable_cache(dir, {"file"}, {"shmem"})
                     : reclaimable_cache(dir, {"total_cache", "cache"}, {"total_shmem", "shmem"});
    if (!best || level.headroom() < best->headroom()) best = std::move(level);
  }
  return best;
}

/// The tightest limit on cgroup `member` and its ancestors up to the top of the mounted
/// hierarchy `mount` (nullopt when `member` is outside it or nothing is limited).
inline std::optional<CgroupMemory> tightest_in_hierarchy(const std::filesystem::path& root,
                                                         const CgroupMount& mount,
                                                         const CgroupMembership& member) {
  const auto below = path_below(member.path, mount.root);
  if (!below) return std::nullopt;
  std::filesystem::path dir = root / std::filesystem::path(mount.mount_point).relative_path();
  std::string path = mount.root == "/" ? "" : mount.root;
  std::vector<std::pair<std::filesystem::path, std::string>> levels{
      {dir, path.empty() ? "/" : path}};
  for (std::string_view part : split_fields(*below, '/')) {
    dir /= part;
    path += "/" + std::string(part);
    levels.emplace_back(dir, path);
  }
  std::optional<CgroupMemory> best;
  for (const auto& [level_dir, level_path] : levels) {
    auto level = read_cgroup_level(level_dir, member.version, level_path);
    if (level && (!best || level->headroom() < best->headroom())) best = std::move(level);
  }
  return best;
}

}  // namespace detail

/// Reads the memory limits of this process below `root` ("/" on a real system; a directory
/// holding proc/ and sys/ in tests). `rlimit_as`: the address-space limit in bytes (nullopt:
/// none). Throws `Error(invalid_format)` naming a malformed file (see the file comment for
/// which), `Error(io)` for a file that exists but cannot be read.
inline MemoryLimits read_memory_limits(const std::filesystem::path& root,
                                       std::optional<std::uint64_t> rlimit_as) {
  MemoryLimits out;
  detail::read_meminfo(root, out);
  detail::read_process_rss(root, out, rlimit_as);
  const auto mounts = detail::read_cgroup_mounts(root);
  for (const detail::CgroupMembership& member : detail::read_process_cgroups(root)) {
    for (const detail::CgroupMount& mount : mounts) {
      if (mount.version != member.version) continue;
      auto found = detail::tightest_in_hierarchy(root, mount, member);
      if (found && (!out.cgroup || found->headroom() < out.cgroup->headroom()))
        out.cgroup = std::move(found);
    }
  }
  return out;
}

/// The memory limits below `root` with this process's `ulimit -v` when `root` is "/" (a fake tree
/// in tests: no address-space limit).
inline MemoryLimits read_memory_limits(const std::filesystem::path& root = "/") {
  return read_memory_limits(root, root == "/" ? detail::address_space_limit() : std::nullopt);
}

}  // namespace moekit::io
