#pragma once
/// \file Per-thread bodies of the CUDA dequant-GEMV, expert-FFN and dequantize kernels
/// (kernels/*.cu), as host/device functions of (lane, row, inputs) so that the tests run them on
/// the CPU under `simt/emulator.hpp`.
///
/// GEMV is warp-per-row: lane `l` takes the 16-byte payload chunks l, l+32, l+64, … of its row
/// (one 128-bit load each; 16 / 32 / 64 weights at q8 / q4 / q2), loads the matching
/// activations with 128-bit loads, and accumulates in fp32 group by group (each 32-bit word of a
/// chunk lies inside one group because groups are multiples of 32 weights). Columns after the
/// last whole chunk go one per lane. The warp then sums the lanes (`warp_sum`).

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "moekit/config.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/half.hpp"
#include "moekit/precision/simt/warp.hpp"

namespace moekit::simt {

/// Activation element types of the CUDA kernels.
template <class T>
concept KernelActivation =
    std::same_as<T, Float16> || std::same_as<T, BFloat16> || std::same_as<T, float>;

/// Loads `N` consecutive activations starting at `x` as floats; 128-bit loads when the block is
/// a multiple of 16 bytes and `Aligned`.
template <class Act, unsigned N, bool Aligned>
MOEKIT_HOST_DEVICE inline void load_activations(const Act* x, float (&out)[N]) noexcept {
  constexpr unsigned bytes = N * sizeof(Act);
  if constexpr (bytes % 16 == 0) {
    constexpr unsigned per = 16 / sizeof(Act);
    MOEKIT_PRAGMA_UNROLL
    for (unsigned v = 0; v < N / per; ++v) {
      const Vec128 raw = load128<Aligned>(x + v * per);
      MOEKIT_PRAGMA_UNROLL
      for (unsigned i = 0; i < per; ++i) {
        if constexpr (sizeof(Act) == 4) {
          out[v * per + i] = detail::bits_to_float(raw.w[i]);
        } else {
          const auto bits16 = static_cast<std::uint16_t>(raw.w[i / 2] >> (16 * (i % 2)));
          out[v * per + i] = to_float(Act{bits16});
        }
      }
    }
  } else {
    MOEKIT_PRAGMA_UNROLL
    for (unsigned i = 0; i < N; ++i) out[i] = to_float(x[i]);
  }
}

/// Group scale / zero of a quantized row (device-safe, any alignment).
MOEKIT_HOST_DEVICE inline float row_scale(const std::byte* row, const RowLayout& l,
                                          std::size_t g) noexcept {
  return half_bits_to_float(load_u16(row + l.scales_offset + 2 * g));
}
MOEKIT_HOST_DEVICE inline float row_zero(const std::byte* row, const RowLayout& l,
                                         std::size_t g) noexcept {
  return l.affine ? half_bits_to_float(load_u16(row + l.zeros_offset + 2 * g)) : l.symmetric_zero;
}

/// Lane `lane`'s partial of row · x for a quantized row of `Bits` bits.
/// `Aligned`: the row, its payload and x are 16-byte aligned (checked by the launcher).
template <unsigned Bits, KernelActivation Act, bool Aligned>
MOEKIT_HOST_DEVICE inline float gemv_lane(unsigned lane, const std::byte* row, const RowLayout& l,
                                          const Act* x) noexcept {
  constexpr unsigned per_chunk = 128 / Bits;  // weights per 16-byte chunk
  constexpr unsigned per_word = 32 / Bits;    // weights per 32-bit word
  constexpr std::uint32_t mask = (1u << Bits) - 1u;
  // Column arithmetic in 32 bits: 64-bit division is a slow call on the GPU (cols < 2^32).
  const auto cols = static_cast<unsigned>(l.cols);
  const auto group_size = static_cast<unsigned>(l.group_size);
  const unsigned chunks = cols / per_chunk;
  float acc = 0.f;
  // Step through a chunk in blocks whose activations fill whole 16-byte loads (one group each).
  constexpr unsigned act_per_load = 16 / sizeof(Act);
  constexpr unsigned step = per_word > act_per_load ? per_word : act_per_load;
  for (unsigned k = lane; k < chunks; k += warp_size) {
    const Vec128 q = load128<Aligned>(row + 16 * static_cast<std::size_t>(k));
    MOEKIT_PRAGMA_UNROLL
    for (unsigned s = 0; s < per_chunk / step; ++s) {
      const unsigned c = k * per_chunk + s * step;
      const unsigned g = c / group_size;
      const float z = row_zero(row, l, g);
      float xs[step];
      load_activations<Act, step, Aligned>(x + c, xs);
      float dot = 0.f;
      MOEKIT_PRAGMA_UNROLL
      for (unsigned j = 0; j < step; ++j) {
        const unsigned i = s * step + j;  // weight within the chunk
        const std::uint32_t code = (q.w[i / per_word] >> ((i % per_word) * Bits)) & mask;
        dot += (static_cast<float>(code) - z) * xs[j];
      }
      acc += row_scale(row, l, g) * dot;
    }
  }
  for (unsigned c = chunks * per_chunk + lane; c < cols; c += warp_size) {
    const unsigned g = c / group_size;
    acc += row_scale(row, l, g) *
           (static_cast<float>(read_code(row, c, Bits)) - row_zero(row, l, g)) * to_float(x[c]);
  }
  return acc;
}

/// Arguments of one warp-per-row GEMV launch: y[r] = scale·(W_r·x) (+ y[r] when accumulating).
template <class Act>
struct GemvArgs {
  const std::byte* w = nullptr;  ///< rows × row_stride bytes
  std::size_t rows = 0;
  std::size_t row_stride = 0;
  RowLayout layout{};
  const Act* x = nullptr;
  float* y = nullptr;
  float scale = 1.f;
  bool accumulate = false;
};

/// What lane 0 does with the warp's total for row `r`.
template <class Act>
MOEKIT_HOST_DEVICE inline void gemv_finish(const GemvArgs<Act>& a, std::size_t r,
                                           float total) noexcept {
  const float v = a.scale * total;
  a.y[r] = a.accumulate ? a.y[r] + v : v;
}

/// SiLU(a) = a·σ(a).
MOEKIT_HOST_DEVICE inline float silu(float a) noexcept {
#if defined(__CUDA_ARCH__)
  return a / (1.f + __expf(-a));
#else
  return a / (1.f + std::exp(-a));
#endif
}

/// Arguments of the first expert-FFN kernel: h[r] = silu(w1_r·x) · (w3_r·x), warp per row r.
template <class Act>
struct UpGateArgs {
  const std::byte* w1 = nullptr;
  const std::byte* w3 = nullptr;
  std::size_t rows = 0;        ///< ffn
  std::size_t row_stride = 0;  ///< both matrices have the same format
  RowLayout layout{};
  const Act* x = nullptr;
  float* h = nullptr;
};

/// Dequantize-for-cuBLASLt body: thread `t` writes weights [8j, 8j+8) of row r (t = r·⌈cols/8⌉ + j)
/// as f16 into `out` (row-major rows × cols).
struct DequantArgs {
  const std::byte* w = nullptr;
  std::size_t rows = 0;
  std::size_t row_stride = 0;
  RowLayout layout{};
  std::uint16_t* out = nullptr;  ///< f16 bits
};

MOEKIT_HOST_DEVICE inline void dequant_thread(std::size_t t, const DequantArgs& a) noexcept {
  const std::size_t per_row = (a.layout.cols + 7) / 8;
  const std::size_t r = t / per_row;
  if (r >= a.rows) return;
  const std::size_t c0 = (t % per_row) * 8;
  const std::byte* row = a.w + r * a.row_stride;
  const RowLayout& l = a.layout;
  for (std::size_t c = c0; c < c0 + 8 && c < l.cols; ++c) {
    const std::size_t g = c / l.group_size;
    const float v = row_scale(row, l, g) *
                    (static_cast<float>(read_code(row, c, l.bits)) - row_zero(row, l, g));
    a.out[r * l.cols + c] = float_to_half_bits(v);
  }
}

}  // namespace moekit::simt
