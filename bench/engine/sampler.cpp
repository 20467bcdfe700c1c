// The sampler's cost per token (issue 28, target < 2% of a decode step): microseconds per sample
// over a 32 000-token vocabulary for the original implementation (a full sort of the vocabulary,
// copied here as the reference) and for Sampler, their ratio, and which of Sampler's paths decided
// (sampler.hpp: the fast one, exact weights for the candidates or for all, the reference). Also
// checks, untimed, that both drew the same tokens. Times are this thread's CPU time per sample
// (the machine is shared; the clock's own cost subtracted), old and new interleaved in rounds so
// that a change of load hits both, each on logits just copied into cache (as the LM head leaves
// them).
//
// Logits: by default synthetic rows shaped like a language model's (a normal bulk plus a few
// tokens above it) in two profiles, "flat" (the default model's spread: nuclei of hundreds to
// thousands of tokens at top-p 0.95) and "peaked" (a narrower bulk, a few tokens up to 12 above
// it); with --model DIR, the decode logits of that checkpoint, recorded while it samples --tokens
// tokens after its reference prompt (f32 experts in memory, --threads threads), timing each
// decode step. With --decode-us D (or --model: its fastest decode step, the least disturbed by
// other load, which makes the share an upper bound), each row also gives the share of a token
// the sampler takes: sample / (D + sample). With --pool N, the new sampler runs its passes over
// the vocabulary on a pool of N threads (Sampler::set_thread_pool; the caller's CPU time then
// includes its wait for the other thread's range, so it is about the sample's wall time); the
// median sample is printed beside the mean, as the less disturbed by other load.
//
// Usage: moekit_bench_sampler [--model DIR] [--tokens N] [--threads N] [--decode-us D]
//                             [--rounds N] [--pool N]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/precision/thread_pool.hpp"
#include "moekit/presets.hpp"

#include "moekit/engine/config.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/sampler.hpp"
#include "moekit/engine/weights.hpp"
#include "support/old_sampler.hpp"

using namespace moekit::engine;
namespace fs = std::filesystem;

namespace {

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) * 1e-3;
}

using moekit::test::OldSampler;  // support/old_sampler.hpp

using Rows = std::vector<std::vector<float>>;

/// `count` rows of a normal bulk of spread `sd` plus 8 tokens up to `height` above it.
Rows synthetic(std::size_t count, float sd, float height, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> bulk(0.f, sd);
  std::uniform_real_distribution<float> up(0.f, height);
  Rows rows(count, std::vector<float>(32000));
  for (auto& r : rows) {
    for (float& x : r) x = bulk(g);
    for (int s = 0; s < 8; ++s) r[g() % r.size()] += up(g);
  }
  return rows;
}

struct Recorded {
  Rows rows;
  double decode_us = 0;         ///< the fastest decode step, wall time (the least loaded)
  double median_decode_us = 0;  ///< the median one
};

/// The decode logits of the checkpoint in `dir` while it samples (moe-run's defaults, seed 42)
/// `tokens` tokens after its reference prompt, with the times of its decode steps.
Recorded record(const fs::path& dir, int tokens, unsigned threads) {
  std::ifstream in(dir / "reference.json");
  const auto prompt = nlohmann::json::parse(in).at("prompt_ids").get<std::vector<Token>>();
  const ModelConfig cfg = load_config(dir);
  const ModelWeights w = load_weights(cfg, dir, {moekit::Precision::f32});
  moekit::ThreadPool pool(threads);
  const auto shape = cfg.shape();
  moekit::presets::Baseline<moekit::MemoryLoader> pipeline(
      shape, pipeline_config(shape, {0, moekit::Precision::f32}), host_loader(w.experts),
      moekit::UniformScorer({moekit::Precision::f32}));
  Model<decltype(pipeline)> model(cfg, w.dense, pipeline,
                                  static_cast<std::uint32_t>(prompt.size() + tokens + 1), &pool);
  model.begin_sequence();
  std::span<const float> logits = model.prefill(prompt);
  Sampler sampler({0.8f, 0.95f, 42});
  Recorded r;
  std::vector<double> steps;
  for (int i = 0; i < tokens; ++i) {
    r.rows.emplace_back(logits.begin(), logits.end());
    const Token next = sampler.sample(logits);
    const auto t0 = std::chrono::steady_clock::now();
    logits = model.decode(next);
    steps.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(steps.begin(), steps.end());
  r.decode_us = steps.front();
  r.median_decode_us = steps[steps.size() / 2];
  return r;
}

struct Setting {
  const char* name;
  SamplerConfig config;
};

struct Timing {
  double old_us = 0, new_us = 0, new_median_us = 0;
  std::size_t same = 0, compared = 0;
  Sampler::PathCounts paths;
  std::uint64_t new_samples = 0;
};

/// The cost of one call of thread_cpu_us, subtracted from each timed sample.
double clock_cost_us() {
  const double t0 = thread_cpu_us();
  for (int i = 0; i < 1000; ++i) thread_cpu_us();
  return (thread_cpu_us() - t0) / 1001;
}

/// `rounds` rounds, each timing the old sampler on `old_per_round` rows and the new one on
/// `new_per_round`; a second new sampler follows the old one untimed, for the comparison. Each
/// row is first copied into one buffer, untimed, as the LM head leaves fresh logits in cache.
Timing measure(const Rows& rows, SamplerConfig c, int rounds, int old_per_round, int new_per_round,
               moekit::ThreadPool* pool) {
  Timing t;
  OldSampler old(c);
  Sampler follower(c), timed(c);
  follower.set_thread_pool(pool);
  timed.set_thread_pool(pool);
  std::vector<double> each;
  std::vector<float> hot(rows[0].size());
  const double clock = clock_cost_us();
  std::size_t at_old = 0, at_new = 0;
  volatile std::uint64_t sink = 0;
  double old_total = 0, new_total = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < old_per_round; ++i, ++at_old) {
      hot = rows[at_old % rows.size()];
      const double t0 = thread_cpu_us();
      const std::uint32_t want = old.sample(hot);
      old_total += thread_cpu_us() - t0 - clock;
      t.same += follower.sample(hot) == want;
      ++t.compared;
    }
    for (int i = 0; i < new_per_round; ++i, ++at_new) {
      hot = rows[at_new % rows.size()];
      const double t0 = thread_cpu_us();
      sink = sink + timed.sample(hot);
      each.push_back(thread_cpu_us() - t0 - clock);
      new_total += each.back();
    }
  }
  std::nth_element(each.begin(), each.begin() + std::ptrdiff_t(each.size() / 2), each.end());
  t.new_median_us = each[each.size() / 2];
  t.old_us = old_total / (rounds * old_per_round);
  t.new_us = new_total / (rounds * new_per_round);
  t.paths = timed.paths();
  t.new_samples = std::uint64_t(rounds) * std::uint64_t(new_per_round);
  return t;
}

