#pragma once
/// \file What converting a checkpoint's experts into another format costs, measured: the KL
/// divergence of the converted model from the exact one over a few hundred tokens of a fixed
/// text, and how often both rank the same token first.
///
/// moe-run converts experts it has no kernel for (GGUF K-quants) once into an expert store at
/// the nearest moekit format (issue #20: "with the loss measured and printed, never silently").
/// The reference pass runs the experts at their exact values: f32 rows dequantized from the
/// GGUF on read (io::CheckpointExperts::locate_as_f32, bit for bit gguf-py's values), through
/// the same loader and cache as any run, so nothing model-sized is held in memory. Each converted
/// pass runs the store at one of its precisions. Both passes share the dense part and run every
/// matrix with float activations, so the difference is the experts' conversion alone.
///
/// KL(reference ‖ converted) per position uses the reference's top-`top_k` tokens plus one
/// "rest" bucket (perplexity.hpp): a lower bound of the full KL, equal to it when top_k covers
/// the vocabulary. The result is recorded beside the store (`<store>.loss.json`, written
/// atomically) with the store's checkpoint fingerprint, so later runs print it without
/// recomputing, and a rebuilt store is measured again.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/checkpoint_experts.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/io/tensor_names.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "moekit/presets/baseline.hpp"

#include "moekit/engine/config.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/perplexity.hpp"
#include "moekit/engine/tokenizer.hpp"
#include "moekit/engine/weights.hpp"

namespace moekit::engine {

/// How the loss is measured.
struct ConversionLossSettings {
  std::size_t tokens = 256;    ///< scored tokens: the first ones of the text
  std::uint32_t ctx = 128;     ///< tokens per chunk, each scored after a BOS
  std::uint32_t top_k = 1024;  ///< reference tokens kept per position for the KL (rest: one bucket)
  /// Expert cache of each pass in bytes, at most (0: every expert resident at the pass's
  /// precision); a pass never gets less than one token's experts.
  std::size_t expert_budget_bytes = 0;
  StoreIo io{};
};

/// The loss at one converted precision.
struct ConversionLossEntry {
  moekit::Precision precision = moekit::Precision::q4;
  double kl_mean = 0, kl_max = 0;
  double top1_agreement = 0;  ///< share of positions whose most likely token is the reference's
  double perplexity = 0;      ///< of the converted model on the text
};

/// One measurement, as recorded beside the store.
struct ConversionLoss {
  std::string source_types;  ///< the checkpoint's expert types, e.g. "Q4_K+Q6_K"
  std::string text;          ///< file the tokens come from
  std::size_t tokens = 0;
  std::uint32_t ctx = 0, top_k = 0;
  double reference_perplexity = 0;
  std::vector<ConversionLossEntry> entries;
  double seconds = 0;
  std::string fingerprint;  ///< the store's checkpoint_fingerprint

  [[nodiscard]] nlohmann::json to_json() const {
    nlohmann::json j{{"version", 1},
                     {"source_types", source_types},
                     {"text", text},
                     {"tokens", tokens},
                     {"ctx", ctx},
                     {"kl_top_k", top_k},
                     {"reference", "experts at their exact dequantized values (f32)"},
                     {"reference_perplexity", reference_perplexity},
                     {"seconds", seconds},
                     {"checkpoint_fingerprint", fingerprint}};
    nlohmann::json& a = j["precisions"] = nlohmann::json::array();
    for (const auto& e : entries)
      a.push_back({{"precision", std::string(moekit::name(e.precision))},
                   {"kl_mean", e.kl_mean},
                   {"kl_max", e.kl_max},
                   {"top1_agreement", e.top1_agreement},
                   {"perplexity", e.perplexity}});
    return j;
  }

