#pragma once
/// \file GgufTokenizerMetadata: what GgufVocab (SentencePiece "llama") and BpeVocab (byte-level
/// BPE "gpt2") read alike from a GGUF file's tokenizer.ggml.* metadata, with errors that name the
/// file and the key.

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/io/gguf.hpp"

namespace moekit::engine {

class GgufTokenizerMetadata {
 public:
  explicit GgufTokenizerMetadata(const moekit::io::GgufFile& g)
      : g_(g), source_("GGUF '" + g.path() + "'") {}

  /// "GGUF '<path>'", for error messages.
  [[nodiscard]] const std::string& source() const noexcept { return source_; }

  [[noreturn]] void fail(const std::string& key, const std::string& what,
                         moekit::ErrorKind kind = moekit::ErrorKind::invalid_format) const {
    throw moekit::Error(kind, source_ + ": metadata '" + key + "' " + what);
  }

  /// tokenizer.ggml.model; an error when the file embeds no vocabulary.
  [[nodiscard]] std::string model() const {
    const auto* m = g_.metadata("tokenizer.ggml.model");
    if (!m) fail("tokenizer.ggml.model", "is missing: the file embeds no vocabulary");
    return m->as_string("tokenizer.ggml.model");
  }

  /// tokenizer.ggml.token_type as SentencePiece's / llama.cpp's type numbers (1..6, checked);
  /// nullopt when the key is absent.
  [[nodiscard]] std::optional<std::vector<std::int64_t>> token_types() const {
    const auto* t = g_.metadata("tokenizer.ggml.token_type");
    if (!t) return std::nullopt;
    std::vector<std::int64_t> out;
    for (const auto& v : t->as_array("tokenizer.ggml.token_type")) {
      if (!v.is_integer()) fail("tokenizer.ggml.token_type", "holds a non-integer");
      const auto* i = std::get_if<std::int64_t>(&v.value);
      const std::int64_t x = i ? *i : static_cast<std::int64_t>(std::get<std::uint64_t>(v.value));
      if (x < 1 || x > 6)
        fail("tokenizer.ggml.token_type", "holds type " + std::to_string(x) + " (1..6 allowed)");
      out.push_back(x);
    }
    return out;
  }

 private:
  const moekit::io::GgufFile& g_;
  std::string source_;
};

}  // namespace moekit::engine
