#pragma once
/// \file Synthetic routing traces for models without recorded ones, driven by published
/// per-layer top-1 transition statistics (data/stats/, MIT; see data/README.md).
///
/// Algorithm, per sequence and independently per layer l:
///  1. top-1 expert: a Markov chain over tokens. Token 0 draws from the chain's popularity
///     (column sums of the layer's transition counts, add-½ smoothed); token t+1 draws from row
///     `top1(t)` of the counts (rows without counts fall back to the popularity).
///  2. the other k−1 experts: drawn by popularity without replacement, excluding those taken
///     (popularity = a given per-layer share table, e.g. Mixtral's measured frequencies, or the
///     smoothed column sums above).
///  3. weights: k independent Gamma(α) draws (a Dirichlet(α,…,α) sample), normalised and sorted
///     descending, assigned by rank.
/// The random stream is std::mt19937_64 with our own uniform/normal/gamma transforms, so a seed
/// gives the same trace on every standard library. Every trace made here has `synthetic() ==
/// true` and a name starting with "synthetic:"; DeepSeek-MoE, for which no statistics are
/// published, uses a parametric table (Zipf popularity + self-transition share) and is named
/// "synthetic-parametric:…".

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/sim/npy.hpp"
#include "moekit/sim/trace.hpp"

namespace moekit::sim {

/// Per-layer top-1 transition counts and selection popularity of a model.
struct TransitionStats {
  std::uint32_t n_layers = 0;
  std::uint32_t n_experts = 0;
  std::vector<double> transitions;  ///< [n_layers × E × E]: counts top1(t) = i → top1(t+1) = j
  std::vector<double> popularity;   ///< [n_layers × E], each row sums to 1, every entry > 0
  std::string origin;               ///< where the numbers come from
  bool is_parametric = false;       ///< not measured: made up from a few parameters

  [[nodiscard]] double count(std::uint32_t l, std::uint32_t i, std::uint32_t j) const noexcept {
    return transitions[(std::size_t{l} * n_experts + i) * n_experts + j];
  }
  /// Add-½-smoothed column sums of layer `l` (the top-1 popularity), normalised.
  [[nodiscard]] std::vector<double> top1_popularity(std::uint32_t l) const {
    std::vector<double> p(n_experts, 0.5);
    for (std::uint32_t i = 0; i < n_experts; ++i)
      for (std::uint32_t j = 0; j < n_experts; ++j) p[j] += count(l, i, j);
    const double s = std::accumulate(p.begin(), p.end(), 0.0);
    for (double& x : p) x /= s;
    return p;
  }

  /// Throws `moekit::Error` naming the first inconsistency.
  void validate() const {
    MOEKIT_EXPECTS(n_layers > 0 && n_experts > 0, "TransitionStats: empty dimensions");
    MOEKIT_EXPECTS(transitions.size() == std::size_t{n_layers} * n_experts * n_experts,
                   "TransitionStats.transitions must be [n_layers × E × E]");
    MOEKIT_EXPECTS(popularity.size() == std::size_t{n_layers} * n_experts,
                   "TransitionStats.popularity must be [n_layers × E]");
    for (double c : transitions)
      MOEKIT_EXPECTS(std::isfinite(c) && c >= 0, "TransitionStats.transitions: negative or NaN");
    for (std::uint32_t l = 0; l < n_layers; ++l) {
      double s = 0;
      for (std::uint32_t e = 0; e < n_experts; ++e) {
        const double p = popularity[std::size_t{l} * n_experts + e];
        MOEKIT_EXPECTS(std::isfinite(p) && p > 0, "TransitionStats.popularity must be > 0");
        s += p;
      }
      MOEKIT_EXPECTS(std::abs(s - 1) < 1e-6, "TransitionStats.popularity rows must sum to 1");
    }
  }

