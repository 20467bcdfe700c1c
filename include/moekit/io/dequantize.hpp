#pragma once
/// \file Scalar conversion of a TensorView to f32, for every DType the readers hand out.
///
/// Block layouts follow ggml's definitions (ggml-common.h / ggml-quants.c, MIT), read from the
/// public specification and reimplemented here:
/// - Q8_0 (32 weights, 34 bytes): f16 d; int8 q[32];                 w = d·q
/// - Q4_0 (32 weights, 18 bytes): f16 d; uint8 qs[16]; weight j<16 is the low nibble of qs[j],
///   weight j+16 its high nibble;                                    w = d·(nibble − 8)
/// - Q4_K (256 weights, 144 bytes): f16 d; f16 dmin; uint8 scales[12]; uint8 qs[128]. Eight
///   sub-blocks of 32 with a 6-bit scale sc and 6-bit min m each (packed in `scales`, see
///   q4k_scale_min); sub-blocks 2i and 2i+1 share qs[32i .. 32i+31] (low then high nibbles);
///   w = d·sc·q − dmin·m
/// - Q2_K (256 weights, 84 bytes): uint8 scales[16]; uint8 qs[64]; f16 d; f16 dmin. Sixteen
///   sub-blocks of 16, scales[s] holds a 4-bit scale (low) and 4-bit min (high); each 128-weight
///   half uses 32 bytes of qs, shifting out 2 bits at a time (shift 0,2,4,6 give 4 runs of 32
///   weights, the first 16 of a run from qs[0..15], the next 16 from qs[16..31]);
///   w = d·sc·q − dmin·m
/// - Q3_K (256 weights, 110 bytes): uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; f16 d.
///   Sixteen sub-blocks of 16 with a 6-bit scale (low 4 bits: nibble s/8 of byte s%8; high 2
///   bits: bits 2·(s/4) of byte 8 + s%4), stored offset by 32. Weight i (half h = i/128, run
///   r = (i%128)/32, l = i%32) has the 2 low bits (qs[32h + l] >> 2r) & 3 and a high bit
///   (hmask[l] >> i/32) & 1 that, when clear, subtracts 4;           w = d·(sc − 32)·q
/// - Q5_K (256 weights, 176 bytes): f16 d; f16 dmin; uint8 scales[12] (as Q4_K); uint8 qh[32];
///   uint8 qs[128]. Sub-block j (of 32) takes the low 4 bits from qs as Q4_K and bit j of qh[l]
///   as bit 4;                                                       w = d·sc·q − dmin·m
/// - Q6_K (256 weights, 210 bytes): uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d.
///   Weight i (half h = i/128, within it n = (i%128)/64 and run r = (i%128)/32, l = i%32): low 4
///   bits are nibble n of ql[64h + i%64], high 2 bits (qh[32h + l] >> 2r) & 3; sub-block of 16
///   s = i/16;                                                       w = d·scales[s]·(q − 32)
///
/// Every product is rounded as gguf-py's `gguf.quants.dequantize` rounds it (f32; d·sc first,
/// then ·q, then − dmin·m), so the values are bit-identical to it (tests/io/data/quant_blocks.gguf
/// holds gguf-py's values). A fused multiply-add would round once instead of twice, so the K-quant
/// block decoders (precision/gguf_q*_k.hpp) are compiled with floating-point contraction off.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/io/detail/bytes.hpp"
#include "moekit/io/tensor.hpp"
#include "moekit/precision/gguf_q2_k.hpp"
#include "moekit/precision/gguf_q3_k.hpp"
#include "moekit/precision/gguf_q4_k.hpp"
#include "moekit/precision/gguf_q5_k.hpp"
#include "moekit/precision/gguf_q6_k.hpp"
#include "moekit/precision/half.hpp"

