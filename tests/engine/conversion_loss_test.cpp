// engine/conversion_loss.hpp on a GGUF whose experts are K-quants
// (tests/engine/data/kquant_moe.gguf, from scripts/make_gguf_transcode_fixture.py: gate/up Q4_K,
// down Q6_K, K-quant dense part): converted into a store at moekit's own formats (a run at
// --precision q4, or a preset's low precision; at their own types they are read in place,
// kquant_in_place_test.cpp), and the loss of each stored precision is measured against the exact
// values, recorded beside the store and read back without measuring again; skipping says so.

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine_test_support.hpp"
#include "moekit/engine/conversion_loss.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/gguf_model.hpp"
#include "moekit/engine/tokenizer.hpp"
#include "moekit/io/gguf.hpp"

namespace conversion_loss_test {

namespace fs = std::filesystem;
using namespace moekit::engine;
using moekit::Precision;

const fs::path kquant_model =
    fs::path(MOEKIT_SOURCE_DIR) / "tests" / "engine" / "data" / "kquant_moe.gguf";
const fs::path heldout = fs::path(MOEKIT_SOURCE_DIR) / "bench" / "quality" / "heldout.txt";

ConversionLossRequest request(bool measure = true) {
  ConversionLossRequest r;
  r.measure = measure;
  r.text = heldout;
  r.settings.tokens = 96;
  r.settings.ctx = 48;
  r.settings.io.direct = true;
  r.quiet = true;
  return r;
}

}  // namespace conversion_loss_test

TEST_CASE(
    "conversion loss of K-quant experts: measured against the exact values, recorded, "
    "read back",
    "[engine][conversion_loss]") {
  using namespace conversion_loss_test;
  const moekit::io::GgufFile g(kquant_model.string());
  const ModelConfig cfg = gguf_config(g);
  // Read in place at their own types; the store below converts them into other precisions.
  REQUIRE(locate_checkpoint_experts(cfg, {}, &g) != nullptr);
  const fs::path dir = engine_test::scratch("engine-conversion-loss", "store");
  const CachedStore st = cached_gguf_store(kquant_model, {Precision::q4, Precision::q2}, dir, true);
  REQUIRE(st.built);
  const ModelWeights w = load_gguf_weights(cfg, g, {});
  const Tokenizer tok = Tokenizer::from_gguf(g);
  moekit::ThreadPool pool(2);

  const nlohmann::json first =
      store_conversion_loss(request(), cfg, w.dense, tok, g, st.store, &pool);
  INFO(first.dump(1));
  CHECK(first.at("measured") == true);
  CHECK(first.at("from_record") == false);
  CHECK(first.at("source_types") == "Q4_K+Q6_K");
  CHECK(first.at("tokens") == 96);
  const fs::path record = conversion_loss_path(st.store->path());
  REQUIRE(fs::exists(record));
  CHECK(first.at("record") == record.string());
  const auto& entries = first.at("precisions");
  REQUIRE(entries.size() == 2);  // most precise first, as the store holds them
  CHECK(entries[0].at("precision") == "q4");
  CHECK(entries[1].at("precision") == "q2");
  for (const auto& e : entries) {
    const double kl = e.at("kl_mean");
    CHECK(std::isfinite(kl));
    CHECK(kl > 0);  // converting rounds the weights again: the model changes
    CHECK(double(e.at("kl_max")) >= kl);
    CHECK(double(e.at("top1_agreement")) > 0.3);
    CHECK(double(e.at("top1_agreement")) <= 1.0);
    CHECK(std::isfinite(double(e.at("perplexity"))));
  }
  // Two bits lose more than four.
  CHECK(double(entries[1].at("kl_mean")) > double(entries[0].at("kl_mean")));
  CHECK(std::isfinite(double(first.at("reference_perplexity"))));

  // A second run reads the record: a value planted in it comes back, nothing is measured.
  nlohmann::json planted = first;
  planted.erase("measured");
  planted.erase("record");
  planted.erase("from_record");
  planted["precisions"][0]["kl_mean"] = 0.125;
  std::ofstream(record) << planted.dump();
  const nlohmann::json second =
      store_conversion_loss(request(), cfg, w.dense, tok, g, st.store, &pool);
  CHECK(second.at("measured") == true);
  CHECK(second.at("from_record") == true);
  CHECK(second.at("precisions")[0].at("kl_mean") == 0.125);
  CHECK(second.at("precisions")[1].at("kl_mean") == entries[1].at("kl_mean"));

  // A record of another checkpoint (fingerprint) is measured again and replaced.
  planted["checkpoint_fingerprint"] = "another.gguf:1:2;";
  std::ofstream(record) << planted.dump();
  const nlohmann::json third =
      store_conversion_loss(request(), cfg, w.dense, tok, g, st.store, &pool);
  CHECK(third.at("precisions")[0].at("kl_mean") == entries[0].at("kl_mean"));  // deterministic

  // Skipped: said, and nothing read or written.
  fs::remove(record);
  const nlohmann::json skipped =
      store_conversion_loss(request(false), cfg, w.dense, tok, g, st.store, &pool);
  CHECK(skipped.at("measured") == false);
  CHECK(skipped.at("reason") == "--no-conversion-loss");
  CHECK_FALSE(fs::exists(record));
  // A text that is not there: not measured, and the flag to pass is named.
  ConversionLossRequest missing = request();
  missing.text = dir / "no-such-text.txt";
  const nlohmann::json none = store_conversion_loss(missing, cfg, w.dense, tok, g, st.store, &pool);
  CHECK(none.at("measured") == false);
  CHECK_THAT(std::string(none.at("reason")), Catch::Contains("--conversion-loss-text"));
}

TEST_CASE(
    "conversion loss: the exact reference reads the K-quant experts as gguf-py's f32 "
    "values, and a store at f32 has no loss",
    "[engine][conversion_loss]") {
  using namespace conversion_loss_test;
  const moekit::io::GgufFile g(kquant_model.string());
  const ModelConfig cfg = gguf_config(g);
  const moekit::ModelShape s = cfg.shape();
  const std::uint32_t layers[] = {0};
  auto reference = std::make_shared<const moekit::io::CheckpointExperts>(
      moekit::io::CheckpointExperts::locate_as_f32(g, io_architecture(cfg.arch),
                                                   moekit::io::TensorFormat::gguf, s, layers));
  CHECK(expert_types(*reference) == "Q4_K+Q6_K");
  // An f32 store holds the same dequantized values: KL exactly 0, every top-1 the same.
  const fs::path dir = engine_test::scratch("engine-conversion-loss", "f32");
  const CachedStore st = cached_gguf_store(kquant_model, {Precision::f32}, dir, true);
  const ModelWeights w = load_gguf_weights(cfg, g, {});
  const Tokenizer tok = Tokenizer::from_gguf(g);
  const std::vector<Token> tokens = tok.encode(read_text_stripped(heldout).substr(0, 2000), false);
  moekit::ThreadPool pool(2);
  ConversionLossSettings settings;
  settings.tokens = 64;
  settings.ctx = 32;
  const ConversionLoss l = measure_conversion_loss(cfg, w.dense, tokens, heldout.string(),
                                                   reference, st.store, settings, &pool);
  REQUIRE(l.entries.size() == 1);
  CHECK(l.tokens == 64);
  CHECK(l.entries[0].kl_mean == 0.0);
  CHECK(l.entries[0].top1_agreement == 1.0);
  CHECK(l.entries[0].perplexity == l.reference_perplexity);
  // The record round-trips.
  const ConversionLoss back = ConversionLoss::from_json(l.to_json(), "test");
  CHECK(back.to_json() == l.to_json());
}
