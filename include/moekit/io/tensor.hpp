#pragma once
/// \file DType and TensorView: what the safetensors and GGUF readers hand out.
///
/// A TensorView is a zero-copy window into a mapped file: element type, row-major shape
/// (outermost first, the last dimension is contiguous: `{rows, cols}` for a matrix; GGUF's
/// innermost-first `ne[]` is reversed on read), and the bytes.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "moekit/error.hpp"

namespace moekit::io {

/// Element formats the readers can hand out. The block formats follow ggml's definitions
/// (see dequantize.hpp for their layouts).
enum class DType : std::uint8_t { f32, f16, bf16, q8_0, q4_0, q4_k, q2_k, q3_k, q5_k, q6_k };

/// Weights per block (1 for the plain float types).
constexpr std::uint64_t block_elements(DType t) noexcept {
  switch (t) {
    case DType::f32:
    case DType::f16:
    case DType::bf16:
      return 1;
    case DType::q8_0:
    case DType::q4_0:
      return 32;
    case DType::q4_k:
    case DType::q2_k:
    case DType::q3_k:
    case DType::q5_k:
    case DType::q6_k:
      return 256;
  }
  return 1;
}

/// Bytes per block.
constexpr std::uint64_t block_bytes(DType t) noexcept {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::q8_0:
      return 34;  // f16 d, int8 qs[32]
    case DType::q4_0:
      return 18;  // f16 d, uint8 qs[16]
    case DType::q4_k:
      return 144;  // f16 d, f16 dmin, uint8 scales[12], uint8 qs[128]
    case DType::q2_k:
      return 84;  // uint8 scales[16], uint8 qs[64], f16 d, f16 dmin
    case DType::q3_k:
      return 110;  // uint8 hmask[32], uint8 qs[64], uint8 scales[12], f16 d
    case DType::q5_k:
      return 176;  // f16 d, f16 dmin, uint8 scales[12], uint8 qh[32], uint8 qs[128]
    case DType::q6_k:
      return 210;  // uint8 ql[128], uint8 qh[64], int8 scales[16], f16 d
  }
  return 0;
}

constexpr std::string_view name(DType t) noexcept {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f16:
      return "F16";
    case DType::bf16:
      return "BF16";
    case DType::q8_0:
      return "Q8_0";
    case DType::q4_0:
      return "Q4_0";
    case DType::q4_k:
      return "Q4_K";
    case DType::q2_k:
      return "Q2_K";
    case DType::q3_k:
      return "Q3_K";
    case DType::q5_k:
      return "Q5_K";
    case DType::q6_k:
      return "Q6_K";
  }
  return "?";
}

/// Most dimensions a tensor may have (GGML_MAX_DIMS).
inline constexpr std::size_t max_tensor_rank = 4;

/// A zero-copy view of one tensor in a mapped file. Valid while its reader lives.
struct TensorView {
  std::string_view name;  ///< tensor name in the file
  std::string_view file;  ///< file it lives in (for error messages)
  DType dtype = DType::f32;
  std::array<std::uint64_t, max_tensor_rank> dims{};  ///< row-major, outermost first
  std::size_t rank = 0;
  std::uint64_t file_offset = 0;  ///< absolute offset of bytes in the file
  std::span<const std::byte> bytes;

  [[nodiscard]] std::span<const std::uint64_t> shape() const noexcept {
    return {dims.data(), rank};
  }
  [[nodiscard]] std::uint64_t elements() const noexcept {
    std::uint64_t n = 1;
    for (std::size_t i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  /// Rows and columns when seen as a matrix: cols = last dimension, rows = product of the rest.
  [[nodiscard]] std::uint64_t cols() const noexcept { return rank == 0 ? 1 : dims[rank - 1]; }
  [[nodiscard]] std::uint64_t rows() const noexcept { return rank == 0 ? 1 : elements() / cols(); }
  /// "name (file, offset N)" for error messages.
  [[nodiscard]] std::string where() const {
    return "tensor '" + std::string(name) + "' in '" + std::string(file) + "' at offset " +
           std::to_string(file_offset);
  }
};

/// Bytes of `elements` weights of type `t` whose innermost dimension is `cols`, or nullopt when
/// `cols` is not a whole number of blocks or the size overflows.
inline std::optional<std::uint64_t> tensor_bytes(DType t, std::uint64_t elements,
                                                 std::uint64_t cols) noexcept {
  const std::uint64_t be = block_elements(t);
  if (cols % be != 0) return std::nullopt;
  std::uint64_t r;
  if (__builtin_mul_overflow(elements / be, block_bytes(t), &r)) return std::nullopt;
  return r;
}

/// Returns the sub-tensor `index` along the outermost dimension (e.g. one expert of GGUF's
/// stacked `[n_expert, rows, cols]` tensors) as a view of rank-1 dimensions.
inline TensorView slice_outer(const TensorView& t, std::uint64_t index) {
  if (t.rank < 2 || index >= t.dims[0])
    throw Error(ErrorKind::invalid_argument, "cannot take slice " + std::to_string(index) + " of " +
                                                 t.where() + " (rank " + std::to_string(t.rank) +
                                                 ", outer dimension " +
                                                 std::to_string(t.rank ? t.dims[0] : 0) + ")");
  TensorView s = t;
  s.rank = t.rank - 1;
  for (std::size_t i = 0; i + 1 < t.rank; ++i) s.dims[i] = t.dims[i + 1];
  s.dims[t.rank - 1] = 0;
  const std::uint64_t per = t.bytes.size() / t.dims[0];
  s.bytes = t.bytes.subspan(index * per, per);
  s.file_offset = t.file_offset + index * per;
  return s;
}

}  // namespace moekit::io