namespace moekit::io {

namespace detail {

// f16/bf16 decoding is moekit/precision/half.hpp's, the one the kernels and quantizers use.
inline float half_at(const std::byte* p) noexcept {
  return half_bits_to_float(load_le<std::uint16_t>(p));
}
inline std::uint8_t u8_at(const std::byte* p) noexcept { return std::to_integer<std::uint8_t>(*p); }

/// Unpacks the 6-bit scale and min of sub-block j (0..7) from Q4_K's 12 packed bytes:
/// j < 4: low 6 bits of bytes j (scale) and j+4 (min); j >= 4: low/high nibble of byte j+4 plus
/// the top 2 bits of bytes j-4 (scale) and j (min) as bits 4..5.
inline void q4k_scale_min(int j, const std::byte* q, std::uint8_t& sc, std::uint8_t& m) noexcept {
  if (j < 4) {
    sc = u8_at(q + j) & 63;
    m = u8_at(q + j + 4) & 63;
  } else {
    sc = static_cast<std::uint8_t>((u8_at(q + j + 4) & 0xF) | ((u8_at(q + j - 4) >> 6) << 4));
    m = static_cast<std::uint8_t>((u8_at(q + j + 4) >> 4) | ((u8_at(q + j) >> 6) << 4));
  }
}

inline void dequantize_q8_0(const std::byte* b, float* y) noexcept {
  const float d = half_at(b);
  for (int i = 0; i < 32; ++i)
    y[i] = d * static_cast<float>(static_cast<std::int8_t>(u8_at(b + 2 + i)));
}

inline void dequantize_q4_0(const std::byte* b, float* y) noexcept {
  const float d = half_at(b);
  for (int j = 0; j < 16; ++j) {
    const std::uint8_t q = u8_at(b + 2 + j);
    y[j] = d * static_cast<float>((q & 0xF) - 8);
    y[j + 16] = d * static_cast<float>((q >> 4) - 8);
  }
}

// The K-quants are moekit formats too (Precision::q2_k .. q6_k): their decoders are the ones the
// kernels use.
inline void dequantize_q4_k(const std::byte* b, float* y) noexcept { q4_k::decode_block(b, y); }

inline void dequantize_q2_k(const std::byte* b, float* y) noexcept { q2_k::decode_block(b, y); }

inline void dequantize_q3_k(const std::byte* b, float* y) noexcept { q3_k::decode_block(b, y); }

inline void dequantize_q5_k(const std::byte* b, float* y) noexcept { q5_k::decode_block(b, y); }

inline void dequantize_q6_k(const std::byte* b, float* y) noexcept { q6_k::decode_block(b, y); }

}  // namespace detail

/// Converts all of `t` to f32 into `out` (out.size() must equal t.elements()). Throws
/// `Error(invalid_argument)` on a size mismatch and `Error(invalid_format)` when the tensor's
/// bytes do not match its shape.
inline void dequantize(const TensorView& t, std::span<float> out) {
  const std::uint64_t n = t.elements();
  if (out.size() != n)
    throw Error(ErrorKind::invalid_argument,
                "dequantize: output has " + std::to_string(out.size()) + " floats but " +
                    t.where() + " has " + std::to_string(n) + " elements");
  const auto expect = tensor_bytes(t.dtype, n, t.cols());
  if (!expect || *expect != t.bytes.size())
    throw Error(ErrorKind::invalid_format, "dequantize: " + t.where() + " has " +
                                               std::to_string(t.bytes.size()) +
                                               " bytes, which does not match its shape and type " +
                                               std::string(name(t.dtype)));
  const std::byte* p = t.bytes.data();
  float* y = out.data();
  const std::uint64_t be = block_elements(t.dtype), bb = block_bytes(t.dtype);
  for (std::uint64_t i = 0; i < n / be; ++i, p += bb, y += be) {
    switch (t.dtype) {
      case DType::f32:
        *y = detail::load_le<float>(p);
        break;
      case DType::f16:
        *y = detail::half_at(p);
        break;
      case DType::bf16:
        *y = bf16_bits_to_float(detail::load_le<std::uint16_t>(p));
        break;
      case DType::q8_0:
        detail::dequantize_q8_0(p, y);
        break;
      case DType::q4_0:
        detail::dequantize_q4_0(p, y);
        break;
      case DType::q4_k:
        detail::dequantize_q4_k(p, y);
        break;
      case DType::q2_k:
        detail::dequantize_q2_k(p, y);
        break;
      case DType::q3_k:
        detail::dequantize_q3_k(p, y);
        break;
      case DType::q5_k:
        detail::dequantize_q5_k(p, y);
        break;
      case DType::q6_k:
        detail::dequantize_q6_k(p, y);
        break;
    }
  }
}

/// Convenience: the whole tensor as a new vector of floats.
inline std::vector<float> dequantize(const TensorView& t) {
  std::vector<float> out(t.elements());
  dequantize(t, out);
  return out;
}

}  // namespace moekit::io
