#pragma once
/// \file EdgeMoE's offline expert-wise bit-width search.
///
/// Algorithm (Yi et al., "EdgeMoE: Empowering Sparse Large Language Models on Mobile Devices",
/// §III-B "Selecting expert-wise bitwidths"; spec §2.3–2.4):
///  1. Bounds: evaluate the model with every expert at each candidate precision (ascending bits,
///     e.g. q2, q4, q8, f32). b_hi = the lowest precision whose loss ≤ P; b_lo = the candidate just
///     below it. If even the lowest meets P, every expert goes there.
///  2. Importance: an expert is more important if quantizing it alone to b_lo (all others at b_hi)
///     loses more accuracy. Experts are ordered least important first (ties → (layer, expert)).
///  3. K search: the first K experts of that order at b_lo, the rest at b_hi; K* = the largest K
///     whose loss ≤ P, found by galloping (K = 1, 2, 4, …) and then bisection. Only evaluated
///     K are ever returned, so a non-monotone loss cannot yield an unverified table.
/// The loss is whatever the engine's evaluator measures (EdgeMoE: relative % drop of the task
/// metric; also KL divergence or perplexity increase on wikitext-2), in the unit of `loss_budget`.
/// Cost: |candidates| + N + O(log N) evaluations.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moekit/core/expert_key.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/score/static_bitwidth.hpp"

