// libFuzzer target: a whole GGUF file must parse or raise moekit::Error; every tensor it accepts
// must dequantize inside the file's bytes.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/io/dequantize.hpp"
#include "moekit/io/gguf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto h = moekit::io::parse_gguf(bytes, "fuzz.gguf");
    for (const auto& t : h.tensors) {
      if (h.data_offset + t.offset + t.bytes > size) __builtin_trap();
      if (!t.dtype) continue;
      moekit::io::TensorView v;
      v.name = t.name;
      v.file = "fuzz.gguf";
      v.dtype = *t.dtype;
      v.dims = t.dims;
      v.rank = t.rank;
      v.file_offset = h.data_offset + t.offset;
      v.bytes = bytes.subspan(v.file_offset, t.bytes);
      if (v.elements() > (1u << 20)) continue;  // keep each run fast
      std::vector<float> out(v.elements());
      moekit::io::dequantize(v, out);
    }
  } catch (const moekit::Error&) {
  }
  return 0;
}
