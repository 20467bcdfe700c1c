#pragma once
/// \file RecallNoise: a predictor's errors modelled on the true routing, shared by the oracle
/// stand-ins (NoisyOraclePredictor over a script, LookaheadOraclePredictor over a replayed trace).
///
/// Given the distinct experts one later layer call will use (sorted by id) and the precision each
/// will be asked at, `draw` keeps each true expert with probability `recall`, otherwise predicts
/// a uniformly random expert of that layer that the call does not use (and that is not already
/// predicted): a wrong guess costs a transfer, exactly as a real predictor's error does, and it
/// carries the precision of the true expert it replaces. `set_size` > 0 pads the prediction with
/// further random wrong experts (at `pad_precision`) up to that many (Fate's percentile rule
/// predicts ceil((1 − q)·E) experts, more than the k it needs). When every expert of the layer is
/// used, a dropped expert is simply not predicted.
///
/// `draw_ranked` is the per-token, per-rank variant (HOBBIT's stand-in): one token's actual top-k
/// by descending weight, the actual rank-r expert kept with the recall of its rank; the kept ones
/// come out first in their actual order, then one wrong guess per dropped expert (an expert the
/// call does not use), so the caller can rank the prediction as a gate would: a wrong guess scores
/// below the actual experts it kept (the predicted logits track the actual ones).
///
/// Randomness: every decision is a hash of (seed, call, position), not a draw from a stream, so a
/// call's predictions do not depend on how often `draw` ran before and a seed always gives the
/// same predictions. recall = 1 keeps every true expert; recall = 0 never predicts a used expert
/// while a wrong one exists.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "moekit/core/precision.hpp"

namespace moekit {

/// The noise model of the oracle stand-ins (see the file comment).
class RecallNoise {
 public:
  using Pick = std::pair<std::uint32_t, Precision>;

  RecallNoise(std::uint64_t seed, std::uint32_t n_experts) : seed_(seed), used_(n_experts, 0) {}

  /// The predictions for call `call` whose true experts are `experts` (ids < n_experts, sorted
  /// ascending, distinct) asked at `precisions` (parallel). The result lives until the next draw.
  const std::vector<Pick>& draw(std::uint64_t call, std::span<const std::uint32_t> experts,
                                std::span<const Precision> precisions, double recall,
                                std::uint32_t set_size, Precision pad_precision) {
    const auto n_experts = static_cast<std::uint32_t>(used_.size());
    picks_.clear();
    std::uint32_t free_left = n_experts;
    for (std::uint32_t e : experts) used_[e] = 1, --free_left;
    for (std::size_t j = 0; j < experts.size(); ++j) {
      // recall 1 keeps all (unit() < 1), recall 0 none (unit() >= 0).
      if (unit(hash(call, j, 0x6b656570ull)) < recall) {
        picks_.push_back({experts[j], precisions[j]});
        continue;
      }
      const std::uint32_t w = wrong(call, j, free_left);
      if (w < n_experts) picks_.push_back({w, precisions[j]});
    }
    for (std::uint64_t j = experts.size(); picks_.size() < set_size; ++j) {
      const std::uint32_t w = wrong(call, j, free_left);
      if (w == n_experts) break;
      picks_.push_back({w, pad_precision});
    }
    std::fill(used_.begin(), used_.end(), std::uint8_t{0});
    return picks_;
  }

  /// Token `token` of call `call`: `ranked` its actual experts by descending weight (< n_experts,
  /// distinct), `call_experts` every expert the call's tokens use (a wrong guess is none of them),
  /// `recall_by_rank[r]` the recall of rank r (the last entry serves the deeper ranks). `out`
  /// receives the kept experts in `ranked` order, then the wrong guesses (fewer when the call uses
  /// every expert of the layer).
  void draw_ranked(std::uint64_t call, std::uint32_t token, std::span<const std::uint32_t> ranked,
                   std::span<const std::uint32_t> call_experts,
                   std::span<const double> recall_by_rank, std::vector<std::uint32_t>& out) {
    const auto n_experts = static_cast<std::uint32_t>(used_.size());
    out.clear();
    std::uint32_t free_left = n_experts, dropped = 0;
    for (std::uint32_t e : call_experts) free_left -= used_[e] == 0, used_[e] = 1;
    for (std::size_t r = 0; r < ranked.size(); ++r) {
      const double recall = recall_by_rank[std::min(r, recall_by_rank.size() - 1)];
      const std::uint64_t j = (std::uint64_t{token} << 8) | r;  // k <= 64 (HobbitRule::max_k)
      if (unit(hash(call, j, 0x72616e6bull)) < recall)
        out.push_back(ranked[r]);
      else
        ++dropped;
    }
    for (std::uint64_t r = 0; dropped > 0; ++r, --dropped) {
      const std::uint32_t w = wrong(call, (std::uint64_t{token} << 8) | r, free_left);
      if (w == n_experts) break;
      out.push_back(w);
    }
    std::fill(used_.begin(), used_.end(), std::uint8_t{0});
  }

  [[nodiscard]] std::uint32_t n_experts() const noexcept {
    return static_cast<std::uint32_t>(used_.size());
  }

 private:
  // splitmix64 finaliser: a well-mixed 64-bit hash.
  static std::uint64_t mix(std::uint64_t x) noexcept {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  [[nodiscard]] std::uint64_t hash(std::uint64_t call, std::uint64_t j, std::uint64_t salt) const {
    return mix(mix(mix(seed_ ^ salt) ^ call) ^ j);
  }
  static double unit(std::uint64_t h) noexcept { return double(h >> 11) * 0x1.0p-53; }

  // A random expert of the layer not marked in used_ (marks it); n_experts if none is left.
  std::uint32_t wrong(std::uint64_t call, std::uint64_t j, std::uint32_t& free_left) {
    const auto n_experts = static_cast<std::uint32_t>(used_.size());
    if (free_left == 0) return n_experts;
    std::uint64_t r = hash(call, j, 0x77726f6e67ull) % free_left;
    for (std::uint32_t e = 0; e < n_experts; ++e) {
      if (used_[e]) continue;
      if (r-- == 0) {
        used_[e] = 1;
        --free_left;
        return e;
      }
    }
    return n_experts;  // unreachable: free_left counts the unmarked experts
  }

  std::uint64_t seed_;
  std::vector<std::uint8_t> used_;
  std::vector<Pick> picks_;
};

}  // namespace moekit
