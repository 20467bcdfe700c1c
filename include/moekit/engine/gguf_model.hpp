#pragma once
/// \file A GGUF file (llama.cpp's format) as a moe-run model: the ModelConfig from its metadata
/// and the dense weights, dequantized to f32 from any type io/dequantize reads (F32, F16, BF16,
/// Q8_0, Q4_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K). The routed experts come from an expert store built
/// from the same file (expert_source.hpp: build_store_from_gguf) or, with `expert_precisions`,
/// into host memory.
///
/// Architectures (`general.architecture`) and llama.cpp's metadata keys `<arch>.*`:
/// - "llama" — Mixtral as llama.cpp's convert_hf_to_gguf.py writes it (there is no "mixtral"
///   architecture in llama.cpp). Its attn_q / attn_k rows are permuted per head so that GGML's
///   adjacent-pair RoPE equals transformers' rotate_half RoPE: HF row (head, half, i) is stored
///   at (head, i, half). We undo that on load (`unpermute_qk`) and keep one RoPE (ops.hpp).
/// - "qwen2moe" — q/k/v biases, a shared expert (`ffn_*_shexp`) gated by `ffn_gate_inp_shexp`;
///   NEOX RoPE (= rotate_half), so no permutation; every block is an MoE block.
/// - "olmoe" — `attn_q_norm` / `attn_k_norm` over the whole q and k projections; NEOX RoPE.
/// Top-k renormalisation: `<arch>.expert_weights_norm` when present, else llama.cpp's choice per
/// architecture (llama: yes; qwen2moe, olmoe: no). Sliding window:
/// `<arch>.attention.sliding_window` on every layer. Every error names the file and the key or
/// tensor.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/io/tensor_names.hpp"

#include "moekit/engine/config.hpp"
#include "moekit/engine/tensor_census.hpp"
#include "moekit/engine/weights.hpp"

namespace moekit::engine {

namespace detail {

/// Typed access to `<arch>.*` and other metadata of a GGUF file; errors name file and key.
class GgufMeta {
 public:
  GgufMeta(const moekit::io::GgufFile& g, std::string arch) : g_(g), arch_(std::move(arch)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what,
                         moekit::ErrorKind kind = moekit::ErrorKind::invalid_format) const {
    throw moekit::Error(kind, "GGUF '" + g_.path() + "': metadata '" + key + "' " + what);
  }
  [[nodiscard]] std::string key(const std::string& k) const { return arch_ + "." + k; }
  [[nodiscard]] const moekit::io::GgufValue* find(const std::string& full) const {
    return g_.metadata(full);
  }
  [[nodiscard]] std::uint32_t uint(const std::string& full) const {
    const auto* v = find(full);
    if (!v) fail(full, "is missing");
    return to_u32(full, *v);
  }
  [[nodiscard]] std::uint32_t uint_or(const std::string& full, std::uint32_t dflt) const {
    const auto* v = find(full);
    return v ? to_u32(full, *v) : dflt;
  }
  [[nodiscard]] std::uint32_t positive(const std::string& full) const {
    const std::uint32_t v = uint(full);
    if (v == 0) fail(full, "must be > 0");
    return v;
  }
  [[nodiscard]] double number_or(const std::string& full, double dflt) const {
    const auto* v = find(full);
    if (!v) return dflt;
    try {
      return v->as_double(full);
    } catch (const moekit::Error&) {
      fail(full, "must be a number");
    }
  }
  [[nodiscard]] std::optional<bool> boolean(const std::string& full) const {
    const auto* v = find(full);
    if (!v) return std::nullopt;
    if (const bool* b = std::get_if<bool>(&v->value)) return *b;
    fail(full, "must be a bool");
  }
  [[nodiscard]] std::optional<std::string> string(const std::string& full) const {
    const auto* v = find(full);
    if (!v) return std::nullopt;
    if (const std::string* s = std::get_if<std::string>(&v->value)) return *s;
    fail(full, "must be a string");
  }

