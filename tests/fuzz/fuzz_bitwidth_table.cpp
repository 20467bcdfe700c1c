// libFuzzer target: the EdgeMoE bit-width table (moe-run --bitwidth-table, moe-sim --bitwidths;
// PrecisionTable::parse) must parse or raise moekit::Error; a parsed table must survive its own
// writer and reader unchanged.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "moekit/error.hpp"
#include "moekit/score/static_bitwidth.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto table = moekit::PrecisionTable::parse(text, "fuzz.bits");
    const auto again = moekit::PrecisionTable::parse(table.to_text(), "fuzz.bits (rewritten)");
    if (again.n_layers() != table.n_layers() || again.n_experts() != table.n_experts() ||
        !std::equal(again.all().begin(), again.all().end(), table.all().begin()))
      std::abort();  // the writer and the reader disagree
  } catch (const moekit::Error&) {
  }
  return 0;
}
