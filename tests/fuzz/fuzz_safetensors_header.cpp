// libFuzzer target: a whole safetensors file must parse or raise moekit::Error.
#include <cstddef>
#include <cstdint>
#include <span>

#include "moekit/error.hpp"
#include "moekit/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto h = moekit::io::parse_safetensors(bytes, "fuzz.safetensors");
    // Invariants the parser promises: every tensor lies inside the data section.
    for (const auto& t : h.tensors)
      if (t.begin > t.end || h.data_offset + t.end > size) __builtin_trap();
  } catch (const moekit::Error&) {
  }
  return 0;
}
