// moe-run's sampler (sampler.hpp) since issue 28: the tokens of the original implementation (kept
// here, verbatim, as the reference) for every seed, on synthetic logits and on the default model's;
// sampled frequencies against the exact distribution, with a chi-square bound that is shown to
// reject a wrong one; top-k and top-p edge cases; the vector passes against each other and the
// fast exp against its error bound; the --top-k flag.

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/precision/isa.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "moekit/presets.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/cli.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/sampler.hpp"
#include "moekit/engine/weights.hpp"
#include "support/old_sampler.hpp"

using namespace moekit::engine;

namespace sampler_test {

constexpr float inf = std::numeric_limits<float>::infinity();

using moekit::test::OldSampler;  // support/old_sampler.hpp

/// Top-k as specified: the old sampler's arithmetic on the k highest logits, in a stable sort's
/// order (ties: lower token id first).
class TopKReference {
 public:
  explicit TopKReference(SamplerConfig c) : cfg_(c), rng_(c.seed) {}

  std::uint32_t sample(std::span<const float> logits) {
    std::vector<std::uint32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return logits[a] > logits[b]; });
    order.resize(std::min<std::size_t>(cfg_.top_k, order.size()));
    std::vector<double> probs(order.size());
    double sum = 0, mass = 0;
    for (std::size_t i = 0; i < order.size(); ++i)
      sum += probs[i] = std::exp((logits[order[i]] - logits[order[0]]) / cfg_.temperature);
    std::size_t keep = order.size();
    for (std::size_t i = 0; i < order.size(); ++i)
      if ((mass += probs[i] / sum) >= cfg_.top_p) {
        keep = i + 1;
        break;
      }
    std::discrete_distribution<std::size_t> pick(probs.begin(), probs.begin() + keep);
    return order[pick(rng_)];
  }

 private:
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
};

std::vector<moekit::Isa> runnable_isas() {
  std::vector<moekit::Isa> v;
  for (auto i : {moekit::Isa::generic, moekit::Isa::avx2, moekit::Isa::avx512})
    if (moekit::isa_supported(i)) v.push_back(i);
  return v;
}

/// Logits shaped like a language model's: a normal bulk of spread `sd`, and `spikes` tokens up to
/// `height` above it.
std::vector<float> lm_logits(std::size_t n, std::uint64_t seed, float sd = 2.5f, int spikes = 8,
                             float height = 10.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> bulk(0.f, sd);
  std::uniform_real_distribution<float> up(0.f, height);
  std::vector<float> l(n);
  for (float& x : l) x = bulk(g);
  for (int s = 0; s < spikes && n > 0; ++s) l[g() % n] += up(g);
  return l;
}

using Rows = std::vector<std::vector<float>>;

/// Draws `draws` tokens with both samplers (same settings and seed), cycling through `rows`, and
/// requires the same token at every step. Returns the new sampler's path counts.
Sampler::PathCounts same_tokens(const Rows& rows, SamplerConfig c, moekit::Isa isa,
                                std::size_t draws, moekit::ThreadPool* pool = nullptr) {
  Sampler s(c, isa);
  s.set_thread_pool(pool);
  OldSampler old(c);
  for (std::size_t i = 0; i < draws; ++i) {
    const auto& row = rows[i % rows.size()];
    const std::uint32_t want = old.sample(row), got = s.sample(row);
    if (got != want) {
      INFO("isa " << moekit::name(isa) << ", T " << c.temperature << ", top-p " << c.top_p
                  << ", seed " << c.seed << ", vocabulary " << row.size() << ", draw " << i);
      REQUIRE(got == want);
    }
  }
  return s.paths();
}

