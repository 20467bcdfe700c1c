#pragma once
/// \file Exact conversion of GGUF Q4_0 / Q8_0 tensor data into moekit's q4 / q8 rows with groups
/// of 32, symmetric (`gguf_exact_scheme`), so that a GGUF checkpoint's experts run in moekit's
/// kernels with the very values llama.cpp would use.
///
/// Why it is exact: a Q4_0 block (f16 d; uint8 qs[16]; w = d·(nibble − 8)) and a Q8_0 block
/// (f16 d; int8 q[32]; w = d·q) are one group of 32 weights with one f16 scale and a symmetric
/// zero, which is moekit's q4 / q8 group-32 symmetric group (w = scale·(code − 2^(bits−1))): the
/// scale is `d` bit for bit, a q4 code is the nibble itself and a q8 code is q + 128. Nothing is
/// re-rounded; the conversion only moves bytes (Q4_0 keeps weight j and j+16 in one byte, moekit
/// keeps columns 2k and 2k+1) and flips the sign bit of Q8_0's codes. Both formats take the same
/// number of bytes per row (payload and one f16 per 32 weights), so a matrix keeps its size.
///
/// In place: a row's codes can be written over its own blocks, front to back, because block i's
/// codes land before block i's source and so never over a block not yet read; only the scales
/// must wait in a scratch until the row's codes are done, since their place at the end of the row
/// is still source. So a loader can read the raw GGUF bytes into the buffer the expert lives in
/// and convert them there (`transcode_in_place`).
///
/// Panels (MatrixOrder::panels4 / blocked_panels4, precision/panels.hpp) are written directly:
/// each 512-column step of a row is a whole number of blocks, so its codes and scales go straight
/// to their places in the panel, with no full-size buffer in between. In place, a panel group is
/// a run of whole rows that occupies the same bytes before and after, so only that group is
/// copied aside (one panel, or one group of blocked_panels4) before it is written.
///
/// Block layouts: ggml's definitions (ggml-common.h), as io/dequantize.hpp documents them.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/detail/gguf_block_codes_x86.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/io/tensor.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/panels.hpp"