  /// From a [L, E, E] transition-count array and, optionally, a [L, E] popularity array (counts
  /// or shares; add-½ smoothed and normalised). Without one, popularity = top-1 popularity.
  [[nodiscard]] static TransitionStats from_arrays(const NpyArray& trans, const NpyArray* pop,
                                                   std::string origin) {
    MOEKIT_EXPECTS(trans.shape.size() == 3 && trans.shape[1] == trans.shape[2] &&
                       trans.shape[0] > 0 && trans.shape[1] > 0,
                   "TransitionStats: transitions of '" + origin + "' must be [L, E, E]");
    TransitionStats s;
    s.n_layers = static_cast<std::uint32_t>(trans.shape[0]);
    s.n_experts = static_cast<std::uint32_t>(trans.shape[1]);
    s.transitions = trans.data;
    s.origin = std::move(origin);
    for (double c : s.transitions)
      MOEKIT_EXPECTS(std::isfinite(c) && c >= 0,
                     "TransitionStats: '" + s.origin + "' holds a negative or NaN count");
    if (pop) {
      MOEKIT_EXPECTS(
          pop->shape.size() == 2 && pop->shape[0] == s.n_layers && pop->shape[1] == s.n_experts,
          "TransitionStats: popularity of '" + s.origin + "' must be [L, E]");
      s.popularity.resize(pop->data.size());
      for (std::uint32_t l = 0; l < s.n_layers; ++l) {
        double sum = 0;
        for (std::uint32_t e = 0; e < s.n_experts; ++e) {
          const double v = pop->data[std::size_t{l} * s.n_experts + e];
          MOEKIT_EXPECTS(std::isfinite(v) && v >= 0,
                         "TransitionStats: popularity of '" + s.origin + "' negative or NaN");
          sum += v;
        }
        MOEKIT_EXPECTS(sum > 0, "TransitionStats: popularity row of '" + s.origin + "' is 0");
        // A floor of 1e-6 of the mean share keeps unseen experts possible but rare.
        const double eps = 1e-6 * sum / s.n_experts;
        double total = 0;
        for (std::uint32_t e = 0; e < s.n_experts; ++e)
          total += s.popularity[std::size_t{l} * s.n_experts + e] =
              pop->data[std::size_t{l} * s.n_experts + e] + eps;
        for (std::uint32_t e = 0; e < s.n_experts; ++e)
          s.popularity[std::size_t{l} * s.n_experts + e] /= total;
      }
    } else {
      s.popularity.resize(std::size_t{s.n_layers} * s.n_experts);
      for (std::uint32_t l = 0; l < s.n_layers; ++l) {
        const auto p = s.top1_popularity(l);
        std::copy(p.begin(), p.end(), s.popularity.begin() + std::ptrdiff_t{l} * s.n_experts);
      }
    }
    s.validate();
    return s;
  }