/// The distribution the sampler draws from, computed afresh in long double: softmax at T over the
/// top_k highest logits (ties: lower id first; 0 = all), cut where the running probability first
/// reaches top_p, renormalised.
std::vector<double> exact_probs(std::span<const float> l, float t, float top_p,
                                std::uint32_t top_k = 0) {
  std::vector<std::uint32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return l[a] > l[b]; });
  if (top_k != 0 && top_k < order.size()) order.resize(top_k);
  std::vector<long double> w(order.size());
  long double total = 0, mass = 0;
  for (std::size_t i = 0; i < order.size(); ++i)
    total += w[i] = std::exp((static_cast<long double>(l[order[i]]) - l[order[0]]) / t);
  std::size_t keep = order.size();
  for (std::size_t i = 0; i < order.size(); ++i)
    if ((mass += w[i] / total) >= top_p) {
      keep = i + 1;
      break;
    }
  long double kept = 0;
  for (std::size_t i = 0; i < keep; ++i) kept += w[i];
  std::vector<double> p(l.size(), 0.0);
  for (std::size_t i = 0; i < keep; ++i) p[order[i]] = static_cast<double>(w[i] / kept);
  return p;
}

/// Pearson's statistic of `counts` (`draws` in all) against `probs`; tokens expected fewer than
/// 5 times are pooled; a draw of a token of probability 0 makes it infinite.
struct ChiSquare {
  double stat = 0;
  int df = -1;
  /// Within six standard deviations (sqrt(2 df)) of the mean df: only a wrong distribution
  /// (or odds far below one in a million) lands above.
  [[nodiscard]] bool plausible() const { return stat <= df + 6 * std::sqrt(2.0 * df); }
};
ChiSquare chi_square(const std::vector<std::uint64_t>& counts, const std::vector<double>& probs,
                     std::uint64_t draws) {
  ChiSquare c;
  double pooled_obs = 0, pooled_exp = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    const double e = probs[i] * static_cast<double>(draws), o = static_cast<double>(counts[i]);
    if (probs[i] == 0 && counts[i] != 0) return {std::numeric_limits<double>::infinity(), 1};
    if (e < 5) {
      pooled_obs += o;
      pooled_exp += e;
      continue;
    }
    c.stat += (o - e) * (o - e) / e;
    ++c.df;
  }
  if (pooled_exp > 0) {
    c.stat += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
    ++c.df;
  }
  return c;
}

std::vector<std::uint64_t> counts_of(Sampler& s, std::span<const float> l, std::uint64_t draws) {
  std::vector<std::uint64_t> counts(l.size(), 0);
  for (std::uint64_t i = 0; i < draws; ++i) ++counts[s.sample(l)];
  return counts;
}

/// The default model's logits at every position of its reference sequence (teacher-forced, f32
/// experts); empty when the model is not in the checkout.
Rows default_model_logits() {
  const std::filesystem::path dir =
      std::filesystem::path(MOEKIT_SOURCE_DIR) / "models/moekit-tiny-moe";
  if (!std::filesystem::exists(dir / "reference.json")) return {};
  std::ifstream in(dir / "reference.json");
  const auto ref = nlohmann::json::parse(in);
  const auto seq = ref.at("sequence_ids").get<std::vector<Token>>();
  const ModelConfig cfg = load_config(dir);
  const ModelWeights w = load_weights(cfg, dir, {moekit::Precision::f32});
  moekit::ThreadPool pool(2);
  const auto shape = cfg.shape();
  moekit::presets::Baseline<moekit::MemoryLoader> pipeline(
      shape, pipeline_config(shape, {0, moekit::Precision::f32}), host_loader(w.experts),
      moekit::UniformScorer({moekit::Precision::f32}));
  const auto all = engine_test::teacher_forced(cfg, w.dense, pipeline, seq, 1, &pool);
  Rows rows;
  for (std::size_t at = 0; at + cfg.vocab_size <= all.size(); at += cfg.vocab_size)
    rows.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(at),
                      all.begin() + static_cast<std::ptrdiff_t>(at + cfg.vocab_size));
  return rows;
}

}  // namespace sampler_test

using namespace sampler_test;