namespace moekit::io {

/// The scheme of a transcoded matrix: groups of 32 weights (one GGUF block), symmetric.
inline constexpr QuantScheme gguf_exact_scheme{32, false};

/// The moekit precision that holds every value of `t` exactly under `gguf_exact_scheme`
/// (Q4_0 -> q4, Q8_0 -> q8), or nullopt (the k-quants have per-sub-block minimums and two-level
/// scales that moekit's rows do not store; the float types are not converted here).
constexpr std::optional<Precision> exact_moekit_precision(DType t) noexcept {
  if (t == DType::q4_0) return Precision::q4;
  if (t == DType::q8_0) return Precision::q8;
  return std::nullopt;
}

/// The same for a ggml type number as a GGUF tensor info stores it (`GgufTensorInfo::ggml_type`).
constexpr std::optional<Precision> exact_moekit_precision(std::uint32_t type) noexcept {
  if (type == ggml_type::q4_0) return Precision::q4;
  if (type == ggml_type::q8_0) return Precision::q8;
  return std::nullopt;
}

/// The moekit format whose rows are `t`'s blocks as they lie in the file, so a tensor of type `t`
/// is used in place (no transcode): the K-quants Q2_K .. Q6_K (Precision::q2_k .. q6_k;
/// precision/gguf_q4_k.hpp etc.); nullopt for the other types.
constexpr std::optional<Precision> in_place_moekit_precision(DType t) noexcept {
  if (t == DType::q2_k) return Precision::q2_k;
  if (t == DType::q3_k) return Precision::q3_k;
  if (t == DType::q4_k) return Precision::q4_k;
  if (t == DType::q5_k) return Precision::q5_k;
  if (t == DType::q6_k) return Precision::q6_k;
  return std::nullopt;
}

/// The moekit format that experts stored as `t` are converted into when there is no exact path:
/// the one with at least `t`'s bits per weight (Q6_K, Q5_K -> q8; Q4_K, Q3_K -> q4), except Q2_K,
/// which q2 holds at about its size (a q4 store would double it). The float types and Q8_0/Q4_0
/// map onto themselves.
constexpr Precision nearest_moekit_precision(DType t) noexcept {
  switch (t) {
    case DType::f32:
      return Precision::f32;
    case DType::f16:
      return Precision::f16;
    case DType::bf16:
      return Precision::bf16;
    case DType::q8_0:
    case DType::q6_k:
    case DType::q5_k:
      return Precision::q8;
    case DType::q4_0:
    case DType::q4_k:
    case DType::q3_k:
      return Precision::q4;
    case DType::q2_k:
      return Precision::q2;
  }
  return Precision::q4;
}

static_assert(row_bytes(32, Precision::q4, gguf_exact_scheme) == block_bytes(DType::q4_0));
static_assert(row_bytes(32, Precision::q8, gguf_exact_scheme) == block_bytes(DType::q8_0));

namespace detail {

inline constexpr std::size_t gguf_block_weights = 32;

/// Q4_0's sixteen code bytes (weight j in the low nibble of byte j, weight j+16 in its high
/// nibble) into moekit's column order (columns 2k and 2k+1 in the low and high nibble of byte k),
/// byte by byte: the definition, and the code where SSE2 is missing.
inline void q4_0_codes_scalar(const std::byte* qs, std::byte* out) noexcept {
  std::uint8_t in[16], o[16];
  std::memcpy(in, qs, sizeof in);
  for (int k = 0; k < 8; ++k) {
    const unsigned a = in[2 * k], b = in[2 * k + 1];
    o[k] = static_cast<std::uint8_t>((a & 0x0Fu) | (b << 4));
    o[k + 8] = static_cast<std::uint8_t>((a >> 4) | (b & 0xF0u));
  }
  std::memcpy(out, o, sizeof o);
}

/// q4_0_codes_scalar in SSE2 (part of every x86-64 CPU, so no run-time dispatch): compilers
/// turn the byte loop into scalar shuffling that runs several times slower than memory. Each
/// 16-bit lane holds the byte pair a | b << 8, the pair's two output bytes are computed in two
/// lanes and narrowed together. The whole block is read before anything is written, so `out` may
/// overlap `qs` (in place).
inline void q4_0_codes(const std::byte* qs, std::byte* out) noexcept {
#if defined(__SSE2__)
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low = _mm_set1_epi16(0x000F), high = _mm_set1_epi16(0x00F0);
  const __m128i v4 = _mm_srli_epi16(v, 4), v8 = _mm_srli_epi16(v, 8);
  const __m128i even = _mm_or_si128(_mm_and_si128(v, low), _mm_and_si128(v4, high));
  const __m128i odd = _mm_or_si128(_mm_and_si128(v4, low), _mm_and_si128(v8, high));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(even, odd));
#else
  q4_0_codes_scalar(qs, out);
#endif
}

/// Q8_0's int8 codes into moekit's unsigned ones: q + 128 is q with its sign bit flipped.
inline void q8_0_codes(const std::byte* qs, std::byte* out) noexcept {
  std::uint8_t v[32];
  std::memcpy(v, qs, sizeof v);
  for (auto& b : v) b ^= 0x80u;
  std::memcpy(out, v, sizeof v);
}

/// `blocks` consecutive blocks of type T at `src`: their codes to `codes`, back to back, and their
/// scales to `scales`. Each block is read whole before its codes are written (which may overlap
/// the block's own scale when converting in place). Whole vectors of blocks first, on this CPU's
/// widest path (with non-temporal stores of the codes when `stream`: a destination apart from
/// the source, fenced by the caller), then one block at a time.
template <DType T>
void transcode_blocks(const std::byte* src, std::size_t blocks, std::byte* codes, std::byte* scales,
                      bool stream = false) noexcept {
  constexpr std::size_t bb = block_bytes(T), cb = bb - 2;
  const std::size_t fast = gguf_blocks_simd(T == DType::q4_0, src, blocks, codes, scales, stream);
  src += fast * bb, codes += fast * cb, scales += 2 * fast;
  for (std::size_t i = fast; i < blocks; ++i, src += bb, codes += cb, scales += 2) {
    std::byte d[2];
    std::memcpy(d, src, 2);
    if constexpr (T == DType::q4_0)
      q4_0_codes(src + 2, codes);
    else
      q8_0_codes(src + 2, codes);
    std::memcpy(scales, d, 2);
  }
}

inline void transcode_blocks(DType t, const std::byte* src, std::size_t blocks, std::byte* codes,
                             std::byte* scales, bool stream = false) noexcept {
  if (t == DType::q4_0)
    transcode_blocks<DType::q4_0>(src, blocks, codes, scales, stream);
  else
    transcode_blocks<DType::q8_0>(src, blocks, codes, scales, stream);
}

/// One row of `cols` weights from `src` into `dst` as RowLayout lays it out; `dst` is `src` (in
/// place: `scratch` holds the row's scales, 2 bytes per block) or does not overlap it.
inline void transcode_row_unchecked(DType t, std::size_t cols, const std::byte* src, std::byte* dst,
                                    std::byte* scratch) noexcept {
  const std::size_t blocks = cols / gguf_block_weights;
  const std::size_t payload = blocks * (block_bytes(t) - 2);
  if (src != dst) return transcode_blocks(t, src, blocks, dst, dst + payload, /*stream=*/true);
  transcode_blocks(t, src, blocks, dst, scratch);
  std::memcpy(dst + payload, scratch, 2 * blocks);
}

/// Row n of panel k of a group of `count` panels (`group`: the group's first byte), from the
/// row's blocks at `src` (never the group's own bytes: in place they are set aside first, so the
/// codes are streamed): each step's codes and scales, then the tail (PanelLayout's offsets).
inline void transcode_panel_row(DType t, const PanelLayout& l, const std::byte* src,
                                std::byte* group, std::size_t k, std::size_t n,
                                std::size_t count) noexcept {
  const std::size_t step_blocks = PanelLayout::step_cols / gguf_block_weights;
  const std::size_t step_src = step_blocks * block_bytes(t);
  for (std::size_t s = 0; s < l.steps; ++s)
    transcode_blocks(t, src + s * step_src, step_blocks, group + l.codes(k, s, n, count),
                     group + l.scales(k, s, n, count), /*stream=*/true);
  const std::size_t tail = l.tail_row(k, n, count);
  transcode_blocks(t, src + l.steps * step_src, l.tail.groups, group + tail,
                   group + tail + l.tail.scales_offset, /*stream=*/true);
}

/// A checked matrix (`dst` is `src` or apart from it) into panels of `order`.
inline void transcode_panels(DType t, Precision p, const std::byte* src, std::size_t rows,
                             std::size_t cols, std::byte* dst, MatrixOrder order) {
  const PanelLayout l = PanelLayout::of(cols, p, gguf_exact_scheme, order);
  const std::size_t h = PanelLayout::height, panels = rows / h, stride = l.row.bytes;
  const bool in_place = src == dst;
  // A group is the same run of whole rows before and after, so in place only it is set aside.
  std::vector<std::byte> aside(in_place ? l.group * l.panel_bytes : 0);
  for (std::size_t g = 0; g * l.group < panels; ++g) {
    const std::size_t count = l.group_count(g, panels), at = g * l.group * l.panel_bytes;
    const std::byte* from = src + at;
    if (in_place) {
      std::memcpy(aside.data(), from, count * l.panel_bytes);
      from = aside.data();
    }
    for (std::size_t k = 0; k < count; ++k)
      for (std::size_t n = 0; n < h; ++n)
        transcode_panel_row(t, l, from + (k * h + n) * stride, dst + at, k, n, count);
  }
  // The rows after the last whole panel stay in rows order.
  std::vector<std::byte> scales(in_place ? 2 * l.row.groups : 0);
  for (std::size_t r = panels * h; r < rows; ++r)
    transcode_row_unchecked(t, cols, src + r * stride, dst + r * stride, scales.data());
}

/// Rows `src` into rows `dst` (the same bytes, or apart).
inline void transcode_rows(DType t, const std::byte* src, std::size_t rows, std::size_t cols,
                           std::byte* dst) {
  const std::size_t blocks = cols / gguf_block_weights, stride = blocks * block_bytes(t);
  std::vector<std::byte> scales(src == dst ? 2 * blocks : 0);
  for (std::size_t r = 0; r < rows; ++r)
    transcode_row_unchecked(t, cols, src + r * stride, dst + r * stride, scales.data());
}

/// Checks a conversion of `rows × cols` weights of type `t` from `src` to `dst` and returns the
/// target precision; throws Error naming `what` otherwise. Messages are built only on failure:
/// this runs once per row in transcode_row.
inline Precision check_transcode(DType t, std::span<const std::byte> src, std::size_t rows,
                                 std::size_t cols, std::span<const std::byte> dst,
                                 std::string_view what) {
  const auto fail = [&](ErrorKind kind, const std::string& why) {
    moekit::detail::fail(kind, std::string(what) + ": " + why);
  };
  const auto p = exact_moekit_precision(t);
  const auto shape = [&] {
    return std::to_string(rows) + "x" + std::to_string(cols) + " " + std::string(name(t));
  };
  if (!p)
    fail(ErrorKind::unsupported, "GGUF type " + std::string(name(t)) +
                                     " has no exact moekit format (Q4_0 -> q4, Q8_0 -> q8)");
  if (rows == 0 || cols == 0 || cols % gguf_block_weights != 0)
    fail(ErrorKind::invalid_argument,
         "a " + shape() + " matrix is empty or its rows are not whole 32-weight blocks");
  std::size_t need = 0;
  const bool overflow =
      __builtin_mul_overflow(rows, cols / gguf_block_weights * block_bytes(t), &need);
  const auto needs = [&] {
    return ", a " + shape() + " matrix needs " +
           (overflow ? std::string("more than SIZE_MAX") : std::to_string(need));
  };
  if (overflow || src.size() != need)
    fail(ErrorKind::invalid_argument,
         "the source has " + std::to_string(src.size()) + " bytes" + needs());
  if (dst.size() != need)
    fail(ErrorKind::invalid_argument,
         "the destination has " + std::to_string(dst.size()) + " bytes" + needs());
  const std::byte* s = src.data();
  const std::byte* d = dst.data();
  if (s != d && d < s + need && s < d + need)
    fail(ErrorKind::invalid_argument,
         "source and destination overlap (only the very same bytes convert in place)");
  return *p;
}

}  // namespace detail