  /// Parses `to_json`'s output; throws `Error(invalid_format)` naming `where` and the field.
  static ConversionLoss from_json(const nlohmann::json& j, const std::string& where) {
    auto bad = [&](const std::string& why) {
      moekit::detail::fail(moekit::ErrorKind::invalid_format, where + ": " + why);
    };
    if (!j.is_object() || j.value("version", 0) != 1) bad("not a version-1 conversion loss record");
    ConversionLoss l;
    try {
      l.source_types = j.at("source_types").get<std::string>();
      l.text = j.at("text").get<std::string>();
      l.tokens = j.at("tokens").get<std::size_t>();
      l.ctx = j.at("ctx").get<std::uint32_t>();
      l.top_k = j.at("kl_top_k").get<std::uint32_t>();
      l.reference_perplexity = j.at("reference_perplexity").get<double>();
      l.seconds = j.at("seconds").get<double>();
      l.fingerprint = j.at("checkpoint_fingerprint").get<std::string>();
      for (const auto& e : j.at("precisions")) {
        const auto p = moekit::parse_precision(e.at("precision").get<std::string>());
        if (!p) bad("unknown precision '" + e.at("precision").get<std::string>() + "'");
        l.entries.push_back({*p, e.at("kl_mean").get<double>(), e.at("kl_max").get<double>(),
                             e.at("top1_agreement").get<double>(),
                             e.at("perplexity").get<double>()});
      }
    } catch (const nlohmann::json::exception& e) {
      bad(std::string("missing or mistyped field (") + e.what() + ")");
    }
    return l;
  }
};

/// Where the record of a store's conversion loss lives: beside the store.
inline std::filesystem::path conversion_loss_path(const std::filesystem::path& store) {
  return std::filesystem::path(store.string() + ".loss.json");
}

/// Writes `loss` to `path` atomically (a temporary file renamed over it).
inline void save_conversion_loss(const std::filesystem::path& path, const ConversionLoss& loss) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << loss.to_json().dump(1) << "\n";
    if (!out.flush())
      moekit::detail::fail(moekit::ErrorKind::io, "cannot write '" + tmp.string() + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    moekit::detail::fail(moekit::ErrorKind::io, "cannot rename '" + tmp.string() + "' to '" +
                                                    path.string() + "': " + ec.message());
}

/// The record at `path` when it exists and is for a store of checkpoint fingerprint
/// `fingerprint` holding exactly `precisions`; nullopt otherwise (the caller measures again).
inline std::optional<ConversionLoss> load_conversion_loss(
    const std::filesystem::path& path, const std::string& fingerprint,
    std::span<const moekit::Precision> precisions) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ConversionLoss l;
  try {
    l = ConversionLoss::from_json(j, path.string());
  } catch (const moekit::Error&) {
    return std::nullopt;  // unreadable (or an older record): measured again and replaced
  }
  if (l.fingerprint != fingerprint || l.entries.size() != precisions.size()) return std::nullopt;
  for (std::size_t i = 0; i < precisions.size(); ++i)
    if (l.entries[i].precision != precisions[i]) return std::nullopt;
  return l;
}

/// The distinct types of the expert matrices in `experts` ("Q4_K", "Q4_K+Q6_K", ...), in the
/// order first met.
inline std::string expert_types(const moekit::io::CheckpointExperts& experts) {
  std::vector<moekit::io::DType> seen;
  const moekit::ModelShape& s = experts.shape();
  for (std::uint32_t l = 0; l < s.n_layers; ++l)
    for (std::uint32_t e = 0; e < s.n_experts; ++e)
      for (const auto& m : experts.matrices({l, e}))
        if (std::find(seen.begin(), seen.end(), m.dtype) == seen.end()) seen.push_back(m.dtype);
  std::string out;
  for (auto t : seen) {  // appended piecewise: GCC 12's -Wrestrict misreads "x" + string&&
    if (!out.empty()) out += '+';
    out += moekit::io::name(t);
  }
  return out;
}

