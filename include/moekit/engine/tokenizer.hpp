#pragma once
/// \file Tokenizer: SentencePiece (Mixtral's tokenizer.model, via Debian's libsentencepiece), the
/// SentencePiece-style vocabulary embedded in a GGUF file (gguf_vocab.hpp), or GPT-2-style
/// byte-level BPE (Qwen2-MoE, OLMoE: a Hugging Face tokenizer.json or a GGUF "gpt2" vocabulary,
/// bpe_vocab.hpp), with BOS handling, and StreamDecoder, which turns generated ids into text as
/// they arrive.
///
/// Streaming detokenisation follows transformers' TextStreamer: decode the ids since a prefix
/// offset, emit only what extends the text already emitted, and hold the output while it ends in
/// U+FFFD (a multi-byte character whose byte-fallback pieces have not all arrived yet). Decoding
/// from a prefix that starts inside the already-printed text keeps SentencePiece's leading-space
/// rule right for every new piece.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <sentencepiece_processor.h>

#include "moekit/error.hpp"

#include "moekit/engine/bpe_vocab.hpp"
#include "moekit/engine/gguf_vocab.hpp"

namespace moekit::engine {

/// A SentencePiece model file (tokenizer.model) behind the interface GgufVocab and BpeVocab share.
class SentencePieceVocab {
 public:
  struct Special {
    std::optional<std::uint32_t> bos, eos;
  };

  /// Loads `path`. Throws `Error` naming the file on failure.
  explicit SentencePieceVocab(const std::filesystem::path& path)
      : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
    if (!std::filesystem::exists(path))
      throw moekit::Error(moekit::ErrorKind::io, "tokenizer '" + path.string() + "' not found");
    const auto status = sp_->Load(path.string());
    if (!status.ok())
      throw moekit::Error(moekit::ErrorKind::invalid_format,
                          "tokenizer '" + path.string() + "': " + status.ToString());
    special_ = {id_or_none(sp_->bos_id()), id_or_none(sp_->eos_id())};
  }

  [[nodiscard]] std::uint32_t size() const noexcept {
    return static_cast<std::uint32_t>(sp_->GetPieceSize());
  }
  [[nodiscard]] const Special& special() const noexcept { return special_; }
  [[nodiscard]] std::string piece(std::uint32_t id) const {
    return sp_->IdToPiece(static_cast<int>(id));
  }

  [[nodiscard]] std::vector<std::uint32_t> encode(std::string_view text) const {
    std::vector<int> ids;
    check(sp_->Encode(text, &ids));
    return {ids.begin(), ids.end()};
  }
  /// Control tokens such as BOS/EOS produce nothing.
  [[nodiscard]] std::string decode(std::span<const std::uint32_t> ids) const {
    const std::vector<int> v(ids.begin(), ids.end());
    std::string text;
    check(sp_->Decode(v, &text));
    return text;
  }

 private:
  static std::optional<std::uint32_t> id_or_none(int id) noexcept {
    return id >= 0 ? std::optional<std::uint32_t>(static_cast<std::uint32_t>(id)) : std::nullopt;
  }
  static void check(const sentencepiece::util::Status& status) {
    if (!status.ok())
      throw moekit::Error(moekit::ErrorKind::invalid_argument, "tokenizer: " + status.ToString());
  }
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  Special special_;
};

/// A SentencePiece model (tokenizer.model), a GGUF file's embedded vocabulary, or a byte-level BPE
/// vocabulary.
class Tokenizer {
 public:
  /// Loads `path` (a tokenizer.model file). Throws `Error` naming the file on failure.
  explicit Tokenizer(const std::filesystem::path& path)
      : vocab_(std::in_place_type<SentencePieceVocab>, path) {}

  /// The vocabulary embedded in a GGUF file.
  explicit Tokenizer(GgufVocab vocab) : vocab_(std::move(vocab)) {}

  /// A byte-level BPE vocabulary.
  explicit Tokenizer(BpeVocab vocab) : vocab_(std::move(vocab)) {}

