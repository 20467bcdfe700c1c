#pragma once
/// \file The layers and experts a checkpoint's tensor names hold, checked against the counts its
/// config gives before anything is sized by them.
///
/// Why: a config is a few bytes of JSON (or GGUF metadata) that sizes everything the engine
/// allocates. `num_hidden_layers` or `num_local_experts` = 1e9 used to allocate for seconds until
/// `std::bad_alloc`, and a config with fewer layers than the weights ran a truncated model
/// silently. The names are in the file headers, read already: counting them costs nothing, and a
/// count that disagrees is refused naming the field, the file and a tensor that is missing or
/// would be unused.
///
///     const auto names = moekit::io::SafetensorsModel::open(dir).names();
///     moekit::engine::check_tensor_census(cfg, names, dir.string());  // throws on a mismatch

#include <charconv>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "moekit/engine/config.hpp"
#include "moekit/error.hpp"
#include "moekit/io/tensor_names.hpp"

namespace moekit::engine {

/// What the tensor names of a checkpoint hold: per layer index, one of its tensors' names and the
/// expert indices named in it.
struct TensorCensus {
  struct Layer {
    std::string example;                           ///< one tensor of the layer
    std::map<std::uint32_t, std::string> experts;  ///< expert index → one of its tensors
  };
  std::map<std::uint32_t, Layer> layers;
};

namespace census_detail {

/// The decimal index at the start of `s` followed by '.', or nullopt.
inline std::optional<std::uint32_t> leading_index(std::string_view s, std::size_t& length) {
  std::uint32_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end == s.data() || end == s.data() + s.size() || *end != '.')
    return std::nullopt;
  length = static_cast<std::size_t>(end - s.data()) + 1;
  return v;
}

}  // namespace census_detail

/// Counts layers ("model.layers.L." in Hugging Face naming, "blk.L." in GGUF's) and experts
/// (".experts.E." after the layer, GGUF's per-expert "ffn_gate.E.weight" and the like).
/// GGUF's stacked `_exps` tensors hold every expert of a layer in one tensor: their count is in
/// their shape, which `check_tensor_census`'s caller checks.
inline TensorCensus take_tensor_census(std::span<const std::string> names, bool gguf) {
  const std::string_view layer_prefix = gguf ? "blk." : "model.layers.";
  TensorCensus out;
  for (const std::string& name : names) {
    const std::string_view n(name);
    if (!n.starts_with(layer_prefix)) continue;
    std::size_t len = 0;
    const auto layer = census_detail::leading_index(n.substr(layer_prefix.size()), len);
    if (!layer) continue;
    TensorCensus::Layer& l = out.layers[*layer];
    if (l.example.empty()) l.example = name;
    const std::string_view rest = n.substr(layer_prefix.size() + len);
    std::optional<std::uint32_t> expert;
    if (!gguf) {
      if (const auto at = rest.find("experts."); at != std::string_view::npos)
        expert = census_detail::leading_index(rest.substr(at + 8), len);
    } else {
      for (std::string_view role : {"ffn_gate.", "ffn_up.", "ffn_down."})
        if (rest.starts_with(role))
          expert = census_detail::leading_index(rest.substr(role.size()), len);
    }
    if (expert) l.experts.emplace(*expert, name);
  }
  return out;
}

/// How messages name the counts: "config 'F': field 'num_hidden_layers'" for a config.json,
/// "GGUF 'F': metadata 'llama.block_count'" for a GGUF.
struct CensusFields {
  std::string prefix;  ///< "config 'F': field " or "GGUF 'F': metadata "
  std::string layers, experts;

  static CensusFields of_config(const ModelConfig& cfg) {
    return {"config '" + cfg.source + "': field ", "num_hidden_layers",
            cfg.arch == Architecture::mixtral ? "num_local_experts" : "num_experts"};
  }
};

/// Refuses a config whose layer or expert count disagrees with the tensors `names` of the
/// checkpoint `where`: a layer or expert the config counts with no tensor (missing), or a tensor
/// of a layer or expert beyond the counts (unused). `Error(invalid_format)` naming the config
/// field, its value, the checkpoint and a tensor. `experts_stacked`: GGUF's `_exps` tensors hold
/// the experts (their count is in their shape, checked by the GGUF reader).
inline void check_tensor_census(const ModelConfig& cfg, std::span<const std::string> names,
                                const std::string& where, bool gguf = false,
                                bool experts_stacked = false,
                                const std::optional<CensusFields>& named = std::nullopt) {
  const TensorCensus census = take_tensor_census(names, gguf);
  // No layer named at all: nothing to count against (loading then names the first tensor
  // missing; the parsers' bounds keep what is sized before it small).
  if (census.layers.empty()) return;
  const CensusFields fields = named ? *named : CensusFields::of_config(cfg);
  const std::string& layers_field = fields.layers;
  const std::string& experts_field = fields.experts;
  auto fail = [&](const std::string& field, std::uint32_t value, const std::string& what) {
    throw moekit::Error(moekit::ErrorKind::invalid_format,
                        fields.prefix + "'" + field + "' is " + std::to_string(value) +
                            " but the checkpoint '" + where + "' " + what);
  };
  // A checkpoint of the dense part alone (its experts are in a store) names no expert.
  bool any_expert = experts_stacked;
  for (const auto& [index, layer] : census.layers)
    any_expert = any_expert || !layer.experts.empty();
  const std::uint32_t present = census.layers.empty() ? 0 : census.layers.rbegin()->first + 1;
  if (present > cfg.n_layers)
    fail(layers_field, cfg.n_layers,
         "holds tensors of " + std::to_string(present) + " layers: '" +
             census.layers.rbegin()->second.example + "' would be unused");
  for (std::uint32_t l = 0; l < cfg.n_layers; ++l) {
    const auto it = census.layers.find(l);
    if (it == census.layers.end())
      fail(layers_field, cfg.n_layers,
           "has no tensor of layer " + std::to_string(l) + " (e.g. '" +
               (gguf ? "blk." + std::to_string(l) + ".attn_norm.weight"
                     : "model.layers." + std::to_string(l) + ".input_layernorm.weight") +
               "' is missing; it holds " + std::to_string(census.layers.size()) + " layers)");
    const bool moe = l < cfg.moe_index.size() && cfg.moe_index[l] >= 0;
    if (!moe || experts_stacked || !any_expert) continue;
    const auto& experts = it->second.experts;
    if (!experts.empty() && experts.rbegin()->first >= cfg.n_experts)
      fail(experts_field, cfg.n_experts,
           "holds tensors of " + std::to_string(experts.rbegin()->first + 1) +
               " experts in layer " + std::to_string(l) + ": '" + experts.rbegin()->second +
               "' would be unused");
    if (experts.size() < cfg.n_experts) {
      std::uint32_t e = 0;
      while (experts.count(e)) ++e;
      fail(experts_field, cfg.n_experts,
           "has no tensor of expert " + std::to_string(e) + " of layer " + std::to_string(l) +
               " (e.g. '" +
               moekit::io::expert_tensor_name(
                   *moekit::io::parse_architecture(name(cfg.arch)),
                   gguf ? moekit::io::TensorFormat::gguf : moekit::io::TensorFormat::hugging_face,
                   {l, e}, moekit::io::ExpertMatrix::gate) +
               "' is missing; it holds " + std::to_string(experts.size()) + ")");
    }
  }
}

}  // namespace moekit::engine
