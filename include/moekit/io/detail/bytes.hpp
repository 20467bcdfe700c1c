#pragma once
/// \file Little-endian loads/stores and overflow-checked arithmetic for the file parsers.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>

namespace moekit::io::detail {

/// Reads a little-endian unsigned integer of sizeof(T) bytes (host is little-endian: checked
/// below).
template <class T>
T load_le(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <class T>
void store_le(std::byte* p, T v) noexcept {
  std::memcpy(p, &v, sizeof(T));
}

/// a + b, or nullopt on overflow.
inline std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// a * b, or nullopt on overflow.
inline std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) noexcept {
  return (v + a - 1) / a * a;
}

inline std::string hex64(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 0xF];
  return s;
}

}  // namespace moekit::io::detail

static_assert(std::endian::native == std::endian::little,
              "moekit's file readers assume a little-endian host (safetensors and GGUF are LE)");