TEST_CASE("the sampler draws the original implementation's tokens for every seed",
          "[engine][sampler]") {
  Rows rows;
  for (std::uint64_t s = 0; s < 6; ++s) rows.push_back(lm_logits(32000, s));
  rows.push_back(lm_logits(32000, 99, 1.0f, 0));      // flat: a wide nucleus
  rows.push_back(lm_logits(32000, 98, 4.0f, 3, 30));  // one token far ahead: keep = 1
  struct Setting {
    float t, p;
  };
  Sampler::PathCounts sum;
  for (const auto isa : runnable_isas())
    for (const Setting st : {Setting{0.8f, 0.95f}, {1.0f, 0.9f}, {0.5f, 0.5f}, {1.5f, 0.99f}})
      for (const std::uint64_t seed : {42u, 7u}) {
        const auto p = same_tokens(rows, {st.t, st.p, seed}, isa, 24);
        sum.approximate += p.approximate;
        sum.exact_candidates += p.exact_candidates;
        sum.exact_all += p.exact_all;
        sum.reference += p.reference;
      }
  // Most draws were decided by the fast path: the identity above is not the reference's alone.
  INFO("approximate " << sum.approximate << ", exact candidates " << sum.exact_candidates
                      << ", exact all " << sum.exact_all << ", reference " << sum.reference);
  CHECK(sum.approximate > 2 * (sum.exact_candidates + sum.exact_all + sum.reference));
}

TEST_CASE("the sampler draws the original's tokens on the default model's logits",
          "[engine][sampler]") {
  const Rows rows = default_model_logits();
  if (rows.empty()) {
    WARN("models/moekit-tiny-moe is not in this checkout; skipped");
    return;
  }
  REQUIRE(rows.size() >= 30);
  Sampler::PathCounts sum;
  struct Setting {
    float t, p;
  };
  for (const Setting st : {Setting{0.8f, 0.95f}, {0.8f, 0.5f}, {1.0f, 0.99f}, {0.8f, 1.0f}}) {
    const auto p = same_tokens(rows, {st.t, st.p, 42}, moekit::detect_isa(), rows.size());
    sum.exact_candidates += p.exact_candidates;
    sum.exact_all += p.exact_all;
  }
  // The wide nuclei of this small model need the slower, exact attempts now and then: they
  // were exercised too (the third, expf for all, is rarer: the next test makes it decide).
  CHECK(sum.exact_candidates > 0);
}

TEST_CASE("on a pool's threads, the sampler draws the original's tokens", "[engine][sampler]") {
  // Vocabularies split into two or three ranges (32768 logits, Sampler::kMinPart, or more each),
  // with tails that are no whole group of the scan; the settings take every path that scans
  // (greedy, top-k) or weighs (nucleus) the vocabulary.
  struct Setting {
    float t, p;
    std::uint32_t k;
  };
  for (const unsigned threads : {2u, 3u}) {
    moekit::ThreadPool pool(threads);
    for (const std::size_t n : {65536u + 17u, 100000u, 151936u}) {
      const Rows rows{lm_logits(n, n), lm_logits(n, n + 1, 1.0f, 0), lm_logits(n, 3, 4.f, 3, 30)};
      for (const auto isa : runnable_isas())
        for (const Setting st : {Setting{0.8f, 0.95f, 0},
                                 {1.0f, 0.99f, 0},
                                 {0.8f, 0.5f, 0},
                                 {0.8f, 0.95f, 40},
                                 {0.0f, 1.0f, 0}}) {
          INFO(threads << " threads, vocabulary " << n << ", T " << st.t << ", top-p " << st.p
                       << ", top-k " << st.k);
          const SamplerConfig c{st.t, st.p, n + threads, st.k};
          if (st.k == 0) {
            CHECK(same_tokens(rows, c, isa, 12, &pool).split == 12);
            continue;
          }
          Sampler alone(c, isa), split(c, isa);
          split.set_thread_pool(&pool);
          for (const auto& row : rows) CHECK(split.sample(row) == alone.sample(row));
          CHECK(split.paths().split == rows.size());
        }
    }
  }
}

