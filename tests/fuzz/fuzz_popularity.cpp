// libFuzzer target: moe-run's --popularity profile (parse_popularity: JSON rows of non-negative
// numbers, one row per MoE layer) must parse or raise moekit::Error. The first byte picks the
// model shape it is checked against (1-8 layers, 1-32 experts).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "moekit/core/model_shape.hpp"
#include "moekit/engine/popularity_file.hpp"
#include "moekit/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  moekit::ModelShape shape;
  shape.n_layers = 1 + (data[0] & 7u);
  shape.n_experts = 1 + (data[0] >> 3);
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const auto popularity = moekit::engine::parse_popularity(text, "fuzz.json", shape);
    if (popularity.size() != std::size_t{shape.n_layers} * shape.n_experts) __builtin_trap();
  } catch (const moekit::Error&) {
  }
  return 0;
}
