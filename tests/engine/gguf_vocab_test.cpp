// The vocabulary embedded in GGUF (gguf_vocab.hpp) against the SentencePiece library on the same
// vocabulary: the GGUF fixture's (tiny-spm-320.model's pieces, written by the PyPI gguf package)
// and Mixtral's tokenizer.model (32000 pieces, as llama.cpp's convert script would embed it),
// for the reference strings of tests/data/tokenizer and for random strings.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <sentencepiece_processor.h>
#include <nlohmann/json.hpp>

#include "moekit/io/gguf.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/gguf_vocab.hpp"
#include "moekit/engine/tokenizer.hpp"

using namespace moekit::engine;
namespace fs = std::filesystem;

namespace {

const fs::path mixtral_tokenizer =
    fs::path(MOEKIT_SOURCE_DIR) / "models/moekit-tiny-moe/tokenizer.model";

std::unique_ptr<sentencepiece::SentencePieceProcessor> load_sp(const fs::path& p) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  REQUIRE(sp->Load(p.string()).ok());
  return sp;
}

// The vocabulary as GGUF stores it (tokens, scores, token_type), read through the library.
GgufVocab vocab_of(const sentencepiece::SentencePieceProcessor& sp) {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<GgufVocab::Type> types;
  for (int i = 0; i < sp.GetPieceSize(); ++i) {
    pieces.push_back(sp.IdToPiece(i));
    scores.push_back(sp.GetScore(i));
    types.push_back(sp.IsUnknown(i)   ? GgufVocab::Type::unknown
                    : sp.IsControl(i) ? GgufVocab::Type::control
                    : sp.IsByte(i)    ? GgufVocab::Type::byte
                    : sp.IsUnused(i)  ? GgufVocab::Type::unused
                                      : GgufVocab::Type::normal);
  }
  GgufVocab::Special s;
  s.bos = static_cast<std::uint32_t>(sp.bos_id());
  s.eos = static_cast<std::uint32_t>(sp.eos_id());
  s.unk = static_cast<std::uint32_t>(sp.unk_id());
  return GgufVocab(std::move(pieces), std::move(scores), std::move(types), s, "test");
}

std::vector<std::uint32_t> sp_encode(const sentencepiece::SentencePieceProcessor& sp,
                                     const std::string& text) {
  std::vector<int> ids;
  REQUIRE(sp.Encode(text, &ids).ok());
  return {ids.begin(), ids.end()};
}

std::string sp_decode(const sentencepiece::SentencePieceProcessor& sp,
                      const std::vector<std::uint32_t>& ids) {
  std::string out;
  REQUIRE(sp.Decode(std::vector<int>(ids.begin(), ids.end()), &out).ok());
  return out;
}

// Random strings from a pool of fragments: words, spaces, digits, punctuation, control
// characters, accented and non-Latin letters, emoji.
std::vector<std::string> random_strings(std::uint32_t seed, int n) {
  static const std::vector<std::string> pool = {
      "the",  " ",    "  ",     "quick",  "Brown",        "fox",      "jumps",      "over",
      "lazy", "dog",  "=",      " = ",    "@-@",          "1",        "23",         "4567",
      ".",    ",",    "!",      "?",      "\n",           "\t",       "\r\n",       "é",
      "ï",    "ß",    "Ελλάδα", "日本語", "中文",         "한국어",   "🙂",       "👍🏽",
      "Мир",  "عربى", "ab",     "ing",    "tion",         "'s",       "\"",         "(",
      ")",    "<s>",  "</s>",   "▁",      "\xE2\x80\x94", "Valkyria", "Chronicles", "1999",
      " III"};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, pool.size() - 1), len(1, 12);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string s;
    for (std::size_t k = len(rng); k > 0; --k) s += pool[pick(rng)];
    out.push_back(s);
  }
  return out;
}

void compare_with_library(const GgufVocab& v, const sentencepiece::SentencePieceProcessor& sp,
                          const fs::path& reference_json) {
  std::vector<std::string> texts;
  std::ifstream in(reference_json);
  const auto ref = nlohmann::json::parse(in);
  for (const auto& c : ref.at("cases")) {
    const auto text = c.at("text").get<std::string>();
    INFO("reference text: '" << text << "'");
    CHECK(v.encode(text) == c.at("ids").get<std::vector<std::uint32_t>>());
    CHECK(v.decode(c.at("ids").get<std::vector<std::uint32_t>>()) ==
          c.at("decoded").get<std::string>());
    texts.push_back(text);
  }
  const std::uint32_t seed = 20261122;
  INFO("random strings, seed " << seed);
  for (const auto& t : random_strings(seed, 300)) texts.push_back(t);
  int checked = 0;
  for (const auto& t : texts) {
    INFO("text: '" << t << "'");
    const auto ids = sp_encode(sp, t);
    REQUIRE(v.encode(t) == ids);
    CHECK(v.decode(ids) == sp_decode(sp, ids));
    ++checked;
  }
  CHECK(checked > 300);
  // Decoding arbitrary id sequences (cut byte runs, control pieces, unknown) as the library does.
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::uint32_t> id(0, v.size() - 1);
  for (int i = 0; i < 200; ++i) {
    std::vector<std::uint32_t> ids(1 + i % 9);
    for (auto& x : ids) x = i % 3 == 0 ? id(rng) % 300 : id(rng);  // many byte/control pieces
    INFO("ids of case " << i);
    CHECK(v.decode(ids) == sp_decode(sp, ids));
  }
}

}  // namespace