 private:
  std::uint32_t to_u32(const std::string& full, const moekit::io::GgufValue& v) const {
    if (!v.is_integer()) fail(full, "must be a non-negative integer");
    std::uint64_t u = 0;
    try {
      u = v.as_uint(full);
    } catch (const moekit::Error&) {
      fail(full, "must be a non-negative integer");
    }
    if (u > 0xffffffffu) fail(full, "is too large (" + std::to_string(u) + ")");
    return static_cast<std::uint32_t>(u);
  }

  const moekit::io::GgufFile& g_;
  std::string arch_;
};

}  // namespace detail

/// Undoes llama.cpp's Q/K row permutation of the llama architecture in place: `w` holds
/// `n_heads` heads of `head_dim` rows of `cols` values; GGUF row (h, i, half) — i < head_dim/2,
/// half ∈ {0, 1}, row h·head_dim + 2i + half — becomes HF row h·head_dim + half·head_dim/2 + i.
inline void unpermute_qk(Linear& w, std::uint32_t n_heads, std::uint32_t head_dim) {
  MOEKIT_EXPECTS(head_dim % 2 == 0 && w.rows == std::size_t{n_heads} * head_dim,
                 "unpermute_qk: rows differ from heads x head_dim");
  std::vector<std::size_t> from(w.rows);
  const std::uint32_t half = head_dim / 2;
  for (std::uint32_t h = 0; h < n_heads; ++h)
    for (std::uint32_t i = 0; i < half; ++i)
      for (std::uint32_t s = 0; s < 2; ++s)
        from[std::size_t{h} * head_dim + s * half + i] = std::size_t{h} * head_dim + 2 * i + s;
  w.permute_rows(from);
}

/// True when `p` starts with GGUF's magic.
inline bool is_gguf_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::string_view(magic, 4) == "GGUF";
}

/// The architecture of a GGUF file as moe-run names it; throws `Error(unsupported)` naming
/// `general.architecture` otherwise.
inline Architecture gguf_architecture(const moekit::io::GgufFile& g) {
  const std::string a = g.architecture();
  if (a == "llama") return Architecture::mixtral;
  if (a == "qwen2moe") return Architecture::qwen2_moe;
  if (a == "olmoe") return Architecture::olmoe;
  throw moekit::Error(moekit::ErrorKind::unsupported,
                      "GGUF '" + g.path() + "': general.architecture '" + a +
                          "' is not one moe-run runs (llama with experts = Mixtral, qwen2moe, "
                          "olmoe)");
}

