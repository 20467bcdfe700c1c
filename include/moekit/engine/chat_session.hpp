#pragma once
/// \file Chat on a Model: rendered chat prompts to token ids (`ChatEncoder`), and a conversation
/// whose KV cache is kept across turns (`ChatSession`), which `moe-run --chat` and
/// `moe-run --serve` share.
///
/// Keeping the cache: the session remembers the text its KV cache holds (the rendered prompt
/// plus the reply's text as generated). Each turn renders the whole conversation; when the
/// remembered text is a prefix of it, only the rest is tokenised and prefilled (llama.cpp's chat
/// does the same with its templates), else the sequence starts over, which the turn reports
/// (`TurnResult::cache_kept`). A reply's own tokens stay in the cache as generated, never
/// re-tokenised.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/error.hpp"

#include "moekit/engine/chat_template.hpp"
#include "moekit/engine/sampler.hpp"
#include "moekit/engine/tokenizer.hpp"

namespace moekit::engine {

/// Token ids of rendered chat text: the template's special texts (BOS, EOS, <|im_start|>, ...)
/// become their token ids, the text between them is encoded without BOS. A SentencePiece-style
/// vocabulary adds a word-start marker ("▁") to each stretch it encodes, which stands for one
/// leading space: a stretch after a special token drops one leading space, so "<s> [INST]" is <s>,
/// "▁[", "INST", "]", and "</s>[INST]" is </s>, "▁[", ... too: HF's LlamaTokenizer with
/// `legacy: true`, as Mixtral-Instruct's has it (tests/chat/chat_token_ids_test.cpp compares with
/// its ids; where a run of spaces is cut differently, SentencePiece's own ids, see docs/engine.md).
class ChatEncoder {
 public:
  /// Without a template (plain completions): no special texts, EOS stops.
  explicit ChatEncoder(const Tokenizer& tok) : tok_(tok) {
    if (tok.eos_id()) stops_.push_back(*tok.eos_id());
  }