/// Converts one row of `cols` weights (a multiple of 32) of GGUF type `t` (Q4_0 or Q8_0): `src`
/// holds its cols/32 blocks, `dst` gets the moekit row (row_bytes(cols, *exact_moekit_precision(t),
/// gguf_exact_scheme) bytes, the same size). `dst` may be `src`'s very bytes (in place; the scales
/// wait in a stack buffer, or a heap one for very long rows) but must not overlap them otherwise.
/// Throws Error naming `what` on an unsupported type or a size mismatch.
inline void transcode_row(DType t, std::size_t cols, std::span<const std::byte> src,
                          std::span<std::byte> dst, std::string_view what = "transcode_row") {
  detail::check_transcode(t, src, 1, cols, dst, what);
  const std::size_t scale_bytes = 2 * (cols / detail::gguf_block_weights);
  std::byte stack[2048];
  std::vector<std::byte> heap(src.data() == dst.data() && scale_bytes > sizeof stack ? scale_bytes
                                                                                     : 0);
  detail::transcode_row_unchecked(t, cols, src.data(), dst.data(),
                                  heap.empty() ? stack : heap.data());
  detail::stream_fence();
}

/// Converts a `rows × cols` matrix of GGUF type `t` (Q4_0 or Q8_0; row-major as GGUF stores a
/// tensor with ne0 = cols: each row cols/32 blocks, rows back to back) into `dst` in `order`, and
/// returns the view of `dst` (precision q4 / q8, gguf_exact_scheme). `dst` has the same size as
/// `src`; it may be `src`'s very bytes (in place, any order: the scratch is one row's scales in
/// rows, one panel group in panels) but must not overlap them otherwise. Throws Error naming
/// `what`: unsupported for other types, invalid_argument for sizes and overlaps.
inline MatrixView transcode_matrix(DType t, std::span<const std::byte> src, std::size_t rows,
                                   std::size_t cols, std::span<std::byte> dst,
                                   MatrixOrder order = MatrixOrder::rows,
                                   std::string_view what = "transcode_matrix") {
  const Precision p = detail::check_transcode(t, src, rows, cols, dst, what);
  if (in_panels(order))
    detail::transcode_panels(t, p, src.data(), rows, cols, dst.data(), order);
  else
    detail::transcode_rows(t, src.data(), rows, cols, dst.data());
  detail::stream_fence();  // the codes were streamed: ordered before the view is handed out
  return MatrixView{dst.data(), rows, cols, p, gguf_exact_scheme, order};
}