TEST_CASE(
    "the sampler stays on one thread when the pool's last step did, or the vocabulary is "
    "small",
    "[engine][sampler]") {
  moekit::ThreadPool pool(2);
  Sampler s({0.8f, 0.95f, 1});
  s.set_thread_pool(&pool);
  // 65536 logits: two ranges of kMinPart (32768); 32000: fewer than one.
  const auto big = lm_logits(65536, 1), small = lm_logits(32000, 1);
  s.sample(big);
  CHECK(s.paths().split == 1);
  s.sample(small);  // Mixtral's vocabulary: one range is cheaper than two
  CHECK(s.paths().split == 1);
  // The StepChooser measures both modes first, each for switch_steps steps: on all threads, then
  // on the caller alone.
  for (unsigned i = 0; i < moekit::ThreadPool::StepChooser::switch_steps; ++i) {
    const moekit::ThreadPool::Active team(pool, true);
  }
  CHECK(pool.last_step_on_team());
  { const moekit::ThreadPool::Active solo(pool, true); }
  REQUIRE_FALSE(pool.last_step_on_team());
  s.sample(big);
  CHECK(s.paths().split == 1);
}

TEST_CASE("a cut that only expf weights for every logit place draws the original's token",
          "[engine][sampler]") {
  // Ten distinct logits near the top and 990 far below (out of the first attempt's candidates,
  // with 62% of the mass), top-p set just below where the running probability crosses at the
  // fifth token: closer than the first two attempts' margins (the fast exp's error, then its
  // share of the rest), farther than the third's (double rounding only). Where the cut is
  // matters to a draw near any boundary between kept tokens: they all move with the kept mass,
  // which a sixth token would raise by an eighth. Those seeds need the third attempt; the others
  // are decided by the first.
  std::vector<float> l(1000, -4.5f);
  for (int i = 0; i < 10; ++i) l[std::size_t(i) * 97] = -0.1f * float(i);
  std::vector<float> w(l.size());
  for (std::size_t i = 0; i < l.size(); ++i) w[i] = std::exp(l[i]);  // T 1, largest logit 0
  double total = 0, top5 = 0;
  for (const float x : w) total += x;
  for (int i = 0; i < 5; ++i) top5 += w[std::size_t(i) * 97];
  const auto p = static_cast<float>(top5 / total * (1 - 2e-7));
  for (const auto isa : runnable_isas()) {
    Sampler::PathCounts sum;
    for (std::uint64_t seed = 1; seed <= 64; ++seed) {
      INFO(moekit::name(isa) << ", seed " << seed);
      const auto paths = same_tokens({l}, {1.0f, p, seed}, isa, 1);
      sum.approximate += paths.approximate;
      sum.exact_candidates += paths.exact_candidates;
      sum.exact_all += paths.exact_all;
      sum.reference += paths.reference;
    }
    INFO(moekit::name(isa) << ": approximate " << sum.approximate << ", exact candidates "
                           << sum.exact_candidates << ", exact all " << sum.exact_all
                           << ", reference " << sum.reference);
    CHECK(sum.exact_all > 0);
    CHECK(sum.exact_candidates == 0);
    CHECK(sum.reference == 0);
    CHECK(sum.approximate > 0);
  }
}

