// libFuzzer target: a whole GGUF file must parse or raise moekit::Error; every tensor it accepts
// must dequantize inside the file's bytes, and the K-quant ones (read in place as moekit's
// q2_k .. q6_k) must run through the int8-activation row kernel inside those bytes.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/io/dequantize.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/io/gguf_transcode.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/kquant_activation.hpp"
#include "moekit/precision/kquant_int8_rows.hpp"

namespace {
// The K-quant rows of a tensor through the portable int8-activation kernel, as a moekit matrix
// over the file's bytes. (The SIMD kernels read the same offsets; this target cannot include
// gemv.hpp, whose CPU feature names clang 14's __builtin_cpu_supports does not know.)
void kquant_rows(std::span<const std::byte> bytes, std::size_t rows, std::size_t cols,
                 moekit::Precision p) {
  const moekit::MatrixView w = moekit::make_matrix_view(bytes, rows, cols, p);
  std::vector<float> x(cols);
  for (std::size_t c = 0; c < cols; ++c) x[c] = static_cast<float>(c % 7) - 3.f;
  moekit::KQuantStorage st;
  const moekit::KQuantActivation a = moekit::prepare_kquant(x.data(), cols, p, st);
  float sink = 0;
  for (std::size_t r = 0; r < rows; ++r)
    sink += moekit::scalar_kquant::row_dot(p, w.row(r), cols / 256, a);
  volatile float keep = sink;
  (void)keep;
}
}  // namespace

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
      if (const auto p = moekit::io::in_place_moekit_precision(v.dtype); p && v.cols() > 0)
        kquant_rows(v.bytes, v.elements() / v.cols(), v.cols(), *p);
    }
  } catch (const moekit::Error&) {
  }
  return 0;
}
