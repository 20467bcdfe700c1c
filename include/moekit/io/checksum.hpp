#pragma once
/// \file XXH64, the checksum of the expert store's blobs.
///
/// Why XXH64: it is specified publicly (Collet, "xxHash fast digest algorithm", XXH64) with test
/// vectors, so other tools can check a store; it processes 32 bytes per step with four
/// independent lanes, faster than a disk reads, so verifying an expert on load is cheap
/// (bench/RESULTS.md, "Verifying blobs on load"); and 64 bits make an accidental match of a
/// corrupted blob negligible. FNV-1a 64 is simpler but byte-serial (a multiply per byte); CRC32C
/// needs SSE4.2 to be fast and has only 32 bits. Implemented here from the specification; streaming
/// and one-shot give equal results.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "moekit/io/detail/bytes.hpp"

namespace moekit::io {

/// Streaming XXH64 (seed 0 by default).
class Xxh64 {
 public:
  explicit Xxh64(std::uint64_t seed = 0) noexcept { reset(seed); }

  void reset(std::uint64_t seed = 0) noexcept {
    seed_ = seed;
    v_[0] = seed + p1 + p2;
    v_[1] = seed + p2;
    v_[2] = seed;
    v_[3] = seed - p1;
    total_ = 0;
    buffered_ = 0;
  }

  void update(std::span<const std::byte> data) noexcept {
    const std::byte* p = data.data();
    std::size_t n = data.size();
    total_ += n;
    if (buffered_ > 0) {
      const std::size_t take = n < 32 - buffered_ ? n : 32 - buffered_;
      std::memcpy(buf_ + buffered_, p, take);
      buffered_ += take;
      p += take;
      n -= take;
      if (buffered_ < 32) return;
      stripe(buf_);
      buffered_ = 0;
    }
    while (n >= 32) {
      stripe(p);
      p += 32;
      n -= 32;
    }
    if (n > 0) {
      std::memcpy(buf_, p, n);
      buffered_ = n;
    }
  }

  [[nodiscard]] std::uint64_t digest() const noexcept {
    std::uint64_t h;
    if (total_ >= 32) {
      h = std::rotl(v_[0], 1) + std::rotl(v_[1], 7) + std::rotl(v_[2], 12) + std::rotl(v_[3], 18);
      for (std::uint64_t v : v_) h = merge(h, v);
    } else {
      h = seed_ + p5;
    }
    h += total_;
    const std::byte* p = buf_;
    std::size_t n = buffered_;
    while (n >= 8) {
      h ^= round(0, detail::load_le<std::uint64_t>(p));
      h = std::rotl(h, 27) * p1 + p4;
      p += 8;
      n -= 8;
    }
    if (n >= 4) {
      h ^= std::uint64_t{detail::load_le<std::uint32_t>(p)} * p1;
      h = std::rotl(h, 23) * p2 + p3;
      p += 4;
      n -= 4;
    }
    while (n > 0) {
      h ^= std::uint64_t{std::to_integer<std::uint8_t>(*p)} * p5;
      h = std::rotl(h, 11) * p1;
      ++p;
      --n;
    }
    h ^= h >> 33;
    h *= p2;
    h ^= h >> 29;
    h *= p3;
    h ^= h >> 32;
    return h;
  }

 private:
  static constexpr std::uint64_t p1 = 0x9E3779B185EBCA87ULL;
  static constexpr std::uint64_t p2 = 0xC2B2AE3D27D4EB4FULL;
  static constexpr std::uint64_t p3 = 0x165667B19E3779F9ULL;
  static constexpr std::uint64_t p4 = 0x85EBCA77C2B2AE63ULL;
  static constexpr std::uint64_t p5 = 0x27D4EB2F165667C5ULL;

  static std::uint64_t round(std::uint64_t acc, std::uint64_t lane) noexcept {
    acc += lane * p2;
    return std::rotl(acc, 31) * p1;
  }
  static std::uint64_t merge(std::uint64_t h, std::uint64_t v) noexcept {
    h ^= round(0, v);
    return h * p1 + p4;
  }
  void stripe(const std::byte* p) noexcept {
    for (int i = 0; i < 4; ++i) v_[i] = round(v_[i], detail::load_le<std::uint64_t>(p + 8 * i));
  }

  std::uint64_t seed_ = 0;
  std::uint64_t v_[4]{};
  std::uint64_t total_ = 0;
  std::byte buf_[32]{};
  std::size_t buffered_ = 0;
};

/// One-shot XXH64 of `data`.
inline std::uint64_t xxh64(std::span<const std::byte> data, std::uint64_t seed = 0) noexcept {
  Xxh64 h(seed);
  h.update(data);
  return h.digest();
}

}  // namespace moekit::io
