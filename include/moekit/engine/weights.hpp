#pragma once
/// \file The model's weights in host memory: the dense part in f32 (embeddings, norms, attention,
/// routers, shared experts, dense MLPs, LM head) and the routed experts encoded at one or more
/// stored precisions, handed to the offload pipeline's loader as byte spans.
/// Experts are expert blobs (io/expert_blob.hpp), one per expert and precision.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "moekit/core/expert_key.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/dequantize.hpp"
#include "moekit/io/expert_blob.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/finite_check.hpp"
#include "moekit/io/gguf_transcode.hpp"
#include "moekit/io/safetensors.hpp"
#include "moekit/io/tensor_names.hpp"
#include "moekit/precision/expert_ffn.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/panels.hpp"
#include "moekit/precision/quantize.hpp"

#include "moekit/engine/config.hpp"
#include "moekit/engine/tensor_census.hpp"

namespace moekit::engine {

/// A dense linear layer y = W·x (+ b); W is rows × cols (cols = input size). Read from the
/// checkpoint in f32 (`w`), then stored at the precision DenseStorage chooses (`narrow`: the
/// weights move to `packed`); the kernels read either through view().
struct Linear {
  std::vector<float> w;           ///< f32 weights (empty once narrowed)
  std::vector<std::byte> packed;  ///< the weights at `precision` in precision/'s row format
  moekit::Precision precision = moekit::Precision::f32;
  moekit::QuantScheme scheme{};  ///< grouping of `packed` when quantized
  /// The checkpoint's own type of W (bf16/f16 when stored so; q8/q4 for GGUF Q8_0/Q4_0, read
  /// packed as stored with `scheme`; else f32): what DenseStorage's automatic choice keeps,
  /// losslessly.
  moekit::Precision source = moekit::Precision::f32;
  std::vector<float> bias;  ///< empty when the layer has no bias (always f32)
  std::size_t rows = 0;
  std::size_t cols = 0;

  [[nodiscard]] moekit::MatrixView view() const noexcept {
    if (precision == moekit::Precision::f32)
      return {reinterpret_cast<const std::byte*>(w.data()), rows, cols, moekit::Precision::f32, {}};
    return {packed.data(), rows, cols, precision, scheme};
  }
  [[nodiscard]] bool empty() const noexcept { return w.empty() && packed.empty(); }
  /// Bytes of the weights and bias as held.
  [[nodiscard]] std::size_t bytes() const noexcept {
    return (w.size() + bias.size()) * sizeof(float) + packed.size();
  }
  /// Row r of W in f32 into out[0..cols) (the embedding lookup).
  void row(std::size_t r, float* out) const {
    if (precision == moekit::Precision::f32) {
      std::copy_n(w.data() + r * cols, cols, out);
      return;
    }
    moekit::decode_row(view().row(r), cols, precision, scheme, out);
  }
  /// Stores W at `p` (quantized ones grouped by `s`), freeing the f32 copy; f32 keeps it. W read
  /// already packed (a quantized GGUF tensor held as stored) is widened first when `p`/`s` differ.
  void narrow(moekit::Precision p, moekit::QuantScheme s) {
    if (empty() || (w.empty() && p == precision && s == scheme)) return;
    widen();
    if (p == moekit::Precision::f32) return;
    packed = moekit::encode_matrix<float>(w, rows, cols, p, s);
    precision = p;
    scheme = s;
    std::vector<float>().swap(w);
  }
  /// Back to f32 (routers and anything the kernels need in f32).
  void widen() {
    if (!w.empty() || packed.empty()) return;
    w.resize(rows * cols);
    for (std::size_t r = 0; r < rows; ++r) row(r, w.data() + r * cols);
    std::vector<std::byte>().swap(packed);
    precision = moekit::Precision::f32;
  }
  /// Moves row `from[i]` to row i, whether held in f32 or packed (rows are self-contained).
  void permute_rows(std::span<const std::size_t> from) {
    MOEKIT_EXPECTS(from.size() == rows, "Linear::permute_rows: one source row per row");
    const std::size_t stride = w.empty() ? view().row_stride() : cols * sizeof(float);
    std::byte* data = w.empty() ? packed.data() : reinterpret_cast<std::byte*>(w.data());
    std::vector<std::byte> out(rows * stride);
    for (std::size_t r = 0; r < rows; ++r)
      std::memcpy(out.data() + r * stride, data + from[r] * stride, stride);
    std::memcpy(data, out.data(), out.size());
  }
};

/// A SwiGLU MLP (Qwen2-MoE's shared expert and dense layers).
struct DenseMlp {
  Linear gate, up, down;
  [[nodiscard]] moekit::ExpertWeights view() const noexcept {
    return {gate.view(), up.view(), down.view()};
  }
  [[nodiscard]] bool empty() const noexcept { return gate.empty(); }
};

/// The dense weights of one decoder layer.
struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  Linear q, k, v, o;
  std::vector<float> q_norm, k_norm;  ///< OLMoE only
  Linear router;                      ///< n_experts × hidden (MoE layers)
  DenseMlp shared;                    ///< Qwen2-MoE shared expert (may be empty)
  Linear shared_gate;                 ///< 1 × hidden (Qwen2-MoE)
  DenseMlp mlp;                       ///< dense MLP (non-MoE layers)