namespace detail {

// Sizes, heads, RoPE and norms.
inline void read_gguf_attention(const GgufMeta& m, ModelConfig& c) {
  using moekit::ErrorKind;
  c.hidden = m.positive(m.key("embedding_length"));
  c.n_layers = m.positive(m.key("block_count"));
  if (c.n_layers > max_config_layers)
    m.fail(m.key("block_count"), "is " + std::to_string(c.n_layers) + ", more than moekit reads (" +
                                     std::to_string(max_config_layers) + ")");
  c.n_heads = m.positive(m.key("attention.head_count"));
  c.n_kv_heads = m.uint_or(m.key("attention.head_count_kv"), c.n_heads);
  if (c.n_kv_heads == 0 || c.n_heads % c.n_kv_heads != 0)
    m.fail(m.key("attention.head_count_kv"), "(" + std::to_string(c.n_kv_heads) +
                                                 ") must be > 0 and divide attention.head_count (" +
                                                 std::to_string(c.n_heads) + ")");
  c.head_dim = m.uint_or(m.key("attention.key_length"), 0);
  if (c.head_dim == 0) {
    if (c.hidden % c.n_heads != 0)
      m.fail(m.key("attention.head_count"),
             "must divide embedding_length when key_length is absent");
    c.head_dim = c.hidden / c.n_heads;
  }
  if (c.head_dim % 2 != 0) m.fail(m.key("attention.key_length"), "must be even for RoPE");
  if (m.uint_or(m.key("attention.value_length"), c.head_dim) != c.head_dim)
    m.fail(m.key("attention.value_length"), "differs from key_length", ErrorKind::unsupported);
  if (m.uint_or(m.key("rope.dimension_count"), c.head_dim) != c.head_dim)
    m.fail(m.key("rope.dimension_count"),
           "differs from the head dimension (partial RoPE is not supported)",
           ErrorKind::unsupported);
  if (const auto t = m.string(m.key("rope.scaling.type")); t && *t != "none")
    m.fail(m.key("rope.scaling.type"), "is '" + *t + "'; only unscaled RoPE is supported",
           ErrorKind::unsupported);
  c.max_positions = m.uint_or(m.key("context_length"), 4096);
  c.rope_theta = m.number_or(m.key("rope.freq_base"), 10000.0);
  if (!(c.rope_theta > 0)) m.fail(m.key("rope.freq_base"), "must be > 0");
  c.rms_norm_eps = static_cast<float>(m.number_or(m.key("attention.layer_norm_rms_epsilon"), 1e-5));
  if (!(c.rms_norm_eps > 0)) m.fail(m.key("attention.layer_norm_rms_epsilon"), "must be > 0");
}

// The vocabulary size (from the embedding's rows) and whether the output is tied to it.
inline void read_gguf_vocab(const moekit::io::GgufFile& g, const GgufMeta& m, ModelConfig& c) {
  const moekit::io::TensorView embd = g.tensor("token_embd.weight");
  if (embd.rank != 2 || embd.cols() != c.hidden)
    throw moekit::Error(moekit::ErrorKind::invalid_format,
                        embd.where() + " is not a [vocab, embedding_length] matrix");
  c.vocab_size = m.uint_or(m.key("vocab_size"), static_cast<std::uint32_t>(embd.rows()));
  if (c.vocab_size != embd.rows())
    m.fail(m.key("vocab_size"), "(" + std::to_string(c.vocab_size) +
                                    ") differs from the rows of token_embd.weight (" +
                                    std::to_string(embd.rows()) + ")");
  c.tie_word_embeddings = g.info("output.weight") == nullptr;
}

// The routed experts; every layer is a MoE layer.
inline void read_gguf_experts(const GgufMeta& m, ModelConfig& c) {
  c.n_experts = m.positive(m.key("expert_count"));
  if (c.n_experts > max_config_experts)
    m.fail(m.key("expert_count"), "is " + std::to_string(c.n_experts) +
                                      ", more than moekit reads (" +
                                      std::to_string(max_config_experts) + ")");
  c.top_k = m.positive(m.key("expert_used_count"));
  if (c.top_k > c.n_experts)
    m.fail(m.key("expert_used_count"), "(" + std::to_string(c.top_k) + ") exceeds expert_count (" +
                                           std::to_string(c.n_experts) + ")");
  // Without expert_feed_forward_length, llama.cpp sizes a qwen2moe expert as
  // feed_forward_length / expert_used_count, the others' as feed_forward_length.
  c.expert_ffn = m.find(m.key("expert_feed_forward_length"))
                     ? m.positive(m.key("expert_feed_forward_length"))
                     : m.positive(m.key("feed_forward_length")) /
                           (c.arch == Architecture::qwen2_moe ? c.top_k : 1u);
  if (c.expert_ffn == 0) m.fail(m.key("feed_forward_length"), "is smaller than expert_used_count");
  c.norm_topk_prob =
      m.boolean(m.key("expert_weights_norm")).value_or(c.arch == Architecture::mixtral);
  const std::uint32_t window = m.uint_or(m.key("attention.sliding_window"), 0);
  c.window.assign(c.n_layers, window);
  c.moe_index.resize(c.n_layers);
  for (std::uint32_t l = 0; l < c.n_layers; ++l) c.moe_index[l] = static_cast<std::int32_t>(l);
  c.n_moe_layers = c.n_layers;
}

// What llama.cpp infers from tensors present: biases, OLMoE's q/k norms, the shared expert.
inline void read_gguf_extras(const moekit::io::GgufFile& g, const GgufMeta& m, ModelConfig& c) {
  c.qkv_bias = g.info("blk.0.attn_q.bias") != nullptr;
  c.o_bias = g.info("blk.0.attn_output.bias") != nullptr;
  c.qk_norm = c.arch == Architecture::olmoe;
  if (const auto* clamp = m.find(m.key("attention.clamp_kqv")); clamp) {
    const double v = m.number_or(m.key("attention.clamp_kqv"), 0);
    if (!(v > 0)) m.fail(m.key("attention.clamp_kqv"), "must be > 0");
    c.clip_qkv = static_cast<float>(v);
  }
  if (c.arch == Architecture::qwen2_moe) {
    c.shared_ffn = m.uint_or(m.key("expert_shared_feed_forward_length"), 0);
    if (c.shared_ffn == 0) {
      if (const auto* t = g.info("blk.0.ffn_gate_shexp.weight"))
        c.shared_ffn = static_cast<std::uint32_t>(t->dims[0]);
    }
  }
  if (c.qk_norm && c.q_dim() != c.hidden)
    m.fail(m.key("attention.key_length"),
           "times head_count must equal embedding_length for OLMoE's q_norm",
           moekit::ErrorKind::unsupported);
}

// The counts and sizes of the metadata against the tensors present, before anything is sized by
// them: block_count against the blocks named, expert_count and the expert FFN size against the
// stacked expert tensors' shape (or the per-expert tensors named).
inline void check_gguf_against_tensors(const moekit::io::GgufFile& g, const GgufMeta& m,
                                       const ModelConfig& c) {
  const moekit::io::GgufTensorInfo* stacked = g.info("blk.0.ffn_gate_exps.weight");
  if (stacked && stacked->rank == 3) {
    if (stacked->dims[0] != c.n_experts)
      m.fail(m.key("expert_count"), "is " + std::to_string(c.n_experts) + " but '" + stacked->name +
                                        "' holds " + std::to_string(stacked->dims[0]) + " experts");
    if (stacked->dims[1] != c.expert_ffn)
      m.fail(m.find(m.key("expert_feed_forward_length")) ? m.key("expert_feed_forward_length")
                                                         : m.key("feed_forward_length"),
             "gives experts of " + std::to_string(c.expert_ffn) + " rows but '" + stacked->name +
                 "' has " + std::to_string(stacked->dims[1]));
  }
  std::vector<std::string> names;
  names.reserve(g.tensors().size());
  for (const auto& t : g.tensors()) names.push_back(t.name);
  check_tensor_census(c, names, g.path(), /*gguf=*/true, stacked != nullptr,
                      CensusFields{"GGUF '" + g.path() + "': metadata ", m.key("block_count"),
                                   m.key("expert_count")});
}

}  // namespace detail