namespace detail {

/// Scores `tokens` with the experts `backing` serves at `p`, float activations,
/// baseline pipeline; `meter` saves or compares.
inline PerplexityResult conversion_loss_pass(const ModelConfig& cfg, const DenseWeights& dense,
                                             const ExpertBacking& backing, moekit::Precision p,
                                             std::span<const Token> tokens,
                                             const ConversionLossSettings& s,
                                             PerplexityMeter& meter, moekit::ThreadPool* pool) {
  const moekit::ModelShape shape = cfg.shape();
  const std::size_t all = all_resident_budget(shape, p);
  const std::size_t cap = s.expert_budget_bytes ? s.expert_budget_bytes : all;
  OffloadSettings o;
  o.precision = p;
  o.expert_budget = std::clamp(cap, minimum_expert_budget(shape, p), all);
  return with_pipeline<moekit::presets::BaselineSpec>(
      shape, o, backing.make_loader(), PresetInputs{}, [&](auto& pipeline) {
        Model<std::decay_t<decltype(pipeline)>> model(cfg, dense, pipeline, s.ctx, pool);
        return score_text(model, tokens, *cfg.bos_token_id, {s.ctx, 0, false}, meter,
                          [](std::size_t, std::size_t) {});
      });
}

}  // namespace detail