  /// The matrices DenseStorage narrows (all but the router and the shared-expert gate), of `l`
  /// const or not.
  template <class Layer>
  static auto narrowable(Layer& l) noexcept {
    return std::array{&l.q,         &l.k,           &l.v,        &l.o,      &l.shared.gate,
                      &l.shared.up, &l.shared.down, &l.mlp.gate, &l.mlp.up, &l.mlp.down};
  }
};

/// The precision the dense part's matrices are held at: embeddings, attention, the LM head,
/// shared experts and dense MLPs. Routers, norms and biases stay f32 (small, and routing
/// decisions are sensitive to them). `precision` nullopt: every matrix at its checkpoint's own
/// float type (bf16 or f16 where stored so, else f32), which loses nothing.
struct DenseStorage {
  std::optional<moekit::Precision> precision = moekit::Precision::f32;
  moekit::QuantScheme scheme{};  ///< grouping when quantized (q8/q4)

  void narrow(Linear& l) const {
    if (!precision && moekit::is_quantized(l.source)) return;  // held as stored
    l.narrow(precision.value_or(l.source), scheme);
  }
  /// A decoder layer's matrices once read whole (GGUF's q/k are un-permuted first).
  void narrow(LayerWeights& l) const {
    for (Linear* x : LayerWeights::narrowable(l)) narrow(*x);
  }
};

/// The checkpoint's float type of a tensor of `t` as a Precision (quantized GGUF types: f32,
/// their dequantized values having no exact narrower float; Q8_0/Q4_0 are read packed instead).
inline moekit::Precision source_precision(moekit::io::DType t) noexcept {
  return t == moekit::io::DType::bf16  ? moekit::Precision::bf16
         : t == moekit::io::DType::f16 ? moekit::Precision::f16
                                       : moekit::Precision::f32;
}

/// The dense part of the model.
struct DenseWeights {
  Linear embed;  ///< vocab × hidden
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;
  Linear lm_head;  ///< vocab × hidden; empty when tied to `embed`

