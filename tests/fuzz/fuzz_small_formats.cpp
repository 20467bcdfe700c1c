// libFuzzer target: the small text/binary files moekit reads — hardware JSON, .npy statistics,
// EdgeMoE bit-width tables and activation-path profiles — must parse or raise moekit::Error.
// The first byte picks the parser.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "moekit/error.hpp"
#include "moekit/predict/activation_path.hpp"
#include "moekit/score/static_bitwidth.hpp"
#include "moekit/sim/hardware.hpp"
#include "moekit/sim/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data) + 1, size - 1);
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 4) {
      case 0:
        (void)moekit::sim::parse_hardware_json(text, "fuzz.json");
        break;
      case 1:
        (void)moekit::sim::parse_npy(bytes, "fuzz.npy");
        break;
      case 2:
        (void)moekit::PrecisionTable::parse(text, "fuzz.bits");
        break;
      default:
        (void)moekit::ActivationPathProfile::parse(text, "fuzz.paths");
        break;
    }
  } catch (const moekit::Error&) {
  }
  return 0;
}
