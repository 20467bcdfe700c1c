#pragma once
/// \file GgufVocab: the SentencePiece-style (BPE by piece score) tokenizer of a vocabulary
/// embedded in a GGUF file (`tokenizer.ggml.model = "llama"`: tokenizer.ggml.tokens / scores /
/// token_type, bos/eos/unk ids, add_space_prefix), as llama.cpp's SPM tokenizer and the
/// SentencePiece library's BPE model encode and decode it.
///
/// Encoding: the text gets a leading "▁" (add_space_prefix) and every ' ' becomes "▁" (U+2581);
/// it is split into UTF-8 characters; then, repeatedly, the adjacent pair whose concatenation is
/// a piece of the highest score is merged (ties: the leftmost pair). Pieces that may be merged
/// into are the normal, user-defined and unused ones (SentencePiece's rule); an unused piece
/// left at the end is split back into the two symbols it was merged from. A character that is
/// not a piece becomes its UTF-8 bytes as the byte pieces `<0xXX>` (byte fallback), or the
/// unknown id when the vocabulary has no byte pieces.
/// Decoding (SentencePiece's): control pieces produce nothing, the unknown piece " ⁇ ", runs of
/// byte pieces their bytes with each invalid UTF-8 byte replaced by U+FFFD, other pieces their
/// text with "▁" → ' '; the first piece's leading space (the added prefix) is dropped.
/// Errors name the GGUF file and the metadata key.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/io/gguf.hpp"

#include "moekit/engine/gguf_tokenizer_metadata.hpp"

namespace moekit::engine {

/// A SentencePiece vocabulary (pieces, scores, types) and its BPE-by-score encoder.
class GgufVocab {
 public:
  /// Piece types, numbered as SentencePiece's ModelProto and llama.cpp's token_type.
  enum class Type : std::int32_t {
    normal = 1,
    unknown = 2,
    control = 3,
    user_defined = 4,
    unused = 5,
    byte = 6
  };

  struct Special {
    std::optional<std::uint32_t> bos, eos, unk;
    bool add_space_prefix = true;
  };