  [[nodiscard]] const Linear& output() const noexcept { return lm_head.empty() ? embed : lm_head; }
  [[nodiscard]] std::size_t bytes() const noexcept {
    auto lin = [](const Linear& l) { return l.bytes(); };
    auto mlp = [&](const DenseMlp& m) { return lin(m.gate) + lin(m.up) + lin(m.down); };
    std::size_t n = lin(embed) + lin(lm_head) + final_norm.size() * sizeof(float);
    for (const auto& l : layers)
      n += (l.attn_norm.size() + l.ffn_norm.size() + l.q_norm.size() + l.k_norm.size()) *
               sizeof(float) +
           lin(l.q) + lin(l.k) + lin(l.v) + lin(l.o) + lin(l.router) + mlp(l.shared) +
           lin(l.shared_gate) + mlp(l.mlp);
    return n;
  }
  /// The precisions of the matrices DenseStorage narrows, "+"-joined in first-seen order: "bf16",
  /// or "bf16+f32" for a checkpoint of mixed float types.
  [[nodiscard]] std::string precisions() const {
    std::string out;
    for (moekit::Precision p : held_precisions()) {
      if (!out.empty()) out += '+';
      out += moekit::name(p);
    }
    return out;
  }
  /// Each precision the matrices are held at, once, in the order first met.
  [[nodiscard]] std::vector<moekit::Precision> held_precisions() const {
    std::vector<moekit::Precision> out;
    auto add = [&](const Linear& l) {
      if (!l.empty() && std::find(out.begin(), out.end(), l.precision) == out.end())
        out.push_back(l.precision);
    };
    add(embed);
    add(lm_head);
    for (const auto& l : layers)
      for (const Linear* x : LayerWeights::narrowable(l)) add(*x);
    return out;
  }
};

/// Architecture of moe-run's config in io/'s naming.
inline moekit::io::Architecture io_architecture(Architecture a) {
  switch (a) {
    case Architecture::mixtral:
      return moekit::io::Architecture::mixtral;
    case Architecture::qwen2_moe:
      return moekit::io::Architecture::qwen2_moe;
    case Architecture::olmoe:
      return moekit::io::Architecture::olmoe;
  }
  return moekit::io::Architecture::mixtral;
}

/// One expert's matrices in f32: w1, w3 (ffn × hidden), w2 (hidden × ffn).
struct ExpertF32 {
  std::vector<float> w1, w3, w2;
};

/// Reads routed expert `key` (MoE-layer numbering of `s`, i.e. layer = the checkpoint layer when
/// every layer is MoE) from a safetensors or GGUF reader in f32, shape-checked against `s`.
/// `layer` is the checkpoint's decoder layer holding that MoE layer.
template <moekit::io::TensorReader R>
ExpertF32 read_expert_f32(const R& reader, moekit::io::Architecture arch,
                          moekit::io::TensorFormat format, std::uint32_t layer,
                          std::uint32_t expert, const moekit::ModelShape& s) {
  const auto m = moekit::io::find_expert_matrices(reader, arch, format, {layer, expert}, s);
  // NaN/Inf refused here, naming tensor, file, layer, expert and index, rather than by the
  // quantizer, which knows only a row and column.
  const std::string which = "layer " + std::to_string(layer) + ", expert " + std::to_string(expert);
  auto read = [&](const moekit::io::TensorView& t) {
    std::vector<float> v = moekit::io::dequantize(t);
    moekit::io::require_finite(t, v, which);
    return v;
  };
  return {read(m.gate), read(m.up), read(m.down)};
}

/// Every routed expert in host memory at each of a set of stored precisions.
class HostExperts {
 public:
  HostExperts() = default;
  HostExperts(const moekit::ModelShape& shape, std::vector<moekit::Precision> precisions)
      : shape_(shape), precisions_(std::move(precisions)) {
    MOEKIT_EXPECTS(!precisions_.empty(), "HostExperts: no precision requested");
    for (moekit::Precision p : precisions_) {
      moekit::validate_scheme(p, shape_.quant, "expert precision");
      blobs_.emplace_back(shape_.expert_count() * shape_.expert_bytes(p));
    }
  }

