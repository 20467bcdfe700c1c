#pragma once
/// \file ModelConfig: the architecture of a checkpoint, read from its Hugging Face config.json.
///
/// Three architectures, defined by transformers' modelling code (v5):
/// - Mixtral (`model_type` "mixtral"): pre-norm decoder, GQA attention with RoPE (rotate_half
///   layout), optional sliding window on every layer, router = softmax over all logits, top-k,
///   always renormalised to sum 1; SwiGLU experts w1 (gate), w3 (up), w2 (down).
/// - Qwen2-MoE ("qwen2_moe"): q/k/v biases (`qkv_bias`), softmax/top-k router renormalised only
///   when `norm_topk_prob`; a shared SwiGLU expert added as
///   sigmoid(shared_expert_gate·x)·shared(x); layers listed in `mlp_only_layers` or not on a
///   `decoder_sparse_step` boundary are dense MLPs; sliding-window layers per `layer_types` (or
///   `use_sliding_window`/`max_window_layers`).
/// - OLMoE ("olmoe"): q_norm / k_norm, RMSNorms over the whole projected q (hidden_size) and k
///   (kv_heads·head_dim) before RoPE, optional `clip_qkv` clamp, `attention_bias` on all four
///   projections, router renormalised only when `norm_topk_prob`.
/// Every validation error names the config file and the field.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/core/model_shape.hpp"
#include "moekit/error.hpp"

