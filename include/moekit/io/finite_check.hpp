#pragma once
/// \file Refusing NaN/Inf weights as they are read. A non-finite weight in a router, embedding,
/// norm or projection does not crash anything: it turns every later activation into NaN, and a
/// run "succeeds" with text of "⁇" and a perplexity of nan. The checks test the exponent bits of
/// the stored values (f32/f16/bf16, and the f16 block scales of Q8_0/Q4_0 — their int codes are
/// always finite), or the f32 values a tensor was dequantized to, and name the tensor, its file
/// and the first bad index.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "moekit/error.hpp"
#include "moekit/io/tensor.hpp"

namespace moekit::io {

/// Index of the first NaN or infinity in `v`, or nullopt.
inline std::optional<std::size_t> first_non_finite(std::span<const float> v) noexcept {
  // The exponent test, not std::isfinite: no branch on the value, vectorizes.
  std::uint32_t any = 0;
  constexpr std::size_t block = 1024;
  for (std::size_t b = 0; b < v.size(); b += block) {
    const std::size_t end = std::min(v.size(), b + block);
    for (std::size_t i = b; i < end; ++i) {
      std::uint32_t u;
      std::memcpy(&u, &v[i], 4);
      any |= static_cast<std::uint32_t>((u & 0x7F800000u) == 0x7F800000u);
    }
    if (any)
      for (std::size_t i = b; i < end; ++i)
        if (!std::isfinite(v[i])) return i;
  }
  return std::nullopt;
}

namespace detail {

// Index (in 16-bit units of `bytes`, stride `stride`) of the first value whose exponent bits
// under `mask` are all ones.
inline std::optional<std::uint64_t> first_all_ones_u16(std::span<const std::byte> bytes,
                                                       std::size_t stride, std::uint16_t mask) {
  for (std::size_t off = 0; off + 2 <= bytes.size(); off += stride) {
    std::uint16_t h;
    std::memcpy(&h, bytes.data() + off, 2);
    if ((h & mask) == mask) return off / stride;
  }
  return std::nullopt;
}

[[noreturn]] inline void fail_non_finite(const TensorView& t, std::uint64_t index,
                                         std::string_view context, std::string_view what) {
  std::string at = "index " + std::to_string(index);
  if (t.rank >= 2 && t.dims[t.rank - 1] > 0) {
    const std::uint64_t cols = t.dims[t.rank - 1];
    at +=
        " (row " + std::to_string(index / cols) + ", column " + std::to_string(index % cols) + ")";
  }
  moekit::detail::fail(ErrorKind::invalid_format,
                       t.where() + (context.empty() ? "" : " (" + std::string(context) + ")") +
                           ": " + std::string(what) + " at " + at +
                           " is not finite (NaN or infinity); the checkpoint is damaged");
}

}  // namespace detail

/// Throws `Error(invalid_format)` naming `t` (and `context`, e.g. "layer 3, expert 5") when a
/// stored value of `t` is NaN or infinite: f32/f16/bf16 values, Q8_0/Q4_0 block scales (the index
/// is then the block's first weight). K-quants are not checked here: check what they dequantize
/// to (require_finite on the values).
inline void require_finite_stored(const TensorView& t, std::string_view context = "") {
  std::optional<std::uint64_t> bad;
  std::uint64_t per = 1;
  switch (t.dtype) {
    case DType::f32: {
      for (std::size_t i = 0; i + 4 <= t.bytes.size(); i += 4) {
        std::uint32_t u;
        std::memcpy(&u, t.bytes.data() + i, 4);
        if ((u & 0x7F800000u) == 0x7F800000u) {
          bad = i / 4;
          break;
        }
      }
      break;
    }
    case DType::f16:
      bad = detail::first_all_ones_u16(t.bytes, 2, 0x7C00);
      break;
    case DType::bf16:
      bad = detail::first_all_ones_u16(t.bytes, 2, 0x7F80);
      break;
    case DType::q8_0:
    case DType::q4_0:
      per = block_elements(t.dtype);
      bad = detail::first_all_ones_u16(t.bytes, block_bytes(t.dtype), 0x7C00);
      break;
    case DType::q2_k:
    case DType::q3_k:
    case DType::q4_k:
    case DType::q5_k:
    case DType::q6_k:
      return;
  }
  if (bad) detail::fail_non_finite(t, *bad * per, context, per > 1 ? "a block scale" : "a value");
}

/// Throws `Error(invalid_format)` naming `t` (and `context`) when `values`, what `t` was
/// dequantized to, hold a NaN or infinity.
inline void require_finite(const TensorView& t, std::span<const float> values,
                           std::string_view context = "") {
  if (const auto i = first_non_finite(values))
    detail::fail_non_finite(t, *i, context, "value " + std::to_string(values[*i]));
}

}  // namespace moekit::io
