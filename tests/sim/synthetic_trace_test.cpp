// Synthetic traces: determinism per seed, well-formed records, labelling, and marginal
// frequencies that match the statistics that drive them.

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "moekit/sim/synthetic_trace.hpp"
#include "moekit/sim/trace_binary.hpp"
#include "moekit/sim/trace_stats.hpp"

using namespace moekit;
using namespace moekit::sim;

namespace {

const std::string stats_dir = MOEKIT_SOURCE_DIR "/data/stats";

// Stationary distribution of layer l's row-normalised chain (rows without counts → popularity),
// by power iteration: the expected long-run top-1 share.
std::vector<double> stationary(const TransitionStats& s, std::uint32_t l) {
  const std::uint32_t E = s.n_experts;
  const auto start = s.top1_popularity(l);
  std::vector<double> pi = start, next(E);
  for (int it = 0; it < 300; ++it) {  // the chains mix in a few dozen steps
    std::fill(next.begin(), next.end(), 0.0);
    for (std::uint32_t i = 0; i < E; ++i) {
      double row = 0;
      for (std::uint32_t j = 0; j < E; ++j) row += s.count(l, i, j);
      for (std::uint32_t j = 0; j < E; ++j)
        next[j] += pi[i] * (row > 0 ? s.count(l, i, j) / row : start[j]);
    }
    pi.swap(next);
  }
  return pi;
}

double total_variation(const double* a, const double* b, std::size_t n) {
  double tv = 0;
  for (std::size_t i = 0; i < n; ++i) tv += std::abs(a[i] - b[i]);
  return tv / 2;
}

}  // namespace

TEST_CASE("synthetic traces are deterministic per seed and well formed", "[sim][synthetic]") {
  for (const auto& m : synthetic_models()) {
    INFO(m.name);
    SyntheticConfig cfg{.sequences = 2, .prefill_tokens = 5, .decode_tokens = 40, .seed = 7};
    const RoutingTrace a = generate_synthetic_trace(m.name, stats_dir, cfg);
    const RoutingTrace b = generate_synthetic_trace(m.name, stats_dir, cfg);
    cfg.seed = 8;
    const RoutingTrace c = generate_synthetic_trace(m.name, stats_dir, cfg);
    CHECK(a == b);
    CHECK_FALSE(a == c);
    CHECK(a.synthetic());
    CHECK(a.name().find("synthetic") == 0);
    CHECK(a.dims().n_experts == m.dims.n_experts);
    CHECK(a.dims().top_k == m.dims.top_k);
    CHECK(a.sequence_count() == 2);
    CHECK(a.prefill_length(1) == 5);
    CHECK(a.missing_count() == 0);
    // Every record passes the reader's full validation (ids in range and distinct, weights
    // finite, descending, normalised), and the synthetic flag survives the file format.
    const RoutingTrace back = parse_trace_binary(serialize_trace_binary(a));
    CHECK(back == a);
    CHECK(back.synthetic());
  }
  CHECK(generate_synthetic_trace("deepseek-moe-16b", stats_dir, {})
            .name()
            .find("synthetic-parametric:") == 0);
  CHECK_THROWS_AS(synthetic_model("gpt-5"), Error);
}