  /// `scores` and `types` may be empty (0 and normal for every piece). `source` names the
  /// vocabulary in errors.
  GgufVocab(std::vector<std::string> pieces, std::vector<float> scores, std::vector<Type> types,
            Special special, std::string source)
      : pieces_(std::move(pieces)),
        scores_(std::move(scores)),
        types_(std::move(types)),
        special_(special),
        source_(std::move(source)) {
    const std::size_t n = pieces_.size();
    if (n == 0) fail("has no pieces");
    if (scores_.empty()) scores_.assign(n, 0.f);
    if (types_.empty()) types_.assign(n, Type::normal);
    if (scores_.size() != n || types_.size() != n)
      fail("lists " + std::to_string(n) + " pieces but " + std::to_string(scores_.size()) +
           " scores and " + std::to_string(types_.size()) + " types");
    for (auto id : {special_.bos, special_.eos, special_.unk})
      if (id && *id >= n)
        fail("names special id " + std::to_string(*id) + " outside the vocabulary");
    byte_id_.fill(-1);
    byte_value_.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const Type t = types_[i];
      if (t == Type::normal || t == Type::user_defined || t == Type::unused)
        mergeable_.emplace(pieces_[i], static_cast<std::uint32_t>(i));  // first one wins
      if (t == Type::byte) {
        const std::string& p = pieces_[i];
        unsigned v = 0;
        if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>' ||
            std::sscanf(p.c_str() + 3, "%2x", &v) != 1)
          fail("has byte piece " + std::to_string(i) + " '" + p + "' not of the form <0xXX>");
        byte_id_[v] = static_cast<std::int64_t>(i);
        byte_value_[i] = static_cast<std::uint8_t>(v);
      }
    }
  }

  /// The vocabulary embedded in `g`; throws `Error(unsupported)` for a tokenizer model other than
  /// "llama" (SentencePiece), `Error(invalid_format)` naming the key for malformed metadata.
  static GgufVocab from_gguf(const moekit::io::GgufFile& g) {
    const GgufTokenizerMetadata meta(g);
    const std::string m = meta.model();
    if (m != "llama")
      meta.fail("tokenizer.ggml.model",
                "is '" + m +
                    "'; moe-run reads SentencePiece ('llama', GgufVocab) and "
                    "byte-level BPE ('gpt2', BpeVocab) vocabularies",
                moekit::ErrorKind::unsupported);
    const auto* tokens = g.metadata("tokenizer.ggml.tokens");
    if (!tokens) meta.fail("tokenizer.ggml.tokens", "is missing");
    std::vector<std::string> pieces;
    for (const auto& v : tokens->as_array("tokenizer.ggml.tokens"))
      pieces.push_back(v.as_string("tokenizer.ggml.tokens"));
    std::vector<float> scores;
    if (const auto* s = g.metadata("tokenizer.ggml.scores"))
      for (const auto& v : s->as_array("tokenizer.ggml.scores"))
        scores.push_back(static_cast<float>(v.as_double("tokenizer.ggml.scores")));
    std::vector<Type> types;
    if (const auto t = meta.token_types())
      for (const std::int64_t x : *t) types.push_back(static_cast<Type>(x));
    Special sp;
    auto id = [&](const char* key) -> std::optional<std::uint32_t> {
      const auto* v = g.metadata(key);
      if (!v) return std::nullopt;
      const std::uint64_t u = v->as_uint(key);
      if (u > 0xffffffffu) meta.fail(key, "is too large");
      return static_cast<std::uint32_t>(u);
    };
    sp.bos = id("tokenizer.ggml.bos_token_id");
    sp.eos = id("tokenizer.ggml.eos_token_id");
    sp.unk = id("tokenizer.ggml.unknown_token_id");
    if (const auto* a = g.metadata("tokenizer.ggml.add_space_prefix")) {
      const bool* b = std::get_if<bool>(&a->value);
      if (!b) meta.fail("tokenizer.ggml.add_space_prefix", "must be a bool");
      sp.add_space_prefix = *b;
    }
    if (!sp.unk)  // SentencePiece models have one; llama.cpp falls back to the UNKNOWN piece
      for (std::size_t i = 0; i < types.size() && !sp.unk; ++i)
        if (types[i] == Type::unknown) sp.unk = static_cast<std::uint32_t>(i);
    return GgufVocab(std::move(pieces), std::move(scores), std::move(types), sp, meta.source());
  }

  [[nodiscard]] std::uint32_t size() const noexcept {
    return static_cast<std::uint32_t>(pieces_.size());
  }
  [[nodiscard]] const Special& special() const noexcept { return special_; }
  [[nodiscard]] const std::string& piece(std::uint32_t id) const {
    check_id(id);
    return pieces_[id];
  }
  [[nodiscard]] Type type(std::uint32_t id) const {
    check_id(id);
    return types_[id];
  }

  /// Token ids of `text` (no BOS/EOS).
  [[nodiscard]] std::vector<std::uint32_t> encode(std::string_view text) const {
    std::vector<std::uint32_t> out;
    if (text.empty()) return out;
    std::string s;
    s.reserve(text.size() + 3);
    if (special_.add_space_prefix) s += space;
    for (char c : text) {
      if (c == ' ')
        s += space;
      else
        s += c;
    }
    // Symbols: one per UTF-8 character, as a doubly linked list over `s`.
    std::vector<Symbol> sym;
    for (std::size_t i = 0; i < s.size();) {
      const std::size_t n = std::min(utf8_length(static_cast<unsigned char>(s[i])), s.size() - i);
      sym.push_back({static_cast<std::int64_t>(sym.size()) - 1,
                     static_cast<std::int64_t>(sym.size()) + 1, i, n});
      i += n;
    }
    sym.back().next = -1;
    std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
    RevMerge rev_merge;  // unused piece -> length of its left part when it was paired
    auto try_pair = [&](std::int64_t l, std::int64_t r) {
      if (l < 0 || r < 0) return;
      const std::string_view piece(s.data() + sym[l].at, sym[l].len + sym[r].len);
      const auto it = mergeable_.find(piece);
      if (it == mergeable_.end()) return;
      queue.push({scores_[it->second], static_cast<std::size_t>(l), piece.size()});
      if (types_[it->second] == Type::unused) rev_merge.insert_or_assign(piece, sym[l].len);
    };
    for (std::size_t i = 1; i < sym.size(); ++i)
      try_pair(static_cast<std::int64_t>(i) - 1, static_cast<std::int64_t>(i));
    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Symbol& l = sym[b.left];
      if (l.len == 0 || l.next < 0) continue;  // merged away
      Symbol& r = sym[static_cast<std::size_t>(l.next)];
      if (l.len + r.len != b.len) continue;  // stale: one side changed since
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0)
        sym[static_cast<std::size_t>(r.next)].prev = static_cast<std::int64_t>(b.left);
      try_pair(l.prev, static_cast<std::int64_t>(b.left));
      try_pair(static_cast<std::int64_t>(b.left), l.next);
    }
    for (std::int64_t i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next)
      resegment(std::string_view(s.data() + sym[i].at, sym[i].len), rev_merge, out);
    return out;
  }

  /// Text of `ids`.
  [[nodiscard]] std::string decode(std::span<const std::uint32_t> ids) const {
    std::string text, bytes;
    bool first = true;  // the added prefix's space is still to be dropped
    auto flush = [&] {
      append_utf8_lossy(bytes, text);
      bytes.clear();
    };
    for (std::uint32_t id : ids) {
      check_id(id);
      const Type t = types_[id];
      if (t == Type::byte) {
        bytes += static_cast<char>(byte_value_[id]);
        first = false;
        continue;
      }
      flush();
      if (t == Type::control) continue;
      if (t == Type::unknown) {
        text += " \xE2\x81\x87 ";
        first = false;
        continue;
      }
      std::string_view p = pieces_[id];
      if (first && special_.add_space_prefix && p.starts_with(space)) p.remove_prefix(space.size());
      first = false;
      for (std::size_t i = 0; i < p.size();) {
        if (p.compare(i, space.size(), space) == 0) {
          text += ' ';
          i += space.size();
        } else {
          text += p[i++];
        }
      }
    }
    flush();
    return text;
  }

 private:
  static constexpr std::string_view space = "\xE2\x96\x81";  // U+2581 ▁

  struct Hash {  // heterogeneous lookup by string_view
    using is_transparent = void;
    std::size_t operator()(std::string_view v) const noexcept {
      return std::hash<std::string_view>{}(v);
    }
  };
  using RevMerge = std::unordered_map<std::string_view, std::size_t>;

  struct Symbol {
    std::int64_t prev, next;
    std::size_t at, len;
  };
  struct Bigram {
    float score;
    std::size_t left, len;
  };
  struct BigramOrder {  // highest score first, then the leftmost
    bool operator()(const Bigram& a, const Bigram& b) const noexcept {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };

  [[noreturn]] void fail(const std::string& what) const {
    throw moekit::Error(moekit::ErrorKind::invalid_format, "vocabulary of " + source_ + " " + what);
  }
  void check_id(std::uint32_t id) const {
    if (id >= pieces_.size())
      throw moekit::Error(moekit::ErrorKind::invalid_argument,
                          "token id " + std::to_string(id) + " is outside the vocabulary of " +
                              std::to_string(pieces_.size()) + " pieces (" + source_ + ")");
  }
  static std::size_t utf8_length(unsigned char c) noexcept {
    static constexpr std::size_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
  }

  // Appends `bytes` to `out`, each byte that does not start a valid UTF-8 character as U+FFFD.
  static void append_utf8_lossy(const std::string& bytes, std::string& out) {
    for (std::size_t i = 0; i < bytes.size();) {
      const auto c = static_cast<unsigned char>(bytes[i]);
      std::size_t n = c < 0x80         ? 1
                      : (c >> 5) == 6  ? 2
                      : (c >> 4) == 14 ? 3
                      : (c >> 3) == 30 ? 4
                                       : 0;
      bool ok = n > 0 && i + n <= bytes.size();
      std::uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
      for (std::size_t k = 1; ok && k < n; ++k) {
        const auto d = static_cast<unsigned char>(bytes[i + k]);
        ok = (d & 0xC0) == 0x80;
        cp = (cp << 6) | (d & 0x3F);
      }
      // Overlong forms, surrogates and values past U+10FFFF are invalid too.
      ok = ok && !(n == 2 && cp < 0x80) && !(n == 3 && cp < 0x800) && !(n == 4 && cp < 0x10000) &&
           !(cp >= 0xD800 && cp <= 0xDFFF) && cp <= 0x10FFFF;
      if (ok) {
        out.append(bytes, i, n);
        i += n;
      } else {
        out += "\xEF\xBF\xBD";
        ++i;
      }
    }
  }

  // Emits the id of a final symbol: its piece, or (unused pieces) the two it was merged from,
  // or its bytes.
  void resegment(std::string_view text, const RevMerge& rev,
                 std::vector<std::uint32_t>& out) const {
    const auto it = mergeable_.find(text);
    if (it != mergeable_.end() && types_[it->second] != Type::unused) {
      out.push_back(it->second);
      return;
    }
    if (const auto r = rev.find(text); r != rev.end() && r->second < text.size()) {
      resegment(text.substr(0, r->second), rev, out);
      resegment(text.substr(r->second), rev, out);
      return;
    }
    if (it != mergeable_.end()) {
      out.push_back(it->second);
      return;
    }
    for (char c : text) {
      const std::int64_t b = byte_id_[static_cast<unsigned char>(c)];
      if (b >= 0) {
        out.push_back(static_cast<std::uint32_t>(b));
      } else if (special_.unk) {
        out.push_back(*special_.unk);
        return;  // one unknown id per character, as SentencePiece
      } else {
        fail("cannot encode '" + std::string(text) + "': no byte pieces and no unknown piece");
      }
    }
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<Type> types_;
  Special special_;
  std::string source_;
  std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> mergeable_;
  std::array<std::int64_t, 256> byte_id_{};
  std::vector<std::uint8_t> byte_value_;
};

}  // namespace moekit::engine
