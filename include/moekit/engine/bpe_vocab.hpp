#pragma once
/// \file BpeVocab: GPT-2-style byte-level BPE (Qwen2-MoE's and OLMoE's tokenizer), read from a
/// Hugging Face `tokenizer.json` (model.type "BPE") or from a GGUF file's embedded vocabulary
/// (`tokenizer.ggml.model = "gpt2"`), encoding and decoding as HF `tokenizers` does.
///
/// Encoding follows HF's AddedVocabulary::extract_and_normalize. The added tokens matched in the
/// raw text (tokenizer.json's added_tokens with "normalized": false, usually the special ones; all
/// of GGUF's control and user-defined tokens) are split out first by exact match (leftmost,
/// longest). Each stretch of text between them is then normalized on its own (tokenizer.json's
/// NFC normalizer, if any), and in the normalized stretch the added tokens with "normalized": true
/// are split out the same way, their content normalized likewise (as HF builds that matcher).
/// Every other stretch of text is pre-tokenized with the model's regex (PCRE2 with UTF + UCP, so
/// \p{L}, \p{N}, \s and (?!\S) are Unicode-aware as in HF's Oniguruma and llama.cpp); each piece's
/// bytes are mapped through GPT-2's bytes_to_unicode table to one symbol each, and adjacent symbols
/// are merged by lowest merge rank (ties: leftmost) until no pair of the merges list is left; the
/// symbols are then the token ids.
/// NFC is utf8proc's (UTF8PROC_STABLE | UTF8PROC_COMPOSE; its Unicode version may be newer than
/// HF's tables, which matters only for characters assigned in between). GGUF files carry no
/// normalizer and llama.cpp applies none, so a GGUF vocabulary does not normalize.
/// Input that is not valid UTF-8 does not fail. HF cannot be given such input at all (a Rust
/// &str), so there is no HF result to match: a stretch with invalid bytes (utf8proc's check, as
/// strict as Rust's: no overlong forms, surrogates or code points above U+10FFFF) is not
/// normalized, and its invalid bytes match no regex branch and become pieces of their own,
/// encoded byte by byte (decoding gives U+FFFD for them). Valid stretches are still normalized.
/// Decoding matches HF `decode(ids, skip_special_tokens=False)` with the ByteLevel decoder: every
/// token's text, special ones included (so EOS decodes to e.g. "<|endoftext|>"), is mapped back
/// character by character through the inverse table (characters outside it pass through as their
/// UTF-8), and the resulting bytes become text with each maximal invalid UTF-8 sequence as one
/// U+FFFD (Rust's from_utf8_lossy, as HF). The text of an added token with "normalized": true is
/// its normalized content, as in HF 0.23 (its normalized_cache; older HF used the content as
/// written: the two differ only for content that NFC changes).
///
/// Not supported, and refused with a `moekit::Error` naming the file and the field: normalizers
/// other than none, NFC and a Sequence of NFC only, BPE dropout, byte_fallback,
/// continuing-subword/end-of-word affixes, added tokens with lstrip/rstrip/single_word,
/// pre-tokenizers other than ByteLevel or Sequence[Split(Regex, Isolated), ByteLevel(use_regex=
/// false)], ByteLevel add_prefix_space, and GGUF `tokenizer.ggml.pre` names other than qwen2 /
/// gpt2 / olmo / default.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/io/gguf.hpp"

#include "moekit/engine/gguf_tokenizer_metadata.hpp"

namespace moekit::engine {

/// A byte-level BPE vocabulary (tokens, merges, added tokens, pre-tokenizer regex).
class BpeVocab {
 public:
  /// GPT-2's pre-tokenizer regex (HF ByteLevel with use_regex; llama.cpp's gpt2 and olmo).
  static constexpr std::string_view gpt2_regex =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  /// Qwen2's pre-tokenizer regex.
  static constexpr std::string_view qwen2_regex =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

  /// A token matched verbatim in the input before pre-tokenization.
  struct AddedToken {
    std::uint32_t id = 0;
    std::string content;
    bool special = true;  ///< HF "special" / GGUF control (false: user-defined)
    /// HF "normalized": matched in the normalized text, content normalized too (false: matched in
    /// the raw text before normalization, as every GGUF added token).
    bool normalized = false;
  };

  struct Special {
    std::optional<std::uint32_t> bos, eos;
  };

  /// Everything a vocabulary is made of; the *_field names and `source` only label errors.
  struct Spec {
    std::vector<std::string> tokens;  ///< id -> token in GPT-2's byte alphabet ("" = no token)
    std::vector<std::string> merges;  ///< "a b", rank = index
    std::vector<AddedToken> added;    ///< their ids must be < tokens.size(); text is `content`
    Special special;
    std::string regex{gpt2_regex};
    bool ignore_merges = false;  ///< a piece that is a token as a whole is not merged (HF option)
    bool nfc = false;            ///< apply Unicode NFC (tokenizer.json's normalizer) before BPE
    std::string source = "BPE vocabulary";
    std::string tokens_field = "tokens", merges_field = "merges", added_field = "added_tokens";
  };