TEST_CASE("top-1 marginals match the statistics (Qwen1.5-MoE, Switch, Mixtral)",
          "[sim][synthetic]") {
  struct Case {
    const char* model;
    std::size_t tokens;
    double tolerance;  // total variation distance per layer
  };
  // Tolerances: sampling noise of the per-layer shares over `tokens` correlated draws is about
  // Σ_e sqrt(p_e/N)/2 ≈ 0.02 for 60 experts at 30k tokens; we allow 0.05.
  for (const Case c : {Case{"qwen1.5-moe", 30000, 0.05}, Case{"switch-base-128", 30000, 0.05},
                       Case{"mixtral-8x7b", 20000, 0.03}}) {
    INFO(c.model);
    const SyntheticModel m = synthetic_model(c.model);
    const TransitionStats s = load_transition_stats(m, stats_dir);
    const RoutingTrace t =
        generate_synthetic_trace(s, {.top_k = m.dims.top_k, .decode_tokens = c.tokens, .seed = 3});
    const auto top1 = expert_shares(t, /*top1_only=*/true);
    double worst_stationary = 0, worst_counts = 0;
    for (std::uint32_t l = 0; l < s.n_layers; ++l) {
      const auto pi = stationary(s, l);
      worst_stationary = std::max(
          worst_stationary, total_variation(top1.data() + l * s.n_experts, pi.data(), s.n_experts));
      // Against the raw column shares of the published counts.
      std::vector<double> col(s.n_experts, 0.0);
      double sum = 0;
      for (std::uint32_t i = 0; i < s.n_experts; ++i)
        for (std::uint32_t j = 0; j < s.n_experts; ++j) {
          col[j] += s.count(l, i, j);
          sum += s.count(l, i, j);
        }
      for (double& x : col) x /= sum;
      worst_counts = std::max(
          worst_counts, total_variation(top1.data() + l * s.n_experts, col.data(), s.n_experts));
    }
    CAPTURE(worst_stationary, worst_counts);
    CHECK(worst_stationary < c.tolerance);
    if (std::string(c.model) != "mixtral-8x7b")  // Mixtral's counts are decayed, not clean
      CHECK(worst_counts < c.tolerance + 0.02);
  }
}

TEST_CASE("lower ranks follow the popularity table (Mixtral, top-2, exact expectation)",
          "[sim][synthetic]") {
  const SyntheticModel m = synthetic_model("mixtral-8x7b");
  const TransitionStats s = load_transition_stats(m, stats_dir);
  const RoutingTrace t =
      generate_synthetic_trace(s, {.top_k = 2, .decode_tokens = 20000, .seed = 5});
  const auto top1 = expert_shares(t, true);
  // Share of each expert at rank 1: Σ_i P(top1 = i) · pop(e) / (1 − pop(i)), i ≠ e.
  double worst = 0;
  for (std::uint32_t l = 0; l < 32; ++l) {
    std::vector<double> rank1(8, 0.0), want(8, 0.0);
    for (std::size_t g = 0; g < t.token_count(); ++g) rank1[t.experts(g, l)[1]] += 1;
    for (double& x : rank1) x /= double(t.token_count());
    const double* pop = s.popularity.data() + l * 8;
    for (std::uint32_t i = 0; i < 8; ++i)
      for (std::uint32_t e = 0; e < 8; ++e)
        if (e != i) want[e] += top1[l * 8 + i] * pop[e] / (1 - pop[i]);
    worst = std::max(worst, total_variation(rank1.data(), want.data(), 8));
  }
  CAPTURE(worst);
  CHECK(worst < 0.03);
}

TEST_CASE("weights: flat Dirichlet top-2 gives E[w0] = 3/4", "[sim][synthetic]") {
  const RoutingTrace t = generate_synthetic_trace(
      "mixtral-8x7b", stats_dir, {.decode_tokens = 5000, .seed = 11, .dirichlet_alpha = 1.0});
  double sum = 0;
  for (std::size_t g = 0; g < t.token_count(); ++g)
    for (std::uint32_t l = 0; l < 32; ++l) sum += t.weights(g, l)[0];
  // max of (U, 1−U) for U uniform has mean 3/4; 160k draws: standard error ≈ 0.0002.
  CHECK(sum / (5000.0 * 32) == Approx(0.75).margin(0.003));
}

TEST_CASE("synthetic generator rejects bad configurations and mismatched stats",
          "[sim][synthetic]") {
  const TransitionStats s = TransitionStats::parametric(2, 4, 1.0, 0.2, 1);
  CHECK_THROWS_AS(generate_synthetic_trace(s, {.top_k = 5}), Error);
  CHECK_THROWS_AS(generate_synthetic_trace(s, {.top_k = 2, .dirichlet_alpha = 0}), Error);
  CHECK_THROWS_AS(generate_synthetic_trace(s, {.top_k = 2, .decode_tokens = 0}), Error);
  SyntheticModel wrong = synthetic_model("qwen1.5-moe");
  wrong.transitions_file = "switch-top1-transition.npy";
  CHECK_THROWS_AS(load_transition_stats(wrong, stats_dir), Error);
  wrong.transitions_file = "no-such-file.npy";
  CHECK_THROWS_AS(load_transition_stats(wrong, stats_dir), Error);
}