TEST_CASE("GGUF vocabulary: the fixture's embedded vocabulary encodes as SentencePiece",
          "[engine][tokenizer][gguf]") {
  const moekit::io::GgufFile g((engine_test::data_dir() / "mixtral/model-f32.gguf").string());
  const GgufVocab v = GgufVocab::from_gguf(g);
  const auto sp = load_sp(engine_test::data_dir() / "tokenizer/tiny-spm-320.model");
  CHECK(v.size() == static_cast<std::uint32_t>(sp->GetPieceSize()));
  CHECK(v.special().bos == 1u);
  CHECK(v.special().eos == 2u);
  CHECK(v.special().unk == 0u);
  CHECK(v.type(3) == GgufVocab::Type::byte);
  compare_with_library(v, *sp, engine_test::data_dir() / "tokenizer/tiny-spm-320.encodings.json");

  // Through moe-run's Tokenizer: BOS from the metadata, streaming decode.
  const Tokenizer tok(GgufVocab::from_gguf(g));
  const Tokenizer lib(engine_test::data_dir() / "tokenizer/tiny-spm-320.model");
  const auto ref = engine_test::load_reference(engine_test::data_dir() / "mixtral");
  CHECK(tok.encode("The quick brown fox", true) == ref.prompt_ids);
  // The random model's 32 tokens include cut multi-byte characters: the stream holds those back
  // the same way for both backends.
  std::string streamed, streamed_lib;
  StreamDecoder stream(tok, ref.prompt_ids), stream_lib(lib, ref.prompt_ids);
  for (auto id : ref.generated_ids) {
    streamed += stream.push(id);
    streamed_lib += stream_lib.push(id);
  }
  CHECK(streamed == streamed_lib);
  CHECK(streamed.size() > 10);
  CHECK(tok.decode(ref.prompt_ids) == "The quick brown fox");
  CHECK_THROWS_WITH(tok.decode(std::vector<std::uint32_t>{320}),
                    Catch::Contains("outside the vocabulary"));
}

TEST_CASE("GGUF vocabulary: Mixtral's 32000 pieces encode as SentencePiece",
          "[engine][tokenizer][gguf]") {
  REQUIRE(fs::exists(mixtral_tokenizer));
  const auto sp = load_sp(mixtral_tokenizer);
  const GgufVocab v = vocab_of(*sp);
  CHECK(v.size() == 32000);
  compare_with_library(v, *sp, engine_test::data_dir() / "tokenizer/mixtral.encodings.json");
}

TEST_CASE("GGUF vocabulary: malformed vocabularies are refused", "[engine][tokenizer][gguf]") {
  CHECK_THROWS_WITH(GgufVocab({"a", "b"}, {0.f}, {}, {}, "x.gguf"),
                    Catch::Contains("x.gguf") && Catch::Contains("2 pieces but 1 scores"));
  CHECK_THROWS_WITH(GgufVocab({"<0xZZ>"}, {}, {GgufVocab::Type::byte}, {}, "x.gguf"),
                    Catch::Contains("byte piece 0"));
  GgufVocab::Special s;
  s.bos = 5;
  CHECK_THROWS_WITH(GgufVocab({"a"}, {}, {}, s, "x.gguf"), Catch::Contains("special id 5"));
  const GgufVocab no_fallback({"a", "b", "ab"}, {0.f, 0.f, 1.f}, {}, {}, "x.gguf");
  CHECK_THROWS_WITH(no_fallback.encode("ab"), Catch::Contains("no byte pieces"));  // '▁' unknown
  GgufVocab::Special no_prefix;
  no_prefix.add_space_prefix = false;
  const GgufVocab plain({"a", "b", "ab"}, {0.f, 0.f, 1.f}, {}, no_prefix, "x.gguf");
  CHECK(plain.encode("ab") == std::vector<std::uint32_t>{2});
  CHECK(plain.encode("aab") == std::vector<std::uint32_t>{0, 2});
}