namespace moekit::engine {

/// The decoder families moe-run implements.
enum class Architecture { mixtral, qwen2_moe, olmoe };

inline const char* name(Architecture a) noexcept {
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

/// Upper bounds the config parsers put on layer and expert counts before any table is sized by
/// them (the tensors present then decide exactly: engine/tensor_census.hpp). Far above any model
/// (hundreds of layers, a few hundred experts), far below what would exhaust memory:
/// `num_hidden_layers` = 1e9 used to allocate for seconds until std::bad_alloc.
inline constexpr std::uint32_t max_config_layers = 1u << 16;
inline constexpr std::uint32_t max_config_experts = 1u << 16;

/// Everything the engine needs to know about a model, independent of where its weights live.
struct ModelConfig {
  Architecture arch = Architecture::mixtral;
  std::string source;  ///< the config file it was read from (for messages)

  std::uint32_t vocab_size = 0;
  std::uint32_t hidden = 0;
  std::uint32_t n_layers = 0;  ///< decoder layers (MoE and dense)
  std::uint32_t n_heads = 0;
  std::uint32_t n_kv_heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t max_positions = 0;
  double rope_theta = 10000.0;
  float rms_norm_eps = 1e-6f;

  /// Attention window per decoder layer: 0 = full causal attention, w > 0 = a query at position
  /// p sees keys at positions > p − w (transformers' sliding_window_overlay).
  std::vector<std::uint32_t> window;

  bool qkv_bias = false;          ///< biases on q/k/v (Qwen2-MoE, OLMoE attention_bias)
  bool o_bias = false;            ///< bias on o_proj (OLMoE attention_bias)
  bool qk_norm = false;           ///< OLMoE's q_norm / k_norm
  std::optional<float> clip_qkv;  ///< OLMoE: clamp q, k, v to ±clip

  std::uint32_t n_experts = 0;
  std::uint32_t top_k = 0;
  std::uint32_t expert_ffn = 0;  ///< routed expert intermediate size
  bool norm_topk_prob = true;    ///< renormalise the top-k probabilities to sum 1
  std::uint32_t shared_ffn = 0;  ///< Qwen2-MoE shared expert intermediate size (0 = none)
  std::uint32_t dense_ffn = 0;   ///< intermediate size of dense (non-MoE) MLP layers

  /// Per decoder layer: its index among the MoE layers, or −1 for a dense MLP layer.
  std::vector<std::int32_t> moe_index;
  std::uint32_t n_moe_layers = 0;

  bool tie_word_embeddings = false;
  std::optional<std::uint32_t> bos_token_id;
  /// Grouping of the experts moekit quantizes: not from config.json, the run's codec
  /// (moe-run --group-size; EdgeMoE's default is per channel).
  moekit::QuantScheme expert_quant{};
  /// The K-quant blob of experts read in place from a GGUF file (io::CheckpointExperts'
  /// `shape().kquant`): not from the metadata, set by the run that reads them.
  moekit::KquantBlob expert_kquant{};
  std::vector<std::uint32_t> eos_token_ids;

  [[nodiscard]] std::uint32_t q_dim() const noexcept { return n_heads * head_dim; }
  [[nodiscard]] std::uint32_t kv_dim() const noexcept { return n_kv_heads * head_dim; }

  /// The routed part, as the offload pipeline sees it.
  [[nodiscard]] moekit::ModelShape shape() const noexcept {
    return moekit::ModelShape{.n_layers = n_moe_layers,
                              .n_experts = n_experts,
                              .top_k = top_k,
                              .hidden = hidden,
                              .ffn = expert_ffn,
                              .n_shared_experts = shared_ffn ? 1u : 0u,
                              .shared_ffn = shared_ffn,
                              .quant = expert_quant,
                              .kquant = expert_kquant};
  }
};

namespace detail {

/// Typed access to the fields of a config.json object; errors name the file and the field.
class JsonFields {
 public:
  JsonFields(const nlohmann::json& j, std::string source) : j_(j), source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what,
                         moekit::ErrorKind kind = moekit::ErrorKind::invalid_format) const {
    throw moekit::Error(kind, "config '" + source_ + "': field '" + field + "' " + what);
  }

  [[nodiscard]] bool has(const char* f) const { return j_.contains(f) && !j_.at(f).is_null(); }

  [[nodiscard]] std::uint32_t uint(const char* f) const {
    if (!j_.contains(f)) fail(f, "is missing");
    return as_uint(f, j_.at(f));
  }
  [[nodiscard]] std::uint32_t uint_or(const char* f, std::uint32_t dflt) const {
    return has(f) ? as_uint(f, j_.at(f)) : dflt;
  }
  [[nodiscard]] std::uint32_t positive(const char* f) const {
    const std::uint32_t v = uint(f);
    if (v == 0) fail(f, "must be > 0");
    return v;
  }
  [[nodiscard]] double number_or(const char* f, double dflt) const {
    if (!has(f)) return dflt;
    const auto& v = j_.at(f);
    if (!v.is_number()) fail(f, "must be a number, not " + v.dump());
    return v.get<double>();
  }
  [[nodiscard]] bool boolean_or(const char* f, bool dflt) const {
    if (!has(f)) return dflt;
    const auto& v = j_.at(f);
    if (!v.is_boolean()) fail(f, "must be true or false, not " + v.dump());
    return v.get<bool>();
  }
  [[nodiscard]] std::string string(const char* f) const {
    if (!has(f)) fail(f, "is missing");
    const auto& v = j_.at(f);
    if (!v.is_string()) fail(f, "must be a string, not " + v.dump());
    return v.get<std::string>();
  }
  [[nodiscard]] std::vector<std::uint32_t> uint_list_or_one(const char* f) const {
    std::vector<std::uint32_t> out;
    if (!has(f)) return out;
    const auto& v = j_.at(f);
    if (v.is_array()) {
      for (const auto& e : v) out.push_back(as_uint(f, e));
    } else {
      out.push_back(as_uint(f, v));
    }
    return out;
  }
  [[nodiscard]] const nlohmann::json& at(const char* f) const { return j_.at(f); }
  [[nodiscard]] const std::string& source() const noexcept { return source_; }

 private:
  std::uint32_t as_uint(const std::string& f, const nlohmann::json& v) const {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 ||
        v.get<std::int64_t>() > std::int64_t{0xffffffff})
      fail(f, "must be a non-negative integer, not " + v.dump());
    return static_cast<std::uint32_t>(v.get<std::int64_t>());
  }

  const nlohmann::json& j_;
  std::string source_;
};

// RoPE: only the default (unscaled) rotary embedding is implemented.
inline double read_rope_theta(const JsonFields& f, double default_theta) {
  if (f.has("rope_parameters")) {
    const auto& rp = f.at("rope_parameters");
    if (!rp.is_object()) f.fail("rope_parameters", "must be an object");
    const auto type = rp.value("rope_type", std::string("default"));
    if (type != "default")
      f.fail("rope_parameters.rope_type", "is '" + type + "'; only the default RoPE is supported",
             moekit::ErrorKind::unsupported);
    if (rp.contains("partial_rotary_factor") && rp.at("partial_rotary_factor") != 1.0)
      f.fail("rope_parameters.partial_rotary_factor", "must be 1 (partial RoPE is not supported)",
             moekit::ErrorKind::unsupported);
    if (!rp.contains("rope_theta")) return f.number_or("rope_theta", default_theta);
    if (!rp.at("rope_theta").is_number()) f.fail("rope_parameters.rope_theta", "must be a number");
    return rp.at("rope_theta").get<double>();
  }
  if (f.has("rope_scaling"))
    f.fail("rope_scaling", "is set; scaled RoPE is not supported", moekit::ErrorKind::unsupported);
  return f.number_or("rope_theta", default_theta);
}

inline Architecture read_architecture(const JsonFields& f) {
  const std::string type = f.string("model_type");
  if (type == "mixtral") return Architecture::mixtral;
  if (type == "qwen2_moe") return Architecture::qwen2_moe;
  if (type == "olmoe") return Architecture::olmoe;
  f.fail("model_type", "is '" + type + "'; supported: mixtral, qwen2_moe, olmoe",
         moekit::ErrorKind::unsupported);
}

// The fields every architecture reads the same way: sizes, heads, norms, RoPE, special tokens.
inline void read_decoder(const JsonFields& f, ModelConfig& c) {
  if (f.has("hidden_act") && f.string("hidden_act") != "silu")
    f.fail("hidden_act", "is '" + f.string("hidden_act") + "'; only silu is supported",
           moekit::ErrorKind::unsupported);

  c.vocab_size = f.positive("vocab_size");
  c.hidden = f.positive("hidden_size");
  c.n_layers = f.positive("num_hidden_layers");
  if (c.n_layers > max_config_layers)
    f.fail("num_hidden_layers", "is " + std::to_string(c.n_layers) + ", more than moekit reads (" +
                                    std::to_string(max_config_layers) + ")");
  c.n_heads = f.positive("num_attention_heads");
  c.n_kv_heads = f.uint_or("num_key_value_heads", c.n_heads);
  if (c.n_kv_heads == 0 || c.n_heads % c.n_kv_heads != 0)
    f.fail("num_key_value_heads", "(" + std::to_string(c.n_kv_heads) +
                                      ") must be > 0 and divide num_attention_heads (" +
                                      std::to_string(c.n_heads) + ")");
  c.head_dim = f.uint_or("head_dim", 0);
  if (f.has("head_dim") && c.head_dim == 0) f.fail("head_dim", "must be > 0 (or null)");
  if (c.head_dim == 0) {
    if (c.hidden % c.n_heads != 0)
      f.fail("num_attention_heads", "must divide hidden_size when head_dim is not given");
    c.head_dim = c.hidden / c.n_heads;
  }
  if (c.head_dim % 2 != 0) f.fail("head_dim", "must be even for RoPE");
  c.max_positions = f.uint_or("max_position_embeddings", 4096);
  if (c.max_positions == 0) f.fail("max_position_embeddings", "must be > 0");
  c.rms_norm_eps = static_cast<float>(
      f.number_or("rms_norm_eps", c.arch == Architecture::qwen2_moe ? 1e-6 : 1e-5));
  if (!(c.rms_norm_eps > 0)) f.fail("rms_norm_eps", "must be > 0");
  c.rope_theta = read_rope_theta(f, c.arch == Architecture::mixtral ? 1e6 : 1e4);
  if (!(c.rope_theta > 0)) f.fail("rope_theta", "must be > 0");
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", false);
  if (f.has("bos_token_id")) c.bos_token_id = f.uint("bos_token_id");
  c.eos_token_ids = f.uint_list_or_one("eos_token_id");
  for (std::uint32_t e : c.eos_token_ids)  // an id past the vocabulary would never end a text
    if (e >= c.vocab_size)
      f.fail("eos_token_id",
             std::to_string(e) + " is not below vocab_size " + std::to_string(c.vocab_size));
}

inline void read_mixtral(const JsonFields& f, ModelConfig& c) {
  c.n_experts = f.positive("num_local_experts");
  c.expert_ffn = f.positive("intermediate_size");
  c.norm_topk_prob = true;  // MixtralTopKRouter always renormalises
  if (f.has("sliding_window")) {
    const std::uint32_t w = f.uint("sliding_window");
    if (w == 0) f.fail("sliding_window", "must be null or > 0");
    c.window.assign(c.n_layers, w);
  }
  for (std::uint32_t l = 0; l < c.n_layers; ++l) c.moe_index[l] = static_cast<std::int32_t>(l);
}

// Qwen2-MoE's MoE layers: those not in mlp_only_layers and on a decoder_sparse_step boundary.
inline void read_qwen2_moe_layers(const JsonFields& f, ModelConfig& c) {
  const std::uint32_t step = f.uint_or("decoder_sparse_step", 1);
  if (step == 0) f.fail("decoder_sparse_step", "must be >= 1");
  std::vector<bool> mlp_only(c.n_layers, false);
  if (f.has("mlp_only_layers")) {
    if (!f.at("mlp_only_layers").is_array()) f.fail("mlp_only_layers", "must be a list");
    for (std::uint32_t l : f.uint_list_or_one("mlp_only_layers")) {
      if (l >= c.n_layers)
        f.fail("mlp_only_layers", "names layer " + std::to_string(l) + " >= num_hidden_layers");
      mlp_only[l] = true;
    }
  }
  std::uint32_t m = 0;
  for (std::uint32_t l = 0; l < c.n_layers; ++l)
    if (!mlp_only[l] && (l + 1) % step == 0) c.moe_index[l] = static_cast<std::int32_t>(m++);
  if (m < c.n_layers && c.dense_ffn == 0)
    f.fail("intermediate_size", "is needed (> 0) for the dense MLP layers");
}

// Qwen2-MoE's sliding-window layers: layer_types when given, else transformers' default rule.
inline void read_qwen2_moe_windows(const JsonFields& f, ModelConfig& c) {
  const bool use_sw = f.boolean_or("use_sliding_window", false);
  const std::uint32_t w = use_sw ? f.uint_or("sliding_window", 0) : 0;
  if (f.has("layer_types")) {
    const auto& lt = f.at("layer_types");
    if (!lt.is_array() || lt.size() != c.n_layers)
      f.fail("layer_types", "must list one type per layer (" + std::to_string(c.n_layers) + ")");
    for (std::uint32_t l = 0; l < c.n_layers; ++l) {
      const std::string t = lt[l].is_string() ? lt[l].get<std::string>() : "";
      if (t == "sliding_attention") {
        if (w == 0)
          f.fail("sliding_window",
                 "must be > 0 (with use_sliding_window) when layer_types has "
                 "sliding_attention layers");
        c.window[l] = w;
      } else if (t != "full_attention") {
        f.fail("layer_types",
               "has '" + lt[l].dump() + "' at layer " + std::to_string(l) +
                   "; expected full_attention or sliding_attention",
               moekit::ErrorKind::unsupported);
      }
    }
  } else if (use_sw) {
    if (w == 0) f.fail("sliding_window", "must be > 0 when use_sliding_window is true");
    const std::uint32_t max_window_layers = f.uint_or("max_window_layers", 28);
    for (std::uint32_t l = 0; l < c.n_layers; ++l)
      if ((l + 1) % 2 != 0 && l < max_window_layers) c.window[l] = w;
  }
}

inline void read_qwen2_moe(const JsonFields& f, ModelConfig& c) {
  c.n_experts = f.positive("num_experts");
  c.expert_ffn = f.positive("moe_intermediate_size");
  c.shared_ffn = f.uint_or("shared_expert_intermediate_size", 0);
  c.dense_ffn = f.uint_or("intermediate_size", 0);
  c.norm_topk_prob = f.boolean_or("norm_topk_prob", false);
  c.qkv_bias = f.boolean_or("qkv_bias", true);
  read_qwen2_moe_layers(f, c);
  read_qwen2_moe_windows(f, c);
}

inline void read_olmoe(const JsonFields& f, ModelConfig& c) {
  c.n_experts = f.uint_or("num_experts", 0);
  if (c.n_experts == 0) c.n_experts = f.positive("num_local_experts");
  c.expert_ffn = f.positive("intermediate_size");
  c.norm_topk_prob = f.boolean_or("norm_topk_prob", false);
  c.qkv_bias = c.o_bias = f.boolean_or("attention_bias", false);
  c.qk_norm = true;
  if (c.head_dim * c.n_heads != c.hidden)
    f.fail("head_dim", "must equal hidden_size / num_attention_heads for OLMoE's q_norm",
           moekit::ErrorKind::unsupported);
  if (f.has("clip_qkv")) {
    const double clip = f.number_or("clip_qkv", 0);
    if (!(clip > 0)) f.fail("clip_qkv", "must be null or > 0");
    c.clip_qkv = static_cast<float>(clip);
  }
  for (std::uint32_t l = 0; l < c.n_layers; ++l) c.moe_index[l] = static_cast<std::int32_t>(l);
}

}  // namespace detail

