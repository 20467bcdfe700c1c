#pragma once
/// \file MoBiLE (2025): big-little experts — a little pass with fewer experts per token, recomputed
/// with the full top-k when the output is not confident — with the little pass's router logits as
/// the recomputation's plan: by default (the paper's reading) the big pass runs the plan's experts,
/// prefetched `lookahead` layers ahead; `BigPass::recompute` re-routes exactly and only prefetches
/// the plan. The little pass's experts stay (soft-)pinned until the token's verdict, so a fallback
/// loads only the K − K_s others per layer (design spec mobile.md §2.4).

#include <algorithm>
#include <memory>
#include <string_view>
#include <utility>

#include "moekit/cache/lru.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/router_replay.hpp"
#include "moekit/presets/preset_spec.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/big_little.hpp"
#include "moekit/score/uniform.hpp"

namespace moekit::presets {

struct MobileSpec : PresetDefaults {
  static constexpr std::string_view name = "mobile";
  static constexpr std::string_view summary =
      "MoBiLE: little pass with --k-little experts, fallback to full top-k when the max "
      "probability <= --gamma (KV rolled back); the big pass runs the little pass's plan "
      "(--big-pass little-plan, or recompute: re-routed), prefetched --big-pass-lookahead "
      "layers ahead";

  template <class Loader>
  using Pipeline = OffloadPipeline<UniformScorer, RouterReplayPredictor, LruPolicy, Loader,
                                   OnDemandScheduler, BigLittlePolicy>;

  /// Every expert, and every replayed prefetch, at `precision`.
  struct Config {
    Precision precision = UniformScorer::Config{}.precision;
    BigLittlePolicy::Config tokens{};
    RouterReplayPredictor::BigPass big_pass = RouterReplayPredictor::Config{}.big_pass;
    std::uint32_t lookahead = RouterReplayPredictor::Config{}.lookahead;
    bool retain_little_experts = true;  ///< design spec mobile.md §2.4 [choice, recommended]
  };
  static Config configure(const ModelShape& s, Precision base, const PresetParams& q) {
    return {.precision = base,
            .tokens = {.gamma = q.gamma, .k_little = std::min(q.k_little, s.top_k)},
            .big_pass = q.big_pass,
            .lookahead = q.big_pass_lookahead};
  }

  static UniformScorer scorer(const Config& c) { return UniformScorer({.precision = c.precision}); }
  static BigLittlePolicy token_policy(const Config& c) { return BigLittlePolicy(c.tokens); }
  static RouterReplayPredictor::Config replay(const ModelShape& s, const Config& c) {
    return {.top_k = s.top_k,
            .precision = c.precision,
            .lookahead = c.lookahead,
            .big_pass = c.big_pass};
  }
  /// `pc` with the little pass's experts retained (`Config.retain_little_experts`).
  static PipelineConfig pipeline_config(PipelineConfig pc, const Config& c) {
    pc.retain_narrowed_experts = c.retain_little_experts;
    return pc;
  }

  template <class Loader>
  static std::unique_ptr<Pipeline<Loader>> build(const ModelShape& s, const PipelineConfig& pc,
                                                 Loader loader, const Config& c,
                                                 const PresetInputs&) {
    return std::make_unique<Pipeline<Loader>>(s, pipeline_config(pc, c), std::move(loader),
                                              scorer(c), RouterReplayPredictor(replay(s, c)),
                                              LruPolicy{}, OnDemandScheduler{}, token_policy(c));
  }
};

/// MoBiLE (2025): big-little experts with confidence fallback and router-replay prefetch.
template <class Loader>
using Mobile = MobileSpec::Pipeline<Loader>;

}  // namespace moekit::presets
