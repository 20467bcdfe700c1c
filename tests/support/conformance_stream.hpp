#pragma once
// A routing stream for the typed conformance suites of the pipeline's components (predictors,
// scorers): per sequence a prefill forward of several tokens, then decode tokens, through every
// layer, with skewed random routing, router logits and gate inputs, and the random routers the
// gate-based predictors read. Deterministic for a seed.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "moekit/core/gate_view.hpp"
#include "moekit/core/layer_context.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/plan.hpp"

namespace moekit::test {

/// One layer call: its context and the arrays its GateView points to.
struct StreamCall {
  LayerContext ctx{};
  std::vector<std::uint32_t> experts;  ///< [n_tokens × k]
  std::vector<float> weights;          ///< [n_tokens × k]
  std::vector<float> logits;           ///< [n_tokens × n_experts]
  std::vector<float> hidden;           ///< [n_tokens × hidden]
  std::uint32_t k = 0;
  std::uint32_t n_experts = 0;

  [[nodiscard]] GateView gate() const {
    return GateView{ctx.n_tokens, k, n_experts, logits, experts, weights, hidden};
  }
  /// The distinct experts of the call, sorted (an oracle's script entry).
  [[nodiscard]] std::vector<std::uint32_t> distinct_experts() const {
    std::vector<std::uint32_t> v = experts;
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  }
};

struct ConformanceStream {
  ModelShape shape;
  std::vector<StreamCall> calls;
  std::vector<float> routers;  ///< [n_layers × n_experts × hidden], random
  std::uint32_t gate_hidden = 16;
};

/// `sequences` sequences of a `prefill`-token forward followed by `decode` one-token forwards.
inline ConformanceStream conformance_stream(const ModelShape& shape, std::uint32_t seed,
                                            std::uint32_t sequences = 2, std::uint32_t prefill = 3,
                                            std::uint32_t decode = 6) {
  ConformanceStream s{shape, {}, {}, 16};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  s.routers.resize(std::size_t{shape.n_layers} * shape.n_experts * s.gate_hidden);
  for (float& w : s.routers) w = normal(rng);
  // Per layer a fixed popularity: logits are the popularity plus noise.
  std::vector<float> bias(std::size_t{shape.n_layers} * shape.n_experts);
  for (float& b : bias) b = 2.0f * normal(rng);
  for (std::uint32_t q = 0; q < sequences; ++q) {
    std::uint64_t pos = 0;
    for (std::uint32_t f = 0; f <= decode; ++f) {
      const std::uint32_t n = f == 0 ? prefill : 1;
      for (std::uint32_t l = 0; l < shape.n_layers; ++l) {
        StreamCall c;
        c.ctx = LayerContext{l, shape.n_layers, pos, f == 0 ? Phase::prefill : Phase::decode, q, n};
        c.k = shape.top_k;
        c.n_experts = shape.n_experts;
        for (std::uint32_t t = 0; t < n; ++t) {
          std::vector<float> lg(shape.n_experts);
          for (std::uint32_t e = 0; e < shape.n_experts; ++e)
            lg[e] = bias[std::size_t{l} * shape.n_experts + e] + normal(rng);
          std::vector<std::uint32_t> order(shape.n_experts);
          for (std::uint32_t e = 0; e < shape.n_experts; ++e) order[e] = e;
          std::stable_sort(order.begin(), order.end(),
                           [&](std::uint32_t a, std::uint32_t b) { return lg[a] > lg[b]; });
          float sum = 0.0f;
          for (std::uint32_t j = 0; j < c.k; ++j) sum += std::exp(lg[order[j]] - lg[order[0]]);
          for (std::uint32_t j = 0; j < c.k; ++j) {
            c.experts.push_back(order[j]);
            c.weights.push_back(std::exp(lg[order[j]] - lg[order[0]]) / sum);
          }
          c.logits.insert(c.logits.end(), lg.begin(), lg.end());
          for (std::uint32_t h = 0; h < s.gate_hidden; ++h) c.hidden.push_back(normal(rng));
        }
        s.calls.push_back(std::move(c));
      }
      pos += n;
    }
  }
  return s;
}

/// The call's distinct experts with their token counts and weights, in first-seen order, as
/// OffloadPipeline hands them to a scorer.
inline std::vector<ExpertDemand> demands_of(const StreamCall& c) {
  std::vector<ExpertDemand> out;
  for (std::uint32_t t = 0; t < c.ctx.n_tokens; ++t)
    for (std::uint32_t j = 0; j < c.k; ++j) {
      const std::uint32_t e = c.experts[std::size_t{t} * c.k + j];
      const float w = c.weights[std::size_t{t} * c.k + j];
      auto it = std::find_if(out.begin(), out.end(),
                             [&](const ExpertDemand& d) { return d.expert == e; });
      if (it == out.end()) it = out.insert(out.end(), ExpertDemand{e, 0, 0.0f, 0.0f, j});
      ++it->n_tokens;
      it->weight_sum += w;
      it->max_weight = std::max(it->max_weight, w);
      it->best_rank = std::min(it->best_rank, j);
    }
  return out;
}

}  // namespace moekit::test
