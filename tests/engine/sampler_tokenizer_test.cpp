// moe-run's sampler (greedy, temperature, top-p, seeding) and SentencePiece tokenizer (reference
// encodings from the Python sentencepiece package in tests/data/tokenizer, streaming decode).

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine_test_support.hpp"
#include "moekit/engine/sampler.hpp"
#include "moekit/engine/tokenizer.hpp"

using namespace moekit::engine;

TEST_CASE("greedy sampling is argmax, first index on ties", "[engine][sampler]") {
  Sampler s({.temperature = 0, .top_p = 1, .seed = 1});
  const std::vector<float> l{0.5f, 2.f, -1.f, 2.f};
  CHECK(s.sample(l) == 1);
}

TEST_CASE("top-p keeps the smallest nucleus; seeds reproduce", "[engine][sampler]") {
  // Probabilities at temperature 1: token 2 dominates (≈0.84); top_p 0.5 keeps only it.
  const std::vector<float> l{0.f, 1.f, 3.f, 1.f};
  Sampler nucleus({.temperature = 1, .top_p = 0.5f, .seed = 7});
  for (int i = 0; i < 50; ++i) CHECK(nucleus.sample(l) == 2);

  Sampler a({.temperature = 1, .top_p = 1, .seed = 123}),
      b({.temperature = 1, .top_p = 1, .seed = 123});
  std::map<std::uint32_t, int> counts;
  for (int i = 0; i < 2000; ++i) {
    const auto x = a.sample(l);
    CHECK(x == b.sample(l));
    ++counts[x];
  }
  CHECK(counts.size() == 4);  // every token reachable without truncation
  CHECK(counts[2] > counts[0]);

  CHECK_THROWS_AS(Sampler({.temperature = -1, .top_p = 1, .seed = 0}), moekit::Error);
  CHECK_THROWS_AS(Sampler({.temperature = 1, .top_p = 0, .seed = 0}), moekit::Error);
}

namespace {
void check_encodings(const std::filesystem::path& model, const std::filesystem::path& ref_file) {
  const Tokenizer tok(model);
  std::ifstream in(ref_file);
  const auto ref = nlohmann::json::parse(in);
  CHECK(tok.vocab_size() == ref.at("vocab_size").get<std::uint32_t>());
  CHECK(tok.bos_id() == ref.at("bos_id").get<std::uint32_t>());
  CHECK(tok.eos_id() == ref.at("eos_id").get<std::uint32_t>());
  for (const auto& c : ref.at("cases")) {
    const auto text = c.at("text").get<std::string>();
    const auto ids = c.at("ids").get<std::vector<std::uint32_t>>();
    INFO("text: " << text);
    CHECK(tok.encode(text, false) == ids);
    auto with_bos = tok.encode(text, true);
    REQUIRE(!with_bos.empty());
    CHECK(with_bos.front() == *tok.bos_id());
    CHECK(tok.decode(ids) == c.at("decoded").get<std::string>());

    // Streaming: the pieces, pushed one by one after the BOS, concatenate to the whole decode.
    const std::vector<std::uint32_t> context{*tok.bos_id()};
    StreamDecoder stream(tok, context);
    std::string streamed;
    for (auto id : ids) streamed += stream.push(id);
    CHECK(streamed == c.at("decoded").get<std::string>());
  }
}
}  // namespace

TEST_CASE("SentencePiece encodings match the Python reference", "[engine][tokenizer]") {
  const auto dir = engine_test::data_dir() / "tokenizer";
  if (!std::filesystem::exists(dir / "tiny-spm-320.model")) {
    WARN("tests/data/tokenizer is missing (run scripts/make_fixtures.py); skipped");
    return;
  }
  check_encodings(dir / "tiny-spm-320.model", dir / "tiny-spm-320.encodings.json");

  // Mixtral's own tokenizer is not shipped in the repository; it is read from the shared data
  // folder when this checkout has one beside it.
  const std::filesystem::path mixtral = std::filesystem::path(MOEKIT_SOURCE_DIR) / ".." /
                                        "shared/data/tokenizers/mixtral-8x7b-v0.1.tokenizer.model";
  if (std::filesystem::exists(mixtral))
    check_encodings(mixtral, dir / "mixtral.encodings.json");
  else
    WARN("Mixtral tokenizer not found at " << mixtral << "; its encodings were not checked");
}

TEST_CASE("streaming decode keeps the first piece's leading space after a prompt",
          "[engine][tokenizer]") {
  const auto model = engine_test::data_dir() / "tokenizer" / "tiny-spm-320.model";
  if (!std::filesystem::exists(model)) {
    WARN("tiny-spm-320.model missing; skipped");
    return;
  }
  const Tokenizer tok(model);
  const auto prompt = tok.encode("The quick", true);
  const auto more = tok.encode(" brown fox", false);
  StreamDecoder stream(tok, prompt);
  std::string out;
  for (auto id : more) out += stream.push(id);
  std::vector<std::uint32_t> all = prompt;
  all.insert(all.end(), more.begin(), more.end());
  CHECK(tok.decode(prompt) + out == tok.decode(all));

  CHECK_THROWS_AS(Tokenizer("/nonexistent/tokenizer.model"), moekit::Error);
}