TEST_CASE("sampled frequencies match the exact distribution, and a wrong one is rejected",
          "[engine][sampler]") {
  SECTION("a small vocabulary, temperature and top-p") {
    const auto l = lm_logits(40, 3, 1.5f, 3, 3);
    Sampler s({0.8f, 0.9f, 11});
    const std::uint64_t n = 200000;
    const auto counts = counts_of(s, l, n);
    const auto right = chi_square(counts, exact_probs(l, 0.8f, 0.9f), n);
    INFO("chi-square " << right.stat << " on " << right.df << " degrees of freedom");
    CHECK(right.df >= 10);
    CHECK(right.plausible());
    // The same draws against wrong distributions: another temperature, no cut, two tokens of
    // the nucleus swapped.
    CHECK_FALSE(chi_square(counts, exact_probs(l, 0.85f, 0.9f), n).plausible());
    CHECK_FALSE(chi_square(counts, exact_probs(l, 0.8f, 1.0f), n).plausible());
    auto swapped = exact_probs(l, 0.8f, 0.9f);
    const auto first = std::max_element(swapped.begin(), swapped.end()) - swapped.begin();
    std::swap(swapped[static_cast<std::size_t>(first)], swapped[(first + 1) % 40]);
    CHECK_FALSE(chi_square(counts, swapped, n).plausible());
  }
  SECTION("the whole vocabulary, on the fast path") {
    const auto l = lm_logits(32000, 5, 2.0f, 12, 9);
    Sampler s({0.8f, 0.95f, 5});
    const std::uint64_t n = 8000;
    const auto counts = counts_of(s, l, n);
    CHECK(s.paths().approximate > n * 9 / 10);
    const auto right = chi_square(counts, exact_probs(l, 0.8f, 0.95f), n);
    INFO("chi-square " << right.stat << " on " << right.df << " degrees of freedom");
    CHECK(right.plausible());
    CHECK_FALSE(chi_square(counts, exact_probs(l, 0.9f, 0.95f), n).plausible());
  }
  SECTION("top-k") {
    const auto l = lm_logits(32000, 8, 2.0f, 30, 6);
    for (const float p : {1.0f, 0.8f}) {
      Sampler s({1.0f, p, 8, 20});
      const std::uint64_t n = 40000;
      const auto counts = counts_of(s, l, n);
      const auto right = chi_square(counts, exact_probs(l, 1.0f, p, 20), n);
      INFO("top-p " << p << ": chi-square " << right.stat << " on " << right.df << " df");
      CHECK(right.plausible());
      CHECK_FALSE(chi_square(counts, exact_probs(l, 1.1f, p, 20), n).plausible());
      if (p == 1.0f) CHECK_FALSE(chi_square(counts, exact_probs(l, 1.0f, p, 25), n).plausible());
    }
  }
}

TEST_CASE("top-k draws what the old arithmetic on the k highest logits draws",
          "[engine][sampler]") {
  Rows rows{lm_logits(32000, 1), lm_logits(32000, 2, 1.0f, 0), lm_logits(5000, 3)};
  for (float& x : rows[2]) x = std::round(x * 2) / 2;  // ties across the k-th place
  for (const auto isa : runnable_isas())
    for (const std::uint32_t k : {1u, 2u, 5u, 40u, 100u, 126u, 1000u, 2100u, 4999u})
      for (const float p : {0.9f, 1.0f}) {
        const SamplerConfig c{0.8f, p, k, k};
        Sampler s(c, isa);
        TopKReference want(c);
        for (std::size_t i = 0; i < 9; ++i) {
          const auto& row = rows[i % rows.size()];
          INFO(moekit::name(isa) << ", k " << k << ", top-p " << p << ", draw " << i);
          REQUIRE(s.sample(row) == want.sample(row));
        }
      }
}

TEST_CASE("top-k: 1 is greedy, ties go to the lower id, the vocabulary or more is no top-k",
          "[engine][sampler]") {
  const std::vector<float> tied{0.5f, 2.f, -1.f, 2.f};
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    Sampler one({0.8f, 0.9f, seed, 1});
    CHECK(one.sample(tied) == 1);
    const auto l = lm_logits(32000, seed);
    for (int i = 0; i < 5; ++i) CHECK(one.sample(l) == Sampler::argmax(l));
  }

  const std::vector<float> flat(100, 1.5f);
  Sampler three({1.0f, 1.0f, 4, 3});
  std::set<std::uint32_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(three.sample(flat));
  CHECK(seen == std::set<std::uint32_t>{0, 1, 2});

  const Rows rows{lm_logits(1000, 1), lm_logits(1000, 2)};
  for (const std::uint32_t k : {1000u, 1005u})
    same_tokens(rows, {0.8f, 0.95f, 6, k}, moekit::detect_isa(), 50);
}

