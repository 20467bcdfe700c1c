#pragma once
// Shared by the bench/io programs: a temporary expert store of Mixtral-matrix-sized experts, the
// raw sequential O_DIRECT bandwidth of a file region, medians and a small flag parser.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "moekit/io/aligned_buffer.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/expert_store.hpp"

namespace moekit::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// hidden 4096, ffn 4779: one expert is ~117 MB at f16 and ~33 MB at q4 (the sizes issue 8 names).
inline ModelShape bench_shape(std::uint32_t n_experts) {
  return ModelShape{.n_layers = 2, .n_experts = n_experts, .top_k = 1, .hidden = 4096, .ffn = 4779};
}

/// An expert store file written at construction (f16 + q4 blobs, non-constant bytes) and removed
/// at destruction.
class TempStore {
 public:
  TempStore(const std::string& dir, const std::string& name, ModelShape shape)
      : path_(dir + "/" + name), shape_(shape) {
    std::filesystem::remove(path_);
    std::printf("writing %s (%u experts x f16 + q4) ...\n", path_.c_str(),
                shape.n_layers * shape.n_experts);
    const std::vector<Precision> ps{Precision::f16, Precision::q4};
    io::write_expert_store(path_, shape, ps,
                           [&](ExpertKey k, Precision p) {
                             // Pseudo-random bytes: nothing a virtual disk could compress or skip.
                             std::vector<std::byte> v(shape.expert_bytes(p));
                             std::uint64_t x =
                                 0x9E3779B97F4A7C15ull * (k.layer * 1000 + k.expert + 1);
                             for (std::size_t i = 0; i + 8 <= v.size(); i += 8) {
                               x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                               std::memcpy(v.data() + i, &x, 8);
                             }
                             return v;
                           },
                           {.verify = false});
  }
  ~TempStore() { std::filesystem::remove(path_); }
  TempStore(const TempStore&) = delete;
  TempStore& operator=(const TempStore&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] const ModelShape& shape() const { return shape_; }

 private:
  std::string path_;
  ModelShape shape_;
};

/// Raw bandwidth (bytes/s): [begin, end) read front to back in `chunk`-byte O_DIRECT preads by
/// `depth` threads, each owning an interleaved stripe (so `depth` requests are in flight).
inline double raw_bandwidth(const std::string& path, std::uint64_t begin, std::uint64_t end,
                            unsigned depth, std::uint64_t chunk = 8u << 20) {
  io::PreadSource src(path, {.direct = true});
  std::vector<std::thread> ts;
  const auto t0 = Clock::now();
  for (unsigned t = 0; t < depth; ++t)
    ts.emplace_back([&, t] {
      io::AlignedBuffer buf(chunk);
      for (std::uint64_t off = begin + t * chunk; off < end; off += depth * chunk)
        src.read({off, std::min(chunk, end - off)}, buf.span());
    });
  for (auto& t : ts) t.join();
  return static_cast<double>(end - begin) / seconds_since(t0);
}

/// `--name value` flags; prints usage and exits on anything unknown.
struct Flags {
  int argc;
  char** argv;
  const char* usage;
  [[nodiscard]] std::string get(const char* name, std::string fallback) const {
    for (int i = 1; i + 1 < argc; i += 2)
      if (!std::strcmp(argv[i], name)) return argv[i + 1];
    return fallback;
  }
  void check(std::initializer_list<const char*> known) const {
    for (int i = 1; i < argc; i += 2) {
      bool ok = i + 1 < argc;
      if (ok)
        ok = std::any_of(known.begin(), known.end(),
                         [&](const char* k) { return !std::strcmp(argv[i], k); });
      if (!ok) {
        std::fprintf(stderr, "usage: %s %s\n", argv[0], usage);
        std::exit(2);
      }
    }
  }
};

}  // namespace moekit::bench
