#pragma once
/// \file Precision: the numeric formats an expert can be stored, moved and run in.
///
/// `skip` is a decision ("do not run this expert"), never a stored format. Byte sizes are defined
/// here, once, so that the cache, the loaders, the simulator and the expert store agree on them;
/// `precision/` implements the layouts whose sizes these functions give.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "moekit/config.hpp"

namespace moekit {

/// Storage/compute format of an expert's weights, or the decision to skip it.
/// `q6_k`, `q4_k`, `q5_k`, `q2_k` and `q3_k` are GGUF's K-quant super-block formats
/// (precision/gguf_q6_k.hpp, gguf_q4_k.hpp, ...), read in place from GGUF files and never produced
/// by moekit's quantizer; they come after `skip` so that the formats before it keep their numbers
/// (arrays indexed by them).
enum class Precision : std::uint8_t {
  f32,
  bf16,
  f16,
  q8,
  q4,
  q2,
  skip,
  q6_k,
  q4_k,
  q5_k,
  q2_k,
  q3_k
};

/// Every precision moekit quantizes into and the policies choose among, highest first (excludes
/// `skip` and the GGUF K-quant formats, which are only read).
inline constexpr Precision all_precisions[] = {Precision::f32, Precision::bf16, Precision::f16,
                                               Precision::q8,  Precision::q4,   Precision::q2};
inline constexpr std::size_t precision_count = 6;
/// One past the largest Precision value: the size of an array indexed by any Precision, `skip`
/// and the GGUF K-quants (which an engine reads in place and runs) included. `precision_count`
/// stays the number of formats moekit quantizes into and the simulator models (loops over
/// `all_precisions`); arrays the engine's pipeline indexes by the precision it was asked for use
/// this one.
inline constexpr std::size_t precision_slots = 12;
static_assert(precision_slots == std::size_t(Precision::q3_k) + 1,
              "precision_slots: one past the last Precision value");

/// Bits per weight of the format, excluding group metadata (0 for `skip`).
MOEKIT_HOST_DEVICE constexpr unsigned bits(Precision p) noexcept {
  switch (p) {
    case Precision::f32:
      return 32;
    case Precision::bf16:
    case Precision::f16:
      return 16;
    case Precision::q8:
      return 8;
    case Precision::q4:
    case Precision::q4_k:
      return 4;
    case Precision::q2:
    case Precision::q2_k:
      return 2;
    case Precision::q3_k:
      return 3;
    case Precision::q6_k:
      return 6;
    case Precision::q5_k:
      return 5;
    case Precision::skip:
      return 0;
  }
  return 0;
}

/// True for GGUF's K-quant formats: rows of 256-weight super-blocks laid out as ggml lays them.
MOEKIT_HOST_DEVICE constexpr bool is_gguf_kquant(Precision p) noexcept {
  return p == Precision::q6_k || p == Precision::q5_k || p == Precision::q4_k ||
         p == Precision::q3_k || p == Precision::q2_k;
}

/// Weights and bytes of one super-block of a GGUF K-quant format (0 for the other formats).
inline constexpr std::size_t kquant_block_weights = 256;
MOEKIT_HOST_DEVICE constexpr std::size_t kquant_block_bytes(Precision p) noexcept {
  switch (p) {
    case Precision::q6_k:
      return 210;
    case Precision::q5_k:
      return 176;
    case Precision::q4_k:
      return 144;
    case Precision::q3_k:
      return 110;
    case Precision::q2_k:
      return 84;
    default:
      return 0;
  }
}

/// True for moekit's integer group-quantized formats (q8, q4, q2; not the GGUF K-quants).
MOEKIT_HOST_DEVICE constexpr bool is_quantized(Precision p) noexcept {
  return p == Precision::q8 || p == Precision::q4 || p == Precision::q2;
}

/// A resident copy at `have` can serve a request for `want` when it is at least as precise.
/// (A high-precision copy answers a low-precision request; HOBBIT's cross-precision hit rule.)
constexpr bool satisfies(Precision have, Precision want) noexcept {
  return have != Precision::skip && want != Precision::skip && bits(have) >= bits(want);
}

constexpr std::string_view name(Precision p) noexcept {
  switch (p) {
    case Precision::f32:
      return "f32";
    case Precision::bf16:
      return "bf16";
    case Precision::f16:
      return "f16";
    case Precision::q8:
      return "q8";
    case Precision::q4:
      return "q4";
    case Precision::q2:
      return "q2";
    case Precision::q6_k:
      return "q6_k";
    case Precision::q4_k:
      return "q4_k";
    case Precision::q5_k:
      return "q5_k";
    case Precision::q2_k:
      return "q2_k";
    case Precision::q3_k:
      return "q3_k";
    case Precision::skip:
      return "skip";
  }
  return "?";
}

/// Parses "f32", "bf16", "f16", "q8", "q4", "q2" or "skip" (not the K-quants: no policy or
/// quantizer takes them).
constexpr std::optional<Precision> parse_precision(std::string_view s) noexcept {
  for (Precision p : all_precisions)
    if (name(p) == s) return p;
  if (s == "skip") return Precision::skip;
  return std::nullopt;
}

/// How the quantized formats group their weights. A row of `cols` weights is cut into groups of
/// `group_size` consecutive weights along the input dimension (0 = one group per row: EdgeMoE's
/// channel-wise variant); each group carries an f16 scale and, for affine schemes, an f16 zero
/// point.
struct QuantScheme {
  std::uint32_t group_size = 32;  ///< 32, 64, 128, or 0 for one group per row
  bool zero_point = false;        ///< false: symmetric (q = round(w/s)); true: affine (HQQ-style)

  friend constexpr bool operator==(const QuantScheme&, const QuantScheme&) = default;
};

/// Bytes of one row of `cols` weights at precision `p` under `scheme`:
/// packed weights (ceil(cols·bits/8)) plus 2 bytes of scale (and 2 of zero point) per group;
/// for the GGUF K-quants, ceil(cols / 256) super-blocks (the scheme does not apply).
/// Normative: the formats in `precision/` produce exactly this many bytes per row.
MOEKIT_HOST_DEVICE constexpr std::size_t row_bytes(std::size_t cols, Precision p,
                                                   QuantScheme scheme = {}) noexcept {
  if (p == Precision::skip) return 0;
  if (is_gguf_kquant(p))
    return (cols + kquant_block_weights - 1) / kquant_block_weights * kquant_block_bytes(p);
  const std::size_t payload = (cols * bits(p) + 7) / 8;
  if (!is_quantized(p)) return payload;
  const std::size_t group = scheme.group_size == 0 ? cols : scheme.group_size;
  const std::size_t groups = (cols + group - 1) / group;
  return payload + groups * (scheme.zero_point ? 4u : 2u);
}

/// Bytes of a `rows × cols` matrix (row-major, `cols` = input dimension).
MOEKIT_HOST_DEVICE constexpr std::size_t matrix_bytes(std::size_t rows, std::size_t cols,
                                                      Precision p,
                                                      QuantScheme scheme = {}) noexcept {
  return rows * row_bytes(cols, p, scheme);
}

}  // namespace moekit
