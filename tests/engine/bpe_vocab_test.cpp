// Byte-level BPE (bpe_vocab.hpp) against Hugging Face `tokenizers`: two small tokenizers trained
// by scripts/make_bpe_fixture.py (Qwen2's Split regex + ByteLevel with an NFC normalizer, and
// GPT-2's ByteLevel regex), each read from its tokenizer.json and from the same vocabulary written
// as GGUF metadata; HF's ids and decoded text for every string of tests/engine/data/bpe/cases.json
// (some not in Unicode NFC: tokenizer.json's NFC normalizer applies, GGUF has none, so the GGUF
// vocabularies must give HF's ids from the tokenizer.json with "normalizer": null). Then invalid
// UTF-8 with NFC on (encoded unnormalized, never an exception), and the errors: malformed
// tokenizer.json / GGUF vocabularies name the file and the field.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/io/gguf.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/bpe_vocab.hpp"
#include "moekit/engine/tokenizer.hpp"

namespace bpe_vocab_test {

namespace fs = std::filesystem;
using moekit::engine::BpeVocab;
using moekit::engine::Tokenizer;

const fs::path bpe_data = fs::path(MOEKIT_SOURCE_DIR) / "tests/engine/data/bpe";

nlohmann::json bpe_cases(const std::string& name) {
  std::ifstream in(bpe_data / "cases.json");
  REQUIRE(in);
  const nlohmann::json j = nlohmann::json::parse(in);
  REQUIRE(j.contains(name));
  REQUIRE(j[name].size() >= 20);
  return j[name];
}

// HF's ids of a case; `normalized` false: those of the tokenizer.json without its normalizer
// (what a GGUF vocabulary, which has none, must give; the same ids when the normalizer changes
// nothing, and then the fixture omits them).
std::vector<std::uint32_t> bpe_ids(const nlohmann::json& c, bool normalized = true) {
  const char* key =
      !normalized && c.contains("ids_without_normalizer") ? "ids_without_normalizer" : "ids";
  return c[key].get<std::vector<std::uint32_t>>();
}
std::string bpe_decoded(const nlohmann::json& c, bool normalized = true) {
  const char* key = !normalized && c.contains("decoded_without_normalizer")
                        ? "decoded_without_normalizer"
                        : "decoded";
  return c[key].get<std::string>();
}

// Every case: HF's ids, HF's decoded text, and decode(encode(s)) == HF's decode(encode(s)) (== s
// unless NFC changed s).
void bpe_check_against_hf(const BpeVocab& v, const std::string& name, bool normalized = true) {
  for (const auto& c : bpe_cases(name)) {
    const std::string text = c["text"].get<std::string>();
    INFO(name << ": text '" << text << "'");
    const std::vector<std::uint32_t> want = bpe_ids(c, normalized);
    CHECK(v.encode(text) == want);
    CHECK(v.decode(want) == bpe_decoded(c, normalized));
    CHECK(v.decode(v.encode(text)) == bpe_decoded(c, normalized));
  }
}

std::string bpe_read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void bpe_write(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
  REQUIRE(out);
}

// A copy of `name`'s tokenizer.json with `edit` applied, in a scratch directory.
template <class Edit>
fs::path bpe_edited_json(const std::string& name, const std::string& case_name, Edit edit) {
  nlohmann::json j = nlohmann::json::parse(bpe_read(bpe_data / name / "tokenizer.json"));
  edit(j);
  // Own names ("json-", "gguf-" below): ctest runs the test cases at once, and a case of the
  // same name in the other would remove this one's directory under it.
  const fs::path dir = engine_test::scratch("bpe_vocab", "json-" + case_name);
  bpe_write(dir / "tokenizer.json", j.dump());
  return dir / "tokenizer.json";
}

// A copy of `name`.gguf with the bytes `from` replaced by `to` (same length) once.
fs::path bpe_patched_gguf(const std::string& name, const std::string& case_name,
                          const std::string& from, const std::string& to) {
  REQUIRE(from.size() == to.size());
  std::string bytes = bpe_read(bpe_data / (name + ".gguf"));
  const auto at = bytes.find(from);
  REQUIRE(at != std::string::npos);
  bytes.replace(at, from.size(), to);
  const fs::path p = engine_test::scratch("bpe_vocab", "gguf-" + case_name) / (name + ".gguf");
  bpe_write(p, bytes);
  return p;
}

// The message of the moekit::Error `f` throws (fails the test when it throws nothing).
template <class F>
std::string bpe_error_of(F f) {
  try {
    f();
  } catch (const moekit::Error& e) {
    return e.message();
  }
  FAIL("no moekit::Error thrown");
  return {};
}

}  // namespace bpe_vocab_test