/// The ModelConfig of a GGUF file, from its metadata (and tensor shapes where llama.cpp infers
/// them: tied output, biases, the shared expert's size).
inline ModelConfig gguf_config(const moekit::io::GgufFile& g) {
  ModelConfig c;
  c.arch = gguf_architecture(g);
  c.source = g.path();
  const detail::GgufMeta m(g, g.architecture());
  if (!m.find(m.key("expert_count")))
    m.fail(m.key("expert_count"), "is missing: not a Mixture-of-Experts model",
           moekit::ErrorKind::unsupported);
  detail::read_gguf_attention(m, c);
  detail::read_gguf_vocab(g, m, c);
  detail::read_gguf_experts(m, c);
  detail::read_gguf_extras(g, m, c);
  detail::check_gguf_against_tensors(g, m, c);
  // llama.cpp prepends BOS unless add_bos_token says otherwise; moe-run prepends it when the
  // config has one.
  if (m.find("tokenizer.ggml.bos_token_id") &&
      m.boolean("tokenizer.ggml.add_bos_token").value_or(true))
    c.bos_token_id = m.uint("tokenizer.ggml.bos_token_id");
  if (m.find("tokenizer.ggml.eos_token_id"))
    c.eos_token_ids.push_back(m.uint("tokenizer.ggml.eos_token_id"));
  return c;
}

