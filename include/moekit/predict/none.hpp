#pragma once
/// \file NoPredictor: load on demand only (no prefetching).

#include "moekit/core/concepts.hpp"

namespace moekit {

/// Predicts nothing.
struct NoPredictor {
  void predict(const LayerContext&, const GateView&, const ResidencyView&,
               PrefetchList&) const noexcept {}
  void observe(const LayerContext&, const GateView&) const noexcept {}
};
static_assert(Predictor<NoPredictor>);

}  // namespace moekit