TEST_CASE("top-p edge cases: 1, tiny, ties, -inf, signed zeros", "[engine][sampler]") {
  const auto isa = moekit::detect_isa();
  SECTION("p = 1 keeps every token") {
    const Rows small{lm_logits(16, 1, 0.5f, 0)};
    Sampler s({1.0f, 1.0f, 3}, isa);
    std::set<std::uint32_t> seen;
    for (int i = 0; i < 2000; ++i) seen.insert(s.sample(small[0]));
    CHECK(seen.size() == 16);
    same_tokens(small, {1.0f, 1.0f, 3}, isa, 500);
    same_tokens({lm_logits(32000, 2)}, {0.8f, 1.0f, 3}, isa, 10);
  }
  SECTION("p = 1 is decided without the reference's sort, and draws only when it keeps two") {
    Rows rows;
    for (std::uint64_t s = 0; s < 4; ++s) rows.push_back(lm_logits(32000, s));
    rows.push_back(lm_logits(32000, 99, 1.0f, 0));  // flat: the draw falls deep in the vocabulary
    const auto p = same_tokens(rows, {0.8f, 1.0f, 11}, isa, 200);
    INFO("approximate " << p.approximate << ", exact candidates " << p.exact_candidates
                        << ", exact all " << p.exact_all << ", reference " << p.reference);
    CHECK(p.approximate > 4 * (p.exact_candidates + p.exact_all + p.reference));
    // One token far ahead: the reference keeps it alone (every other weight rounds away in its
    // sum) and draws no number, so the draws on the next rows must still agree. The second
    // logit sits around 36.7 T below the top, where a weight of 2^-53 decides.
    for (const float gap : {20.f, 36.5f, 36.7f, 36.75f, 37.f, 60.f}) {
      auto peaked = lm_logits(32000, 5, 0.5f, 0);
      const float t = 0.8f, top = 40.f;
      for (float& x : peaked) x = std::min(x, top - (gap + 2) * t);
      peaked[1234] = top;
      peaked[777] = top - gap * t;
      INFO("gap " << gap << " T");
      same_tokens({peaked, rows[0], peaked, rows[4]}, {t, 1.0f, 5}, isa, 40);
    }
  }
  SECTION("a tiny p keeps the top token, or the reference's pick among tied tops") {
    const auto l = lm_logits(32000, 3);
    Sampler s({0.8f, 1e-6f, 9}, isa);
    for (int i = 0; i < 10; ++i) CHECK(s.sample(l) == Sampler::argmax(l));
    auto tied = l;
    tied[17] = tied[Sampler::argmax(l)];
    same_tokens({tied}, {0.8f, 1e-6f, 9}, isa, 10);
  }
  SECTION("many ties: logits on a grid") {
    Rows rows;
    for (std::uint64_t s = 0; s < 3; ++s) {
      auto l = lm_logits(32000, s);
      for (float& x : l) x = std::round(x * 4) / 4;
      rows.push_back(l);
    }
    const auto p = same_tokens(rows, {0.8f, 0.95f, 12}, isa, 30);
    CHECK(p.reference > 0);  // tied draws are the reference's to order
  }
  SECTION("-inf logits are never drawn; all -inf is refused") {
    auto l = lm_logits(32000, 4, 1.0f, 0);
    for (std::size_t i = 0; i < l.size(); i += 3) l[i] = -inf;
    same_tokens({l}, {1.0f, 0.99f, 2}, isa, 20);
    Sampler s({1.0f, 1.0f, 2}, isa);
    for (int i = 0; i < 200; ++i) CHECK(l[s.sample(l)] != -inf);
    const std::vector<float> none(40, -inf);
    CHECK_THROWS_WITH(s.sample(none), Catch::Contains("every logit is -inf"));
  }
  SECTION("signed zeros are one value") {
    std::vector<float> l(300, -3.f);
    for (std::size_t i = 0; i < l.size(); i += 7) l[i] = (i % 2) ? -0.0f : 0.0f;
    same_tokens({l}, {1.0f, 0.6f, 5}, isa, 50);
    same_tokens({l}, {0.0f, 0.6f, 5}, isa, 5);
  }
}