/// Measures the loss of the experts in `store` (every precision it holds) against `reference`
/// (the checkpoint's experts read by `locate_as_f32`) on `tokens` (the text, no BOS; the first
/// `s.tokens` are scored). `text` names their file in the record.
inline ConversionLoss measure_conversion_loss(
    const ModelConfig& cfg, const DenseWeights& dense, std::span<const Token> tokens,
    const std::string& text, std::shared_ptr<const moekit::io::CheckpointExperts> reference,
    std::shared_ptr<const moekit::io::ExpertStore> store, const ConversionLossSettings& s,
    moekit::ThreadPool* pool) {
  MOEKIT_EXPECTS(reference && reference->precision() == moekit::Precision::f32,
                 "measure_conversion_loss: the reference reads the experts as f32");
  if (!cfg.bos_token_id)
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         "conversion loss: the model's config has no bos_token_id");
  tokens = tokens.first(std::min(tokens.size(), s.tokens));
  const auto t0 = std::chrono::steady_clock::now();
  ConversionLoss out;
  out.source_types = expert_types(*reference);
  out.text = text;
  out.ctx = s.ctx;
  out.top_k = std::min<std::uint32_t>(s.top_k, cfg.vocab_size);
  out.fingerprint = store->manifest().meta.value("checkpoint_fingerprint", std::string());

  LogProbFile ref_logprobs(cfg.vocab_size, out.top_k);
  PerplexityMeter saver(cfg.vocab_size, &ref_logprobs);
  ExpertBacking exact;
  exact.io = s.io;
  exact.checkpoint = reference;
  const PerplexityResult r = detail::conversion_loss_pass(cfg, dense, exact, moekit::Precision::f32,
                                                          tokens, s, saver, pool);
  out.tokens = r.tokens;
  out.reference_perplexity = r.perplexity();

  ExpertBacking converted;
  converted.store = store;
  converted.io = s.io;
  for (moekit::Precision p : store->manifest().precisions) {
    PerplexityMeter meter(cfg.vocab_size, nullptr, &ref_logprobs);
    const PerplexityResult c =
        detail::conversion_loss_pass(cfg, dense, converted, p, tokens, s, meter, pool);
    out.entries.push_back({p, c.mean_kl(), c.kl_max, c.top1_agreement(), c.perplexity()});
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

/// The lines moe-run prints: one per converted precision, saying what was compared and whether
/// the numbers were measured now or read from the record.
inline std::string describe_conversion_loss(const ConversionLoss& l, bool measured_now) {
  std::string out;
  char buf[512];
  for (const auto& e : l.entries) {
    std::snprintf(buf, sizeof buf,
                  "conversion loss: %s experts -> %s: mean KL %.6f nats/token (max %.4f), top-1 "
                  "agreement %.1f%%, perplexity %.3f vs %.3f exact; %zu tokens of %s%s\n",
                  l.source_types.c_str(), std::string(moekit::name(e.precision)).c_str(), e.kl_mean,
                  e.kl_max, 100 * e.top1_agreement, e.perplexity, l.reference_perplexity, l.tokens,
                  std::filesystem::path(l.text).filename().c_str(),
                  measured_now ? "" : " (recorded beside the store)");
    out += buf;
  }
  return out;
}

/// What moe-run asks for a store it converted from a GGUF.
struct ConversionLossRequest {
  bool measure = true;         ///< false: --no-conversion-loss
  std::filesystem::path text;  ///< the text scored
  ConversionLossSettings settings{};
  bool quiet = false;  ///< --json: nothing on stderr
};

/// The loss of `store`, converted from GGUF `gguf` whose experts `cfg` describes: read from the
/// record beside the store, or measured and recorded; printed on stderr unless quiet. Returns
/// the JSON moe-run reports ("measured": false with the reason when it was not measured).
inline nlohmann::json store_conversion_loss(const ConversionLossRequest& req,
                                            const ModelConfig& cfg, const DenseWeights& dense,
                                            const Tokenizer& tok, const moekit::io::GgufFile& gguf,
                                            std::shared_ptr<const moekit::io::ExpertStore> store,
                                            moekit::ThreadPool* pool) {
  std::vector<std::uint32_t> layers(cfg.shape().n_layers);  // GGUF numbers MoE layers as blocks
  for (std::uint32_t l = 0; l < layers.size(); ++l) layers[l] = l;
  auto reference = std::make_shared<const moekit::io::CheckpointExperts>(
      moekit::io::CheckpointExperts::locate_as_f32(
          gguf, io_architecture(cfg.arch), moekit::io::TensorFormat::gguf, cfg.shape(), layers));
  const auto& held = store->manifest().precisions;
  auto not_measured = [&](const std::string& why) {
    if (!req.quiet)
      std::fprintf(stderr,
                   "conversion loss: NOT measured (%s); the %s experts were converted to "
                   "%s\n",
                   why.c_str(), expert_types(*reference).c_str(),
                   std::string(moekit::name(held.front())).c_str());
    return nlohmann::json{{"measured", false}, {"reason", why}};
  };
  if (!req.measure) return not_measured("--no-conversion-loss");
  const auto record = conversion_loss_path(store->path());
  const std::string fp = store->manifest().meta.value("checkpoint_fingerprint", std::string());
  if (auto l = load_conversion_loss(record, fp, held)) {
    if (!req.quiet) std::fputs(describe_conversion_loss(*l, false).c_str(), stderr);
    nlohmann::json j = l->to_json();
    j["measured"] = true;
    j["from_record"] = true;
    j["record"] = record.string();
    return j;
  }
  if (!std::filesystem::is_regular_file(req.text))
    return not_measured("text '" + req.text.string() + "' not found; pass --conversion-loss-text");
  // Enough characters for the tokens at any vocabulary (at least one character per token).
  std::string text = read_text_stripped(req.text, "--conversion-loss-text");
  text.resize(std::min(text.size(), 16 * req.settings.tokens));
  const std::vector<Token> tokens = tok.encode(text, false);
  if (!req.quiet)
    std::fprintf(stderr,
                 "conversion loss: measuring %s experts (exact, f32) against the store "
                 "on %zu tokens of %s (once; --no-conversion-loss skips it)...\n",
                 expert_types(*reference).c_str(), std::min(tokens.size(), req.settings.tokens),
                 req.text.c_str());
  const ConversionLoss l = measure_conversion_loss(cfg, dense, tokens, req.text.string(), reference,
                                                   store, req.settings, pool);
  nlohmann::json j = l.to_json();
  j["measured"] = true;
  j["from_record"] = false;
  try {
    save_conversion_loss(record, l);
    j["record"] = record.string();
  } catch (const moekit::Error& e) {
    if (!req.quiet)
      std::fprintf(stderr, "conversion loss: not recorded: %s\n", e.message().c_str());
  }
  if (!req.quiet) std::fputs(describe_conversion_loss(l, true).c_str(), stderr);
  return j;
}

}  // namespace moekit::engine
