#pragma once
/// \file Where each MoE architecture keeps its expert weights, in Hugging Face (safetensors) and
/// GGUF naming, and a function that finds one expert's three matrices in a reader.
///
/// | role | Mixtral (HF) | Qwen2-MoE, OLMoE (HF) | GGUF (llama/mixtral, qwen2moe, olmoe) |
/// |---|---|---|---|
/// | gate (w1) | `model.layers.L.block_sparse_moe.experts.E.w1.weight` |
/// `model.layers.L.mlp.experts.E.gate_proj.weight` | `blk.L.ffn_gate_exps.weight` [E,ffn,hidden] or
/// `blk.L.ffn_gate.E.weight` | | up (w3) | `...experts.E.w3.weight` | `...experts.E.up_proj.weight`
/// | `blk.L.ffn_up_exps.weight` / `blk.L.ffn_up.E.weight` | | down (w2) | `...experts.E.w2.weight`
/// | `...experts.E.down_proj.weight` | `blk.L.ffn_down_exps.weight` [E,hidden,ffn] /
/// `blk.L.ffn_down.E.weight` | | router | `model.layers.L.block_sparse_moe.gate.weight` |
/// `model.layers.L.mlp.gate.weight` | `blk.L.ffn_gate_inp.weight` | | shared expert (Qwen2-MoE) | —
/// | `model.layers.L.mlp.shared_expert.{gate,up,down}_proj.weight` |
/// `blk.L.ffn_{gate,up,down}_shexp.weight` | | shared-expert gate (Qwen2-MoE) | — |
/// `model.layers.L.mlp.shared_expert_gate.weight` | `blk.L.ffn_gate_inp_shexp.weight` | Matrices
/// are `[out, in]` row-major: gate/up `[ffn, hidden]`, down `[hidden, ffn]`.

#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/expert_key.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/error.hpp"
#include "moekit/io/tensor.hpp"

