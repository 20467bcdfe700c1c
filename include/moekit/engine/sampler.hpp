#pragma once
/// \file Sampler: picks the next token from logits — greedy (temperature 0), or softmax at a
/// temperature restricted to the smallest set of top tokens whose probability reaches top_p
/// (nucleus sampling), drawn with a seeded std::mt19937_64 so runs are reproducible.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "moekit/error.hpp"

namespace moekit::engine {

/// Sampling settings.
struct SamplerConfig {
  float temperature = 0.8f;  ///< 0 = greedy (argmax)
  float top_p = 0.95f;       ///< nucleus mass in (0, 1]; 1 = no truncation
  std::uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(SamplerConfig c) : cfg_(c), rng_(c.seed) {
    MOEKIT_EXPECTS(c.temperature >= 0 && std::isfinite(c.temperature),
                   "--temp must be a finite number >= 0");
    MOEKIT_EXPECTS(c.top_p > 0 && c.top_p <= 1, "--top-p must be in (0, 1]");
  }

  /// Index of the largest logit (the first one on ties, as torch.argmax).
  static std::uint32_t argmax(std::span<const float> logits) noexcept {
    return static_cast<std::uint32_t>(std::max_element(logits.begin(), logits.end()) -
                                      logits.begin());
  }

  std::uint32_t sample(std::span<const float> logits) {
    MOEKIT_EXPECTS(!logits.empty(), "Sampler: empty logits");
    if (cfg_.temperature == 0) return argmax(logits);
    const std::size_t n = logits.size();
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0u);
    std::sort(order_.begin(), order_.end(),
              [&](std::uint32_t a, std::uint32_t b) { return logits[a] > logits[b]; });
    probs_.resize(n);
    const float top = logits[order_[0]];
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i)
      sum += probs_[i] = std::exp((logits[order_[i]] - top) / cfg_.temperature);
    std::size_t keep = n;
    double mass = 0;
    for (std::size_t i = 0; i < n; ++i) {
      mass += probs_[i] / sum;
      if (mass >= cfg_.top_p) {
        keep = i + 1;
        break;
      }
    }
    std::discrete_distribution<std::size_t> pick(probs_.begin(), probs_.begin() + keep);
    return order_[pick(rng_)];
  }

  [[nodiscard]] const SamplerConfig& config() const noexcept { return cfg_; }

 private:
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
  std::vector<std::uint32_t> order_;
  std::vector<double> probs_;
};

}  // namespace moekit::engine
