// libFuzzer target: the .mklogp log-prob file (moe-run --save-logits / --kl-reference;
// LogProbFile::parse: header, K and vocab, record count against the size, every id and log-prob)
// must parse or raise moekit::Error; a parsed file must survive its own writer byte for byte.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "moekit/engine/logprob_file.hpp"
#include "moekit/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const auto file = moekit::engine::LogProbFile::parse(bytes, "fuzz.mklogp");
    const std::vector<std::byte> again = file.to_bytes();
    std::uint32_t version = 0;
    std::memcpy(&version, data + 8, sizeof version);  // parse checked the 32-byte header
    // version 1 files are rewritten as version 2, with the same records
    if (again.size() != size || (version == 2 && std::memcmp(again.data(), data, size) != 0) ||
        std::memcmp(again.data() + 32, data + 32, size - 32) != 0)
      __builtin_trap();  // the writer and the reader disagree
  } catch (const moekit::Error&) {
  }
  return 0;
}