  ChatEncoder(const Tokenizer& tok, const ChatTemplate& tmpl) : tok_(tok) {
    const auto wanted = tmpl.special_texts();
    for (std::uint32_t id = 0; id < tok.vocab_size(); ++id) {
      const std::string p = tok.piece(id);
      for (const std::string& w : wanted)
        if (p == w && std::none_of(specials_.begin(), specials_.end(),
                                   [&](const auto& s) { return s.first == w; }))
          specials_.emplace_back(w, id);
    }
    // Longest first, so that no special text is cut by a shorter one it contains.
    std::sort(specials_.begin(), specials_.end(),
              [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    const auto probe = tok.encode("a", false);
    word_start_marker_ = !probe.empty() && tok.piece(probe.front()).starts_with("\xE2\x96\x81");
    if (tok.eos_id()) stops_.push_back(*tok.eos_id());
    if (const std::string eot = tmpl.end_of_turn(); !eot.empty())
      for (const auto& [text, id] : specials_)
        if (text == eot) stops_.push_back(id);
  }

  /// Ids of `text`; `after_special`: the text follows a special token already in the sequence.
  [[nodiscard]] std::vector<std::uint32_t> encode(std::string_view text,
                                                  bool after_special = false) const {
    std::vector<std::uint32_t> out;
    while (!text.empty()) {
      std::size_t at = std::string_view::npos;
      const std::pair<std::string, std::uint32_t>* hit = nullptr;
      for (const auto& s : specials_)
        if (const std::size_t p = text.find(s.first); p < at) at = p, hit = &s;
      const std::string_view plain = text.substr(0, at);
      encode_plain(plain, after_special, out);
      if (!hit) break;
      out.push_back(hit->second);
      after_special = true;
      text.remove_prefix(at + hit->first.size());
    }
    return out;
  }

  /// Token ids that end a reply: EOS, and the format's end-of-turn token (<|im_end|>, <|eot_id|>).
  [[nodiscard]] std::span<const std::uint32_t> stops() const noexcept { return stops_; }
  [[nodiscard]] bool is_stop(std::uint32_t id) const noexcept {
    return std::find(stops_.begin(), stops_.end(), id) != stops_.end();
  }
  void add_stop(std::uint32_t id) {
    if (!is_stop(id)) stops_.push_back(id);
  }

 private:
  void encode_plain(std::string_view s, bool after_special, std::vector<std::uint32_t>& out) const {
    if (word_start_marker_ && after_special && s.starts_with(' ')) s.remove_prefix(1);
    if (s.empty()) return;
    const auto ids = tok_.encode(s, false);
    out.insert(out.end(), ids.begin(), ids.end());
  }

  const Tokenizer& tok_;
  std::vector<std::pair<std::string, std::uint32_t>> specials_;
  std::vector<std::uint32_t> stops_;
  bool word_start_marker_ = false;
};

/// What a turn asks for: at most `max_tokens` generated, each piece of text handed to `on_text`
/// as it completes (returning false stops the turn: a client gone), `should_stop` polled before
/// each token (a deadline, a shutdown).
struct TurnRequest {
  int max_tokens = 64;
  std::function<bool(std::string_view)> on_text;
  std::function<bool()> should_stop;
};

/// What a turn did.
struct TurnResult {
  std::string text;
  std::size_t prompt_tokens = 0;     ///< tokens prefilled this turn (the new part only)
  std::size_t generated_tokens = 0;  ///< sampled, the stop token included
  std::size_t decoded_tokens = 0;    ///< forwards of one token
  bool cache_kept = false;           ///< the cache held this turn's start (only the rest ran)
  std::string finish_reason;         ///< "stop" (EOS/end of turn), "length", "cancelled"
  double prefill_seconds = 0, decode_seconds = 0;
};

/// A conversation with a model (`M`: Model<Pipeline>), its KV cache kept between turns.
template <class M>
class ChatSession {
 public:
  /// `tmpl` may be null: then only `complete` runs.
  ChatSession(M& model, const Tokenizer& tok, const ChatTemplate* tmpl, const ChatEncoder& enc)
      : model_(model), tok_(tok), tmpl_(tmpl), enc_(enc) {}

  /// Forgets the conversation; the next turn starts a new sequence.
  void reset() {
    history_.clear();
    cached_.clear();
  }
  [[nodiscard]] const std::vector<ChatMessage>& history() const noexcept { return history_; }

  /// Adds the user's message and generates the assistant's reply (kept in the history). The
  /// reply's text is its content as a message (see `reply`).
  TurnResult say(std::string user_text, Sampler& sampler, const TurnRequest& req) {
    history_.push_back({"user", std::move(user_text)});
    TurnResult r = reply(history_, sampler, req);
    history_.push_back({"assistant", r.text});
    return r;
  }

  /// The reply to `conversation` (which need not continue the previous one: a server's
  /// requests). `TurnResult::text` is the reply as the message content the template expects
  /// back (Mistral's formats: without the leading space of its first token). Throws
  /// `Error(invalid_argument)` when the template refuses the conversation or the prompt plus
  /// max_tokens does not fit the context.
  TurnResult reply(std::span<const ChatMessage> conversation, Sampler& sampler,
                   const TurnRequest& req) {
    if (!tmpl_) fail("no chat template");
    const std::string rendered = tmpl_->render(conversation, true);
    TurnResult r;
    const std::uint32_t room = model_.kv_cache().capacity();
    std::vector<std::uint32_t> ids;
    r.cache_kept = !cached_.empty() && rendered.starts_with(cached_) && rendered != cached_;
    if (r.cache_kept) {
      ids = enc_.encode(std::string_view(rendered).substr(cached_.size()), cached_after_special_);
      if (model_.position() + ids.size() + std::size_t(req.max_tokens) > room) r.cache_kept = false;
    }
    if (!r.cache_kept) {
      ids = enc_.encode(rendered);
      if (ids.empty()) fail("the chat prompt encodes to no tokens");
      if (ids.size() + std::size_t(req.max_tokens) > room)
        fail("the conversation (" + std::to_string(ids.size()) + " tokens) plus " +
             std::to_string(req.max_tokens) + " tokens to generate exceeds the context length " +
             std::to_string(room) + " (-c)");
      model_.begin_sequence();
      cached_.clear();
    }
    cached_.clear();  // until the turn ends: a turn that throws leaves nothing to continue
    cached_after_special_ = false;
    generate(ids, sampler, req, r, spaced_reply());
    cached_ = rendered + r.text;
    if (spaced_reply() && r.text.starts_with(' ')) r.text.erase(0, 1);
    return r;
  }

  /// Plain completion of `prompt` ids (a new sequence; nothing is kept for a next turn).
  TurnResult complete(std::span<const std::uint32_t> prompt, Sampler& sampler,
                      const TurnRequest& req) {
    if (prompt.empty()) fail("the prompt encodes to no tokens");
    if (prompt.size() + std::size_t(req.max_tokens) > model_.kv_cache().capacity())
      fail("the prompt (" + std::to_string(prompt.size()) + " tokens) plus " +
           std::to_string(req.max_tokens) + " tokens to generate exceeds the context length " +
           std::to_string(model_.kv_cache().capacity()) + " (-c)");
    reset();
    model_.begin_sequence();
    TurnResult r;
    generate(prompt, sampler, req, r);
    return r;
  }

 private:
  [[noreturn]] static void fail(const std::string& msg) {
    throw Error(ErrorKind::invalid_argument, msg);
  }

  // The formats that write ' ' + content for the assistant: the reply's content is its text
  // without the leading space its first token decodes to (as HF's decode of the reply alone),
  // so that the next render reproduces the cached text.
  [[nodiscard]] bool spaced_reply() const noexcept {
    return tmpl_ &&
           (tmpl_->format() == ChatFormat::mistral_v1 || tmpl_->format() == ChatFormat::llama2_sys);
  }

  // Prefills `ids`, then samples until a stop token, max_tokens or a cancellation. Every kept
  // token is decoded (the last one too), so the cache holds exactly the text remembered.
  // `drop_space`: the first piece handed to on_text loses one leading space (spaced_reply).
  void generate(std::span<const std::uint32_t> ids, Sampler& sampler, const TurnRequest& req,
                TurnResult& r, bool drop_space = false) {
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    std::span<const float> logits = model_.prefill(ids);
    r.prompt_tokens = ids.size();
    r.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    t0 = clock::now();
    StreamDecoder stream(tok_, ids);
    r.finish_reason = "length";
    for (int i = 0; i < req.max_tokens; ++i) {
      if (req.should_stop && req.should_stop()) {
        r.finish_reason = "cancelled";
        break;
      }
      const std::uint32_t next = sampler.sample(logits);
      ++r.generated_tokens;
      if (enc_.is_stop(next)) {
        r.finish_reason = "stop";
        break;
      }
      const std::string piece = stream.push(next);
      logits = model_.decode(next);
      ++r.decoded_tokens;
      const bool first = r.text.empty();
      r.text += piece;
      std::string_view shown = piece;
      if (first && drop_space && shown.starts_with(' ')) shown.remove_prefix(1);
      if (!shown.empty() && req.on_text && !req.on_text(shown)) {
        r.finish_reason = "cancelled";
        break;
      }
    }
    r.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  }

  M& model_;
  const Tokenizer& tok_;
  const ChatTemplate* tmpl_;
  const ChatEncoder& enc_;
  std::vector<ChatMessage> history_;
  std::string cached_;  // the text the KV cache holds ("" = nothing kept)
  bool cached_after_special_ = false;
};

}  // namespace moekit::engine