namespace moekit::tools {

/// Accuracy loss of the model run with a precision per expert (the engine provides it).
using PrecisionEvaluator = std::function<double(const PrecisionTable&)>;

/// Settings of `bitwidth_search`.
struct BitwidthSearchConfig {
  double loss_budget = 2.0;  ///< P: tolerated loss (EdgeMoE default: 2 % relative)
  /// Candidate precisions, ascending in bits (EdgeMoE: INT2, INT4, INT8, FP32).
  std::vector<Precision> candidates{Precision::q2, Precision::q4, Precision::q8, Precision::f32};
  /// Optional precomputed importance per expert (index layer·E + expert); empty = measure it
  /// with N evaluations (one expert at b_lo, the others at b_hi).
  std::vector<double> importance{};
};

/// What the search decided, and what it measured on the way.
struct BitwidthSearchResult {
  PrecisionTable table;                ///< the chosen precision per expert
  Precision low = Precision::q2;       ///< b_lo
  Precision high = Precision::q4;      ///< b_hi
  std::vector<double> uniform_loss;    ///< loss with every expert at candidates[i]
  std::vector<double> importance;      ///< per expert (layer·E + expert); empty if not needed
  std::vector<ExpertKey> order;        ///< least important first
  std::size_t k = 0;                   ///< experts at `low`
  double loss = 0.0;                   ///< evaluated loss of `table`
  std::size_t evaluations = 0;         ///< evaluator calls in total
  std::size_t search_evaluations = 0;  ///< of which in the K search
};

namespace detail {

inline void check_bitwidth_search(std::uint32_t n_layers, std::uint32_t n_experts,
                                  const PrecisionEvaluator& evaluate,
                                  const BitwidthSearchConfig& cfg) {
  MOEKIT_EXPECTS(n_layers > 0 && n_experts > 0, "bitwidth_search: empty model shape");
  MOEKIT_EXPECTS(static_cast<bool>(evaluate), "bitwidth_search: no evaluator given");
  MOEKIT_EXPECTS(!cfg.candidates.empty(), "bitwidth_search: Config.candidates is empty");
  MOEKIT_EXPECTS(std::isfinite(cfg.loss_budget) && cfg.loss_budget >= 0.0,
                 "bitwidth_search: Config.loss_budget must be finite and >= 0");
  for (std::size_t i = 0; i < cfg.candidates.size(); ++i) {
    MOEKIT_EXPECTS(cfg.candidates[i] != Precision::skip,
                   "bitwidth_search: Config.candidates must be stored precisions");
    MOEKIT_EXPECTS(i == 0 || bits(cfg.candidates[i - 1]) < bits(cfg.candidates[i]),
                   "bitwidth_search: Config.candidates must be ascending in bits");
  }
  const std::size_t N = std::size_t{n_layers} * n_experts;
  MOEKIT_EXPECTS(cfg.importance.empty() || cfg.importance.size() == N,
                 "bitwidth_search: Config.importance must be empty or hold n_layers x n_experts "
                 "values");
}

/// Step 1: the loss with every expert at each candidate, ascending, up to the first that meets
/// the budget. Returns that candidate's index (`candidates.size()` when none does).
template <class Eval>
std::size_t uniform_bound(std::uint32_t n_layers, std::uint32_t n_experts,
                          const BitwidthSearchConfig& cfg, Eval& eval, BitwidthSearchResult& r) {
  for (std::size_t i = 0; i < cfg.candidates.size(); ++i) {
    r.uniform_loss.push_back(eval(PrecisionTable(n_layers, n_experts, cfg.candidates[i])));
    // Higher precisions lose no more than this one: no need to evaluate them.
    if (r.uniform_loss.back() <= cfg.loss_budget) return i;
  }
  return cfg.candidates.size();
}

/// Step 2: each expert's importance (given, or the loss with it alone at `r.low` and the others
/// at `r.high`), and the experts least important first.
template <class Eval>
void order_by_importance(std::uint32_t n_layers, std::uint32_t n_experts,
                         const BitwidthSearchConfig& cfg, Eval& eval, BitwidthSearchResult& r) {
  r.importance = cfg.importance;
  if (r.importance.empty()) {
    r.importance.resize(std::size_t{n_layers} * n_experts);
    PrecisionTable t(n_layers, n_experts, r.high);
    for (std::uint32_t l = 0; l < n_layers; ++l)
      for (std::uint32_t e = 0; e < n_experts; ++e) {
        t.set({l, e}, r.low);
        r.importance[std::size_t{l} * n_experts + e] = eval(t);
        t.set({l, e}, r.high);
      }
  }
  for (std::uint32_t l = 0; l < n_layers; ++l)
    for (std::uint32_t e = 0; e < n_experts; ++e) r.order.push_back({l, e});
  std::stable_sort(r.order.begin(), r.order.end(), [&](ExpertKey a, ExpertKey b) {
    return r.importance[std::size_t{a.layer} * n_experts + a.expert] <
           r.importance[std::size_t{b.layer} * n_experts + b.expert];
  });
}

/// Step 3: the largest K whose table (the first K of `r.order` at `r.low`, the rest at
/// `r.high`) meets the budget, by galloping and then bisection between a verified-feasible and an
/// infeasible K. `k0_loss` is the loss of K = 0 (every expert at `r.high`).
template <class Eval>
void search_k(std::uint32_t n_layers, std::uint32_t n_experts, double loss_budget, double k0_loss,
              Eval& eval, BitwidthSearchResult& r) {
  const std::size_t N = std::size_t{n_layers} * n_experts;
  auto table_for = [&](std::size_t k) {
    PrecisionTable t(n_layers, n_experts, r.high);
    for (std::size_t i = 0; i < k; ++i) t.set(r.order[i], r.low);
    return t;
  };
  const std::size_t before = r.evaluations;
  std::size_t good = 0, bad = N + 1;
  double good_loss = k0_loss;
  for (std::size_t k = 1;; k *= 2) {
    const std::size_t kc = std::min(k, N);
    const double loss = eval(table_for(kc));
    if (loss <= loss_budget) {
      good = kc, good_loss = loss;
      if (kc == N) break;
    } else {
      bad = kc;
      break;
    }
  }
  while (bad <= N && bad - good > 1) {
    const std::size_t mid = good + (bad - good) / 2;
    const double loss = eval(table_for(mid));
    if (loss <= loss_budget)
      good = mid, good_loss = loss;
    else
      bad = mid;
  }
  r.search_evaluations = r.evaluations - before;
  r.k = good;
  r.loss = good_loss;
  r.table = table_for(good);
}

}  // namespace detail

/// Runs the search for a model of `n_layers` × `n_experts` routed experts.
[[nodiscard]] inline BitwidthSearchResult bitwidth_search(std::uint32_t n_layers,
                                                          std::uint32_t n_experts,
                                                          const PrecisionEvaluator& evaluate,
                                                          const BitwidthSearchConfig& cfg = {}) {
  detail::check_bitwidth_search(n_layers, n_experts, evaluate, cfg);
  BitwidthSearchResult r;
  auto eval = [&](const PrecisionTable& t) {
    ++r.evaluations;
    const double loss = evaluate(t);
    MOEKIT_EXPECTS(!std::isnan(loss), "bitwidth_search: the evaluator returned NaN");
    return loss;
  };
  const std::size_t hi = detail::uniform_bound(n_layers, n_experts, cfg, eval, r);
  if (hi == cfg.candidates.size())
    throw Error(ErrorKind::invalid_argument,
                "bitwidth_search: no candidate precision meets the loss budget " +
                    std::to_string(cfg.loss_budget) + " even with every expert at " +
                    std::string(name(cfg.candidates.back())) + " (loss " +
                    std::to_string(r.uniform_loss.back()) + ")");
  r.high = cfg.candidates[hi];
  if (hi == 0) {  // even the lowest precision meets the budget
    r.low = r.high;
    r.table = PrecisionTable(n_layers, n_experts, r.high);
    r.k = std::size_t{n_layers} * n_experts;
    r.loss = r.uniform_loss[0];
    return r;
  }
  r.low = cfg.candidates[hi - 1];
  detail::order_by_importance(n_layers, n_experts, cfg, eval, r);
  detail::search_k(n_layers, n_experts, cfg.loss_budget, r.uniform_loss[hi], eval, r);
  return r;
}

}  // namespace moekit::tools