/// transcode_matrix with the result written over the source: `data` holds the raw GGUF blocks
/// (as read from the file) and then the moekit matrix.
inline MatrixView transcode_in_place(DType t, std::span<std::byte> data, std::size_t rows,
                                     std::size_t cols, MatrixOrder order = MatrixOrder::rows,
                                     std::string_view what = "transcode_in_place") {
  return transcode_matrix(t, data, rows, cols, data, order, what);
}

/// transcode_matrix of a tensor as a reader hands it out (rows = the product of all but the last
/// dimension, cols = the last). In panels the tensor must be one matrix (rank 2 at most: take one
/// expert of a stacked tensor with slice_outer first), since panels of a stack would cross from
/// one expert into the next. Errors name the tensor, its file and offset; a tensor whose bytes do
/// not match its shape is Error(invalid_format), as in dequantize().
inline MatrixView transcode(const TensorView& t, std::span<std::byte> dst,
                            MatrixOrder order = MatrixOrder::rows) {
  const std::string what = "transcode: " + t.where();
  if (in_panels(order) && t.rank > 2)
    moekit::detail::fail(ErrorKind::invalid_argument,
                         what + " has rank " + std::to_string(t.rank) +
                             ": panels take one matrix (slice_outer the stack first)");
  const auto want = tensor_bytes(t.dtype, t.elements(), t.cols());
  if (exact_moekit_precision(t.dtype) && (!want || *want != t.bytes.size()))
    moekit::detail::fail(ErrorKind::invalid_format,
                         what + " has " + std::to_string(t.bytes.size()) +
                             " bytes, which does not match its shape and type " +
                             std::string(name(t.dtype)));
  return transcode_matrix(t.dtype, t.bytes, t.rows(), t.cols(), dst, order, what);
}

}  // namespace moekit::io
