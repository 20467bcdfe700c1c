// libFuzzer target: moe-run's config.json reader (moekit/engine/config.hpp, parse_config_text:
// JSON, architecture, every field's type and range) must build a config or raise moekit::Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "moekit/engine/config.hpp"
#include "moekit/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    (void)moekit::engine::parse_config_text(text, "fuzz/config.json");
  } catch (const moekit::Error&) {
  }
  return 0;
}