  explicit BpeVocab(Spec spec)
      : tokens_(std::move(spec.tokens)),
        special_(spec.special),
        ignore_merges_(spec.ignore_merges),
        nfc_(spec.nfc),
        source_(std::move(spec.source)) {
    const std::size_t n = tokens_.size();
    if (n == 0) fail(spec.tokens_field, "has no tokens");
    if (n > 0xffffffffu) fail(spec.tokens_field, "has too many tokens");
    ids_.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (tokens_[i].empty()) continue;
      ids_.emplace(tokens_[i], static_cast<std::uint32_t>(i));  // a duplicate: the first id wins
    }
    index_added_tokens(spec);
    for (auto id : {special_.bos, special_.eos})
      if (id && (*id >= n || tokens_[*id].empty()))
        fail("bos/eos", "names id " + std::to_string(*id) + ", which is not a token");
    index_byte_symbols();
    index_merges(spec);
    compile_pre_tokenizer(std::move(spec.regex));
  }

  /// The vocabulary of a Hugging Face `tokenizer.json` (model.type "BPE"); bos/eos from the
  /// `tokenizer_config.json` beside it when there is one (bos_token / eos_token).
  static BpeVocab from_tokenizer_json(const std::filesystem::path& path) {
    const std::string src = "tokenizer.json '" + path.string() + "'";
    try {
      Spec s = parse_tokenizer_json(read_text(path, src), src);
      s.special = special_tokens_beside(path, s.tokens, src);
      return BpeVocab(std::move(s));
    } catch (const nlohmann::json::exception& e) {  // a value of the wrong JSON type
      throw moekit::Error(moekit::ErrorKind::invalid_format, src + ": " + e.what());
    }
  }

  /// The vocabulary of the text of a `tokenizer.json`, parsed as from_tokenizer_json parses a
  /// file's; `source` names it in errors, and bos/eos are `special` (there is no file beside it).
  static BpeVocab from_tokenizer_json_text(std::string_view json,
                                           const std::string& source = "tokenizer.json",
                                           Special special = {}) {
    try {
      Spec s = parse_tokenizer_json(json, source);
      s.special = special;
      return BpeVocab(std::move(s));
    } catch (const nlohmann::json::exception& e) {  // a value of the wrong JSON type
      throw moekit::Error(moekit::ErrorKind::invalid_format, source + ": " + e.what());
    }
  }

 private:
  // Everything of a tokenizer.json but bos/eos (which live in tokenizer_config.json).
  static Spec parse_tokenizer_json(std::string_view text, const std::string& src) {
    auto bad = [&](const std::string& field, const std::string& what,
                   moekit::ErrorKind k = moekit::ErrorKind::invalid_format) -> void {
      throw moekit::Error(k, src + ": '" + field + "' " + what);
    };
    const nlohmann::json j = parse_json(text, src);
    if (!j.is_object()) bad("(top level)", "is not a JSON object");
    auto need = [&](const nlohmann::json& obj, const char* key,
                    const std::string& field) -> const nlohmann::json& {
      if (!obj.is_object() || !obj.contains(key)) bad(field, "is missing");
      return obj.at(key);
    };
    const nlohmann::json& model = need(j, "model", "model");
    check_bpe_model(model, need(model, "type", "model.type"), bad);
    Spec s;
    s.source = src;
    s.tokens_field = "model.vocab";
    s.merges_field = "model.merges";
    s.added_field = "added_tokens";
    if (model.contains("ignore_merges") && !model["ignore_merges"].is_null()) {
      if (!model["ignore_merges"].is_boolean()) bad("model.ignore_merges", "is not a boolean");
      s.ignore_merges = model["ignore_merges"].get<bool>();
    }
    read_tokens(j, need(model, "vocab", "model.vocab"), s, bad);
    read_merges(need(model, "merges", "model.merges"), s, bad);
    s.nfc = reads_nfc(j, bad);
    if (j.contains("decoder") && !j["decoder"].is_null() &&
        (!j["decoder"].is_object() || j["decoder"].value("type", std::string()) != "ByteLevel"))
      bad("decoder", "is " + j["decoder"].dump() + "; moe-run supports the ByteLevel decoder only",
          moekit::ErrorKind::unsupported);
    s.regex = pre_tokenizer_regex(need(j, "pre_tokenizer", "pre_tokenizer"), bad);
    return s;
  }