TEST_CASE("NaN and +inf logits are refused, naming the position", "[engine][sampler]") {
  auto l = lm_logits(1000, 1);
  l[123] = std::numeric_limits<float>::quiet_NaN();
  for (const float t : {0.0f, 0.8f}) {
    Sampler s({t, 0.9f, 1});
    CHECK_THROWS_WITH(s.sample(l), Catch::Contains("logit 123 of 1000 is NaN"));
  }
  l[123] = -std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(Sampler({0.8f, 0.9f, 1}).sample(l), Catch::Contains("is NaN"));
  l[123] = inf;
  CHECK_THROWS_WITH(Sampler({0.8f, 0.9f, 1}).sample(l),
                    Catch::Contains("logit 123 of 1000 is +inf"));
  CHECK_THROWS_WITH(Sampler({0.8f, 0.9f, 1}).sample(std::vector<float>{}),
                    Catch::Contains("empty logits"));
}

TEST_CASE("every vocabulary size, on every vector path", "[engine][sampler]") {
  for (const auto isa : runnable_isas())
    for (const std::size_t n : {1u, 2u, 3u, 15u, 16u, 17u, 255u, 256u, 257u, 300u, 4097u}) {
      const Rows rows{lm_logits(n, n, 1.0f, 2, 3), lm_logits(n, n + 1)};
      same_tokens(rows, {0.8f, 0.9f, n}, isa, 20);
      same_tokens(rows, {0.0f, 0.9f, n}, isa, 2);
    }
}

TEST_CASE("the vector passes agree with the portable ones; the fast exp is within its bound",
          "[engine][sampler]") {
  const SamplerVectorPasses portable{moekit::Isa::generic};
  for (const std::size_t n : {5u, 256u, 1000u, 32000u}) {
    auto l = lm_logits(n, n);
    l[n / 2] = -inf;
    std::vector<std::int32_t> want(sampler_scan_lanes(n)), got(sampler_scan_lanes(n));
    const auto a = portable.scan(l.data(), n, want.data());
    std::vector<std::uint32_t> want_idx(n + 16), got_idx(n + 16);
    const std::size_t c = portable.collect(l.data(), n, 1.0f, want_idx.data());
    want_idx.resize(c);
    for (const auto isa : runnable_isas()) {
      const SamplerVectorPasses p{isa};
      const auto b = p.scan(l.data(), n, got.data());
      CHECK(a.max_key == b.max_key);
      CHECK(a.min_key == b.min_key);
      CHECK(got == want);
      got_idx.resize(n + 16);
      got_idx.resize(p.collect(l.data(), n, 1.0f, got_idx.data()));
      CHECK(got_idx == want_idx);
    }
  }
  // e^x over [-87, 0]: a random sample and the ends, through the weight pass (top 0, T 1).
  std::vector<float> x(1 << 20);
  std::mt19937_64 g(1);
  std::uniform_real_distribution<float> u(-87.f, 0.f);
  for (float& v : x) v = u(g);
  x[0] = 0.f;
  x[1] = -87.f;
  x[2] = -0.f;
  std::vector<float> w(x.size());
  std::vector<std::uint32_t> idx(x.size() + 16);
  for (const auto isa : runnable_isas()) {
    SamplerVectorPasses{isa}.exp_weights(x.data(), x.size(), 0.f, 1.f, 0.f, w.data(), idx.data());
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double e = std::exp(static_cast<double>(x[i]));
      worst = std::max(worst, std::abs(w[i] - e) / e);
    }
    INFO(moekit::name(isa) << ": worst relative error " << worst);
    CHECK(worst <= sampler_exp_approx_error);
  }
}

TEST_CASE("moe-run --top-k: 0 by default, a count, refused when negative", "[engine][sampler]") {
  auto parse = [](std::vector<const char*> args, Options* o = nullptr) {
    args.insert(args.begin(), "moe-run");
    Cli cli;
    std::ostringstream out, err;
    const int rc = cli.parse(static_cast<int>(args.size()), args.data(), out, err);
    if (o) *o = cli.options();
    return std::pair{rc, err.str()};
  };
  Options o;
  REQUIRE(parse({}, &o).first == 0);
  CHECK(o.top_k == 0);
  REQUIRE(parse({"--top-k", "40"}, &o).first == 0);
  CHECK(o.top_k == 40);
  const auto [rc, err] = parse({"--top-k", "-1"});
  CHECK(rc != 0);
  CHECK(err.find("--top-k") != std::string::npos);
}