using namespace bpe_vocab_test;

TEST_CASE("bpe: Qwen2-style tokenizer.json encodes and decodes as HF tokenizers", "[engine][bpe]") {
  const BpeVocab v = BpeVocab::from_tokenizer_json(bpe_data / "qwen2/tokenizer.json");
  CHECK(v.regex() == BpeVocab::qwen2_regex);
  bpe_check_against_hf(v, "qwen2");
}

TEST_CASE("bpe: GPT-2-style tokenizer.json encodes and decodes as HF tokenizers", "[engine][bpe]") {
  const BpeVocab v = BpeVocab::from_tokenizer_json(bpe_data / "gpt2/tokenizer.json");
  CHECK(v.regex() == BpeVocab::gpt2_regex);
  bpe_check_against_hf(v, "gpt2");
}

TEST_CASE("bpe: the same vocabularies from GGUF (tokenizer.ggml.model gpt2) encode as HF",
          "[engine][bpe]") {
  for (const std::string name : {"qwen2", "gpt2"}) {
    const moekit::io::GgufFile g((bpe_data / (name + ".gguf")).string());
    const BpeVocab v = BpeVocab::from_gguf(g);
    CHECK(v.regex() == (name == "qwen2" ? BpeVocab::qwen2_regex : BpeVocab::gpt2_regex));
    CHECK_FALSE(v.applies_nfc());  // GGUF carries no normalizer
    bpe_check_against_hf(v, name, false);
  }
}

TEST_CASE("bpe: Tokenizer picks byte-level BPE for tokenizer.json dirs and gpt2 GGUF files",
          "[engine][bpe]") {
  const auto qwen_cases = bpe_cases("qwen2");
  const Tokenizer hf = Tokenizer::from_hf_dir(bpe_data / "qwen2");
  const Tokenizer gg =
      Tokenizer::from_gguf(moekit::io::GgufFile((bpe_data / "qwen2.gguf").string()));
  const BpeVocab raw = BpeVocab::from_tokenizer_json(bpe_data / "qwen2/tokenizer.json");
  for (const Tokenizer* t : {&hf, &gg}) {
    CHECK(t->vocab_size() == raw.size());
    CHECK_FALSE(t->bos_id());  // Qwen2 has no BOS
    REQUIRE(t->eos_id());
    CHECK(t->piece(*t->eos_id()) ==
          "<|im_end|>");  // tokenizer_config.json / tokenizer.ggml.eos_token_id
    CHECK(t->decode(std::vector<std::uint32_t>{*t->eos_id()}) == "<|im_end|>");
    for (const auto& c : qwen_cases)
      CHECK(t->encode(c["text"].get<std::string>(), false) == bpe_ids(c, t == &hf));
  }
  // GPT-2's GGUF names a BOS (= EOS = <|endoftext|>): encode(add_bos) puts it first.
  const Tokenizer g2 =
      Tokenizer::from_gguf(moekit::io::GgufFile((bpe_data / "gpt2.gguf").string()));
  REQUIRE(g2.bos_id());
  CHECK(g2.piece(*g2.bos_id()) == "<|endoftext|>");
  const auto ids = g2.encode("Hello", true);
  REQUIRE(ids.size() >= 2);
  CHECK(ids.front() == *g2.bos_id());
  CHECK(g2.decode(ids) == "<|endoftext|>Hello");
}

