// What memory this process may use (moekit/io/memory_limit.hpp): cgroup v1 and v2 limits read
// through fake /proc and /sys trees, the tightest of nested cgroups, "max" and "no limit",
// malformed files, and the real machine's files checked for consistency.

#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/io_test_util.hpp"
#include "moekit/io/memory_limit.hpp"

namespace memory_limit_test {

using moekit::ErrorKind;
using moekit::io::MemoryLimits;
using moekit::io::read_memory_limits;
using moekit::test::require_error;

constexpr std::uint64_t mib = std::uint64_t{1} << 20;
constexpr std::uint64_t gib = std::uint64_t{1} << 30;
/// What cgroup v1 writes for "no limit" (4 KiB pages).
constexpr const char* v1_unlimited = "9223372036854771712";

/// A fake root holding proc/ and sys/ files, removed at scope exit.
class FakeRoot {
 public:
  /// Writes `text` to `<root>/<relative>`, creating the directories.
  void write(const std::string& relative, const std::string& text) const {
    const auto file = dir_.path() / relative;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  void meminfo(std::uint64_t total, std::uint64_t available) const {
    write("proc/meminfo", "MemTotal:       " + std::to_string(total >> 10) +
                              " kB\nMemFree:        1024 kB\nMemAvailable:   " +
                              std::to_string(available >> 10) + " kB\nBuffers:  0 kB\n");
  }
  /// This machine's layout: v1 controllers under /sys/fs/cgroup/<name>, v2 at .../unified.
  void hybrid_mounts() const {
    write("proc/self/mountinfo",
          "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
          "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
          "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
          "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
          "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
          "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
  }
  /// A unified (v2 only) layout at /sys/fs/cgroup.
  void v2_mounts() const {
    write("proc/self/mountinfo",
          "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
          "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 "
          "cgroup2 rw,nsdelegate,memory_recursiveprot\n");
  }
  /// A v1 memory cgroup directory (relative to the hierarchy) with its limit, usage and stat.
  void v1_cgroup(const std::string& path, const std::string& limit, std::uint64_t usage,
                 const std::string& stat = "") const {
    const std::string dir = "sys/fs/cgroup/memory" + path;
    write(dir + "/memory.limit_in_bytes", limit + "\n");
    write(dir + "/memory.usage_in_bytes", std::to_string(usage) + "\n");
    if (!stat.empty()) write(dir + "/memory.stat", stat);
  }
  /// A v2 cgroup directory with memory.max, memory.high, memory.current and memory.stat.
  void v2_cgroup(const std::string& path, const std::string& max, std::uint64_t current,
                 const std::string& stat = "", const std::string& high = "max") const {
    const std::string dir = "sys/fs/cgroup" + path;
    write(dir + "/memory.max", max + "\n");
    write(dir + "/memory.high", high + "\n");
    write(dir + "/memory.current", std::to_string(current) + "\n");
    if (!stat.empty()) write(dir + "/memory.stat", stat);
  }
  [[nodiscard]] std::string file(const std::string& relative) const {
    return (dir_.path() / relative).string();
  }
  [[nodiscard]] const std::filesystem::path& root() const { return dir_.path(); }

 private:
  moekit::test::TempDir dir_;
};

std::string v2_stat(std::uint64_t file, std::uint64_t shmem) {
  return "anon 1000\nfile " + std::to_string(file) + "\nkernel 0\nshmem " + std::to_string(shmem) +
         "\nfile_dirty 0\n";
}

TEST_CASE("memory limits: cgroup v1 limit less the unreclaimable usage", "[io][memory_limit]") {
  FakeRoot fs;
  fs.meminfo(16 * gib, 12 * gib);
  fs.hybrid_mounts();
  fs.write("proc/self/cgroup", "9:name=systemd:/\n4:memory:/user.slice/x\n3:cpu,cpuacct:/\n0::/\n");
  fs.v1_cgroup("", v1_unlimited, 5 * gib);
  fs.v1_cgroup("/user.slice", v1_unlimited, 3 * gib);
  // cache 200 MiB of which 50 MiB tmpfs: 150 MiB can be dropped.
  fs.v1_cgroup("/user.slice/x", std::to_string(gib), 300 * mib,
               "cache 1\nrss 2\nshmem 3\ntotal_cache " + std::to_string(200 * mib) +
                   "\ntotal_rss 4\ntotal_shmem " + std::to_string(50 * mib) + "\n");
  fs.write("proc/self/status", "Name:\tmoe-run\nVmHWM:\t    4096 kB\nVmRSS:\t    2048 kB\n");

  const MemoryLimits m = read_memory_limits(fs.root());
  REQUIRE(m.cgroup);
  CHECK(m.cgroup->version == 1);
  CHECK(m.cgroup->path == "/user.slice/x");
  CHECK(m.cgroup->limit == gib);
  CHECK(m.cgroup->usage == 300 * mib);
  CHECK(m.cgroup->reclaimable_cache == 150 * mib);
  CHECK(m.cgroup->headroom() == gib - 150 * mib);
  CHECK(m.usable_bytes() == gib - 150 * mib);
  CHECK(m.source() == "cgroup v1 memory.limit_in_bytes of /user.slice/x");
  CHECK(m.mem_total == 16 * gib);
  CHECK(m.mem_available == 12 * gib);
  CHECK(m.rss == 2 * mib);
  CHECK(m.peak_rss == 4 * mib);
}

TEST_CASE("memory limits: cgroup v1 without total_* stats uses cache and shmem",
          "[io][memory_limit]") {
  FakeRoot fs;
  fs.meminfo(16 * gib, 12 * gib);
  fs.hybrid_mounts();
  fs.write("proc/self/cgroup", "4:memory:/job\n");
  fs.v1_cgroup(
      "/job", std::to_string(2 * gib), gib,
      "cache " + std::to_string(400 * mib) + "\nshmem " + std::to_string(100 * mib) + "\n");
  const MemoryLimits m = read_memory_limits(fs.root());
  REQUIRE(m.cgroup);
  CHECK(m.cgroup->reclaimable_cache == 300 * mib);
  CHECK(m.usable_bytes() == gib + 300 * mib);
}

TEST_CASE("memory limits: cgroup v2 memory.max, and memory.high when it is lower",
          "[io][memory_limit]") {
  FakeRoot fs;
  fs.meminfo(64 * gib, 40 * gib);
  fs.v2_mounts();
  fs.write("proc/self/cgroup", "0::/app.slice/svc\n");
  fs.v2_cgroup("/app.slice", "max", 20 * gib);
  fs.v2_cgroup("/app.slice/svc", std::to_string(8 * gib), 3 * gib, v2_stat(gib, 256 * mib));

  SECTION("memory.max") {
    const MemoryLimits m = read_memory_limits(fs.root());
    REQUIRE(m.cgroup);
    CHECK(m.cgroup->version == 2);
    CHECK(m.cgroup->limit == 8 * gib);
    CHECK(m.cgroup->reclaimable_cache == gib - 256 * mib);
    CHECK(m.usable_bytes() == 8 * gib - (3 * gib - (gib - 256 * mib)));
    CHECK(m.source() == "cgroup v2 memory.max of /app.slice/svc");
  }
  SECTION("memory.high below memory.max binds: past it the kernel throttles") {
    fs.write("sys/fs/cgroup/app.slice/svc/memory.high", std::to_string(6 * gib) + "\n");
    const MemoryLimits m = read_memory_limits(fs.root());
    REQUIRE(m.cgroup);
    CHECK(m.cgroup->limit == 6 * gib);
    CHECK(m.source() == "cgroup v2 memory.high of /app.slice/svc");
  }
  SECTION("no memory.stat: no cache counted as reclaimable") {
    std::filesystem::remove(fs.file("sys/fs/cgroup/app.slice/svc/memory.stat"));
    const MemoryLimits m = read_memory_limits(fs.root());
    REQUIRE(m.cgroup);
    CHECK_FALSE(m.cgroup->reclaimable_cache);
    CHECK(m.usable_bytes() == 5 * gib);
  }
}

TEST_CASE("memory limits: nested cgroups, the least headroom binds", "[io][memory_limit]") {
  FakeRoot fs;
  fs.meminfo(64 * gib, 60 * gib);
  fs.v2_mounts();
  fs.write("proc/self/cgroup", "0::/a/b/c\n");
  fs.v2_cgroup("/a/b/c", "max", gib);

  SECTION("a smaller limit on an ancestor") {
    fs.v2_cgroup("/a", std::to_string(4 * gib), gib);
    fs.v2_cgroup("/a/b", std::to_string(16 * gib), gib);
    const MemoryLimits m = read_memory_limits(fs.root());
    REQUIRE(m.cgroup);
    CHECK(m.cgroup->path == "/a");
    CHECK(m.usable_bytes() == 3 * gib);
  }
  SECTION("a parent with a larger limit whose other children use most of it") {
    fs.v2_cgroup("/a", std::to_string(10 * gib), 9 * gib);
    fs.v2_cgroup("/a/b", std::to_string(4 * gib), gib);
    const MemoryLimits m = read_memory_limits(fs.root());
    REQUIRE(m.cgroup);
    CHECK(m.cgroup->path == "/a");
    CHECK(m.cgroup->limit == 10 * gib);
    CHECK(m.usable_bytes() == gib);
  }
  SECTION("the process's own cgroup when it is the tightest") {
    fs.v2_cgroup("/a", std::to_string(10 * gib), 2 * gib);
    fs.v2_cgroup("/a/b/c", std::to_string(2 * gib), gib);
    const MemoryLimits m = read_memory_limits(fs.root());
    REQUIRE(m.cgroup);
    CHECK(m.cgroup->path == "/a/b/c");
    CHECK(m.usable_bytes() == gib);
  }
  SECTION("a v1 hierarchy: the ancestor's limit") {
    fs.hybrid_mounts();
    fs.write("proc/self/cgroup", "4:memory:/outer/inner\n0::/\n");
    fs.v1_cgroup("", v1_unlimited, 8 * gib);
    fs.v1_cgroup("/outer", std::to_string(3 * gib), gib);
    fs.v1_cgroup("/outer/inner", v1_unlimited, 512 * mib);
    const MemoryLimits m = read_memory_limits(fs.root());
    REQUIRE(m.cgroup);
    CHECK(m.source() == "cgroup v1 memory.limit_in_bytes of /outer");
    CHECK(m.usable_bytes() == 2 * gib);
  }
}

TEST_CASE("memory limits: MemAvailable binds when it is below the cgroup's headroom",
          "[io][memory_limit]") {
  FakeRoot fs;
  fs.meminfo(16 * gib, 3 * gib);
  fs.v2_mounts();
  fs.write("proc/self/cgroup", "0::/big\n");
  fs.v2_cgroup("/big", std::to_string(12 * gib), gib);
  const MemoryLimits m = read_memory_limits(fs.root());
  REQUIRE(m.cgroup);
  CHECK(m.usable_bytes() == 3 * gib);
  CHECK(m.source() == "MemAvailable");
}

TEST_CASE("memory limits: no limit set, no cgroup, nothing known", "[io][memory_limit]") {
  FakeRoot fs;
  SECTION("\"max\" and the v1 unlimited value are no limits") {
    fs.meminfo(16 * gib, 10 * gib);
    fs.v2_mounts();
    fs.write("proc/self/cgroup", "0::/user.slice\n");
    fs.v2_cgroup("/user.slice", "max", gib);
    CHECK_FALSE(read_memory_limits(fs.root()).cgroup);
    fs.hybrid_mounts();
    fs.write("proc/self/cgroup", "4:memory:/user.slice\n0::/\n");
    fs.v1_cgroup("/user.slice", v1_unlimited, gib);
    const MemoryLimits m = read_memory_limits(fs.root());
    CHECK_FALSE(m.cgroup);
    CHECK(m.usable_bytes() == 10 * gib);
    CHECK(m.source() == "MemAvailable");
  }
  SECTION("a hybrid system whose v2 hierarchy has no memory controller") {
    fs.meminfo(16 * gib, 10 * gib);
    fs.hybrid_mounts();
    fs.write("proc/self/cgroup", "4:memory:/\n0::/session\n");
    fs.write("sys/fs/cgroup/unified/session/cgroup.procs", "1\n");
    fs.v1_cgroup("", v1_unlimited, gib);
    CHECK_FALSE(read_memory_limits(fs.root()).cgroup);
  }
  SECTION("no /proc/self/cgroup") {
    fs.meminfo(16 * gib, 10 * gib);
    fs.v2_mounts();
    const MemoryLimits m = read_memory_limits(fs.root());
    CHECK_FALSE(m.cgroup);
    CHECK(m.usable_bytes() == 10 * gib);
  }
  SECTION("an empty root: every value unknown") {
    const MemoryLimits m = read_memory_limits(fs.root());
    CHECK_FALSE(m.cgroup);
    CHECK_FALSE(m.mem_total);
    CHECK_FALSE(m.rss);
    CHECK_FALSE(m.usable_bytes());
    CHECK(m.source() == "unknown");
  }
}

TEST_CASE("memory limits: a namespaced mount root and escaped mount points", "[io][memory_limit]") {
  FakeRoot fs;
  fs.meminfo(16 * gib, 10 * gib);
  // The container's own cgroup is mounted at the mount point (Docker, cgroupns=host, v1).
  fs.write("proc/self/mountinfo",
           "35 31 0:32 /docker/abc /sys/fs/cgroup/mem\\040ory rw - cgroup cgroup rw,memory\n");
  fs.write("sys/fs/cgroup/mem ory/memory.limit_in_bytes", std::to_string(2 * gib));
  fs.write("sys/fs/cgroup/mem ory/memory.usage_in_bytes", std::to_string(gib));
  fs.write("sys/fs/cgroup/mem ory/task/memory.limit_in_bytes", v1_unlimited);
  fs.write("sys/fs/cgroup/mem ory/task/memory.usage_in_bytes", std::to_string(gib));

  fs.write("proc/self/cgroup", "4:memory:/docker/abc/task\n");
  MemoryLimits m = read_memory_limits(fs.root());
  REQUIRE(m.cgroup);
  CHECK(m.source() == "cgroup v1 memory.limit_in_bytes of /docker/abc");
  CHECK(m.usable_bytes() == gib);

  fs.write("proc/self/cgroup", "4:memory:/elsewhere\n");  // not below the mounted directory
  m = read_memory_limits(fs.root());
  CHECK_FALSE(m.cgroup);
}

TEST_CASE("memory limits: a malformed limit, usage or list throws naming the file",
          "[io][memory_limit]") {
  FakeRoot fs;
  fs.meminfo(16 * gib, 10 * gib);
  fs.v2_mounts();
  fs.write("proc/self/cgroup", "0::/svc\n");
  fs.v2_cgroup("/svc", std::to_string(2 * gib), gib, v2_stat(0, 0));
  auto read = [&] { return read_memory_limits(fs.root()); };
  const std::string dir = fs.file("sys/fs/cgroup/svc");

  SECTION("memory.max") {
    fs.write("sys/fs/cgroup/svc/memory.max", "lots\n");
    require_error(read, ErrorKind::invalid_format,
                  {dir + "/memory.max'", "'lots'", "not a byte count or 'max'"});
  }
  SECTION("memory.limit_in_bytes (v1)") {
    fs.hybrid_mounts();
    fs.write("proc/self/cgroup", "4:memory:/svc\n");
    fs.v1_cgroup("/svc", "-1", gib);
    require_error(read, ErrorKind::invalid_format,
                  {"sys/fs/cgroup/memory/svc/memory.limit_in_bytes'", "'-1'"});
  }
  SECTION("memory.current missing next to a limit") {
    std::filesystem::remove(dir + "/memory.current");
    require_error(read, ErrorKind::invalid_format,
                  {dir + "/memory.current'", "missing next to memory.max"});
  }
  SECTION("memory.current not a count") {
    fs.write("sys/fs/cgroup/svc/memory.current", "12 34\n");
    require_error(read, ErrorKind::invalid_format, {dir + "/memory.current'", "not a byte count"});
  }
  SECTION("/proc/self/cgroup") {
    fs.write("proc/self/cgroup", "0::/svc\ngarbage\n");
    require_error(read, ErrorKind::invalid_format,
                  {fs.file("proc/self/cgroup"), "'garbage'", "id:controllers:/path"});
  }
  SECTION("/proc/self/mountinfo") {
    fs.write("proc/self/mountinfo", "30 23 0:26 / /sys/fs/cgroup rw cgroup2 cgroup2 rw\n");
    require_error(read, ErrorKind::invalid_format,
                  {fs.file("proc/self/mountinfo"), "not a mount entry"});
  }
  SECTION("MemAvailable") {
    fs.write("proc/meminfo", "MemTotal: 1024 kB\nMemAvailable: plenty\n");
    require_error(read, ErrorKind::invalid_format, {fs.file("proc/meminfo"), "MemAvailable"});
  }
  SECTION("MemTotal in another unit") {
    fs.write("proc/meminfo", "MemTotal: 1024 MB\nMemAvailable: 512 kB\n");
    require_error(read, ErrorKind::invalid_format, {fs.file("proc/meminfo"), "MemTotal"});
  }
}

TEST_CASE("memory limits: malformed values that could only lower the estimate are unknown",
          "[io][memory_limit]") {
  FakeRoot fs;
  fs.meminfo(16 * gib, 10 * gib);
  fs.v2_mounts();
  fs.write("proc/self/cgroup", "0::/svc\n");
  // A broken line next to the cache size: the whole file is unknown, so no cache is reclaimable.
  fs.v2_cgroup("/svc", std::to_string(4 * gib), 2 * gib,
               "file " + std::to_string(gib) + "\nshmem many\n");
  fs.write("proc/self/status", "VmHWM:\tlarge\nVmRSS:\t 12 pages\n");
  const MemoryLimits m = read_memory_limits(fs.root());
  REQUIRE(m.cgroup);
  CHECK_FALSE(m.cgroup->reclaimable_cache);
  CHECK(m.usable_bytes() == 2 * gib);
  CHECK_FALSE(m.rss);
  CHECK_FALSE(m.peak_rss);
}

TEST_CASE("memory limits: headroom is never below zero", "[io][memory_limit]") {
  moekit::io::CgroupMemory c{1, "/x", "memory.limit_in_bytes", gib, gib + 4096, 0};
  CHECK(c.headroom() == 0);
  c.reclaimable_cache = 2 * gib;  // more cache than usage: at most the usage is droppable
  CHECK(c.headroom() == gib);
}

TEST_CASE("memory limits: this machine's files are consistent", "[io][memory_limit][real]") {
  const MemoryLimits m = read_memory_limits();
  const auto usable = m.usable_bytes();
  INFO("usable " << (usable ? std::to_string(*usable) : "unknown") << " bytes, from "
                 << m.source());
  INFO("MemTotal " << m.mem_total.value_or(0) << ", MemAvailable " << m.mem_available.value_or(0)
                   << ", RSS " << m.rss.value_or(0) << ", peak RSS " << m.peak_rss.value_or(0));
  const std::string cgroup_text =
      m.cgroup ? m.cgroup->describe() + ": limit " + std::to_string(m.cgroup->limit) + ", usage " +
                     std::to_string(m.cgroup->usage) + ", reclaimable cache " +
                     std::to_string(m.cgroup->reclaimable_cache.value_or(0)) + ", headroom " +
                     std::to_string(m.cgroup->headroom())
               : std::string("no cgroup memory limit");
  INFO(cgroup_text);
  REQUIRE(m.mem_total);  // Linux always has /proc/meminfo
  REQUIRE(usable);
  CHECK(*usable > 0);
  CHECK(*usable <= *m.mem_total);
  if (m.mem_available) CHECK(*m.mem_available <= *m.mem_total);
  if (m.cgroup) CHECK(m.cgroup->headroom() <= m.cgroup->limit);
  if (m.rss && m.peak_rss) CHECK(*m.rss <= *m.peak_rss);
  CHECK(m.source() != "unknown");
}

TEST_CASE("memory limits: ulimit -v bounds what is usable, less the address space in use",
          "[io][memory_limit]") {
  FakeRoot fs;
  fs.meminfo(16 * gib, 12 * gib);
  fs.write("proc/self/status", "Name:\tmoe-run\nVmSize:\t  102400 kB\nVmRSS:\t    2048 kB\n");
  const MemoryLimits m = read_memory_limits(fs.root(), 4 * gib);
  CHECK(m.address_space_left == 4 * gib - 100 * mib);
  CHECK(m.usable_bytes() == 4 * gib - 100 * mib);
  CHECK(m.source() == "ulimit -v (RLIMIT_AS)");
  // A limit above MemAvailable does not bind.
  const MemoryLimits wide = read_memory_limits(fs.root(), 64 * gib);
  CHECK(wide.usable_bytes() == 12 * gib);
  CHECK(wide.source() == "MemAvailable");
  // No limit (or a fake root without one): unknown, as before.
  CHECK_FALSE(read_memory_limits(fs.root()).address_space_left);
}

}  // namespace memory_limit_test