  /// Encodes expert `key` from its f32 matrices (w1, w3: ffn × hidden; w2: hidden × ffn).
  void set(moekit::ExpertKey key, std::span<const float> w1, std::span<const float> w3,
           std::span<const float> w2) {
    for (std::size_t i = 0; i < precisions_.size(); ++i) {
      const moekit::Precision p = precisions_[i];
      const std::size_t n = shape_.expert_bytes(p);
      moekit::io::encode_expert_blob(
          shape_, w1, w3, w2, p, std::span<std::byte>(blobs_[i].data() + shape_.index(key) * n, n));
    }
  }

  /// The stored bytes of `key` at `p`; throws when `p` is not held.
  [[nodiscard]] std::span<const std::byte> bytes(moekit::ExpertKey key, moekit::Precision p) const {
    MOEKIT_EXPECTS(shape_.contains(key), "HostExperts: expert key outside the model");
    for (std::size_t i = 0; i < precisions_.size(); ++i)
      if (precisions_[i] == p) {
        const std::size_t n = shape_.expert_bytes(p);
        return {blobs_[i].data() + shape_.index(key) * n, n};
      }
    throw moekit::Error(moekit::ErrorKind::unsupported, "experts are held in host memory at " +
                                                            held_names() + ", not at " +
                                                            std::string(moekit::name(p)));
  }

  [[nodiscard]] const std::vector<moekit::Precision>& precisions() const noexcept {
    return precisions_;
  }

  /// Moves every quantized expert from rows into panels (`to`: panels4 or blocked_panels4, what
  /// the CPU's int8 kernels read fastest), as an expert store written with that order holds
  /// them; f32/bf16/f16 stay.
  void pack_panels(moekit::MatrixOrder to = moekit::MatrixOrder::blocked_panels4) {
    if (order_ == to) return;
    MOEKIT_EXPECTS(order_ == moekit::MatrixOrder::rows && moekit::in_panels(to),
                   "HostExperts::pack_panels: experts in " + std::string(moekit::name(order_)) +
                       " cannot be packed into " + std::string(moekit::name(to)) +
                       " (only from rows into panels)");
    for (std::size_t i = 0; i < precisions_.size(); ++i) {
      const moekit::Precision p = precisions_[i];
      if (!moekit::is_quantized(p)) continue;
      const std::size_t n = shape_.expert_bytes(p);
      for (std::size_t e = 0; e < shape_.expert_count(); ++e) {
        const std::span<std::byte> blob(blobs_[i].data() + e * n, n);
        const std::vector<std::byte> packed =
            moekit::io::expert_blob_in_panels(shape_, p, blob, to);
        std::copy(packed.begin(), packed.end(), blob.begin());
      }
    }
    order_ = to;
  }
  /// Where the rows of the quantized experts are (rows until pack_panels).
  [[nodiscard]] moekit::MatrixOrder order() const noexcept { return order_; }
  [[nodiscard]] std::size_t total_bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& b : blobs_) n += b.size();
    return n;
  }

 private:
  std::string held_names() const {
    std::string s;
    for (moekit::Precision p : precisions_) s += (s.empty() ? "" : ", ") + std::string(name(p));
    return s;
  }

  moekit::ModelShape shape_{};
  std::vector<moekit::Precision> precisions_;
  std::vector<std::vector<std::byte>> blobs_;
  moekit::MatrixOrder order_ = moekit::MatrixOrder::rows;
};

/// The model's weights: dense part and routed experts.
struct ModelWeights {
  DenseWeights dense;
  HostExperts experts;
};

namespace detail {

/// Reads tensors of a checkpoint (a safetensors model or a GGUF file: anything with
/// `find(name)` and `tensor(name)`) as f32 with shape checks that name the tensor.
template <class Reader>
class CheckedReader {
 public:
  explicit CheckedReader(const Reader& m) : m_(m) {}

  [[nodiscard]] bool has(const std::string& name) const { return m_.find(name).has_value(); }