  /// The vocabulary embedded in `g`: byte-level BPE for `tokenizer.ggml.model = "gpt2"`, else
  /// GgufVocab (which refuses models other than "llama").
  static Tokenizer from_gguf(const moekit::io::GgufFile& g) {
    const auto* model = g.metadata("tokenizer.ggml.model");
    if (model && model->as_string("tokenizer.ggml.model") == "gpt2")
      return Tokenizer(BpeVocab::from_gguf(g));
    return Tokenizer(GgufVocab::from_gguf(g));
  }

  /// The tokenizer of a Hugging Face model directory: tokenizer.model (SentencePiece) when there
  /// is one, else tokenizer.json (byte-level BPE).
  static Tokenizer from_hf_dir(const std::filesystem::path& dir) {
    const auto sp = dir / "tokenizer.model";
    const auto json = dir / "tokenizer.json";
    if (std::filesystem::exists(sp) || !std::filesystem::exists(json)) return Tokenizer(sp);
    return Tokenizer(BpeVocab::from_tokenizer_json(json));
  }

  /// Token ids of `text`, with BOS first when `add_bos` (and the model has one).
  [[nodiscard]] std::vector<std::uint32_t> encode(std::string_view text, bool add_bos) const {
    std::vector<std::uint32_t> out;
    if (add_bos && bos_id()) out.push_back(*bos_id());
    const auto ids = std::visit([&](const auto& v) { return v.encode(text); }, vocab_);
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  /// Text of `ids`. SentencePiece vocabularies: control tokens such as BOS/EOS produce nothing.
  /// Byte-level BPE: every token produces its text, special ones too (HF's
  /// decode(skip_special_tokens=False), so EOS gives e.g. "<|endoftext|>").
  [[nodiscard]] std::string decode(std::span<const std::uint32_t> ids) const {
    return std::visit([&](const auto& v) { return v.decode(ids); }, vocab_);
  }

  [[nodiscard]] std::uint32_t vocab_size() const noexcept {
    return std::visit([](const auto& v) { return v.size(); }, vocab_);
  }
  [[nodiscard]] std::optional<std::uint32_t> bos_id() const noexcept {
    return std::visit([](const auto& v) { return v.special().bos; }, vocab_);
  }
  [[nodiscard]] std::optional<std::uint32_t> eos_id() const noexcept {
    return std::visit([](const auto& v) { return v.special().eos; }, vocab_);
  }
  [[nodiscard]] std::string piece(std::uint32_t id) const {
    return std::visit([&](const auto& v) { return std::string(v.piece(id)); }, vocab_);
  }

 private:
  std::variant<SentencePieceVocab, GgufVocab, BpeVocab> vocab_;
};

/// Turns a growing sequence of ids into text increments.
class StreamDecoder {
 public:
  /// `context` are the ids before the generated ones (the prompt), used only to get the first
  /// generated piece's leading space right.
  StreamDecoder(const Tokenizer& tok, std::span<const std::uint32_t> context) : tok_(tok) {
    if (!context.empty()) ids_.push_back(context.back());
    prefix_ = 0;
    read_ = ids_.size();
  }

  /// Adds one id; returns the text it completes (possibly empty).
  std::string push(std::uint32_t id) {
    ids_.push_back(id);
    const std::span<const std::uint32_t> all(ids_);
    const std::string before = tok_.decode(all.subspan(prefix_, read_ - prefix_));
    const std::string now = tok_.decode(all.subspan(prefix_));
    if (now.size() <= before.size() || now.ends_with("\xEF\xBF\xBD")) return {};
    std::string out = now.substr(before.size());
    prefix_ = read_;
    read_ = ids_.size();
    return out;
  }

 private:
  const Tokenizer& tok_;
  std::vector<std::uint32_t> ids_;
  std::size_t prefix_ = 0, read_ = 0;
};

}  // namespace moekit::engine