namespace moekit::io {

/// MoE architectures whose checkpoints moekit reads.
enum class Architecture : std::uint8_t { mixtral, qwen2_moe, olmoe };

/// Checkpoint naming convention.
enum class TensorFormat : std::uint8_t { hugging_face, gguf };

/// One of an expert's three matrices (SwiGLU: down(silu(gate·x) ⊙ up·x)).
enum class ExpertMatrix : std::uint8_t { gate, up, down };

inline constexpr ExpertMatrix all_expert_matrices[] = {ExpertMatrix::gate, ExpertMatrix::up,
                                                       ExpertMatrix::down};

/// Parses a Hugging Face `model_type` ("mixtral", "qwen2_moe", "olmoe") or a GGUF
/// `general.architecture` ("llama" as Mixtral GGUFs use, "mixtral", "qwen2moe", "olmoe").
constexpr std::optional<Architecture> parse_architecture(std::string_view s) noexcept {
  if (s == "mixtral" || s == "llama") return Architecture::mixtral;
  if (s == "qwen2_moe" || s == "qwen2moe") return Architecture::qwen2_moe;
  if (s == "olmoe") return Architecture::olmoe;
  return std::nullopt;
}

constexpr std::string_view name(Architecture a) noexcept {
  switch (a) {
    case Architecture::mixtral:
      return "mixtral";
    case Architecture::qwen2_moe:
      return "qwen2_moe";
    case Architecture::olmoe:
      return "olmoe";
  }
  return "?";
}

namespace detail {
inline std::string hf_layer(std::uint32_t l) { return "model.layers." + std::to_string(l) + "."; }
inline std::string gguf_layer(std::uint32_t l) { return "blk." + std::to_string(l) + "."; }
constexpr std::string_view gguf_role(ExpertMatrix m) noexcept {
  return m == ExpertMatrix::gate ? "ffn_gate" : m == ExpertMatrix::up ? "ffn_up" : "ffn_down";
}
constexpr std::string_view hf_proj(ExpertMatrix m) noexcept {
  return m == ExpertMatrix::gate ? "gate_proj" : m == ExpertMatrix::up ? "up_proj" : "down_proj";
}
}  // namespace detail

/// Name of one routed expert's matrix stored on its own (HF, or GGUF's older per-expert layout).
inline std::string expert_tensor_name(Architecture a, TensorFormat f, ExpertKey k, ExpertMatrix m) {
  const std::string e = std::to_string(k.expert);
  if (f == TensorFormat::gguf)
    return detail::gguf_layer(k.layer) + std::string(detail::gguf_role(m)) + "." + e + ".weight";
  if (a == Architecture::mixtral) {
    const char* w = m == ExpertMatrix::gate ? "w1" : m == ExpertMatrix::up ? "w3" : "w2";
    return detail::hf_layer(k.layer) + "block_sparse_moe.experts." + e + "." + w + ".weight";
  }
  return detail::hf_layer(k.layer) + "mlp.experts." + e + "." + std::string(detail::hf_proj(m)) +
         ".weight";
}

/// GGUF's stacked 3-D tensor holding matrix `m` of every expert of `layer` (experts outermost).
inline std::string stacked_expert_tensor_name(std::uint32_t layer, ExpertMatrix m) {
  return detail::gguf_layer(layer) + std::string(detail::gguf_role(m)) + "_exps.weight";
}

/// The router (gate network) weight of `layer`: `[n_experts, hidden]`.
inline std::string router_tensor_name(Architecture a, TensorFormat f, std::uint32_t layer) {
  if (f == TensorFormat::gguf) return detail::gguf_layer(layer) + "ffn_gate_inp.weight";
  return detail::hf_layer(layer) +
         (a == Architecture::mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
}

/// Matrix `m` of the shared expert of `layer` (Qwen2-MoE); `Error(unsupported)` otherwise.
inline std::string shared_expert_tensor_name(Architecture a, TensorFormat f, std::uint32_t layer,
                                             ExpertMatrix m) {
  if (a != Architecture::qwen2_moe)
    throw Error(ErrorKind::unsupported, std::string(name(a)) + " has no shared expert");
  if (f == TensorFormat::gguf)
    return detail::gguf_layer(layer) + std::string(detail::gguf_role(m)) + "_shexp.weight";
  return detail::hf_layer(layer) + "mlp.shared_expert." + std::string(detail::hf_proj(m)) +
         ".weight";
}

/// The shared-expert gate of `layer` (Qwen2-MoE: a `[1, hidden]` sigmoid gate on the shared
/// expert).
inline std::string shared_expert_gate_tensor_name(Architecture a, TensorFormat f,
                                                  std::uint32_t layer) {
  if (a != Architecture::qwen2_moe)
    throw Error(ErrorKind::unsupported, std::string(name(a)) + " has no shared-expert gate");
  if (f == TensorFormat::gguf) return detail::gguf_layer(layer) + "ffn_gate_inp_shexp.weight";
  return detail::hf_layer(layer) + "mlp.shared_expert_gate.weight";
}

/// Anything with `find(name) -> std::optional<TensorView>`: SafetensorsFile, SafetensorsModel,
/// GgufFile.
template <class R>
concept TensorReader = requires(const R& r, std::string_view n) {
  { r.find(n) } -> std::same_as<std::optional<TensorView>>;
};

/// An expert's three matrices as zero-copy views.
struct ExpertMatrices {
  TensorView gate, up, down;
  [[nodiscard]] const TensorView& operator[](ExpertMatrix m) const noexcept {
    return m == ExpertMatrix::gate ? gate : m == ExpertMatrix::up ? up : down;
  }
};

namespace detail {

/// Checks gate/up `[ffn, hidden]` and down `[hidden, ffn]`, against `shape` when given.
inline void check_expert_shapes(const ExpertMatrices& m, const std::optional<ModelShape>& shape,
                                std::uint32_t ffn_expect_override = 0) {
  auto fail = [](const TensorView& t, const std::string& why) {
    throw Error(ErrorKind::invalid_format, t.where() + ": " + why);
  };
  for (const TensorView* t : {&m.gate, &m.up, &m.down})
    if (t->rank != 2) fail(*t, "expected a matrix, found rank " + std::to_string(t->rank));
  const std::uint64_t ffn = m.gate.rows(), hidden = m.gate.cols();
  if (m.up.rows() != ffn || m.up.cols() != hidden)
    fail(m.up, "shape [" + std::to_string(m.up.rows()) + ", " + std::to_string(m.up.cols()) +
                   "] differs from the gate matrix's [" + std::to_string(ffn) + ", " +
                   std::to_string(hidden) + "]");
  if (m.down.rows() != hidden || m.down.cols() != ffn)
    fail(m.down, "shape [" + std::to_string(m.down.rows()) + ", " + std::to_string(m.down.cols()) +
                     "] is not the transpose of the gate matrix's [" + std::to_string(ffn) + ", " +
                     std::to_string(hidden) + "]");
  if (shape) {
    const std::uint64_t want_ffn = ffn_expect_override ? ffn_expect_override : shape->ffn;
    if (ffn != want_ffn || hidden != shape->hidden)
      fail(m.gate, "shape [" + std::to_string(ffn) + ", " + std::to_string(hidden) +
                       "] does not match the model description's [ffn " + std::to_string(want_ffn) +
                       ", hidden " + std::to_string(shape->hidden) + "]");
  }
}

}  // namespace detail

/// Finds routed expert `key`'s matrices. GGUF: the stacked `_exps` tensors (sliced) or else the
/// per-expert tensors. Throws `Error(invalid_format)` naming the missing tensor, or a tensor whose
/// shape disagrees with the others or with `shape` (when given).
template <TensorReader R>
ExpertMatrices find_expert_matrices(const R& reader, Architecture a, TensorFormat f, ExpertKey key,
                                    const std::optional<ModelShape>& shape = std::nullopt) {
  ExpertMatrices out;
  for (ExpertMatrix m : all_expert_matrices) {
    TensorView* slot = m == ExpertMatrix::gate ? &out.gate
                       : m == ExpertMatrix::up ? &out.up
                                               : &out.down;
    if (f == TensorFormat::gguf) {
      if (auto stacked = reader.find(stacked_expert_tensor_name(key.layer, m))) {
        if (stacked->rank != 3)
          throw Error(ErrorKind::invalid_format,
                      stacked->where() + ": stacked expert tensor has rank " +
                          std::to_string(stacked->rank) + ", expected 3");
        if (shape && stacked->dims[0] != shape->n_experts)
          throw Error(ErrorKind::invalid_format, stacked->where() + ": holds " +
                                                     std::to_string(stacked->dims[0]) +
                                                     " experts, the model description says " +
                                                     std::to_string(shape->n_experts));
        if (key.expert >= stacked->dims[0])
          throw Error(ErrorKind::invalid_argument,
                      stacked->where() + ": no expert " + std::to_string(key.expert));
        *slot = slice_outer(*stacked, key.expert);
        continue;
      }
    }
    const std::string n = expert_tensor_name(a, f, key, m);
    auto t = reader.find(n);
    if (!t)
      throw Error(
          ErrorKind::invalid_format,
          "checkpoint has no tensor '" + n + "'" +
              (f == TensorFormat::gguf ? " (nor '" + stacked_expert_tensor_name(key.layer, m) + "')"
                                       : std::string()) +
              " for layer " + std::to_string(key.layer) + ", expert " + std::to_string(key.expert));
    *slot = *t;
  }
  detail::check_expert_shapes(out, shape);
  return out;
}

/// Finds the shared expert of `layer` (Qwen2-MoE), checked against `shape.shared_ffn` when given.
template <TensorReader R>
ExpertMatrices find_shared_expert_matrices(const R& reader, Architecture a, TensorFormat f,
                                           std::uint32_t layer,
                                           const std::optional<ModelShape>& shape = std::nullopt) {
  ExpertMatrices out;
  for (ExpertMatrix m : all_expert_matrices) {
    const std::string n = shared_expert_tensor_name(a, f, layer, m);
    auto t = reader.find(n);
    if (!t) throw Error(ErrorKind::invalid_format, "checkpoint has no tensor '" + n + "'");
    (m == ExpertMatrix::gate ? out.gate : m == ExpertMatrix::up ? out.up : out.down) = *t;
  }
  detail::check_expert_shapes(out, shape, shape ? shape->shared_ffn : 0);
  return out;
}

}  // namespace moekit::io
