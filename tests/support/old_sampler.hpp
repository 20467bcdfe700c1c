#pragma once
// The sampler before issue 28 (include/moekit/engine/sampler.hpp at 6600da2), verbatim: a full
// sort of the vocabulary for every token. The reference the sampler's tests compare seeded tokens
// with, and the peer bench/engine/sampler.cpp times it against.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "moekit/engine/sampler.hpp"

namespace moekit::test {

class OldSampler {
 public:
  explicit OldSampler(engine::SamplerConfig c) : cfg_(c), rng_(c.seed) {}

  std::uint32_t sample(std::span<const float> logits) {
    if (cfg_.temperature == 0) return engine::Sampler::argmax(logits);
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

 private:
  engine::SamplerConfig cfg_;
  std::mt19937_64 rng_;
  std::vector<std::uint32_t> order_;
  std::vector<double> probs_;
};

}  // namespace moekit::test
