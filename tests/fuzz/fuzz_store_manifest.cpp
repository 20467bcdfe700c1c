// libFuzzer target: the expert store's header page and manifest must parse or raise moekit::Error.
// Input: 8 bytes of little-endian `data_end`, then the manifest JSON.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "moekit/error.hpp"
#include "moekit/io/expert_store.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    (void)moekit::io::parse_store_header(bytes, size, "fuzz.moestore");
  } catch (const moekit::Error&) {
  }
  if (size < 8) return 0;
  std::uint64_t data_end;
  std::memcpy(&data_end, data, 8);
  const std::string_view text(reinterpret_cast<const char*>(data) + 8, size - 8);
  try {
    const auto m = moekit::io::parse_store_manifest(text, data_end, "fuzz.moestore");
    for (const auto& b : m.blobs)
      if (b.offset % 4096 != 0 || b.offset + b.bytes > data_end) __builtin_trap();
  } catch (const moekit::Error&) {
  }
  return 0;
}
