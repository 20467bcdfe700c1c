#pragma once
/// \file PopularityScorer: Fate's popularity-aware hybrid precision for prefill.
///
/// Algorithm (Fang et al., "Fate: Fast Edge Inference of Mixture-of-Experts Models via Cross-Layer
/// Gate", §4.5, Fig. 9–10): in a prefill forward the experts a layer needs are ranked by
/// popularity, the number of tokens that selected them (descending; ties → smaller id is more
/// popular). The least popular fraction p of them, floor(p·|A|) experts, moves at int2 and the rest
/// at int4: unpopular experts serve few tokens, so their precision barely moves accuracy (p = 25 %
/// keeps Qwen1.5-MoE within 1 % on MMLU). Decode uses int4 only. The paper loads mispredicted
/// experts at int2 in both stages (§5.3): with `on_demand_precision` set, every demand of either
/// stage asks for it, so a resident or prefetched copy at any precision serves it and a miss loads
/// at it; the prefill split then decides only what a predictor scoring with this scorer moves.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// Fate's scorer: prefill by popularity (bottom `int2_fraction` at `low`), decode at one precision.
class PopularityScorer {
 public:
  static constexpr std::string_view name = "popularity";
  struct Config {
    double int2_fraction = 0.25;     ///< least popular share of a prefill layer at `low`
    Precision high = Precision::q4;  ///< precision of the popular prefill experts
    Precision low = Precision::q2;   ///< precision of the least popular prefill experts
    Precision decode_precision = Precision::q4;  ///< every decode expert
    /// Not `skip`: what every demand asks for instead, in decode and prefill, so that a resident
    /// or prefetched copy at a higher precision serves it and a miss loads at this one (Fate §5.3:
    /// int2 for mispredictions, in both stages).
    Precision on_demand_precision = Precision::skip;
  };
  PopularityScorer() = default;
  explicit PopularityScorer(Config c) : cfg_(c) {
    MOEKIT_EXPECTS(cfg_.int2_fraction >= 0.0 && cfg_.int2_fraction <= 1.0,
                   "PopularityScorer: Config.int2_fraction must be in [0, 1] (got " +
                       std::to_string(cfg_.int2_fraction) + ")");
    MOEKIT_EXPECTS(cfg_.high != Precision::skip && cfg_.low != Precision::skip &&
                       cfg_.decode_precision != Precision::skip,
                   "PopularityScorer: precisions must be stored formats, not skip");
  }

  void score(const LayerContext& ctx, const GateView&, std::span<const ExpertDemand> demands,
             std::span<Precision> out) noexcept {
    // Misses of either stage load at the on-demand precision; a decode step (a multi-request
    // batch too, Fate §6 A23) otherwise at the decode precision.
    if (cfg_.on_demand_precision != Precision::skip || ctx.phase == Phase::decode) {
      const Precision p = cfg_.on_demand_precision == Precision::skip ? cfg_.decode_precision
                                                                      : cfg_.on_demand_precision;
      for (std::size_t i = 0; i < demands.size(); ++i) out[i] = p;
      return;
    }
    const auto n_low = static_cast<std::size_t>(
        std::floor(cfg_.int2_fraction * static_cast<double>(demands.size())));
    if (order_.capacity() < demands.size())
      order_.reserve(std::max<std::size_t>(demands.size(), 64));
    order_.resize(demands.size());
    for (std::size_t i = 0; i < demands.size(); ++i) order_[i] = static_cast<std::uint32_t>(i);
    std::sort(order_.begin(), order_.end(), [&](std::uint32_t a, std::uint32_t b) {
      const ExpertDemand &x = demands[a], &y = demands[b];
      return x.n_tokens != y.n_tokens ? x.n_tokens > y.n_tokens : x.expert < y.expert;
    });
    for (std::size_t r = 0; r < order_.size(); ++r)
      out[order_[r]] = r + n_low >= order_.size() ? cfg_.low : cfg_.high;
  }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  Config cfg_{};
  std::vector<std::uint32_t> order_;
};
static_assert(Scorer<PopularityScorer>);

}  // namespace moekit