TEST_CASE("the pass for the largest logit alone agrees with the scan, on every vector path",
          "[engine][sampler]") {
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  constexpr float big = std::numeric_limits<float>::max();
  const SamplerVectorPasses portable{moekit::Isa::generic};
  for (const std::size_t n :
       {1u, 2u, 15u, 16u, 17u, 31u, 33u, 63u, 64u, 65u, 257u, 1000u, 32000u}) {
    std::vector<std::pair<std::string, std::vector<float>>> rows;
    rows.emplace_back("lm", lm_logits(n, n));
    auto late = lm_logits(n, n + 1);
    late.back() = 50.f;  // the largest in the tail after the last whole vector
    rows.emplace_back("largest last", late);
    if (n >= 2) {
      late[n - 2] = 60.f;  // then in a lane of the last whole step, or the tail
      rows.emplace_back("largest second to last", late);
    }
    auto first = lm_logits(n, n + 2);
    first[0] = 50.f;
    rows.emplace_back("largest first", first);
    rows.emplace_back("all equal", std::vector<float>(n, -1.25f));
    auto huge = lm_logits(n, n + 3);
    for (std::size_t i = 0; i < n; ++i) huge[i] = (i % 3 == 0 ? -big : 1e30f * huge[i]);
    rows.emplace_back("huge range", huge);
    std::vector<float> zeros(n, -0.0f);
    rows.emplace_back("negative zeros", zeros);
    zeros[n / 2] = 0.0f;
    rows.emplace_back("signed zeros", zeros);
    for (const float bad : {-inf, inf, nan, -nan})
      for (const std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        auto l = lm_logits(n, n + 4);
        l[at] = bad;
        rows.emplace_back("non-finite " + std::to_string(bad) + " at " + std::to_string(at), l);
      }
    for (const auto& [name, l] : rows) {
      std::vector<std::int32_t> lanes(sampler_scan_lanes(n));
      const auto want = portable.scan(l.data(), n, lanes.data());
      const bool finite = std::all_of(l.begin(), l.end(), [](float v) { return std::isfinite(v); });
      for (const auto isa : runnable_isas()) {
        INFO(moekit::name(isa) << ", vocabulary " << n << ", " << name);
        const auto got = SamplerVectorPasses{isa}.top(l.data(), n);
        CHECK(got.finite == finite);
        if (finite)
          CHECK(std::bit_cast<std::uint32_t>(got.top) ==
                std::bit_cast<std::uint32_t>(detail::from_key(want.max_key)));
      }
    }
  }
}

TEST_CASE("the sampler draws the original's tokens where the largest logit is late, tied or huge",
          "[engine][sampler]") {
  for (const std::size_t n : {17u, 100u, 32000u}) {
    Rows rows{lm_logits(n, 1), lm_logits(n, 2, 1.0f, 0), std::vector<float>(n, 3.5f)};
    rows[0].back() = 40.f;                   // far ahead, last: the nucleus is it alone
    rows[1][n - 1] = rows[1][n - 2] = 6.f;   // tied at the end
    auto middle = lm_logits(n, 5, 1.0f, 0);  // within the vector passes' last whole steps
    middle[n * 7 / 10] = 4.f;
    rows.push_back(middle);
    auto huge = lm_logits(n, 3);
    for (std::size_t i = 0; i < n; ++i) huge[i] = huge[i] * 1e30f;
    huge[n - 1] = 3e38f;
    rows.push_back(huge);
    auto some_inf = lm_logits(n, 4, 1.0f, 0);  // -inf: the full scan decides the top
    for (std::size_t i = 0; i < n; i += 2) some_inf[i] = -inf;
    rows.push_back(some_inf);
    for (const auto isa : runnable_isas())
      for (const float p : {0.95f, 0.5f}) {
        INFO(moekit::name(isa) << ", vocabulary " << n << ", top-p " << p);
        same_tokens(rows, {0.8f, p, n}, isa, 3 * rows.size());
      }
  }
}
