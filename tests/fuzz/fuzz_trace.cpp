// libFuzzer target: every routing-trace reader (binary .mktrace, our JSONL, the two shared Mixtral
// JSONL formats) must parse or raise moekit::Error. The first byte picks the reader.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "moekit/error.hpp"
#include "moekit/sim/trace_binary.hpp"
#include "moekit/sim/trace_jsonl.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data) + 1, size - 1);
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 4) {
      case 0:
        (void)moekit::sim::parse_trace_binary(bytes, "fuzz.mktrace");
        break;
      case 1:
        (void)moekit::sim::parse_trace_jsonl(text, "fuzz.jsonl");
        break;
      case 2:
        (void)moekit::sim::parse_mixtral_decode_jsonl(text, "fuzz.decode.jsonl");
        break;
      default:
        (void)moekit::sim::parse_mixtral_raw_jsonl(text, "fuzz.raw.jsonl");
        break;
    }
  } catch (const moekit::Error&) {
  }
  return 0;
}
