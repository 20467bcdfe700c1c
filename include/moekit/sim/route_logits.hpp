#pragma once
/// \file Router logits made from a record's top-k, for traces that store none.
///
/// MoBiLE's router replay plans the big pass from the little pass's router logits (the top-K of
/// them). The shared Mixtral traces keep only each record's top-k experts and weights, so a plan
/// needs logits that a router could have produced for that record: `route_logits` gives each
/// selected expert the log of its weight (a softmax over the selected ones alone gives back the
/// weights) and every other expert a logit below the smallest selected one, ordered by id. Their
/// top-k is the record's experts in the record's order, which is all a plan reads of them; the
/// values of the others carry no information (a stand-in, stated where it is used).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/sim/trace.hpp"

namespace moekit::sim {

/// How far below the smallest selected logit the unselected experts start (natural log units:
/// they share e^-8 of the mass, at most, per expert).
inline constexpr float unselected_logit_gap = 8.0f;

/// Writes `out` [n_experts]: log(weight) at `experts`, below them the other experts by id.
/// Weights must be positive (a record's are, after `normalize_route`); a zero weight is clamped to
/// the smallest normal float.
inline void route_logits(std::span<const std::uint32_t> experts, std::span<const float> weights,
                         std::span<float> out) {
  MOEKIT_EXPECTS(experts.size() == weights.size() && experts.size() <= out.size(),
                 "route_logits: experts and weights differ in length or exceed n_experts");
  float lowest = std::numeric_limits<float>::infinity();
  for (float w : weights)
    lowest = std::min(lowest, std::log(std::max(w, std::numeric_limits<float>::min())));
  const float base = experts.empty() ? 0.0f : lowest - unselected_logit_gap;
  const float step = 1.0f / float(out.size());  // keeps the others distinct, below `base`
  for (std::size_t e = 0; e < out.size(); ++e) out[e] = base - step * float(e);
  for (std::size_t j = 0; j < experts.size(); ++j) {
    MOEKIT_EXPECTS(experts[j] < out.size(), "route_logits: expert id beyond n_experts");
    out[experts[j]] = std::log(std::max(weights[j], std::numeric_limits<float>::min()));
  }
}

/// A copy of `trace` whose every valid record carries `route_logits` of its experts and weights
/// (missing records keep NaN logits). A trace that stores logits is returned unchanged.
inline RoutingTrace with_route_logits(const RoutingTrace& trace) {
  if (trace.has_logits()) return trace;
  TraceDims dims = trace.dims();
  dims.has_logits = true;
  RoutingTrace out(dims, trace.name(), trace.synthetic());
  out.reserve_tokens(trace.token_count());
  std::vector<float> logits(dims.n_experts);
  for (std::size_t s = 0; s < trace.sequence_count(); ++s) {
    out.begin_sequence(trace.sequence_name(s));
    for (std::size_t t = 0; t < trace.sequence_length(s); ++t) {
      const std::size_t g = trace.global_token(s, t);
      const std::size_t o = out.append_token(trace.phase(g));
      for (std::uint32_t l = 0; l < dims.n_layers; ++l) {
        if (!trace.valid(g, l)) continue;
        route_logits(trace.experts(g, l), trace.weights(g, l), logits);
        out.set_route(o, l, trace.experts(g, l), trace.weights(g, l), logits, trace.hidden(g, l));
      }
    }
  }
  return out;
}

}  // namespace moekit::sim
