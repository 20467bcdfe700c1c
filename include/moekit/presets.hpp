#pragma once
/// \file The papers' combinations: the preset registry (`presets/registry.hpp`, one header per
/// preset in `presets/`) and each preset's pipeline as a one-line alias over a loader type.
///
/// A preset names components; their `Config` defaults are each the paper's value, the authors'
/// code's, or moekit's choice where the paper gives none (docs/presets.md marks which, and lists
/// what each preset runs and what stands in), and the engine overrides any of them by passing
/// configured components to the pipeline's constructor:
///
///     presets::Hobbit<MyLoader> p(shape, {.expert_budget_bytes = b}, loader,
///                                 HobbitThresholdScorer({.rule = {.t1 = 0.5f}}),
///                                 StackedGatePredictor({.router_weights = w, ...}),
///                                 MultiDimPolicy({.w_lru = 0.4, ...}));
///
/// | preset   | scorer                  | predictor                | cache policy               |
/// scheduler      | token policy    |
/// |----------|-------------------------|--------------------------|----------------------------|----------------|-----------------|
/// | Baseline | uniform (model prec.)   | none                     | LRU                        |
/// on demand      | full top-k      | | Hobbit   | T1/T2 cumulative gate   | stacked gates, p = 2
/// | multidimensional, 2 pools  | on demand      | full top-k      | | Fate     | popularity
/// (q4/q2)      | cross-layer gate, q=0.75 | shallow-favoring ARC       | ready first    | full
/// top-k      | | EdgeMoe  | static bit-width table  | activation path          | EdgeMoE eviction
/// score     | on demand      | full top-k      | | Mobile   | uniform                 | router
/// replay            | LRU                        | on demand      | big-little γ=.7 | | Fiddler  |
/// uniform (model prec.)   | none                     | static popularity          | CPU vs copy |
/// full top-k      | | NextUse  | T1/T2 cumulative gate   | none                     | expected
/// next use (moekit) | on demand      | full top-k      |

#include "moekit/presets/registry.hpp"
