#pragma once
/// \file The papers' combinations as one-line aliases over a loader type.
///
/// A preset names components; their `Config` defaults are the papers' parameters
/// (`../design/papers` in the project notes, summarised per header), and the engine overrides any
/// of them by passing configured components to the pipeline's constructor:
///
///     presets::Hobbit<MyLoader> p(shape, {.expert_budget_bytes = b}, loader,
///                                 HobbitThresholdScorer({.rule = {.t1 = 0.5f}}),
///                                 StackedGatePredictor({.router_weights = w, ...}),
///                                 MultiDimPolicy({.w_lru = 0.4, ...}));
///
/// | preset   | scorer                  | predictor                | cache policy               | scheduler      | token policy    |
/// |----------|-------------------------|--------------------------|----------------------------|----------------|-----------------|
/// | Baseline | uniform (model prec.)   | none                     | LRU                        | on demand      | full top-k      |
/// | Hobbit   | T1/T2 cumulative gate   | stacked gates, p = 2     | multidimensional, 2 pools  | on demand      | full top-k      |
/// | Fate     | popularity (q4/q2)      | cross-layer gate, q=0.75 | shallow-favoring ARC       | ready first    | full top-k      |
/// | EdgeMoe  | static bit-width table  | activation path          | EdgeMoE eviction score     | on demand      | full top-k      |
/// | Mobile   | uniform                 | router replay            | LRU                        | on demand      | big-little γ=.7 |
/// | Fiddler  | uniform (model prec.)   | none                     | static popularity          | CPU vs copy    | full top-k      |
/// | NextUse  | T1/T2 cumulative gate   | none                     | expected next use (moekit) | on demand      | full top-k      |

#include "moekit/cache/arc.hpp"
#include "moekit/cache/edgemoe.hpp"
#include "moekit/cache/expected_next_use.hpp"
#include "moekit/cache/lru.hpp"
#include "moekit/cache/multidim.hpp"
#include "moekit/cache/shallow_favoring.hpp"
#include "moekit/cache/static_popularity.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/activation_path.hpp"
#include "moekit/predict/cross_layer_gate.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/predict/router_replay.hpp"
#include "moekit/predict/stacked_gate.hpp"
#include "moekit/sched/fiddler.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/sched/ready_first.hpp"
#include "moekit/score/big_little.hpp"
#include "moekit/score/full_top_k.hpp"
#include "moekit/score/hobbit_threshold.hpp"
#include "moekit/score/popularity.hpp"
#include "moekit/score/static_bitwidth.hpp"
#include "moekit/score/uniform.hpp"

namespace moekit::presets {

/// LRU cache, on-demand loads at the model's precision, no prediction.
template <class Loader>
using Baseline = OffloadPipeline<UniformScorer, NoPredictor, LruPolicy, Loader, OnDemandScheduler>;

/// HOBBIT (Tang et al., 2024): mixed-precision misses, stacked-gate prefetch, multidimensional cache.
template <class Loader>
using Hobbit = OffloadPipeline<HobbitThresholdScorer, StackedGatePredictor, MultiDimPolicy, Loader,
                               OnDemandScheduler>;

/// Fate (Fang et al., 2025): cross-layer gate prefetch, shallow-favoring per-layer ARC, q4/q2 I/O.
template <class Loader>
using Fate = OffloadPipeline<PopularityScorer, CrossLayerGatePredictor, ShallowFavoring<ArcPolicy>,
                             Loader, ReadyFirstScheduler>;

/// EdgeMoE (Yi et al., 2023): expert-wise bit widths, activation-path preloading, layer-aware eviction.
template <class Loader>
using EdgeMoe = OffloadPipeline<StaticBitwidthScorer, ActivationPathPredictor, EdgeMoePolicy,
                                Loader, OnDemandScheduler>;

/// MoBiLE (2025): big-little experts with confidence fallback and router-replay prefetch.
template <class Loader>
using Mobile = OffloadPipeline<UniformScorer, RouterReplayPredictor, LruPolicy, Loader,
                               OnDemandScheduler, BigLittlePolicy>;

/// Fiddler (Kamahori et al., 2025): static popular experts; misses run on the CPU when cheaper.
template <class Loader>
using Fiddler = OffloadPipeline<UniformScorer, NoPredictor, StaticPopularityPolicy, Loader,
                                FiddlerScheduler>;

/// moekit's own: HOBBIT's mixed-precision misses with the ExpectedNextUse cache, the online policy
/// closest to Belady on the real Mixtral traces (bench/RESULTS.md). No predictor, so it needs no
/// router weights or hidden states.
template <class Loader>
using NextUse = OffloadPipeline<HobbitThresholdScorer, NoPredictor, ExpectedNextUsePolicy, Loader,
                                OnDemandScheduler>;

}  // namespace moekit::presets
