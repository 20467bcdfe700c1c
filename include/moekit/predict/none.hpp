#pragma once
/// \file NoPredictor: load on demand only (no prefetching).

#include <string_view>

#include "moekit/core/concepts.hpp"

namespace moekit {

/// Predicts nothing.
struct NoPredictor {
  static constexpr std::string_view name = "none";
  void predict(const LayerContext&, const GateView&, const ResidencyView&,
               PrefetchList&) const noexcept {}
  void observe(const LayerContext&, const GateView&) const noexcept {}
};
static_assert(Predictor<NoPredictor>);

}  // namespace moekit
