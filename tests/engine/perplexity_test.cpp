// moe-run --perplexity / --save-logits / --kl-reference (examples/moe-run/perplexity.hpp) on the
// tiny transformers fixture: perplexity from the engine equals exp(mean NLL) computed from the
// golden logits; a run compared with its own saved log-probs has KL 0; q4 experts have KL > 0.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "moekit/precision/thread_pool.hpp"
#include "moekit/presets.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/perplexity.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;
using Baseline = moekit::presets::Baseline<moekit::MemoryLoader>;
namespace fs = std::filesystem;

namespace {

const fs::path fixture = engine_test::data_dir() / "mixtral";

// Scores `tokens` with experts at `p`; `meter` receives every position.
PerplexityResult score(const engine_test::LoadedModel& m, Precision p,
                       std::span<const Token> tokens, const PerplexitySettings& s,
                       PerplexityMeter& meter) {
  moekit::ThreadPool pool(2);
  const auto shape = m.cfg.shape();
  Baseline pipeline(shape, pipeline_config(shape, {0, p}), host_loader(m.weights.experts),
                    moekit::UniformScorer({p}));
  Model<Baseline> model(m.cfg, m.weights.dense, pipeline, s.ctx, &pool);
  return score_text(model, tokens, *m.cfg.bos_token_id, s, meter, [](std::size_t, std::size_t) {});
}

// exp(mean NLL) of the golden logits: row t predicts sequence_ids[t + 1].
double golden_mean_nll(const engine_test::Reference& ref) {
  const std::size_t V = ref.vocab, n = ref.sequence_ids.size() - 1;
  double sum = 0;
  for (std::size_t t = 0; t < n; ++t) {
    const float* row = ref.logits.data() + t * V;
    double mx = row[0];
    for (std::size_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
    double s = 0;
    for (std::size_t v = 0; v < V; ++v) s += std::exp(double(row[v]) - mx);
    sum += mx + std::log(s) - row[ref.sequence_ids[t + 1]];
  }
  return sum / double(n);
}

}  // namespace

TEST_CASE("perplexity equals exp(mean NLL) of the golden logits", "[engine][perplexity]") {
  if (!fs::exists(fixture / "reference.json")) {
    WARN("fixture " << fixture << " is missing (run scripts/make_fixtures.py); skipped");
    return;
  }
  const auto ref = engine_test::load_reference(fixture);
  const auto m = engine_test::load_model(fixture, Precision::f32);
  REQUIRE(m);
  REQUIRE(m->cfg.bos_token_id == ref.sequence_ids[0]);
  // The golden sequence is BOS + 50 tokens; one chunk of 50 scores exactly the golden rows.
  const std::vector<Token> text(ref.sequence_ids.begin() + 1, ref.sequence_ids.end());
  const double expected = golden_mean_nll(ref);
  for (const bool decode : {false, true}) {
    DYNAMIC_SECTION((decode ? "decode" : "prefill")) {
      PerplexityMeter meter(m->cfg.vocab_size);
      const auto r = score(*m, Precision::f32, text, {50, 0, decode}, meter);
      CHECK(r.tokens == 50);
      CHECK(r.chunks == 1);
      CHECK(r.mean_nll() == Approx(expected).epsilon(1e-5));
      CHECK(r.perplexity() == Approx(std::exp(expected)).epsilon(1e-4));
      CHECK_FALSE(r.has_kl);
    }
  }
}

TEST_CASE("perplexity chunks: every token scored once, each chunk after a BOS",
          "[engine][perplexity]") {
  const auto c = perplexity_chunks(50, {20, 0, false});
  REQUIRE(c.size() == 3);
  CHECK(c[0] == std::pair<std::size_t, std::size_t>{0, 20});
  CHECK(c[2] == std::pair<std::size_t, std::size_t>{40, 50});
  CHECK(perplexity_chunks(50, {20, 2, false}).size() == 2);
  CHECK(perplexity_chunks(0, {20, 0, false}).empty());

  if (!fs::exists(fixture / "reference.json")) return;
  const auto ref = engine_test::load_reference(fixture);
  const auto m = engine_test::load_model(fixture, Precision::f32);
  REQUIRE(m);
  const std::vector<Token> text(ref.sequence_ids.begin() + 1, ref.sequence_ids.end());
  PerplexityMeter whole(m->cfg.vocab_size), split(m->cfg.vocab_size);
  const auto a = score(*m, Precision::f32, text, {50, 0, false}, whole);
  const auto b = score(*m, Precision::f32, text, {20, 0, false}, split);
  CHECK(b.tokens == 50);
  CHECK(b.chunks == 3);
  // The second and third chunks lose their context, so they are scored differently.
  CHECK(b.nll_sum != Approx(a.nll_sum).epsilon(1e-6));
  // Chunk 1 alone is the first 20 golden positions.
  PerplexityMeter first(m->cfg.vocab_size);
  const auto f =
      score(*m, Precision::f32, std::span<const Token>(text).first(20), {20, 0, false}, first);
  double golden20 = 0;
  {
    const std::size_t V = ref.vocab;
    for (std::size_t t = 0; t < 20; ++t) {
      const float* row = ref.logits.data() + t * V;
      double mx = row[0], s = 0;
      for (std::size_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
      for (std::size_t v = 0; v < V; ++v) s += std::exp(double(row[v]) - mx);
      golden20 += mx + std::log(s) - row[ref.sequence_ids[t + 1]];
    }
  }
  CHECK(f.nll_sum == Approx(golden20).epsilon(1e-5));
}

TEST_CASE("KL against the run's own saved log-probs is 0; q4 experts give KL > 0",
          "[engine][perplexity]") {
  if (!fs::exists(fixture / "reference.json")) return;
  const auto ref = engine_test::load_reference(fixture);
  const auto m32 = engine_test::load_model(fixture, Precision::f32);
  REQUIRE(m32);
  const auto m4 = engine_test::load_model(fixture, Precision::q4);
  REQUIRE(m4);
  const std::vector<Token> text(ref.sequence_ids.begin() + 1, ref.sequence_ids.end());
  const PerplexitySettings s{25, 0, false};
  const std::uint32_t V = m32->cfg.vocab_size;
  const fs::path tmp = engine_test::scratch("engine-perplexity", "case1");

  for (const std::uint32_t K : {8u, V}) {
    DYNAMIC_SECTION("K = " << K) {
      LogProbFile saved(V, K);
      PerplexityMeter rec(V, &saved);
      const auto base = score(*m32, Precision::f32, text, s, rec);
      REQUIRE(saved.positions() == 50);
      const fs::path file = tmp / ("ref" + std::to_string(K) + ".mklogp");
      saved.save(file, false);
      CHECK_THROWS_WITH(saved.save(file, false), Catch::Contains("refusing to overwrite"));
      const LogProbFile back = LogProbFile::load(file);
      CHECK(back.positions() == 50);
      CHECK(back.top_k() == K);
      CHECK(back.target(7) == text[7]);
      CHECK(back.target_logprob(7) == saved.target_logprob(7));

      PerplexityMeter self(V, nullptr, &back);
      const auto again = score(*m32, Precision::f32, text, s, self);
      CHECK(again.has_kl);
      CHECK(again.kl_sum == 0.0);
      CHECK(again.kl_max == 0.0);
      CHECK(again.top1_agreement() == 1.0);
      CHECK(again.nll_sum == base.nll_sum);
      // The saved target log-probs reproduce the reference perplexity.
      double nll = 0;
      for (std::size_t i = 0; i < back.positions(); ++i) nll -= back.target_logprob(i);
      CHECK(nll == Approx(base.nll_sum).epsilon(1e-6));

      PerplexityMeter q4(V, nullptr, &back);
      const auto low = score(*m4, Precision::q4, text, s, q4);
      CHECK(low.mean_kl() > 0.0);
      CHECK(low.kl_max >= low.mean_kl());
      CHECK(low.nll_sum != base.nll_sum);
    }
  }
}

TEST_CASE("top-K KL is the full KL of the coarsened distribution (a lower bound)",
          "[engine][perplexity]") {
  if (!fs::exists(fixture / "reference.json")) return;
  const auto ref = engine_test::load_reference(fixture);
  const auto m32 = engine_test::load_model(fixture, Precision::f32);
  REQUIRE(m32);
  const auto m2 = engine_test::load_model(fixture, Precision::q2);
  REQUIRE(m2);
  const std::vector<Token> text(ref.sequence_ids.begin() + 1, ref.sequence_ids.end());
  const PerplexitySettings s{50, 0, false};
  const std::uint32_t V = m32->cfg.vocab_size;
  LogProbFile full(V, V), top(V, 4);
  PerplexityMeter a(V, &full), b(V, &top);
  score(*m32, Precision::f32, text, s, a);
  score(*m32, Precision::f32, text, s, b);
  PerplexityMeter kl_full(V, nullptr, &full), kl_top(V, nullptr, &top);
  const auto rf = score(*m2, Precision::q2, text, s, kl_full);
  const auto rt = score(*m2, Precision::q2, text, s, kl_top);
  CHECK(rt.mean_kl() > 0.0);
  CHECK(rt.mean_kl() <= rf.mean_kl() + 1e-12);
  // The full KL from the saved full distributions and this run's: brute force.
  LogProbFile low(V, V);
  PerplexityMeter c(V, &low);
  score(*m2, Precision::q2, text, s, c);
  double kl = 0;
  for (std::size_t i = 0; i < full.positions(); ++i) {
    std::vector<double> lq(V);
    for (std::uint32_t j = 0; j < V; ++j) lq[low.ids(i)[j]] = low.logprobs(i)[j];
    for (std::uint32_t j = 0; j < V; ++j) {
      const double lp = full.logprobs(i)[j];
      kl += std::exp(lp) * (lp - lq[full.ids(i)[j]]);
    }
  }
  CHECK(rf.kl_sum == Approx(kl).epsilon(1e-6));
}

TEST_CASE(".mklogp files: bad input is refused naming the flag and field", "[engine][perplexity]") {
  const fs::path tmp = engine_test::scratch("engine-perplexity", "case2");
  const fs::path p = tmp / "x.mklogp";
  auto write = [&](const std::string& bytes) {
    std::ofstream(p, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  write("not a logp file at all, really not it");
  CHECK_THROWS_WITH(LogProbFile::load(p),
                    Catch::Contains("--kl-reference") && Catch::Contains("magic"));
  CHECK_THROWS_WITH(LogProbFile::load(tmp / "missing.mklogp"), Catch::Contains("cannot open"));

  LogProbFile f(10, 2);
  const std::uint32_t ids[2] = {3, 4};
  const float lps[2] = {-0.1f, -2.5f};
  f.add(3, -0.1f, ids, lps);
  f.save(p, true);
  CHECK(LogProbFile::load(p).positions() == 1);
  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  write(bytes.substr(0, bytes.size() - 1));
  CHECK_THROWS_WITH(LogProbFile::load(p), Catch::Contains("size does not match"));
  std::string desc = bytes;
  const float up[2] = {-2.5f, -0.1f};
  std::memcpy(desc.data() + desc.size() - 8, up, 8);
  write(desc);
  CHECK_THROWS_WITH(LogProbFile::load(p), Catch::Contains("not descending"));
  std::string big = bytes;
  const std::uint32_t bad_id = 10;
  std::memcpy(big.data() + 32 + 8, &bad_id, 4);
  write(big);
  CHECK_THROWS_WITH(LogProbFile::load(p), Catch::Contains("token id out of range"));

  // A reference for another text is refused at the first differing position.
  PerplexityMeter m(10, nullptr, &f);
  std::vector<float> logits(10, 0.f);
  CHECK_THROWS_WITH(m.add(logits, 5), Catch::Contains("scores token 3"));
  CHECK_THROWS_WITH(PerplexityMeter(11, nullptr, &f), Catch::Contains("vocabulary"));
  CHECK_THROWS_WITH(read_text_stripped(tmp / "none.txt"), Catch::Contains("--perplexity"));
  std::ofstream(tmp / "crlf.txt") << "a\r\nb\r\n";
  CHECK(read_text_stripped(tmp / "crlf.txt") == "a\nb\n");
}

TEST_CASE(".mklogp v2 records the context size; v1 files still load with none recorded",
          "[engine][perplexity]") {
  const fs::path tmp = engine_test::scratch("engine-perplexity", "mklogp-ctx");
  LogProbFile f(8, 2);
  f.set_context(64);
  const std::uint32_t ids[2] = {3, 1};
  const float lps[2] = {-0.5f, -1.5f};
  f.add(3, -0.5f, ids, lps);
  const fs::path v2 = tmp / "v2.mklogp";
  f.save(v2, true);
  CHECK(LogProbFile::load(v2).context() == 64);

  // The same bytes as version 1 (field 20 reserved, 0): read, context not recorded.
  std::vector<char> bytes;
  {
    std::ifstream in(v2, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::uint32_t one = 1, zero = 0;
  std::memcpy(bytes.data() + 8, &one, 4);
  std::memcpy(bytes.data() + 20, &zero, 4);
  const fs::path v1 = tmp / "v1.mklogp";
  std::ofstream(v1, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const LogProbFile back = LogProbFile::load(v1);
  CHECK(back.context() == 0);
  CHECK(back.positions() == 1);
  // A version 1 file with the reserved field set is refused.
  const std::uint32_t seven = 7;
  std::memcpy(bytes.data() + 20, &seven, 4);
  std::ofstream(v1, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  CHECK_THROWS_WITH(LogProbFile::load(v1), Catch::Contains("reserved field is not 0"));
  // Devices are refused, not read without end.
  CHECK_THROWS_WITH(LogProbFile::load("/dev/zero"), Catch::Contains("is not a regular file"));
}