  /// Tensor `name` (any dtype io/dequantize reads), checked to have exactly `shape`.
  /// NaN/Inf refused, naming the tensor, its file and the index.
  std::vector<float> read(const std::string& name, std::vector<std::uint64_t> shape) const {
    const moekit::io::TensorView t = checked(name, shape);
    std::vector<float> v = moekit::io::dequantize(t);
    moekit::io::require_finite(t, v);
    return v;
  }
  /// A vector stored as [n] or [1, n] (GGUF keeps some gate vectors 1-D).
  std::vector<float> read_vector(const std::string& name, std::uint64_t n) const {
    const moekit::io::TensorView t = m_.tensor(name);
    return read(name,
                t.rank == 1 ? std::vector<std::uint64_t>{n} : std::vector<std::uint64_t>{1, n});
  }
  Linear linear(const std::string& name, std::size_t rows, std::size_t cols,
                bool bias = false) const {
    Linear l;
    l.rows = rows;
    l.cols = cols;
    const moekit::io::TensorView t = checked(name + ".weight", {rows, cols});
    l.source = source_precision(t.dtype);
    if (const auto p = moekit::io::exact_moekit_precision(t.dtype)) {
      // Held as stored: the same values as dequantizing, in moekit's own rows.
      moekit::io::require_finite_stored(t);  // the block scales: codes are always finite
      l.packed.resize(t.bytes.size());
      moekit::io::transcode(t, l.packed);
      l.precision = l.source = *p;
      l.scheme = moekit::io::gguf_exact_scheme;
    } else {
      l.w = moekit::io::dequantize(t);
      moekit::io::require_finite(t, l.w);
    }
    if (bias) l.bias = read(name + ".bias", {rows});
    return l;
  }
  DenseMlp mlp(const std::string& prefix, std::size_t hidden, std::size_t ffn) const {
    return {linear(prefix + ".gate_proj", ffn, hidden), linear(prefix + ".up_proj", ffn, hidden),
            linear(prefix + ".down_proj", hidden, ffn)};
  }

 private:
  /// Tensor `name`, checked to have exactly `shape` (the error names the tensor and both shapes).
  moekit::io::TensorView checked(const std::string& name,
                                 const std::vector<std::uint64_t>& shape) const {
    const moekit::io::TensorView t = m_.tensor(name);
    const auto got = t.shape();
    if (!std::equal(got.begin(), got.end(), shape.begin(), shape.end()))
      throw moekit::Error(
          moekit::ErrorKind::invalid_format,
          t.where() + " has shape " + dims(got) + ", expected " + dims(shape) + " from the config");
    return t;
  }
  static std::string dims(std::span<const std::uint64_t> d) {
    std::string s = "[";
    for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
  }
  const Reader& m_;
};

}  // namespace detail