TEST_CASE("bpe: streaming detokenisation of multi-byte characters split over tokens",
          "[engine][bpe]") {
  const Tokenizer tok = Tokenizer::from_hf_dir(bpe_data / "qwen2");
  for (const std::string& text : {std::string("你好，世界。🙂👍🏽 café"),
                                  std::string("안녕하세요 Привет мир 🇫🇷!")}) {
    const auto ids = tok.encode(text, false);
    REQUIRE(ids.size() > 4);
    // The first character's bytes are split over tokens: a context token before it ("x").
    const auto context = tok.encode("x", false);
    moekit::engine::StreamDecoder stream(tok, context);
    std::string out;
    for (const std::uint32_t id : ids) {
      const std::string piece = stream.push(id);
      CHECK(piece.find("\xEF\xBF\xBD") == std::string::npos);
      out += piece;
    }
    CHECK(out == text);
  }
}

TEST_CASE("bpe: input that is not valid UTF-8 encodes byte by byte and decodes lossily",
          "[engine][bpe]") {
  const BpeVocab v = BpeVocab::from_tokenizer_json(bpe_data / "qwen2/tokenizer.json");
  const std::string text = "ab\xFF\xFE cd \xE4\xBD tail\xC3";
  std::vector<std::uint32_t> ids;
  REQUIRE_NOTHROW(ids = v.encode(text));
  CHECK(!ids.empty());
  // Each maximal invalid sequence becomes one U+FFFD (HF: Rust's from_utf8_lossy).
  CHECK(v.decode(ids) == "ab\xEF\xBF\xBD\xEF\xBF\xBD cd \xEF\xBF\xBD tail\xEF\xBF\xBD");
  // The valid text around the invalid bytes encodes as it does alone.
  const auto ab = v.encode("ab");
  CHECK(std::vector<std::uint32_t>(ids.begin(),
                                   ids.begin() + static_cast<std::ptrdiff_t>(ab.size())) == ab);
}

TEST_CASE(
    "bpe: tokenizer.json's NFC normalizer applies between the raw-matched added tokens, as HF",
    "[engine][bpe]") {
  const BpeVocab nfc = BpeVocab::from_tokenizer_json(bpe_data / "qwen2/tokenizer.json");
  CHECK(nfc.applies_nfc());
  CHECK_FALSE(BpeVocab::from_tokenizer_json(bpe_data / "gpt2/tokenizer.json").applies_nfc());
  // The fixture has strings that NFC changes, and HF's ids for them differ with and without it.
  std::size_t changed = 0;
  for (const auto& c : bpe_cases("qwen2")) changed += c.contains("ids_without_normalizer") ? 1 : 0;
  CHECK(changed >= 8);
  // Decomposed and precomposed spellings encode alike; a normalized added token (<e U+0301>,
  // "normalized": true) matches either spelling, the special ones only their raw text.
  CHECK(nfc.encode("cafe\xCC\x81") == nfc.encode("caf\xC3\xA9"));
  CHECK(nfc.encode("\xE1\x84\x80\xE1\x85\xA1") == nfc.encode("\xEA\xB0\x80"));  // jamo -> U+AC00
  CHECK(nfc.encode("<e\xCC\x81>") == nfc.encode("<\xC3\xA9>"));
  CHECK(nfc.encode("<e\xCC\x81>").size() == 1);
  // A Sequence of NFC only is NFC; an empty Sequence and null are no normalizer.
  using nlohmann::json;
  const fs::path seq = bpe_edited_json("qwen2", "nfc_sequence", [](json& j) {
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
  });
  const fs::path empty = bpe_edited_json("qwen2", "nfc_empty_sequence", [](json& j) {
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
  });
  const fs::path none =
      bpe_edited_json("qwen2", "nfc_none", [](json& j) { j["normalizer"] = nullptr; });
  const BpeVocab s = BpeVocab::from_tokenizer_json(seq), e = BpeVocab::from_tokenizer_json(empty),
                 n = BpeVocab::from_tokenizer_json(none);
  CHECK(s.applies_nfc());
  CHECK_FALSE(e.applies_nfc());
  CHECK_FALSE(n.applies_nfc());
  for (const auto& c : bpe_cases("qwen2")) {
    const std::string text = c["text"].get<std::string>();
    INFO("text '" << text << "'");
    CHECK(s.encode(text) == bpe_ids(c));
    CHECK(e.encode(text) == bpe_ids(c, false));
    CHECK(n.encode(text) == bpe_ids(c, false));
  }
  const fs::path other = bpe_edited_json("qwen2", "nfc_sequence_other", [](json& j) {
    j["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Lowercase"}}})}};
  });
  CHECK_THAT(bpe_error_of([&] { (void)BpeVocab::from_tokenizer_json(other); }),
             Catch::Contains("'normalizer'"));
}

