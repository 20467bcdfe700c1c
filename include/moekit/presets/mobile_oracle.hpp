#pragma once
/// \file mobile-oracle: MoBiLE's mechanism on replayed routing (moe-run --routing-trace), with the
/// two inputs a random-weight model cannot give standing in at the paper's figures. A model with
/// random weights is never confident, so `mobile` under replay falls back on every token, and its
/// plan comes from a random router. Here the token verdict falls back on a fixed share of decode
/// tokens (`--fallback-ratio`, default MoBiLE Table II's mean, 0.1375) and the plan is made from
/// the trace's routing (the trace's router logits, or logits made from each record's top-k,
/// sim/route_logits.hpp) with the little pass's agreement with the big pass degraded to
/// `--replay-accuracy` (default the paper's 0.8; sim/noisy_router_replay.hpp), as moe-sim's
/// MoBiLE does. The big pass then runs that plan (the paper's reading). Everything else is
/// MoBiLE's: the little pass's experts kept, the plan prefetched `--big-pass-lookahead` ahead.

#include <memory>
#include <string_view>
#include <utility>

#include "moekit/presets/mobile.hpp"
#include "moekit/sim/noisy_router_replay.hpp"

namespace moekit::presets {

struct MobileOracleSpec : MobileSpec {
  static constexpr std::string_view name = "mobile-oracle";
  static constexpr std::string_view summary =
      "MoBiLE on --routing-trace: fallback on a fixed share of tokens (--fallback-ratio, default "
      "the paper's 0.1375) and the plan from the trace at --replay-accuracy (default 0.8) instead "
      "of a random model's confidence and router";
  static constexpr PresetNeeds needs{.lookahead = true, .replayed_logits = true};

  using Predictor = sim::NoisyRouterReplay;
  template <class Loader>
  using Pipeline = OffloadPipeline<UniformScorer, Predictor, LruPolicy, Loader, OnDemandScheduler,
                                   BigLittlePolicy>;

  struct Config : MobileSpec::Config {
    double replay_accuracy = mobile_paper_replay_accuracy;
  };
  static Config configure(const ModelShape& s, Precision base, const PresetParams& q) {
    Config c{MobileSpec::configure(s, base, q)};
    c.big_pass = RouterReplayPredictor::BigPass::little_plan;  // the plan is the trace's
    c.tokens.fallback_ratio_without_logits = q.fallback_ratio;
    c.tokens.share_only = true;
    c.replay_accuracy = q.replay_accuracy;
    return c;
  }

  template <class Loader>
  static std::unique_ptr<Pipeline<Loader>> build(const ModelShape& s, const PipelineConfig& pc,
                                                 Loader loader, const Config& c,
                                                 const PresetInputs&) {
    return std::make_unique<Pipeline<Loader>>(
        s, pipeline_config(pc, c), std::move(loader), scorer(c),
        Predictor({.replay = replay(s, c), .accuracy = c.replay_accuracy}), LruPolicy{},
        OnDemandScheduler{}, token_policy(c));
  }
};

}  // namespace moekit::presets