  /// A made-up table: per layer a Zipf(`zipf_s`) popularity over a seeded random permutation of
  /// the experts, and transitions P(j | i) = stay·[i = j] + (1 − stay)·pop(j), scaled to
  /// `tokens` counts per layer. For models without published statistics.
  [[nodiscard]] static TransitionStats parametric(std::uint32_t n_layers, std::uint32_t n_experts,
                                                  double zipf_s, double stay, std::uint64_t seed,
                                                  double tokens = 10000) {
    MOEKIT_EXPECTS(n_layers > 0 && n_experts > 0, "TransitionStats::parametric: empty dims");
    MOEKIT_EXPECTS(zipf_s >= 0 && std::isfinite(zipf_s), "parametric: zipf_s must be >= 0");
    MOEKIT_EXPECTS(stay >= 0 && stay < 1, "parametric: stay must be in [0, 1)");
    TransitionStats s;
    s.n_layers = n_layers;
    s.n_experts = n_experts;
    s.is_parametric = true;
    s.origin = "parametric: Zipf s=" + std::to_string(zipf_s) +
               ", self-transition=" + std::to_string(stay) + ", seed=" + std::to_string(seed);
    s.transitions.resize(std::size_t{n_layers} * n_experts * n_experts);
    s.popularity.resize(std::size_t{n_layers} * n_experts);
    std::mt19937_64 rng(seed);
    for (std::uint32_t l = 0; l < n_layers; ++l) {
      std::vector<std::uint32_t> perm(n_experts);
      std::iota(perm.begin(), perm.end(), 0u);
      for (std::uint32_t i = n_experts - 1; i > 0; --i)  // Fisher–Yates with our own draw
        std::swap(perm[i], perm[rng() % (i + 1)]);
      double total = 0;
      for (std::uint32_t r = 0; r < n_experts; ++r) total += std::pow(r + 1.0, -zipf_s);
      double* pop = s.popularity.data() + std::size_t{l} * n_experts;
      for (std::uint32_t r = 0; r < n_experts; ++r)
        pop[perm[r]] = std::pow(r + 1.0, -zipf_s) / total;
      for (std::uint32_t i = 0; i < n_experts; ++i)
        for (std::uint32_t j = 0; j < n_experts; ++j)
          s.transitions[(std::size_t{l} * n_experts + i) * n_experts + j] =
              tokens * pop[i] * ((i == j ? stay : 0.0) + (1 - stay) * pop[j]);
    }
    s.validate();
    return s;
  }
};

/// A model the generator knows: dimensions and which statistics drive it.
struct SyntheticModel {
  std::string name;
  TraceDims dims;
  std::string transitions_file;  ///< in the stats directory; empty = parametric
  std::string popularity_file;   ///< optional [L, E] popularity
};

/// The models with presets: Qwen1.5-MoE-A2.7B (24 layers, 60 experts, top-4), Switch-base-128
/// (6 MoE layers, top-1), Mixtral-8x7B (32, 8, top-2), DeepSeek-MoE-16B (27 MoE layers, 64
/// experts, top-6; parametric, no statistics published).
inline std::vector<SyntheticModel> synthetic_models() {
  return {
      {"qwen1.5-moe",
       {.n_layers = 24, .n_experts = 60, .top_k = 4},
       "qwen-top1-transition.npy",
       ""},
      {"switch-base-128",
       {.n_layers = 6, .n_experts = 128, .top_k = 1},
       "switch-top1-transition.npy",
       ""},
      {"mixtral-8x7b",
       {.n_layers = 32, .n_experts = 8, .top_k = 2},
       "mixtral-top1-transition.npy",
       "expert_activation_counts.npy"},
      {"deepseek-moe-16b", {.n_layers = 27, .n_experts = 64, .top_k = 6}, "", ""},
  };
}

/// Parameters of the DeepSeek parametric table [choice]: Zipf exponent 0.7 and self-transition
/// share 0.12, both measured on the Qwen1.5-MoE statistics (the closest fine-grained model:
/// fitted log-log slope of the sorted top-1 shares −0.70, diagonal share of the counts 0.117).
inline constexpr double deepseek_zipf_s = 0.7;
inline constexpr double deepseek_self_transition = 0.12;

/// Looks a model up by name; throws listing the known names.
[[nodiscard]] inline SyntheticModel synthetic_model(std::string_view name) {
  std::string known;
  for (auto& m : synthetic_models()) {
    if (m.name == name) return m;
    known += " " + m.name;
  }
  ::moekit::detail::fail(ErrorKind::invalid_argument,
                         "unknown synthetic model '" + std::string(name) + "'; known:" + known);
}

/// Loads the statistics of `model` from `stats_dir` (the repository's data/stats), or builds the
/// parametric table when the model has none. Checks the arrays against the model's dimensions.
[[nodiscard]] inline TransitionStats load_transition_stats(const SyntheticModel& model,
                                                           const std::string& stats_dir) {
  if (model.transitions_file.empty())
    return TransitionStats::parametric(model.dims.n_layers, model.dims.n_experts, deepseek_zipf_s,
                                       deepseek_self_transition, 0x5eed);
  const std::string tpath = stats_dir + "/" + model.transitions_file;
  const NpyArray t = read_npy(tpath);
  NpyArray p;
  if (!model.popularity_file.empty()) p = read_npy(stats_dir + "/" + model.popularity_file);
  TransitionStats s =
      TransitionStats::from_arrays(t, model.popularity_file.empty() ? nullptr : &p, tpath);
  MOEKIT_EXPECTS(s.n_layers == model.dims.n_layers && s.n_experts == model.dims.n_experts,
                 "load_transition_stats: '" + tpath + "' does not match model '" + model.name +
                     "' dimensions");
  return s;
}

/// What to generate.
struct SyntheticConfig {
  std::uint32_t top_k = 0;  ///< experts per token (≤ n_experts)
  std::size_t sequences = 1;
  std::size_t prefill_tokens = 0;   ///< per sequence
  std::size_t decode_tokens = 128;  ///< per sequence
  std::uint64_t seed = 0;
  double dirichlet_alpha = 1.0;  ///< concentration of the weight draw (1: flat Dirichlet)
  std::string label = "trace";   ///< appended to the "synthetic:" name
};

namespace detail {

/// Deterministic transforms of a mt19937_64 stream (std distributions differ across libraries).
class SyntheticRng {
 public:
  explicit SyntheticRng(std::uint64_t seed) : g_(seed) {}
  double uniform() noexcept { return double(g_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform_open() noexcept {                                      // (0, 1)
    double u;
    do u = uniform();
    while (u == 0.0);
    return u;
  }
  double normal() noexcept {  // Box–Muller, one value per call
    const double u1 = uniform_open(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  double gamma(double alpha) noexcept {  // Marsaglia & Tsang (2000)
    if (alpha < 1.0) return gamma(alpha + 1.0) * std::pow(uniform_open(), 1.0 / alpha);
    const double d = alpha - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x, v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = uniform_open();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
    }
  }
  /// Index drawn with probability ∝ w[i] among entries with !taken[i]; `total` = their sum.
  std::uint32_t pick(const double* w, std::uint32_t n, double total, const char* taken) noexcept {
    double r = uniform() * total;
    std::uint32_t last = n;
    for (std::uint32_t i = 0; i < n; ++i) {
      if (taken && taken[i]) continue;
      last = i;
      if (r < w[i]) return i;
      r -= w[i];
    }
    return last;  // rounding at the top end
  }

 private:
  std::mt19937_64 g_;
};

}  // namespace detail

/// Generates a synthetic trace from `stats` (see the file comment). Deterministic in `cfg.seed`.
[[nodiscard]] inline RoutingTrace generate_synthetic_trace(const TransitionStats& stats,
                                                           const SyntheticConfig& cfg) {
  stats.validate();
  const std::uint32_t L = stats.n_layers, E = stats.n_experts, k = cfg.top_k;
  MOEKIT_EXPECTS(k >= 1 && k <= E, "SyntheticConfig.top_k must be in [1, n_experts]");
  MOEKIT_EXPECTS(cfg.dirichlet_alpha > 0 && std::isfinite(cfg.dirichlet_alpha),
                 "SyntheticConfig.dirichlet_alpha must be > 0");
  MOEKIT_EXPECTS(cfg.sequences > 0 && cfg.prefill_tokens + cfg.decode_tokens > 0,
                 "SyntheticConfig: nothing to generate");
  const std::string name =
      std::string(stats.is_parametric ? "synthetic-parametric:" : "synthetic:") + cfg.label +
      " (seed " + std::to_string(cfg.seed) + ", from " + stats.origin + ")";
  RoutingTrace trace(TraceDims{.n_layers = L, .n_experts = E, .top_k = k}, name, true);
  trace.reserve_tokens(cfg.sequences * (cfg.prefill_tokens + cfg.decode_tokens));

  // Per layer: cumulative-free row tables and their sums, and the popularity used for ranks ≥ 1.
  std::vector<double> row_sum(std::size_t{L} * E), start(std::size_t{L} * E);
  std::vector<double> start_sum(L, 1.0);
  for (std::uint32_t l = 0; l < L; ++l) {
    const auto p = stats.top1_popularity(l);
    std::copy(p.begin(), p.end(), start.begin() + std::ptrdiff_t{l} * E);
    for (std::uint32_t i = 0; i < E; ++i) {
      double s = 0;
      for (std::uint32_t j = 0; j < E; ++j) s += stats.count(l, i, j);
      row_sum[std::size_t{l} * E + i] = s;
    }
  }

  detail::SyntheticRng rng(cfg.seed);
  std::vector<std::uint32_t> prev(L), ids(k);
  std::vector<float> w(k);
  std::vector<double> g(k);
  std::vector<char> taken(E, 0);
  for (std::size_t s = 0; s < cfg.sequences; ++s) {
    trace.begin_sequence("synthetic/" + std::to_string(s));
    const std::size_t n = cfg.prefill_tokens + cfg.decode_tokens;
    for (std::size_t t = 0; t < n; ++t) {
      const std::size_t tok =
          trace.append_token(t < cfg.prefill_tokens ? Phase::prefill : Phase::decode);
      for (std::uint32_t l = 0; l < L; ++l) {
        std::uint32_t top;
        const double rs = t == 0 ? 0.0 : row_sum[std::size_t{l} * E + prev[l]];
        if (rs > 0)
          top = rng.pick(stats.transitions.data() + (std::size_t{l} * E + prev[l]) * E, E, rs,
                         nullptr);
        else
          top = rng.pick(start.data() + std::size_t{l} * E, E, start_sum[l], nullptr);
        prev[l] = top;
        ids[0] = top;
        const double* pop = stats.popularity.data() + std::size_t{l} * E;
        taken[top] = 1;
        for (std::uint32_t r = 1; r < k; ++r) {
          double left = 0;  // summed afresh: no drift from repeated subtraction
          for (std::uint32_t e = 0; e < E; ++e) left += taken[e] ? 0.0 : pop[e];
          const std::uint32_t e = rng.pick(pop, E, left, taken.data());
          ids[r] = e;
          taken[e] = 1;
        }
        for (std::uint32_t r = 0; r < k; ++r) taken[ids[r]] = 0;
        double sum = 0;
        for (std::uint32_t r = 0; r < k; ++r) sum += g[r] = rng.gamma(cfg.dirichlet_alpha);
        std::sort(g.begin(), g.end(), std::greater<>());
        for (std::uint32_t r = 0; r < k; ++r) w[r] = static_cast<float>(g[r] / sum);
        // f32 rounding can leave equal neighbours out of order by one ulp: keep them sorted.
        for (std::uint32_t r = 1; r < k; ++r) w[r] = std::min(w[r], w[r - 1]);
        trace.set_route(tok, l, ids, w);
      }
    }
  }
  return trace;
}

/// Convenience: generate for a named model preset with statistics from `stats_dir`.
[[nodiscard]] inline RoutingTrace generate_synthetic_trace(std::string_view model,
                                                           const std::string& stats_dir,
                                                           SyntheticConfig cfg) {
  const SyntheticModel m = synthetic_model(model);
  if (cfg.top_k == 0) cfg.top_k = m.dims.top_k;
  if (cfg.label == "trace") cfg.label = m.name;
  return generate_synthetic_trace(load_transition_stats(m, stats_dir), cfg);
}

}  // namespace moekit::sim