  // A byte-level "BPE" model, with the options moe-run does not implement absent or off.
  template <class Bad>
  static void check_bpe_model(const nlohmann::json& model, const nlohmann::json& type, Bad& bad) {
    if (!type.is_string() || type.get<std::string>() != "BPE")
      bad("model.type", "is " + type.dump() + "; only byte-level \"BPE\" is supported",
          moekit::ErrorKind::unsupported);
    auto null_or = [&](const char* key, auto ok) {
      if (model.contains(key) && !model[key].is_null() && !ok(model[key]))
        bad(std::string("model.") + key,
            "is " + model[key].dump() + ", which moe-run does not support",
            moekit::ErrorKind::unsupported);
    };
    null_or("dropout",
            [](const nlohmann::json& v) { return v.is_number() && v.get<double>() == 0.0; });
    null_or("continuing_subword_prefix", [](const nlohmann::json& v) { return v == ""; });
    null_or("end_of_word_suffix", [](const nlohmann::json& v) { return v == ""; });
    null_or("byte_fallback", [](const nlohmann::json& v) { return v == false; });
  }

  // Gives token `id` the text `text` (an id given two different texts is an error).
  template <class Bad>
  static void place_token(Spec& s, std::uint64_t id, const std::string& text,
                          const std::string& field, Bad& bad) {
    if (id >= (1u << 24))
      bad(field, "gives '" + text + "' id " + std::to_string(id) + " (ids must be < 2^24)");
    if (text.empty()) bad(field, "has an empty token (id " + std::to_string(id) + ")");
    if (s.tokens.size() <= id) s.tokens.resize(id + 1);
    if (!s.tokens[id].empty() && s.tokens[id] != text)
      bad(field,
          "gives id " + std::to_string(id) + " to both '" + s.tokens[id] + "' and '" + text + "'");
    s.tokens[id] = text;
  }

