#pragma once
/// \file ModelShape: the sizes of an MoE model that offloading decisions depend on.

#include <cstddef>
#include <cstdint>

#include "moekit/core/expert_key.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// An expert blob of GGUF K-quant matrices as they lie in the file (io/checkpoint_experts.hpp).
/// GGUF files mix K-quant types: a Q4_K_M file holds gate and up as Q4_K and down as Q6_K in some
/// layers, Q4_K in the others. The blob at `precision` (the type of the first layer's gate, what
/// the file is named for) gives each matrix a slot sized for the widest type it has in any layer
/// (`w1`, `w3`, `w2`), then ends with `kquant_tag_bytes` naming the types of this expert's three
/// matrices (io::expert_view reads them). Fixed slots keep one blob size per precision, which the
/// cache, the arena and the loaders count in; a matrix narrower than its slot leaves the rest
/// unused. Unset (`precision == skip`): no such blob.
struct KquantBlob {
  Precision precision = Precision::skip;
  Precision w1 = Precision::skip;  ///< widest type of the gate in any layer
  Precision w3 = Precision::skip;  ///< ... of the up projection
  Precision w2 = Precision::skip;  ///< ... of the down projection

  [[nodiscard]] constexpr bool set() const noexcept { return precision != Precision::skip; }
  friend constexpr bool operator==(const KquantBlob&, const KquantBlob&) = default;
};

/// The tag at the end of a K-quant blob: the Precision values of w1, w3, w2, then a zero byte.
inline constexpr std::size_t kquant_tag_bytes = 4;

/// Shape of the routed part of an MoE model. An expert is a SwiGLU FFN of three matrices:
/// w1 (gate) and w3 (up) are `ffn × hidden`, w2 (down) is `hidden × ffn`.
struct ModelShape {
  std::uint32_t n_layers = 0;          ///< MoE layers
  std::uint32_t n_experts = 0;         ///< routed experts per layer
  std::uint32_t top_k = 0;             ///< experts selected per token
  std::uint32_t hidden = 0;            ///< model dimension d
  std::uint32_t ffn = 0;               ///< expert intermediate size
  std::uint32_t n_shared_experts = 0;  ///< always-on experts per layer (Qwen2-MoE: 1)
  std::uint32_t shared_ffn = 0;        ///< intermediate size of a shared expert
  QuantScheme quant{};                 ///< grouping of the quantized formats
  KquantBlob kquant{};                 ///< the K-quant blob read in place, if any

  /// Number of routed experts in the model.
  [[nodiscard]] constexpr std::size_t expert_count() const noexcept {
    return std::size_t{n_layers} * n_experts;
  }
  /// Dense index of `key` in [0, expert_count()).
  [[nodiscard]] constexpr std::size_t index(ExpertKey key) const noexcept {
    return std::size_t{key.layer} * n_experts + key.expert;
  }
  [[nodiscard]] constexpr bool contains(ExpertKey key) const noexcept {
    return key.layer < n_layers && key.expert < n_experts;
  }
  /// Bytes of one routed expert stored at `p`.
  [[nodiscard]] constexpr std::size_t expert_bytes(Precision p) const noexcept {
    if (kquant.set() && p == kquant.precision)
      return matrix_bytes(ffn, hidden, kquant.w1) + matrix_bytes(ffn, hidden, kquant.w3) +
             matrix_bytes(hidden, ffn, kquant.w2) + kquant_tag_bytes;
    return 2 * matrix_bytes(ffn, hidden, p, quant) + matrix_bytes(hidden, ffn, p, quant);
  }
  /// Bytes of one shared expert stored at `p` (0 when the model has none).
  [[nodiscard]] constexpr std::size_t shared_expert_bytes(Precision p) const noexcept {
    return 2 * matrix_bytes(shared_ffn, hidden, p, quant) +
           matrix_bytes(hidden, shared_ffn, p, quant);
  }

  /// Throws `moekit::Error` naming the first field that cannot describe a model.
  void validate() const {
    MOEKIT_EXPECTS(n_layers > 0, "ModelShape.n_layers must be > 0");
    MOEKIT_EXPECTS(n_experts > 0, "ModelShape.n_experts must be > 0");
    MOEKIT_EXPECTS(top_k > 0 && top_k <= n_experts, "ModelShape.top_k must be in [1, n_experts]");
    MOEKIT_EXPECTS(hidden > 0, "ModelShape.hidden must be > 0");
    MOEKIT_EXPECTS(ffn > 0, "ModelShape.ffn must be > 0");
    MOEKIT_EXPECTS(n_shared_experts == 0 || shared_ffn > 0,
                   "ModelShape.shared_ffn must be > 0 when n_shared_experts > 0");
    MOEKIT_EXPECTS(quant.group_size == 0 || quant.group_size % 32 == 0,
                   "ModelShape.quant.group_size must be 0 or a multiple of 32");
    MOEKIT_EXPECTS(
        !kquant.set() || (is_gguf_kquant(kquant.precision) && is_gguf_kquant(kquant.w1) &&
                          is_gguf_kquant(kquant.w3) && is_gguf_kquant(kquant.w2)),
        "ModelShape.kquant: every type must be a GGUF K-quant");
  }

  friend constexpr bool operator==(const ModelShape&, const ModelShape&) = default;
};

/// Mixtral-8x7B's routed part (32 layers, 8 experts, top-2, d = 4096, f = 14336).
inline constexpr ModelShape mixtral_8x7b{
    .n_layers = 32, .n_experts = 8, .top_k = 2, .hidden = 4096, .ffn = 14336};

}  // namespace moekit
