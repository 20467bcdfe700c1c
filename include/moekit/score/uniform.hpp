#pragma once
/// \file UniformScorer: every needed expert at one precision (the baseline's rule).

#include <span>
#include <string_view>

#include "moekit/core/concepts.hpp"

namespace moekit {

/// Runs every selected expert at `Config::precision`.
class UniformScorer {
 public:
  static constexpr std::string_view name = "uniform";
  struct Config {
    Precision precision = Precision::f16;  ///< precision of every expert
  };
  UniformScorer() = default;
  explicit UniformScorer(Config c) noexcept : cfg_(c) {}

  void score(const LayerContext&, const GateView&, std::span<const ExpertDemand> demands,
             std::span<Precision> out) const noexcept {
    for (std::size_t i = 0; i < demands.size(); ++i) out[i] = cfg_.precision;
  }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  Config cfg_{};
};
static_assert(Scorer<UniformScorer>);

}  // namespace moekit