TEST_CASE(
    "bpe: with NFC on, a stretch that is not valid UTF-8 is encoded unnormalized, never an error",
    "[engine][bpe]") {
  using nlohmann::json;
  const BpeVocab nfc = BpeVocab::from_tokenizer_json(bpe_data / "qwen2/tokenizer.json");
  const BpeVocab raw = BpeVocab::from_tokenizer_json(
      bpe_edited_json("qwen2", "nfc_off", [](json& j) { j["normalizer"] = nullptr; }));
  REQUIRE(nfc.applies_nfc());
  const std::string e_acute = "e\xCC\x81";  // not NFC
  // Invalid per Rust's str (HF cannot be given them): stray continuation, truncated sequence,
  // overlong, surrogate, above U+10FFFF, 0xFF.
  for (const std::string& bad :
       {std::string("\x81"), std::string("\xE2\x82"), std::string("\xC0\xAF"),
        std::string("\xED\xA0\x80"), std::string("\xF4\x90\x80\x80"), std::string("\xFF")}) {
    for (const std::string& text :
         {e_acute + bad, bad + e_acute + "x", "a" + e_acute + bad + e_acute}) {
      INFO("text bytes '" << text << "'");
      std::vector<std::uint32_t> ids;
      REQUIRE_NOTHROW(ids = nfc.encode(text));
      CHECK(ids == raw.encode(text));  // the whole stretch unnormalized
      std::string back;
      REQUIRE_NOTHROW(back = nfc.decode(ids));
      CHECK(back.find("\xEF\xBF\xBD") != std::string::npos);
    }
  }
  // Stretches are normalized one by one: the raw-matched special token splits an invalid stretch
  // (encoded raw) from a valid one (NFC).
  const std::uint32_t im_end = *nfc.special().eos;
  const std::string left = e_acute + "\xFF", right = e_acute;
  std::vector<std::uint32_t> want = raw.encode(left);
  want.push_back(im_end);
  for (const std::uint32_t id : nfc.encode("\xC3\xA9")) want.push_back(id);
  CHECK(nfc.encode(left + "<|im_end|>" + right) == want);
  CHECK(nfc.encode(right) == nfc.encode("\xC3\xA9"));
  // NUL is valid UTF-8: normalized around it, not cut at it.
  const std::string with_nul = e_acute + std::string(1, '\0') + e_acute;
  CHECK(nfc.encode(with_nul) == nfc.encode(std::string("\xC3\xA9\0\xC3\xA9", 5)));
  CHECK(nfc.decode(nfc.encode(with_nul)) == std::string("\xC3\xA9\0\xC3\xA9", 5));
}

