#pragma once
/// \file The papers' combinations as one-line aliases over a loader type.
///
/// A preset names components; the engine supplies the loader (memory, file, simulated) and the
/// run-time parameters through each component's `Config`. Components still being built are
/// marked "interim" below; the alias keeps its name and parameters when they land.

#include "moekit/cache/lru.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/full_top_k.hpp"
#include "moekit/score/uniform.hpp"

namespace moekit::presets {

/// LRU cache, on-demand loads at full precision, no prediction.
template <class Loader>
using Baseline = OffloadPipeline<UniformScorer, NoPredictor, LruPolicy, Loader, OnDemandScheduler>;

}  // namespace moekit::presets