void print_row(const char* profile, const Setting& s, const Timing& t, double decode_us) {
  const auto& p = t.paths;
  const double n = double(t.new_samples);
  const bool exact = s.config.top_k == 0;
  std::printf("| %s | %s | %.1f | %.2f | %.2f | %.0f | %s | %.3f / %.3f / %.4f / %.4f | %.0f |",
              profile, s.name, t.old_us, t.new_us, t.new_median_us, t.old_us / t.new_us,
              exact ? (std::to_string(t.same) + "/" + std::to_string(t.compared)).c_str() : "n/a",
              double(p.approximate) / n, double(p.exact_candidates) / n, double(p.exact_all) / n,
              double(p.reference) / n, double(p.candidates) / n);
  if (decode_us > 0)
    std::printf(" %.2f%% | %.3f%% |", 100 * t.old_us / (decode_us + t.old_us),
                100 * t.new_us / (decode_us + t.new_us));
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) try {
  fs::path model;
  int tokens = 128, rounds = 10;
  unsigned threads = 1, pool_threads = 1;
  double decode_us = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model")
      model = argv[i + 1];
    else if (a == "--tokens")
      tokens = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--threads")
      threads = unsigned(std::max(1, std::atoi(argv[i + 1])));
    else if (a == "--decode-us")
      decode_us = std::atof(argv[i + 1]);
    else if (a == "--rounds")
      rounds = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--pool")
      pool_threads = unsigned(std::max(1, std::atoi(argv[i + 1])));
    else
      throw std::runtime_error("unknown flag " + a);
  }
  std::vector<std::pair<std::string, Rows>> profiles;
  if (!model.empty()) {
    Recorded r = record(model, tokens, threads);
    std::printf(
        "%s: %zu decode steps sampled at T 0.8, top-p 0.95, %u threads: fastest step "
        "%.1f us, median %.1f us\n",
        model.filename().c_str(), r.rows.size(), threads, r.decode_us, r.median_decode_us);
    if (decode_us == 0) decode_us = r.decode_us;
    profiles.emplace_back(model.filename().string(), std::move(r.rows));
  } else {
    profiles.emplace_back("flat", synthetic(8, 2.9f, 4.f, 1));
    profiles.emplace_back("peaked", synthetic(8, 2.0f, 12.f, 2));
  }
  const Setting settings[] = {
      {"T 0.8, top-p 0.95 (moe-run's default)", {0.8f, 0.95f, 42}},
      {"T 0.8, top-p 0.5", {0.8f, 0.5f, 42}},
      {"T 1.0, top-p 0.99", {1.0f, 0.99f, 42}},
      {"T 0.8, top-p 1", {0.8f, 1.0f, 42}},
      {"T 0.8, top-k 40, top-p 0.95 (old: no top-k)", {0.8f, 0.95f, 42, 40}},
      {"greedy", {0.0f, 1.0f, 42}}};
  moekit::ThreadPool pool(pool_threads);
  std::printf("vector passes: %s; new sampler's passes on %u thread(s)\n\n",
              std::string(moekit::name(moekit::detect_isa())).c_str(), pool_threads);
  std::printf(
      "| logits | setting | old us | new us | new median us | old / new | same tokens | decided: "
      "fast / exact candidates / exact all / reference | candidates per sample |%s\n",
      decode_us > 0 ? " old share of a token | new share |" : "");
  std::printf("|---|---|---|---|---|---|---|---|---|%s\n", decode_us > 0 ? "---|---|" : "");
  for (const auto& [name, rows] : profiles)
    for (const Setting& s : settings) {
      const bool greedy = s.config.temperature == 0;
      print_row(name.c_str(), s, measure(rows, s.config, rounds, greedy ? 200 : 5, 200, &pool),
                decode_us);
    }
  if (decode_us > 0) std::printf("\nshares against a decode step of %.1f us\n", decode_us);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "moekit_bench_sampler: %s\n", e.what());
  return 1;
}