/// Loads a Hugging Face safetensors checkpoint (directory, index or single file) for `cfg`,
/// encoding the routed experts at each of `expert_precisions`. With no precision the routed
/// experts are not read at all (they come from an expert store): only the dense part is loaded,
/// held as `dense_storage` says (each layer narrowed once read, so the f32 copy of at most one
/// layer exists at a time).
inline ModelWeights load_weights(const ModelConfig& cfg, const std::filesystem::path& path,
                                 std::vector<moekit::Precision> expert_precisions,
                                 const DenseStorage& dense_storage = {}) {
  const auto model = moekit::io::SafetensorsModel::open(path);
  check_tensor_census(cfg, model.names(), path.string());
  const detail::CheckedReader r(model);
  const std::size_t H = cfg.hidden, V = cfg.vocab_size;
  ModelWeights w;
  DenseWeights& d = w.dense;
  d.embed = r.linear("model.embed_tokens", V, H);
  dense_storage.narrow(d.embed);
  d.final_norm = r.read("model.norm.weight", {H});
  if (!cfg.tie_word_embeddings) {
    d.lm_head = r.linear("lm_head", V, H);
    dense_storage.narrow(d.lm_head);
  }

  const moekit::ModelShape shape = cfg.shape();
  const bool with_experts = !expert_precisions.empty();
  if (with_experts) w.experts = HostExperts(shape, std::move(expert_precisions));
  const bool mixtral = cfg.arch == Architecture::mixtral;
  d.layers.resize(cfg.n_layers);
  for (std::uint32_t l = 0; l < cfg.n_layers; ++l) {
    LayerWeights& L = d.layers[l];
    const std::string p = "model.layers." + std::to_string(l);
    L.attn_norm = r.read(p + ".input_layernorm.weight", {H});
    L.ffn_norm = r.read(p + ".post_attention_layernorm.weight", {H});
    L.q = r.linear(p + ".self_attn.q_proj", cfg.q_dim(), H, cfg.qkv_bias);
    L.k = r.linear(p + ".self_attn.k_proj", cfg.kv_dim(), H, cfg.qkv_bias);
    L.v = r.linear(p + ".self_attn.v_proj", cfg.kv_dim(), H, cfg.qkv_bias);
    L.o = r.linear(p + ".self_attn.o_proj", H, cfg.q_dim(), cfg.o_bias);
    if (cfg.qk_norm) {
      L.q_norm = r.read(p + ".self_attn.q_norm.weight", {cfg.q_dim()});
      L.k_norm = r.read(p + ".self_attn.k_norm.weight", {cfg.kv_dim()});
    }
    const std::int32_t m = cfg.moe_index[l];
    if (m < 0) {
      L.mlp = r.mlp(p + ".mlp", H, cfg.dense_ffn);
      dense_storage.narrow(L);
      continue;
    }
    const std::string moe = p + (mixtral ? ".block_sparse_moe" : ".mlp");
    L.router = r.linear(moe + ".gate", cfg.n_experts, H);
    if (cfg.shared_ffn) {
      L.shared = r.mlp(moe + ".shared_expert", H, cfg.shared_ffn);
      L.shared_gate = r.linear(moe + ".shared_expert_gate", 1, H);
    }
    dense_storage.narrow(L);
    const std::size_t F = cfg.expert_ffn;
    for (std::uint32_t e = 0; with_experts && e < cfg.n_experts; ++e) {
      const std::string x = moe + ".experts." + std::to_string(e);
      const auto w1 = r.read(x + (mixtral ? ".w1.weight" : ".gate_proj.weight"), {F, H});
      const auto w3 = r.read(x + (mixtral ? ".w3.weight" : ".up_proj.weight"), {F, H});
      const auto w2 = r.read(x + (mixtral ? ".w2.weight" : ".down_proj.weight"), {H, F});
      w.experts.set({static_cast<std::uint32_t>(m), e}, w1, w3, w2);
    }
  }
  return w;
}

/// The routers of every MoE layer back to back, [n_moe_layers · n_experts · hidden] f32 (row
/// l·E + e = expert e of MoE layer l): the layout HOBBIT's and Fate's gate predictors read.
inline std::vector<float> router_stack(const ModelConfig& cfg, const DenseWeights& d) {
  std::vector<float> out;
  out.reserve(std::size_t{cfg.n_moe_layers} * cfg.n_experts * cfg.hidden);
  for (std::uint32_t l = 0; l < cfg.n_layers; ++l)
    if (cfg.moe_index[l] >= 0)
      out.insert(out.end(), d.layers[l].router.w.begin(), d.layers[l].router.w.end());
  MOEKIT_EXPECTS(out.size() == std::size_t{cfg.n_moe_layers} * cfg.n_experts * cfg.hidden,
                 "router_stack: router sizes differ from the config");
  return out;
}

/// Decoder layer (checkpoint numbering) of each MoE layer of `cfg`.
inline std::vector<std::uint32_t> moe_decoder_layers(const ModelConfig& cfg) {
  std::vector<std::uint32_t> out(cfg.n_moe_layers);
  for (std::uint32_t l = 0; l < cfg.n_layers; ++l)
    if (cfg.moe_index[l] >= 0) out[static_cast<std::size_t>(cfg.moe_index[l])] = l;
  return out;
}

}  // namespace moekit::engine
