// ChatEncoder: rendered chat prompts to token ids on Mixtral's SentencePiece tokenizer (the default
// model's): special texts become their ids, the text between them is encoded without BOS, and a
// stretch after a special token drops the one leading space its word-start marker stands for.

#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "moekit/engine/chat_session.hpp"
#include "moekit/engine/chat_template.hpp"
#include "moekit/engine/tokenizer.hpp"

using namespace moekit::engine;

namespace {

const Tokenizer& mixtral_tokenizer() {
  static const Tokenizer t(std::filesystem::path(MOEKIT_SOURCE_DIR) /
                           "models/moekit-tiny-moe/tokenizer.model");
  return t;
}

std::vector<std::uint32_t> concat(std::vector<std::vector<std::uint32_t>> parts) {
  std::vector<std::uint32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace

TEST_CASE("a Mixtral-Instruct prompt encodes its BOS and EOS as tokens", "[chat]") {
  const Tokenizer& tok = mixtral_tokenizer();
  REQUIRE(tok.bos_id() == 1u);
  REQUIRE(tok.eos_id() == 2u);
  const ChatTemplate t = make_chat_template("mistral-v1", tok.piece(1), tok.piece(2), "test");
  const ChatEncoder enc(tok, t);
  const std::vector<ChatMessage> m{{"user", "Hello"}, {"assistant", "Hi!"}, {"user", "Bye"}};
  const std::string text = t.render(m, true);
  REQUIRE(text == "<s> [INST] Hello [/INST] Hi!</s> [INST] Bye [/INST]");
  const auto ids = enc.encode(text);
  // "<s>" → 1, then " [INST] Hello [/INST] Hi!" as SentencePiece encodes "[INST] Hello ...".
  CHECK(ids == concat({{1},
                       tok.encode("[INST] Hello [/INST] Hi!", false),
                       {2},
                       tok.encode("[INST] Bye [/INST]", false)}));
  CHECK(ids[1] == tok.encode("[", false).front());  // "▁[": the space is the word-start marker
  CHECK(enc.is_stop(2));
  CHECK_FALSE(enc.is_stop(1));
}

TEST_CASE("the chat encoder leaves text without special tokens as the tokenizer encodes it",
          "[chat]") {
  const Tokenizer& tok = mixtral_tokenizer();
  const ChatTemplate t = make_chat_template("llama2", tok.piece(1), tok.piece(2), "test");
  const ChatEncoder enc(tok, t);
  CHECK(enc.encode("plain text, no markers") == tok.encode("plain text, no markers", false));
  CHECK(enc.encode("<s><s>") == std::vector<std::uint32_t>{1, 1});
  // A format's marker the vocabulary lacks (ChatML's on Mixtral's) stays text.
  const ChatTemplate chatml = make_chat_template("chatml", tok.piece(1), tok.piece(2), "test");
  const ChatEncoder plain(tok, chatml);
  CHECK(plain.encode("<|im_start|>user") == tok.encode("<|im_start|>user", false));
}