/// Builds a ModelConfig from a parsed config.json. `source` names the file in errors.
inline ModelConfig parse_config(const nlohmann::json& j, const std::string& source) {
  using moekit::ErrorKind;
  if (!j.is_object())
    throw moekit::Error(ErrorKind::invalid_format, "config '" + source + "' is not a JSON object");
  const detail::JsonFields f(j, source);
  ModelConfig c;
  c.source = source;
  c.arch = detail::read_architecture(f);
  detail::read_decoder(f, c);

  c.top_k = f.positive("num_experts_per_tok");
  c.window.assign(c.n_layers, 0);
  c.moe_index.assign(c.n_layers, -1);
  switch (c.arch) {
    case Architecture::mixtral:
      detail::read_mixtral(f, c);
      break;
    case Architecture::qwen2_moe:
      detail::read_qwen2_moe(f, c);
      break;
    case Architecture::olmoe:
      detail::read_olmoe(f, c);
      break;
  }
  if (c.n_experts > max_config_experts)
    f.fail(c.arch == Architecture::mixtral ? "num_local_experts" : "num_experts",
           "is " + std::to_string(c.n_experts) + ", more than moekit reads (" +
               std::to_string(max_config_experts) + ")");
  if (c.top_k > c.n_experts)
    f.fail("num_experts_per_tok", "(" + std::to_string(c.top_k) +
                                      ") must not exceed the number of experts (" +
                                      std::to_string(c.n_experts) + ")");
  c.n_moe_layers = 0;
  for (std::int32_t m : c.moe_index) c.n_moe_layers += m >= 0;
  if (c.n_moe_layers == 0)
    f.fail("mlp_only_layers", "leaves no MoE layer; moe-run needs at least one",
           ErrorKind::unsupported);
  return c;
}

/// Builds a ModelConfig from the text of a config.json; `source` names the file in errors.
inline ModelConfig parse_config_text(std::string_view text, const std::string& source) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw moekit::Error(moekit::ErrorKind::invalid_format,
                        "config '" + source + "' is not valid JSON");
  return parse_config(j, source);
}

/// Reads `path` when it is a file, else `<path>/config.json`.
inline ModelConfig load_config(const std::filesystem::path& path) {
  const std::filesystem::path file =
      std::filesystem::is_regular_file(path) ? path : path / "config.json";
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw moekit::Error(moekit::ErrorKind::io, "cannot open model config '" + file.string() + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_config_text(text, file.string());
}

}  // namespace moekit::engine