/// Loads the dense part of GGUF file `g` (config `cfg` from gguf_config), held as `dense_storage`
/// says, and the routed experts into host memory at each of `expert_precisions` (none: the
/// experts come from a store).
inline ModelWeights load_gguf_weights(const ModelConfig& cfg, const moekit::io::GgufFile& g,
                                      std::vector<moekit::Precision> expert_precisions,
                                      const DenseStorage& dense_storage = {}) {
  const detail::CheckedReader r(g);
  const std::size_t H = cfg.hidden, V = cfg.vocab_size;
  ModelWeights w;
  DenseWeights& d = w.dense;
  d.embed = r.linear("token_embd", V, H);
  dense_storage.narrow(d.embed);
  d.final_norm = r.read("output_norm.weight", {H});
  if (!cfg.tie_word_embeddings) {
    d.lm_head = r.linear("output", V, H);
    dense_storage.narrow(d.lm_head);
  }
  const bool permuted = cfg.arch == Architecture::mixtral;  // llama: GGML adjacent-pair RoPE rows
  const moekit::ModelShape shape = cfg.shape();
  const bool with_experts = !expert_precisions.empty();
  if (with_experts) w.experts = HostExperts(shape, std::move(expert_precisions));
  d.layers.resize(cfg.n_layers);
  for (std::uint32_t l = 0; l < cfg.n_layers; ++l) {
    LayerWeights& L = d.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    L.attn_norm = r.read(p + "attn_norm.weight", {H});
    L.ffn_norm = r.read(p + "ffn_norm.weight", {H});
    L.q = r.linear(p + "attn_q", cfg.q_dim(), H, cfg.qkv_bias);
    L.k = r.linear(p + "attn_k", cfg.kv_dim(), H, cfg.qkv_bias);
    L.v = r.linear(p + "attn_v", cfg.kv_dim(), H, cfg.qkv_bias);
    L.o = r.linear(p + "attn_output", H, cfg.q_dim(), cfg.o_bias);
    if (permuted) {
      unpermute_qk(L.q, cfg.n_heads, cfg.head_dim);
      unpermute_qk(L.k, cfg.n_kv_heads, cfg.head_dim);
    }
    if (cfg.qk_norm) {
      L.q_norm = r.read(p + "attn_q_norm.weight", {cfg.q_dim()});
      L.k_norm = r.read(p + "attn_k_norm.weight", {cfg.kv_dim()});
    }
    L.router = r.linear(p + "ffn_gate_inp", cfg.n_experts, H);
    L.router.widen();  // routers stay f32 (DenseStorage)
    if (cfg.shared_ffn) {
      L.shared = {r.linear(p + "ffn_gate_shexp", cfg.shared_ffn, H),
                  r.linear(p + "ffn_up_shexp", cfg.shared_ffn, H),
                  r.linear(p + "ffn_down_shexp", H, cfg.shared_ffn)};
      L.shared_gate.rows = 1;
      L.shared_gate.cols = H;
      L.shared_gate.w = r.read_vector(p + "ffn_gate_inp_shexp.weight", H);
    }
    dense_storage.narrow(L);
    for (std::uint32_t e = 0; with_experts && e < cfg.n_experts; ++e) {
      const ExpertF32 x = read_expert_f32(g, io_architecture(cfg.arch),
                                          moekit::io::TensorFormat::gguf, l, e, shape);
      w.experts.set({l, e}, x.w1, x.w3, x.w2);
    }
  }
  return w;
}

}  // namespace moekit::engine