TEST_CASE("bpe: ids outside the vocabulary are errors naming the id", "[engine][bpe]") {
  const BpeVocab v = BpeVocab::from_tokenizer_json(bpe_data / "gpt2/tokenizer.json");
  const std::string msg = bpe_error_of([&] {
    (void)v.decode(std::vector<std::uint32_t>{1, v.size()});
  });
  CHECK_THAT(msg, Catch::Contains("token id " + std::to_string(v.size())));
  CHECK_THAT(msg, Catch::Contains("gpt2/tokenizer.json"));
  CHECK_THROWS_AS(v.piece(v.size() + 5), moekit::Error);
}

TEST_CASE("bpe: malformed tokenizer.json files are errors naming the file and the field",
          "[engine][bpe]") {
  using nlohmann::json;
  struct Case {
    const char* name;
    void (*edit)(json&);
    const char* field;
  };
  const Case cases[] = {
      {"no_merges", [](json& j) { j["model"].erase("merges"); }, "'model.merges' is missing"},
      {"no_vocab", [](json& j) { j["model"].erase("vocab"); }, "'model.vocab' is missing"},
      {"no_model", [](json& j) { j.erase("model"); }, "'model' is missing"},
      {"unknown_merge_token",
       [](json& j) {
         j["model"]["merges"].insert(j["model"]["merges"].begin(), json::array({"zzqq", "e"}));
       },
       "model.merges entry 0 'zzqq e' names 'zzqq', which is not a token"},
      {"merge_not_pair", [](json& j) { j["model"]["merges"].push_back(42); },
       "'model.merges' entry"},
      {"merge_result_unknown",
       [](json& j) {
         j["model"]["merges"].push_back(json::array({"\xC4\x80", "\xC4\x80"}));  // "ĀĀ" is no token
       },
       "merges into"},
      {"model_type", [](json& j) { j["model"]["type"] = "WordPiece"; }, "'model.type'"},
      {"vocab_id_type", [](json& j) { j["model"]["vocab"]["e"] = "five"; }, "'model.vocab'"},
      {"added_out_of_range",
       [](json& j) {
         j["added_tokens"].push_back({{"id", -3}, {"content", "<x>"}, {"special", true}});
       },
       "'added_tokens[5]'"},  // after the fixture's five
      {"added_lstrip", [](json& j) { j["added_tokens"][0]["lstrip"] = true; },
       "'added_tokens[0].lstrip'"},
      {"normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "'normalizer'"},
      {"pre_tokenizer_missing", [](json& j) { j.erase("pre_tokenizer"); },
       "'pre_tokenizer' is missing"},
      {"pre_tokenizer_other",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "'pre_tokenizer'"},
      {"split_regex_broken",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
       "pre-tokenizer regex '(unclosed' does not compile"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "'model.dropout'"},
      {"decoder",
       [](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "'decoder'"},
      {"wrong_json_type", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = 3; },
       "tokenizer.json"},
  };
  for (const Case& c : cases) {
    INFO("case " << c.name);
    const fs::path p = bpe_edited_json("qwen2", c.name, c.edit);
    const std::string msg = bpe_error_of([&] { (void)BpeVocab::from_tokenizer_json(p); });
    CHECK_THAT(msg, Catch::Contains(p.string()));
    CHECK_THAT(msg, Catch::Contains(c.field));
  }
  // Not JSON at all, and no file.
  const fs::path dir = engine_test::scratch("bpe_vocab", "not_json");
  bpe_write(dir / "tokenizer.json", "{\"model\": ");
  CHECK_THAT(bpe_error_of([&] { (void)BpeVocab::from_tokenizer_json(dir / "tokenizer.json"); }),
             Catch::Contains("not valid JSON"));
  CHECK_THAT(bpe_error_of([&] { (void)BpeVocab::from_tokenizer_json(dir / "missing.json"); }),
             Catch::Contains("cannot be opened"));
  // tokenizer_config.json naming a token the vocabulary lacks.
  const fs::path cfg_dir = engine_test::scratch("bpe_vocab", "bad_config");
  fs::copy_file(bpe_data / "qwen2/tokenizer.json", cfg_dir / "tokenizer.json");
  bpe_write(cfg_dir / "tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  CHECK_THAT(bpe_error_of([&] { (void)Tokenizer::from_hf_dir(cfg_dir); }),
             Catch::Contains("'eos_token' is '<|nope|>', which is not a token"));
}

TEST_CASE("bpe: a tokenizer.json's text loads as its file does, bos/eos given by the caller",
          "[engine][bpe]") {
  std::ifstream in(bpe_data / "qwen2/tokenizer.json", std::ios::binary);
  REQUIRE(in);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const BpeVocab file = BpeVocab::from_tokenizer_json(bpe_data / "qwen2/tokenizer.json");
  BpeVocab::Special special;
  special.eos = file.special().eos;
  const BpeVocab v = BpeVocab::from_tokenizer_json_text(text, "qwen2 text", special);
  CHECK(v.size() == file.size());
  CHECK(v.regex() == file.regex());
  CHECK(v.special().eos == file.special().eos);
  CHECK_FALSE(BpeVocab::from_tokenizer_json_text(text).special().eos);
  bpe_check_against_hf(v, "qwen2");
  special.bos = v.size();
  CHECK_THAT(bpe_error_of([&] { (void)BpeVocab::from_tokenizer_json_text(text, "t", special); }),
             Catch::Contains("which is not a token"));
  CHECK_THAT(bpe_error_of([&] { (void)BpeVocab::from_tokenizer_json_text("{\"model\": ", "t"); }),
             Catch::Contains("t: not valid JSON"));
}

TEST_CASE("bpe: malformed GGUF vocabularies are errors naming the file and the key",
          "[engine][bpe]") {
  struct Case {
    const char* name;
    const char* from;
    const char* to;
    const char* field;
  };
  // Same-length byte patches of the fixture's metadata.
  const Case cases[] = {
      {"unknown_pre", "qwen2", "qwen9", "metadata 'tokenizer.ggml.pre' is 'qwen9'"},
      {"no_merges", "tokenizer.ggml.merges", "tokenizer.ggml.mergez",
       "metadata 'tokenizer.ggml.merges' is missing"},
      {"no_tokens", "tokenizer.ggml.tokens", "tokenizer.ggml.tokenz",
       "metadata 'tokenizer.ggml.tokens' is missing"},
  };
  for (const Case& c : cases) {
    INFO("case " << c.name);
    // "qwen2" first occurs as the value of tokenizer.ggml.pre only after the key; patch the value.
    std::string from = c.from, to = c.to;
    if (std::string(c.name) == "unknown_pre") {
      from = std::string("tokenizer.ggml.pre") + std::string("\x08\0\0\0\x05\0\0\0\0\0\0\0", 12) +
             "qwen2";
      to = std::string("tokenizer.ggml.pre") + std::string("\x08\0\0\0\x05\0\0\0\0\0\0\0", 12) +
           "qwen9";
    }
    const fs::path p = bpe_patched_gguf("qwen2", c.name, from, to);
    const moekit::io::GgufFile g(p.string());
    const std::string msg = bpe_error_of([&] { (void)BpeVocab::from_gguf(g); });
    CHECK_THAT(msg, Catch::Contains(p.string()));
    CHECK_THAT(msg, Catch::Contains(c.field));
    CHECK_THROWS_AS(Tokenizer::from_gguf(g), moekit::Error);
  }
  // A merge naming an unknown token: the token list's first entry renamed (same length).
  {
    const std::string msg = bpe_error_of([] {
      BpeVocab::Spec s;
      s.tokens = {"a", "b", "ab"};
      s.merges = {"a b", "a c"};
      s.merges_field = "metadata 'tokenizer.ggml.merges'";
      s.source = "GGUF 'x.gguf'";
      (void)BpeVocab(std::move(s));
    });
    CHECK_THAT(msg, Catch::Contains(
                        "GGUF 'x.gguf': metadata 'tokenizer.ggml.merges' entry 1 'a c' names 'c'"));
  }
}