  // Tokens: model.vocab, then added_tokens.
  template <class Bad>
  static void read_tokens(const nlohmann::json& j, const nlohmann::json& vocab, Spec& s, Bad& bad) {
    if (!vocab.is_object()) bad("model.vocab", "is not an object of token -> id");
    for (const auto& item : vocab.items()) {
      const std::string& text = item.key();
      const nlohmann::json& id = item.value();
      if (!id.is_number_unsigned())
        bad("model.vocab", "gives '" + text + "' an id that is not a non-negative integer");
      place_token(s, id.get<std::uint64_t>(), text, "model.vocab", bad);
    }
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      if (!j["added_tokens"].is_array()) bad("added_tokens", "is not an array");
      std::size_t k = 0;
      for (const auto& a : j["added_tokens"])
        read_added_token(a, "added_tokens[" + std::to_string(k++) + "]", s, bad);
    }
    if (s.tokens.empty()) bad("model.vocab", "is empty");
  }

  template <class Bad>
  static void read_added_token(const nlohmann::json& a, const std::string& f, Spec& s, Bad& bad) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_unsigned() ||
        !a.contains("content") || !a["content"].is_string())
      bad(f, "needs a non-negative integer 'id' and a string 'content'");
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (a.contains(flag) && a[flag] == true)
        bad(f + "." + flag, "is true, which moe-run does not support",
            moekit::ErrorKind::unsupported);
    AddedToken t;
    t.id = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(a["id"].get<std::uint64_t>(), 0xffffffffu));
    t.content = a["content"].get<std::string>();
    t.special = a.contains("special") && a["special"] == true;
    // HF requires the field; when it is absent, HF's AddedToken::from default (!special).
    t.normalized = a.contains("normalized") && a["normalized"].is_boolean()
                       ? a["normalized"].get<bool>()
                       : !t.special;
    place_token(s, a["id"].get<std::uint64_t>(), t.content, f, bad);
    s.added.push_back(std::move(t));
  }

  // model.merges: "a b" strings or ["a", "b"] pairs, rank = position.
  template <class Bad>
  static void read_merges(const nlohmann::json& merges, Spec& s, Bad& bad) {
    if (!merges.is_array()) bad("model.merges", "is not an array");
    std::size_t r = 0;
    for (const auto& m : merges) {
      const std::string f = "model.merges";
      if (m.is_string()) {
        s.merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        const auto a = m[0].get<std::string>(), b = m[1].get<std::string>();
        if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos || a.empty() ||
            b.empty())
          bad(f, "entry " + std::to_string(r) + " " + m.dump() +
                     " has an empty token or one with a space");
        s.merges.push_back(a + " " + b);
      } else {
        bad(f, "entry " + std::to_string(r) + " " + m.dump() +
                   " is neither \"a b\" nor [\"a\", \"b\"]");
      }
      ++r;
    }
  }

  // The normalizer: none, NFC, or a Sequence of NFC only (NFC is idempotent; [] is none).
  template <class Bad>
  static bool reads_nfc(const nlohmann::json& j, Bad& bad) {
    if (!j.contains("normalizer") || j["normalizer"].is_null()) return false;
    const auto& n = j["normalizer"];
    auto type = [](const nlohmann::json& x) {
      return x.is_object() ? x.value("type", std::string()) : std::string();
    };
    if (type(n) == "NFC") return true;
    if (type(n) == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
        std::all_of(n["normalizers"].begin(), n["normalizers"].end(),
                    [&](const nlohmann::json& e) { return type(e) == "NFC"; }))
      return !n["normalizers"].empty();
    bad("normalizer", "is " + n.dump() + "; moe-run supports none or NFC",
        moekit::ErrorKind::unsupported);
    return false;
  }

  // bos/eos from the tokenizer_config.json beside `path`, when there is one.
  static Special special_tokens_beside(const std::filesystem::path& path,
                                       const std::vector<std::string>& tokens,
                                       const std::string& src) {
    Special out;
    const auto config = path.parent_path() / "tokenizer_config.json";
    if (!std::filesystem::exists(config)) return out;
    const std::string csrc = "tokenizer_config.json '" + config.string() + "'";
    const nlohmann::json c = parse_json(read_text(config, csrc), csrc);
    auto id_of = [&](const char* key) -> std::optional<std::uint32_t> {
      if (!c.is_object() || !c.contains(key) || c[key].is_null()) return std::nullopt;
      const auto& v = c[key];
      std::string text;
      if (v.is_string())
        text = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v["content"].is_string())
        text = v["content"].get<std::string>();
      else
        throw moekit::Error(moekit::ErrorKind::invalid_format,
                            csrc + ": '" + key + "' is neither a string nor {content}");
      for (std::size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] == text) return static_cast<std::uint32_t>(i);
      throw moekit::Error(
          moekit::ErrorKind::invalid_format,
          csrc + ": '" + key + "' is '" + text + "', which is not a token of " + src);
    };
    out.bos = id_of("bos_token");
    out.eos = id_of("eos_token");
    return out;
  }

 public:
  /// The vocabulary embedded in a GGUF file with `tokenizer.ggml.model = "gpt2"`.
  static BpeVocab from_gguf(const moekit::io::GgufFile& g) {
    const GgufTokenizerMetadata meta(g);
    if (const std::string model = meta.model(); model != "gpt2")
      meta.fail("tokenizer.ggml.model", "is '" + model + "', not 'gpt2' (byte-level BPE)",
                moekit::ErrorKind::unsupported);
    Spec s;
    s.source = meta.source();
    s.tokens_field = "metadata 'tokenizer.ggml.tokens'";
    s.merges_field = "metadata 'tokenizer.ggml.merges'";
    s.added_field = "metadata 'tokenizer.ggml.token_type'";
    auto strings = [&](const char* key) {
      const auto* v = g.metadata(key);
      if (!v) meta.fail(key, "is missing");
      std::vector<std::string> out;
      for (const auto& e : v->as_array(key)) out.push_back(e.as_string(key));
      return out;
    };
    s.tokens = strings("tokenizer.ggml.tokens");
    for (std::size_t i = 0; i < s.tokens.size(); ++i)
      if (s.tokens[i].empty())
        meta.fail("tokenizer.ggml.tokens", "has an empty token (id " + std::to_string(i) + ")");
    s.merges = strings("tokenizer.ggml.merges");
    if (const auto t = meta.token_types()) {
      const auto& types = *t;
      if (types.size() != s.tokens.size())
        meta.fail("tokenizer.ggml.token_type", "lists " + std::to_string(types.size()) +
                                                   " types for " + std::to_string(s.tokens.size()) +
                                                   " tokens");
      for (std::size_t i = 0; i < types.size(); ++i)
        if (types[i] == 3 ||
            types[i] == 4)  // control, user-defined: matched verbatim in the raw text
          s.added.push_back({static_cast<std::uint32_t>(i), s.tokens[i], types[i] == 3, false});
    }
    std::string pre = "default";  // llama.cpp's assumption for files without the key
    if (const auto* p = g.metadata("tokenizer.ggml.pre")) pre = p->as_string("tokenizer.ggml.pre");
    if (pre == "qwen2")
      s.regex = std::string(qwen2_regex);
    else if (pre == "gpt2" || pre == "olmo" || pre == "default")
      s.regex = std::string(gpt2_regex);
    else
      meta.fail("tokenizer.ggml.pre",
                "is '" + pre + "'; moe-run knows the pre-tokenizers qwen2, gpt2, olmo and default",
                moekit::ErrorKind::unsupported);
    auto id = [&](const char* key) -> std::optional<std::uint32_t> {
      const auto* v = g.metadata(key);
      if (!v) return std::nullopt;
      const std::uint64_t u = v->as_uint(key);
      if (u >= s.tokens.size())
        meta.fail(key, "is " + std::to_string(u) + ", outside the vocabulary");
      return static_cast<std::uint32_t>(u);
    };
    s.special.bos = id("tokenizer.ggml.bos_token_id");
    s.special.eos = id("tokenizer.ggml.eos_token_id");
    return BpeVocab(std::move(s));
  }

  [[nodiscard]] std::uint32_t size() const noexcept {
    return static_cast<std::uint32_t>(tokens_.size());
  }
  [[nodiscard]] const Special& special() const noexcept { return special_; }
  [[nodiscard]] const std::string& regex() const noexcept { return regex_text_; }
  /// Whether encode applies Unicode NFC (tokenizer.json's NFC normalizer; never for GGUF).
  [[nodiscard]] bool applies_nfc() const noexcept { return nfc_; }
  /// The token text of `id` (in GPT-2's byte alphabet; added tokens as written).
  [[nodiscard]] const std::string& piece(std::uint32_t id) const {
    check_id(id);
    return tokens_[id];
  }

  /// Token ids of `text` (no BOS/EOS). Any bytes: see the file comment for invalid UTF-8.
  [[nodiscard]] std::vector<std::uint32_t> encode(std::string_view text) const {
    std::vector<std::uint32_t> out;
    // HF: the non-normalized added tokens in the raw text, then each stretch between them
    // normalized, then the normalized added tokens in it, then pre-tokenization and BPE.
    split_added(text, raw_added_, out, [&](std::string_view stretch) {
      if (!nfc_) {
        split_added(stretch, normalized_added_, out,
                    [&](std::string_view s) { encode_plain(s, out); });
        return;
      }
      const std::string normal = normalize(stretch);
      split_added(normal, normalized_added_, out,
                  [&](std::string_view s) { encode_plain(s, out); });
    });
    return out;
  }

  /// Text of `ids` (HF's decode with skip_special_tokens=False).
  [[nodiscard]] std::string decode(std::span<const std::uint32_t> ids) const {
    std::string bytes;
    for (std::uint32_t id : ids) {
      check_id(id);
      const auto as = decode_as_.empty() ? decode_as_.end() : decode_as_.find(id);
      const std::string& t = as == decode_as_.end() ? tokens_[id] : as->second;
      for (std::size_t i = 0; i < t.size();) {
        const std::size_t n = utf8_char_length(t, i);
        const auto it = n ? unicode_to_byte_.find(decode_char(t, i, n)) : unicode_to_byte_.end();
        if (it != unicode_to_byte_.end()) {
          bytes += static_cast<char>(it->second);
        } else {
          bytes.append(t, i, n ? n : 1);
        }
        i += n ? n : 1;
      }
    }
    std::string text;
    append_utf8_lossy(bytes, text);
    return text;
  }

 private:
  struct Merge {
    std::uint32_t rank, id;
  };
  struct Pattern {  // an added token as matched: its id and the text it matches
    std::uint32_t id;
    std::string text;
  };
  struct MallocFree {
    void operator()(void* p) const noexcept { std::free(p); }
  };
  struct PcreFree {
    void operator()(pcre2_code* c) const noexcept { pcre2_code_free(c); }
  };
  struct MatchDataFree {
    void operator()(pcre2_match_data* m) const noexcept { pcre2_match_data_free(m); }
  };
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };

  // The constructor's steps, in its order (their errors name `spec`'s fields).
  void index_added_tokens(const Spec& spec) {
    const std::size_t n = tokens_.size();
    for (const AddedToken& a : spec.added) {
      if (a.id >= n)
        fail(spec.added_field, "names id " + std::to_string(a.id) + " ('" + a.content +
                                   "') outside the vocabulary of " + std::to_string(n) + " tokens");
      if (a.content.empty())
        fail(spec.added_field, "has an empty token (id " + std::to_string(a.id) + ")");
      if (!a.normalized) {
        raw_added_.push_back({a.id, a.content});
        continue;
      }
      normalized_added_.push_back({a.id, normalize(a.content)});
      // HF (0.23's normalized_cache) decodes such a token from its normalized form too.
      if (normalized_added_.back().text != a.content)
        decode_as_.emplace(a.id, normalized_added_.back().text);
    }
    // Longest first, so the first match at a position is the longest.
    for (auto* list : {&raw_added_, &normalized_added_})
      std::stable_sort(list->begin(), list->end(), [](const Pattern& x, const Pattern& y) {
        return x.text.size() > y.text.size();
      });
  }

  void index_byte_symbols() {
    const auto table = byte_to_unicode();
    for (unsigned b = 0; b < 256; ++b) {
      byte_char_[b] = utf8_of(table[b]);
      unicode_to_byte_.emplace(table[b], static_cast<std::uint8_t>(b));
      const auto it = ids_.find(byte_char_[b]);
      byte_id_[b] = it == ids_.end() ? -1 : static_cast<std::int64_t>(it->second);
    }
  }

  void index_merges(const Spec& spec) {
    // Merges: (left id, right id) -> (rank, merged id).
    merges_.reserve(spec.merges.size());
    std::string joined;  // left + right, its buffer reused
    for (std::size_t r = 0; r < spec.merges.size(); ++r) {
      const std::string& m = spec.merges[r];
      const auto where = [&] { return "entry " + std::to_string(r) + " '" + m + "'"; };
      const std::size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
      if (sp == std::string::npos || sp + 1 >= m.size())
        fail(spec.merges_field, where() + " is not two tokens separated by a space");
      const std::string_view left = std::string_view(m).substr(0, sp),
                             right = std::string_view(m).substr(sp + 1);
      joined.assign(left).append(right);
      const auto l = ids_.find(left), rt = ids_.find(right), lr = ids_.find(joined);
      if (l == ids_.end())
        fail(spec.merges_field,
             where() + " names '" + std::string(left) + "', which is not a token");
      if (rt == ids_.end())
        fail(spec.merges_field,
             where() + " names '" + std::string(right) + "', which is not a token");
      if (lr == ids_.end())
        fail(spec.merges_field, where() + " merges into '" + joined + "', which is not a token");
      merges_.emplace(pair_key(l->second, rt->second),
                      Merge{static_cast<std::uint32_t>(r), lr->second});
    }
  }

  void compile_pre_tokenizer(std::string regex) {
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(regex.data()), regex.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
    if (!code) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      fail("pre-tokenizer regex", "'" + regex + "' does not compile at offset " +
                                      std::to_string(at) + ": " +
                                      reinterpret_cast<const char*>(msg.data()));
    }
    regex_.reset(code);
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter
    regex_text_ = std::move(regex);
  }

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw moekit::Error(moekit::ErrorKind::invalid_format, source_ + ": " + field + " " + what);
  }
  void check_id(std::uint32_t id) const {
    if (id >= tokens_.size() || tokens_[id].empty())
      throw moekit::Error(moekit::ErrorKind::invalid_argument,
                          "token id " + std::to_string(id) + " is not in the vocabulary of " +
                              std::to_string(tokens_.size()) + " tokens (" + source_ + ")");
  }
  static std::uint64_t pair_key(std::uint32_t a, std::uint32_t b) noexcept {
    return (static_cast<std::uint64_t>(a) << 32) | b;
  }

  // The whole file, read straight into the string (no stream copy of it).
  static std::string read_text(const std::filesystem::path& path, const std::string& src) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw moekit::Error(moekit::ErrorKind::io, src + ": cannot be opened");
    std::string text;
    std::array<char, 1 << 16> buf{};
    while (in.read(buf.data(), buf.size()) || in.gcount() > 0)
      text.append(buf.data(), static_cast<std::size_t>(in.gcount()));
    if (in.bad()) throw moekit::Error(moekit::ErrorKind::io, src + ": cannot be read");
    return text;
  }

  static nlohmann::json parse_json(std::string_view text, const std::string& src) {
    try {
      return nlohmann::json::parse(text.begin(), text.end());
    } catch (const nlohmann::json::exception& e) {
      throw moekit::Error(moekit::ErrorKind::invalid_format, src + ": not valid JSON: " + e.what());
    }
  }

  // The regex of tokenizer.json's pre_tokenizer.
  template <class Bad>
  static std::string pre_tokenizer_regex(const nlohmann::json& p, Bad& bad) {
    auto type = [](const nlohmann::json& x) {
      return x.is_object() ? x.value("type", std::string()) : std::string();
    };
    auto byte_level = [&](const nlohmann::json& b, const std::string& field) {
      if (b.contains("add_prefix_space") && b["add_prefix_space"] == true)
        bad(field + ".add_prefix_space", "is true, which moe-run does not support",
            moekit::ErrorKind::unsupported);
      return !b.contains("use_regex") || b["use_regex"] != false;
    };
    if (type(p) == "ByteLevel") {
      if (!byte_level(p, "pre_tokenizer"))
        bad("pre_tokenizer.use_regex", "is false with no Split before it",
            moekit::ErrorKind::unsupported);
      return std::string(gpt2_regex);
    }
    if (type(p) == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array() &&
        p["pretokenizers"].size() == 2) {
      const auto& split = p["pretokenizers"][0];
      const auto& bl = p["pretokenizers"][1];
      const std::string f = "pre_tokenizer.pretokenizers[0]";
      if (type(split) == "Split" && type(bl) == "ByteLevel") {
        if (byte_level(bl, "pre_tokenizer.pretokenizers[1]"))
          bad("pre_tokenizer.pretokenizers[1].use_regex", "is true after a Split",
              moekit::ErrorKind::unsupported);
        if (split.value("behavior", std::string()) != "Isolated" || split.value("invert", false))
          bad(f + ".behavior", "must be Isolated (invert false)", moekit::ErrorKind::unsupported);
        if (!split.contains("pattern") || !split["pattern"].is_object() ||
            !split["pattern"].contains("Regex") || !split["pattern"]["Regex"].is_string())
          bad(f + ".pattern.Regex", "is missing (a String pattern is not supported)",
              moekit::ErrorKind::unsupported);
        return split["pattern"]["Regex"].get<std::string>();
      }
    }
    bad("pre_tokenizer",
        "is " + p.dump().substr(0, 200) +
            "; moe-run supports ByteLevel and Sequence[Split(Regex), ByteLevel(use_regex=false)]",
        moekit::ErrorKind::unsupported);
    return {};
  }

  // Splits `text` at the leftmost-longest matches of `patterns` (longest first), as HF's
  // AhoCorasick with MatchKind::LeftmostLongest: appends a match's id, hands `plain` the rest.
  template <class Plain>
  static void split_added(std::string_view text, const std::vector<Pattern>& patterns,
                          std::vector<std::uint32_t>& out, Plain&& plain) {
    std::size_t from = 0;  // start of the text not yet handed on
    for (std::size_t i = 0; i < text.size() && !patterns.empty();) {
      const Pattern* hit = nullptr;
      for (const Pattern& p : patterns)
        if (text.compare(i, p.text.size(), p.text) == 0) {
          hit = &p;
          break;
        }
      if (!hit) {
        ++i;
        continue;
      }
      if (i > from) plain(text.substr(from, i - from));
      out.push_back(hit->id);
      i += hit->text.size();
      from = i;
    }
    if (from < text.size()) plain(text.substr(from));
  }

  // `text` in NFC when the vocabulary normalizes (utf8proc: STABLE | COMPOSE is its NFC), else
  // as it is. Text that is not valid UTF-8 is returned as it is (see the file comment): HF cannot
  // be given it, and unnormalized its invalid bytes are still encoded byte by byte.
  [[nodiscard]] std::string normalize(std::string_view text) const {
    const auto ascii = [](char c) { return static_cast<unsigned char>(c) < 0x80; };
    if (!nfc_ || std::all_of(text.begin(), text.end(), ascii))
      return std::string(text);  // ASCII is NFC
    utf8proc_uint8_t* dst = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                     static_cast<utf8proc_ssize_t>(text.size()), &dst,
                     static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    const std::unique_ptr<utf8proc_uint8_t, MallocFree> owned(
        dst);  // malloc'd (utf8proc.h: free it)
    if (n == UTF8PROC_ERROR_NOMEM) throw std::bad_alloc();
    if (n < 0 || !dst)
      return std::string(text);  // invalid UTF-8 (or too long for utf8proc): unnormalized
    return {reinterpret_cast<const char*>(dst), static_cast<std::size_t>(n)};
  }

  // Pre-tokenizes `text` (no added tokens in it) and appends its BPE ids.
  void encode_plain(std::string_view text, std::vector<std::uint32_t>& out) const {
    if (text.empty()) return;
    std::unique_ptr<pcre2_match_data, MatchDataFree> md(
        pcre2_match_data_create_from_pattern(regex_.get(), nullptr));
    if (!md) throw std::bad_alloc();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    std::size_t pos = 0, emitted = 0;
    while (pos < text.size()) {
      const int rc = pcre2_match(regex_.get(), subject, text.size(), pos, 0, md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(rc, msg.data(), msg.size());
        throw moekit::Error(
            moekit::ErrorKind::invalid_argument,
            source_ + ": pre-tokenizer regex failed: " + reinterpret_cast<const char*>(msg.data()));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      const std::size_t s = ov[0], e = ov[1];
      if (e <= s) {  // an empty match: move on by one character
        pos = s + std::max<std::size_t>(1, utf8_char_length(text, s));
        continue;
      }
      if (s > emitted) bpe(text.substr(emitted, s - emitted), out);  // a gap (Isolated keeps it)
      bpe(text.substr(s, e - s), out);
      emitted = pos = e;
    }
    if (emitted < text.size()) bpe(text.substr(emitted), out);
  }

  // BPE of one pre-tokenized piece: byte symbols merged by lowest rank (ties leftmost), as HF.
  void bpe(std::string_view piece, std::vector<std::uint32_t>& out) const {
    if (ignore_merges_) {
      std::string mapped;
      for (char c : piece) mapped += byte_char_[static_cast<unsigned char>(c)];
      if (const auto it = ids_.find(mapped); it != ids_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    struct Sym {
      std::uint32_t id;
      std::int64_t prev, next;
    };
    std::vector<Sym> sym;
    sym.reserve(piece.size());
    for (std::size_t i = 0; i < piece.size(); ++i) {
      const auto b = static_cast<unsigned char>(piece[i]);
      if (byte_id_[b] < 0)
        throw moekit::Error(moekit::ErrorKind::invalid_argument,
                            source_ + ": cannot encode byte 0x" + hex(b) + ": its symbol '" +
                                byte_char_[b] + "' is not a token");
      sym.push_back({static_cast<std::uint32_t>(byte_id_[b]), static_cast<std::int64_t>(i) - 1,
                     static_cast<std::int64_t>(i) + 1});
    }
    sym.back().next = -1;
    struct Cand {
      std::uint32_t rank;
      std::size_t left;
      std::uint32_t a, b, id;
    };
    auto later = [](const Cand& x, const Cand& y) {
      return x.rank != y.rank ? x.rank > y.rank : x.left > y.left;
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(later)> queue(later);
    auto try_pair = [&](std::int64_t l) {
      if (l < 0 || sym[static_cast<std::size_t>(l)].next < 0) return;
      const std::uint32_t a = sym[static_cast<std::size_t>(l)].id;
      const std::uint32_t b =
          sym[static_cast<std::size_t>(sym[static_cast<std::size_t>(l)].next)].id;
      const auto it = merges_.find(pair_key(a, b));
      if (it != merges_.end())
        queue.push({it->second.rank, static_cast<std::size_t>(l), a, b, it->second.id});
    };
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) try_pair(static_cast<std::int64_t>(i));
    std::vector<bool> dead(sym.size(), false);
    while (!queue.empty()) {
      const Cand c = queue.top();
      queue.pop();
      Sym& l = sym[c.left];
      if (dead[c.left] || l.id != c.a || l.next < 0) continue;
      const auto ri = static_cast<std::size_t>(l.next);
      if (sym[ri].id != c.b) continue;  // stale: the pair is gone
      l.id = c.id;
      dead[ri] = true;
      l.next = sym[ri].next;
      if (l.next >= 0)
        sym[static_cast<std::size_t>(l.next)].prev = static_cast<std::int64_t>(c.left);
      try_pair(l.prev);
      try_pair(static_cast<std::int64_t>(c.left));
    }
    for (std::int64_t i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next)
      out.push_back(sym[static_cast<std::size_t>(i)].id);
  }

  static std::string hex(unsigned b) {
    static constexpr char digits[] = "0123456789ABCDEF";
    return {digits[b >> 4], digits[b & 15]};
  }

  // GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the others to 256 + k.
  static std::array<std::uint32_t, 256> byte_to_unicode() {
    std::array<std::uint32_t, 256> t{};
    std::uint32_t k = 0;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[b] = printable ? b : 256 + k++;
    }
    return t;
  }
  static std::string utf8_of(std::uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  }
  // Length of the valid UTF-8 character at s[i], 0 when the bytes there are not one.
  static std::size_t utf8_char_length(std::string_view s, std::size_t i) noexcept {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80         ? 1
                          : (c >> 5) == 6  ? 2
                          : (c >> 4) == 14 ? 3
                          : (c >> 3) == 30 ? 4
                                           : 0;
    if (n == 0 || i + n > s.size()) return 0;
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
    return n;
  }
  static std::uint32_t decode_char(std::string_view s, std::size_t i, std::size_t n) noexcept {
    const auto c = static_cast<unsigned char>(s[i]);
    std::uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (std::size_t k = 1; k < n; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    return cp;
  }
  // Appends `bytes` to `out` with each maximal invalid UTF-8 subsequence as one U+FFFD (the
  // Unicode "maximal subpart" practice of Rust's from_utf8_lossy, hence of HF's decode).
  static void append_utf8_lossy(const std::string& b, std::string& out) {
    for (std::size_t i = 0; i < b.size();) {
      const auto c = static_cast<unsigned char>(b[i]);
      if (c < 0x80) {
        out += b[i++];
        continue;
      }
      std::size_t n = 0;
      unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
      if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
      } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
      }
      std::size_t k = 1;
      while (k < n && i + k < b.size()) {
        const auto d = static_cast<unsigned char>(b[i + k]);
        if (d < (k == 1 ? lo : 0x80u) || d > (k == 1 ? hi : 0xBFu)) break;
        ++k;
      }
      if (n != 0 && k == n)
        out.append(b, i, n);
      else
        out += "\xEF\xBF\xBD";
      i += k;
    }
  }

  std::vector<std::string> tokens_;
  Special special_;
  bool ignore_merges_ = false;
  bool nfc_ = false;
  std::string source_;
  std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> ids_;
  std::vector<Pattern> raw_added_;  // matched in the raw text; longest first
  std::vector<Pattern>
      normalized_added_;  // matched in the normalized text (content normalized); longest first
  std::unordered_map<std::uint32_t, std::string>
      decode_as_;  // decode text of normalized added tokens NFC changed
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::array<std::string, 256> byte_char_;
  std::array<std::int64_t, 256> byte_id_{};
  std::unordered_map<std::uint32_t, std::uint8_t> unicode_to_byte_;
  std::unique_ptr<pcre2_code, PcreFree> regex_;
  std::string regex_text_;
};

}  // namespace moekit::engine
