#pragma once
/// \file How the simulator (moe-sim) replays the presets of the registry
/// (moekit/presets/registry.hpp): one adapter per preset, `SimPreset<Spec>`, builds the preset
/// through its spec, and says what it substituted (the run's `label` and `note`; every substitution
/// is listed below and, against each paper, in docs/presets.md: none of these runs is its paper's
/// whole mechanism); the references (Belady, cost-aware Belady) run beside them. A registered
/// preset without an adapter is not replayed: the oracle stand-ins (hobbit-oracle, fate-oracle,
/// mobile-oracle), which moe-sim's hobbit, fate and mobile rows are on traces. Tests
/// call the same functions (tests/sim/moe_sim_presets_test.cpp), so what they check is what moe-sim
/// runs. In namespace `moekit::sim::preset_runs`.
///
/// Substitutions (each visible in the output):
///  * hobbit / fate: their gate predictors need the gate-input hidden states (traces may lack
///    them) and the model's router weights (`--routers`). Without both, an oracle degraded to the
///    paper's accuracy stands in. HOBBIT: RankedNoisyOraclePredictor, per distance and per rank
///    (`--hobbit-recall`, the paper's figures by default), precisions from the predicted gate
///    values by T1/T2. Fate: NoisyOraclePredictor, the trace's true next-layer experts each kept
///    with recall 0.9715 (the 75th-percentile set, §4.2), otherwise a random wrong expert (design
///    spec fate.md §3); the decode cap is spent in the stand-in's score order, blind to the truth
///    (`ScoreRankedCap`); prefetches wait in staging outside the cache, misses load at q2 and are
///    upgraded to q4 when the link is idle.
///  * edgemoe: bit widths uniform q4 unless a table is given (`--bitwidths`), sized per output
///    channel as the preset's codec; the activation-path
///    profile and the eviction prior come from the calibration trace (`RunParams::calibration`:
///    moe-sim's first half of each trace, `split_for_calibration`; the replayed trace is the
///    other half).
///  * mobile: traces store no output logits, so BigLittlePolicy falls back on a fixed share of
///    tokens (MoBiLE Table II); router replay plans from the trace's router logits, or, where the
///    trace has none, from logits made from each record's top-k (sim/route_logits.hpp; the shared
///    Mixtral traces). The little pass uses the first K/2 of
///    each record's experts (what the router picks from the same logits). A trace has one forward
///    per token, so the little pass's logits are the big pass's and its plan would always be right:
///    the plan's agreement with the big pass is a stated stand-in instead (`--replay-accuracy`,
///    default 0.8, the paper's "more than 80 %"; sim/noisy_router_replay.hpp), and the output
///    gives the agreement reached.
///  * fiddler: popularity profiled on the calibration trace (as edgemoe's profile); latencies
///    from the hardware model; the CPU side runs beside the device side, as in the paper.
///
/// Fate runs at its paper's precisions (the spec's Config defaults: q4, prefill tail q2) whatever
/// the base precision.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "moekit/cache/belady.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/noisy_oracle.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/predict/ranked_noisy_oracle.hpp"
#include "moekit/predict/score_ranked_cap.hpp"
#include "moekit/presets/registry.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/uniform.hpp"
#include "moekit/sim/calibration_split.hpp"
#include "moekit/sim/noisy_router_replay.hpp"
#include "moekit/sim/replay.hpp"
#include "moekit/sim/route_logits.hpp"
#include "moekit/sim/sim_loader.hpp"
#include "moekit/sim/trace.hpp"
#include "moekit/sim/trace_stats.hpp"
#include "moekit/sim/trace_walk.hpp"
#include "moekit/tools/activation_profile.hpp"

namespace moekit::sim::preset_runs {

/// Paper defaults of the substitutes (see the file comment for sources).
inline constexpr double fate_paper_recall = 0.9715;  ///< Fate §4.2, 75th-percentile set, decode
using presets::mobile_paper_fallback_ratio;          // MoBiLE Table II (presets/mobile.hpp)
using presets::mobile_paper_replay_accuracy;         // MoBiLE §III-B

/// `f` as the shortest decimal that reads back as it (0.6f → 0.6): a component's float default
/// seeds a double knob that prints as written.
inline double decimal(float f) {
  char b[32];
  const auto end = std::to_chars(b, b + sizeof b, f).ptr;
  double d = 0;
  std::from_chars(b, end, d);
  return d;
}

/// Everything one replay needs besides the trace.
struct RunParams {
  moekit::ModelShape shape{};
  /// `shape.quant.group_size` is the run's own (moe-sim --group-size: a checkpoint read in place
  /// keeps its groups), not to be replaced by a preset's codec.
  bool group_size_given = false;
  moekit::PipelineConfig config{};
  moekit::sim::LinkModel link{};
  moekit::sim::ComputeModel compute{};
  double t1 = decimal(moekit::HobbitRule{}.t1);  ///< HOBBIT's high-precision threshold
  double t2 = decimal(moekit::HobbitRule{}.t2);  ///< HOBBIT's low-precision threshold
  /// MoBiLE's fallback threshold (used only with output logits)
  double gamma = decimal(moekit::BigLittlePolicy::Config{}.gamma);
  /// noisy-oracle recall per rank at +1, +2, +3 layers standing in for HOBBIT's stacked gate
  moekit::presets::HobbitRecallProfile hobbit_recall = moekit::presets::hobbit_paper_profile();
  /// HOBBIT's share of cache slots in the high-precision pool (MultiDimPolicy's default)
  double hobbit_high_slots = moekit::MultiDimPolicy::Config{}.high_slot_fraction;
  double fate_recall = fate_paper_recall;  ///< ... and for Fate's cross-layer gate
  /// Fate's prefetch staging slots (0: FateSpec's default, one per expert of a layer)
  std::uint32_t fate_staging_slots = moekit::presets::FateSpec::Config{}.staging_slots;
  double fallback_ratio = mobile_paper_fallback_ratio;    ///< MoBiLE without output logits
  double replay_accuracy = mobile_paper_replay_accuracy;  ///< MoBiLE's plan agreement stand-in
  /// MoBiLE's big pass: the little pass's plan (paper) or re-routed.
  moekit::RouterReplayPredictor::BigPass big_pass =
      moekit::RouterReplayPredictor::BigPass::little_plan;
  std::uint64_t seed = 1;  ///< noisy-oracle seed
  /// Router weights [n_layers · n_experts · hidden] f32 (`--routers`); null: none.
  std::shared_ptr<const std::vector<float>> routers{};
  /// EdgeMoE bit widths (`--bitwidths`); null: every expert at q4.
  std::shared_ptr<const moekit::PrecisionTable> bitwidths{};
  /// Routing that calibrates EdgeMoE's profile and prior and Fiddler's popularity, never the
  /// replayed one (moe-sim: `split_for_calibration`); null: those presets refuse to run.
  std::shared_ptr<const moekit::sim::RoutingTrace> calibration{};
};

/// One replay: the report and what actually ran.
struct PresetResult {
  moekit::sim::ReplayReport report;
  std::string label;  ///< e.g. "hobbit (noisy-oracle predictor, recall 0.96)"
  std::string note;   ///< why a substitute ran (empty when the paper's mechanism ran as is)
};

using RunFn = PresetResult (*)(const RunParams&, const moekit::sim::RoutingTrace&);

inline std::string fmt_num(double v, int digits = 2) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

// ---- offline walks of the trace -----------------------------------------------------------------

/// What a scorer asks for at every demand of a full-top-k replay of the trace: the layer calls
/// (for the noisy oracle), the precision of each of their experts (same order), and the demand
/// sequence with precisions (for the cost-aware Belady reference). The order is the pipeline's
/// (first-seen per call), i.e. `sim::demand_sequence`'s.
struct ScoredScript {
  std::vector<moekit::OracleCall> calls;
  std::vector<std::vector<moekit::Precision>> precisions;
  std::vector<moekit::FutureAccess> future;
};

/// Runs `scorer` (a copy) over every layer call a replay with the full top-k makes.
template <class Scorer>
ScoredScript scored_script(const moekit::sim::RoutingTrace& tr, Scorer scorer) {
  using namespace moekit;
  ScoredScript out;
  const sim::TraceDims& d = tr.dims();
  std::vector<int> slot(d.n_experts, -1);
  std::vector<ExpertDemand> demands;
  std::vector<Precision> prec;
  sim::GateGatherer buf;
  std::uint64_t missing = 0;
  std::size_t last_seq = static_cast<std::size_t>(-1);
  sim::ForwardWalker(tr).for_each_forward(
      [&](std::size_t seq, std::size_t first, std::size_t n, Phase phase) {
        if (seq != last_seq) {
          if constexpr (declares<Scorer>(Hook::begin_sequence)) scorer.begin_sequence();
          last_seq = seq;
        }
        for (std::uint32_t l = 0; l < d.n_layers; ++l) {
          const GateView g = buf.gather(tr, first, n, l, d.top_k, missing);
          if (g.n_tokens == 0) continue;
          collect_demands(g, slot, demands);
          prec.assign(demands.size(), Precision::skip);
          const LayerContext ctx{l,     d.n_layers, first - tr.global_token(seq, 0),
                                 phase, seq,        g.n_tokens};
          scorer.score(ctx, g, std::span<const ExpertDemand>(demands), std::span<Precision>(prec));
          OracleCall call{l, {}};
          for (std::size_t i = 0; i < demands.size(); ++i) {
            call.experts.push_back(demands[i].expert);
            // A skipped demand is served by any resident copy: it asks for the fewest bits.
            out.future.push_back(
                {{l, demands[i].expert}, prec[i] == Precision::skip ? Precision::q2 : prec[i]});
          }
          out.calls.push_back(std::move(call));
          out.precisions.push_back(prec);
        }
      });
  return out;
}

/// Every layer call a full-top-k replay of the trace makes, with its tokens' routing (each token's
/// experts by descending weight, ties to the smaller id): the script of the ranked noisy oracle.
inline std::vector<moekit::RoutedCall> routed_script(const moekit::sim::RoutingTrace& tr) {
  using namespace moekit;
  std::vector<RoutedCall> out;
  const sim::TraceDims& d = tr.dims();
  sim::GateGatherer buf;
  std::uint64_t missing = 0;
  std::vector<std::pair<float, std::uint32_t>> token;
  sim::ForwardWalker(tr).for_each_forward(
      [&](std::size_t, std::size_t first, std::size_t n, Phase) {
        for (std::uint32_t l = 0; l < d.n_layers; ++l) {
          const GateView g = buf.gather(tr, first, n, l, d.top_k, missing);
          if (g.n_tokens == 0) continue;
          RoutedCall call{l, g.n_tokens, g.k, {}, {}};
          for (std::uint32_t t = 0; t < g.n_tokens; ++t) {
            const TokenRoute r = g.token(t);
            token.clear();
            for (std::uint32_t j = 0; j < g.k; ++j) token.push_back({r.weights[j], r.experts[j]});
            std::sort(token.begin(), token.end(), [](const auto& a, const auto& b) {
              return a.first != b.first ? a.first > b.first : a.second < b.second;
            });
            for (const auto& [w, e] : token) call.experts.push_back(e), call.weights.push_back(w);
          }
          out.push_back(std::move(call));
        }
      });
  return out;
}

/// CostAwareBeladyPolicy behind the key-only `set_future` that sim::CallOrderedPolicy feeds: the
/// precisions come from a ScoredScript of the same trace (checked key by key).
class CostAwareByKey {
 public:
  static constexpr bool needs_future = true;
  static constexpr moekit::Hooks hooks = moekit::Hook::bind;
  explicit CostAwareByKey(std::vector<moekit::FutureAccess> future) : future_(std::move(future)) {}

  void set_future(std::span<const moekit::ExpertKey> keys) {
    MOEKIT_EXPECTS(keys.size() == future_.size(),
                   "CostAwareByKey: the demand sequence and the scored script differ in length");
    for (std::size_t i = 0; i < keys.size(); ++i)
      MOEKIT_EXPECTS(keys[i] == future_[i].key,
                     "CostAwareByKey: the demand sequence and the scored script differ at " +
                         std::to_string(i));
    inner_.set_future(future_);
  }
  void bind(const moekit::ModelShape& s) { inner_.bind(s); }
  void on_hit(moekit::ExpertKey k, const moekit::AccessInfo& a) { inner_.on_hit(k, a); }
  void on_insert(moekit::ExpertKey k, const moekit::AccessInfo& a) { inner_.on_insert(k, a); }
  void on_evict(moekit::ExpertKey k) { inner_.on_evict(k); }
  [[nodiscard]] std::optional<moekit::ExpertKey> victim(const moekit::EvictionQuery& q) const {
    return inner_.victim(q);
  }

 private:
  std::vector<moekit::FutureAccess> future_;
  moekit::CostAwareBeladyPolicy inner_;
};

// ---- presets ------------------------------------------------------------------------------------

/// The baseline: LRU, on demand, at the base precision (BaselineSpec::configure: a default
/// Config loaded f16 whatever --precision said, so a q4 run moved 3.6× the bytes it should).
inline PresetResult run_baseline(const RunParams& rp, const moekit::sim::RoutingTrace& tr) {
  using moekit::presets::BaselineSpec;
  auto p = BaselineSpec::build(rp.shape, rp.config, moekit::sim::SimLoader(rp.shape, rp.link),
                               BaselineSpec::configure(rp.shape, rp.config.base_precision, {}), {});
  return {moekit::sim::replay(*p, tr, rp.compute), std::string(BaselineSpec::name), ""};
}

/// The Belady reference: the baseline's components with Belady's offline eviction, fed the
/// trace's own demand sequence.
inline PresetResult run_belady(const RunParams& rp, const moekit::sim::RoutingTrace& tr) {
  using namespace moekit;
  using Belady = sim::CallOrderedPolicy<BeladyPolicy>;
  OffloadPipeline<UniformScorer, NoPredictor, Belady, sim::SimLoader, OnDemandScheduler> p(
      rp.shape, rp.config, sim::SimLoader(rp.shape, rp.link),
      UniformScorer({.precision = rp.config.base_precision}), NoPredictor{},
      Belady(sim::demand_sequence(tr)));
  return {sim::replay(p, tr, rp.compute), "belady", ""};
}

/// Cost-aware Belady with `scorer`'s precisions: no prediction, on demand; the reference for a
/// mixed-precision preset (a strong greedy reference, not a lower bound: see cache/belady.hpp).
template <class Scorer>
PresetResult run_cost_aware(const RunParams& rp, const moekit::sim::RoutingTrace& tr, Scorer scorer,
                            moekit::PipelineConfig cfg, std::string label) {
  using namespace moekit;
  using Policy = sim::CallOrderedPolicy<CostAwareByKey>;
  ScoredScript s = scored_script(tr, scorer);
  OffloadPipeline<Scorer, NoPredictor, Policy, sim::SimLoader, OnDemandScheduler> p(
      rp.shape, cfg, sim::SimLoader(rp.shape, rp.link), std::move(scorer), NoPredictor{},
      Policy(sim::demand_sequence(tr), CostAwareByKey(std::move(s.future))));
  return {sim::replay(p, tr, rp.compute), std::move(label), ""};
}

/// HOBBIT's precision rule for the run's base precision (f16/bf16/f32 → high = base, low = q4;
/// q8 → q8/q2, the paper's Jetson setting; q4 → q4/q2, as moe-run's --low-precision auto).
inline moekit::HobbitRule hobbit_rule(const RunParams& rp) {
  moekit::HobbitRule r;
  if (rp.config.base_precision == moekit::Precision::q8)
    r = moekit::HobbitRule::for_q8_model();
  else
    r.high = rp.config.base_precision;
  if (moekit::bits(r.low) >= moekit::bits(r.high) && moekit::bits(r.high) > 2)
    r.low = moekit::Precision::q2;  // a q4 model: low was q4 (HOBBIT needs low < high)
  r.t1 = static_cast<float>(rp.t1);
  r.t2 = static_cast<float>(rp.t2);
  r.validate();
  return r;
}

/// The reason a gate predictor cannot run on `tr` (empty: it can).
inline std::string gate_predictor_gap(const RunParams& rp, const moekit::sim::RoutingTrace& tr) {
  std::string why;
  if (!tr.has_hidden()) why = "the trace has no gate-input hidden states";
  if (!rp.routers) why += std::string(why.empty() ? "" : " and ") + "no --routers given";
  if (why.empty() &&
      rp.routers->size() != std::size_t{rp.shape.n_layers} * rp.shape.n_experts * tr.dims().hidden)
    why = "--routers holds " + std::to_string(rp.routers->size()) + " floats, the trace needs " +
          std::to_string(rp.shape.n_layers) + " x " + std::to_string(rp.shape.n_experts) + " x " +
          std::to_string(tr.dims().hidden);
  return why;
}

/// What a gate predictor reads: the routers, whose rows are as wide as the trace's hidden states.
inline moekit::presets::PresetInputs gate_inputs(const RunParams& rp,
                                                 const moekit::sim::RoutingTrace& tr) {
  return {.routers = *rp.routers, .router_hidden = tr.dims().hidden};
}

/// `--hobbit-recall` (presets/hobbit_recall.hpp: moe-run's `hobbit-oracle` reads the same flag).
using moekit::presets::parse_hobbit_recall;

/// HOBBIT's Config for the run: its precision rule and pool split.
inline moekit::presets::HobbitSpec::Config hobbit_config(const RunParams& rp) {
  moekit::presets::HobbitSpec::Config c{.rule = hobbit_rule(rp)};
  c.cache.high_slot_fraction = rp.hobbit_high_slots;
  return c;
}

/// "high pool 69% of the slots".
inline std::string pool_text(const moekit::presets::HobbitSpec::Config& c) {
  return "high pool " + fmt_num(100.0 * c.cache.high_slot_fraction, 0) + "% of the slots";
}

/// HOBBIT: T1/T2 mixed precision, stacked-gate prefetch (or the noisy oracle), multidimensional
/// cache with high/low pools.
inline PresetResult run_hobbit(const RunParams& rp, const moekit::sim::RoutingTrace& tr) {
  using namespace moekit;
  using presets::HobbitSpec;
  const HobbitSpec::Config cfg = hobbit_config(rp);
  const std::string gap = gate_predictor_gap(rp, tr);
  if (gap.empty()) {
    auto p = HobbitSpec::build(rp.shape, rp.config, sim::SimLoader(rp.shape, rp.link), cfg,
                               gate_inputs(rp, tr));
    return {sim::replay(*p, tr, rp.compute),
            "hobbit (stacked-gate predictor, p = " + std::to_string(cfg.lookahead) + ", " +
                pool_text(cfg) + ")",
            ""};
  }
  using Oracle = RankedNoisyOraclePredictor<HobbitThresholdScorer>;
  auto p = HobbitSpec::build_with(
      rp.shape, rp.config, sim::SimLoader(rp.shape, rp.link), cfg,
      Oracle({.calls = routed_script(tr),
              .recall_by_rank = {rp.hobbit_recall.top1, rp.hobbit_recall.lower},
              .seed = rp.seed,
              .distance = cfg.lookahead,
              .n_experts = rp.shape.n_experts},
             HobbitSpec::scorer(cfg)));
  return {sim::replay(*p, tr, rp.compute),
          "hobbit (noisy-oracle predictor, " + presets::describe(rp.hobbit_recall) +
              ", precisions by T1/T2 on the predicted gate weights, p = " +
              std::to_string(cfg.lookahead) + ", " + pool_text(cfg) + ")",
          "stacked-gate predictor not run: " + gap};
}

/// Fate's decode prefetch cap n = floor(T / t_expert): T = dense layer + top-k experts at the
/// decode precision on the device (one decode token), t_expert = one transfer at it.
inline std::uint32_t fate_decode_cap(const RunParams& rp, double* budget_s = nullptr,
                                     double* expert_s = nullptr) {
  const moekit::Precision p = moekit::presets::FateSpec::Config{}.scorer.decode_precision;
  const double T = rp.compute.layer(1) + rp.shape.top_k * rp.compute.device(p, 1);
  const double t = rp.link.transfer_s(rp.shape.expert_bytes(p), p);
  if (budget_s) *budget_s = T;
  if (expert_s) *expert_s = t;
  return static_cast<std::uint32_t>(std::floor(T / t));
}

/// Fate: popularity precisions (q4, prefill tail q2), cross-layer gate prefetch (or the noisy
/// oracle), shallow-favoring per-layer ARC sized at q4, ready-first scheduling.
inline PresetResult run_fate(const RunParams& rp, const moekit::sim::RoutingTrace& tr) {
  using namespace moekit;
  using presets::FateSpec;
  FateSpec::Config cfg;  // the paper's precisions and shallow layers
  cfg.staging_slots = rp.fate_staging_slots;
  const std::uint32_t cap = fate_decode_cap(rp, &cfg.budget_time, &cfg.expert_time);
  const std::string cap_text =
      "decode cap n = floor(" + fmt_num(cfg.budget_time * 1e3, 3) + " ms / " +
      fmt_num(cfg.expert_time * 1e3, 3) + " ms) = " + std::to_string(cap) + ", " +
      std::to_string(FateSpec::pipeline_config(rp.shape, rp.config, cfg).prefetch_staging_slots) +
      " staging slots";
  const std::string gap = gate_predictor_gap(rp, tr);
  if (gap.empty()) {
    auto p = FateSpec::build(rp.shape, rp.config, sim::SimLoader(rp.shape, rp.link), cfg,
                             gate_inputs(rp, tr));
    return {sim::replay(*p, tr, rp.compute), "fate (cross-layer gate, " + cap_text + ")", ""};
  }
  // The stand-in prefetches at the decode precision: the script's precisions ignore the on-demand
  // one (a miss's load precision).
  FateSpec::Config script_cfg = cfg;
  script_cfg.scorer.on_demand_precision = Precision::skip;
  ScoredScript s = scored_script(tr, FateSpec::scorer(script_cfg));
  // The percentile rule predicts ceil((1 - percentile)·E) experts per layer: pad to that many.
  const auto set =
      static_cast<std::uint32_t>(std::ceil((1.0 - cfg.percentile) * rp.shape.n_experts));
  // The cap is spent in the order of a score blind to which predictions are true (the oracle lists
  // its true picks first).
  using StandIn = ScoreRankedCap<NoisyOraclePredictor>;
  auto p = FateSpec::build_with(
      rp.shape, rp.config, sim::SimLoader(rp.shape, rp.link), cfg,
      StandIn(NoisyOraclePredictor({.calls = std::move(s.calls),
                                    .precisions = std::move(s.precisions),
                                    .recall = rp.fate_recall,
                                    .seed = rp.seed,
                                    .distance = 1,
                                    .set_size = set,
                                    .n_experts = rp.shape.n_experts,
                                    .precision = cfg.scorer.decode_precision}),
              {.max_nonresident = cap, .seed = rp.seed, .n_experts = rp.shape.n_experts}));
  return {sim::replay(*p, tr, rp.compute),
          "fate (noisy-oracle predictor, recall " + fmt_num(rp.fate_recall, 4) + ", " +
              std::to_string(set) + " predicted per layer, ranked by a score blind to the truth, " +
              cap_text + ")",
          "cross-layer gate not run: " + gap};
}

/// `rp` with the experts' byte sizes of EdgeMoE's codec (per output channel), unless the run gave
/// its own (moe-run reading a Q4_0 file in place keeps its groups of 32).
inline RunParams edgemoe_params(RunParams rp) {
  if (!rp.group_size_given)
    rp.shape.quant.group_size = moekit::presets::EdgeMoeSpec::quant_group_size;
  return rp;
}

/// EdgeMoE's bit-width table for this run (given, or uniform q4) and its most common precision.
inline moekit::PrecisionTable edgemoe_table(const RunParams& rp, moekit::Precision* common) {
  using namespace moekit;
  PrecisionTable t = rp.bitwidths
                         ? *rp.bitwidths
                         : PrecisionTable(rp.shape.n_layers, rp.shape.n_experts, Precision::q4);
  MOEKIT_EXPECTS(t.n_layers() == rp.shape.n_layers && t.n_experts() == rp.shape.n_experts,
                 "--bitwidths: the table has " + std::to_string(t.n_layers()) + " layers x " +
                     std::to_string(t.n_experts()) + " experts, the model " +
                     std::to_string(rp.shape.n_layers) + " x " +
                     std::to_string(rp.shape.n_experts));
  std::size_t best = 0;
  for (Precision p : all_precisions)
    if (t.count(p) > best) best = t.count(p), *common = p;
  return t;
}

// The calibration splits (CalibrationSplit, split_for_calibration, slice_like_routing_replay)
// are in sim/calibration_split.hpp, shared with moe-run's held-out calibration.
using moekit::sim::CalibrationSplit;
using moekit::sim::slice_like_routing_replay;
using moekit::sim::split_for_calibration;

/// `rp.calibration`, or an error naming `preset`.
inline const moekit::sim::RoutingTrace& calibration_of(const RunParams& rp,
                                                       std::string_view preset) {
  MOEKIT_EXPECTS(rp.calibration != nullptr,
                 std::string(preset) +
                     ": no calibration trace (RunParams::calibration; moe-sim "
                     "calibrates on the first half of each trace)");
  return *rp.calibration;
}

/// EdgeMoE: static bit widths, activation-path preloading (profile from the calibration trace's
/// decode tokens), EdgeMoE eviction score with the calibration's prior, the buffer filled with
/// the highest-prior experts before the clock starts; the cache sized at the table's most common
/// precision; experts sized per output channel (EdgeMoE's codec).
inline PresetResult run_edgemoe(const RunParams& given, const moekit::sim::RoutingTrace& tr) {
  using namespace moekit;
  const RunParams rp = edgemoe_params(given);
  using presets::EdgeMoeSpec;
  Precision common = Precision::q4;
  PrecisionTable table = edgemoe_table(rp, &common);
  const sim::RoutingTrace& cal = calibration_of(rp, "edgemoe");
  auto profile = std::make_shared<ActivationPathProfile>(tools::build_activation_profile(cal));
  std::size_t profiled = 0;
  for (std::size_t g = 0; g < cal.token_count(); ++g) profiled += cal.phase(g) == Phase::decode;
  MOEKIT_EXPECTS(profiled > 0, "edgemoe: the calibration part of trace '" + tr.name() +
                                   "' has no decode token to build the activation-path profile");
  const std::string what = table.count(Precision::q4) == table.size() && !rp.bitwidths
                               ? "uniform q4 bit widths"
                               : "bit widths from --bitwidths";
  const presets::PresetInputs in{
      .popularity = sim::expert_shares(cal),
      .paths = profile,
      .bitwidths = std::make_shared<const PrecisionTable>(std::move(table))};
  auto p = EdgeMoeSpec::build(rp.shape, rp.config, sim::SimLoader(rp.shape, rp.link),
                              {.sizing = common}, in);
  const std::size_t placed = EdgeMoeSpec::place(*p, in);
  sim::SimLoader& loader = p->loader();  // the buffer is filled before the clock starts
  while (loader.queued() > 0) loader.clock().stall_until(loader.link_free_at());
  loader.clock().stall_until(loader.link_free_at());
  return {sim::replay(*p, tr, rp.compute),
          "edgemoe (" + what + ", activation-path profile from " + std::to_string(profiled) +
              " calibration decode tokens, " + std::to_string(p->predictor().config().max_preload) +
              " preloads per layer after the capacity guard)",
          "profile and prior from the calibration half, not the replayed one; buffer "
          "initialised with " +
              std::to_string(placed) + " experts before the clock starts"};
}

/// MoBiLE: big-little token policy (fixed fallback share: traces store no output logits), router
/// replay, its plan's accuracy a stand-in (sim/noisy_router_replay.hpp). A trace without router
/// logits gets logits made from each record's top-k (sim/route_logits.hpp), as moe-run's
/// mobile-oracle does, so the plan is the record's experts before the accuracy stand-in.
inline PresetResult run_mobile(const RunParams& rp, const moekit::sim::RoutingTrace& trace) {
  using namespace moekit;
  using presets::MobileSpec;
  MobileSpec::Config cfg{.precision = rp.config.base_precision,
                         .tokens = {.gamma = static_cast<float>(rp.gamma),
                                    .fallback_ratio_without_logits = rp.fallback_ratio}};
  cfg.big_pass = rp.big_pass;
  const std::uint32_t little = std::max<std::uint32_t>(1, rp.shape.top_k / 2);
  const std::string base = "fallback ratio " + fmt_num(rp.fallback_ratio, 4) +
                           " (no output logits), little pass = first " + std::to_string(little) +
                           " of " + std::to_string(rp.shape.top_k) + " recorded experts";
  const bool made_logits = !trace.has_logits();
  const sim::RoutingTrace made = made_logits ? sim::with_route_logits(trace) : sim::RoutingTrace{};
  const sim::RoutingTrace& tr = made_logits ? made : trace;
  using Replay = sim::NoisyRouterReplay;
  OffloadPipeline<UniformScorer, Replay, LruPolicy, sim::SimLoader, OnDemandScheduler,
                  BigLittlePolicy>
      p(rp.shape, MobileSpec::pipeline_config(rp.config, cfg), sim::SimLoader(rp.shape, rp.link),
        MobileSpec::scorer(cfg),
        Replay({.replay = MobileSpec::replay(rp.shape, cfg),
                .accuracy = rp.replay_accuracy,
                .seed = rp.seed}),
        LruPolicy{}, OnDemandScheduler{}, MobileSpec::token_policy(cfg));
  sim::ReplayReport rep = sim::replay(p, tr, rp.compute);
  const double floor = Replay::floor_accuracy(rp.shape.top_k, little);
  const std::string mode =
      rp.big_pass == RouterReplayPredictor::BigPass::little_plan ? "little-plan" : "recompute";
  return {std::move(rep),
          "mobile (router replay, big pass " + mode + ", plan accuracy " +
              fmt_num(rp.replay_accuracy) + " stand-in, reached " +
              fmt_num(p.predictor().inner().stats().accuracy()) + ", " + base + ")",
          std::string("traces store no output logits: fallback on a fixed share of tokens; ") +
              (made_logits ? "router logits made from each record's top-k (the trace has none); "
                           : "") +
              "the plan's agreement with the big pass is a stand-in (" +
              fmt_num(rp.replay_accuracy) + ", paper > 0.8" +
              (rp.replay_accuracy < floor
                   ? ", below the floor " + fmt_num(floor) + " with the little pass's experts kept"
                   : "") +
              "): a trace's little pass sees the big pass's logits"};
}

/// Fiddler: static popularity placement profiled on the calibration trace (Fiddler profiles a
/// calibration set), and the CPU-vs-copy scheduler with latencies from the hardware model (CPU:
/// the line fixed part + per token of one expert, as moe-run fits it; copy: transfer + device
/// run). The replay runs the CPU side beside the device side.
inline PresetResult run_fiddler(const RunParams& rp, const moekit::sim::RoutingTrace& tr) {
  using namespace moekit;
  using presets::FiddlerSpec;
  const Precision base = rp.config.base_precision;
  const auto b = static_cast<std::size_t>(base);
  const bool sloped = rp.compute.cpu_expert_token_s[b] > 0;  // else the paper's line through 0
  // The line's intercept, cpu(base, n) = intercept + slope · n; a fixed part that holds the first
  // token (first_token_in_fixed) less one slope, 0 at least (as moe-run's fit_cpu_line).
  const double intercept =
      rp.compute.first_token_in_fixed
          ? std::max(0.0, rp.compute.cpu_expert_s[b] - rp.compute.cpu_expert_token_s[b])
          : rp.compute.cpu_expert_s[b];
  const presets::PresetInputs in{
      .popularity = sim::expert_shares(calibration_of(rp, "fiddler")),
      .cpu_seconds_per_token = sloped ? rp.compute.cpu_expert_token_s[b] : rp.compute.cpu(base, 1),
      .cpu_seconds_per_expert = sloped ? intercept : 0.0,
      .copy_seconds =
          rp.link.transfer_s(rp.shape.expert_bytes(base), base) + rp.compute.device(base, 1)};
  auto p = FiddlerSpec::build(rp.shape, rp.config, sim::SimLoader(rp.shape, rp.link),
                              {.scorer = {.precision = base}}, in);
  // The placement's transfers finish before the replay's clock starts (start-up, not decode
  // time); its bytes are in the loader's count.
  const std::size_t placed = FiddlerSpec::place(*p, in);
  sim::SimLoader& loader = p->loader();
  while (loader.queued() > 0) loader.clock().stall_until(loader.link_free_at());
  loader.clock().stall_until(loader.link_free_at());
  const std::uint64_t bytes = p->stats().bytes_preloaded;
  return {sim::replay(*p, tr, rp.compute), std::string(FiddlerSpec::name),
          "popularity profiled on the calibration half; start-up placement of " +
              std::to_string(placed) + " experts (" + fmt_num(double(bytes) / 1e9) +
              " GB, counted in bytes moved) completes before the clock starts"};
}

/// nextuse and nextuse-fit: HOBBIT's T1/T2 precisions over ExpectedNextUse (the spec's
/// statistics), no predictor: nothing to substitute.
template <class Spec>
inline PresetResult run_nextuse(const RunParams& rp, const moekit::sim::RoutingTrace& tr) {
  typename Spec::Config cfg = Spec::configure(rp.shape, rp.config.base_precision, {});
  cfg.rule = hobbit_rule(rp);
  auto p = Spec::build(rp.shape, rp.config, moekit::sim::SimLoader(rp.shape, rp.link), cfg, {});
  return {moekit::sim::replay(*p, tr, rp.compute), std::string(Spec::name), ""};
}

inline PresetResult run_belady_cost_hobbit(const RunParams& rp,
                                           const moekit::sim::RoutingTrace& tr) {
  return run_cost_aware(rp, tr, moekit::presets::HobbitSpec::scorer({.rule = hobbit_rule(rp)}),
                        rp.config, "cost-aware belady with HOBBIT's T1/T2 precisions");
}
inline PresetResult run_belady_cost_fate(const RunParams& rp, const moekit::sim::RoutingTrace& tr) {
  using moekit::presets::FateSpec;
  FateSpec::Config cfg;
  cfg.scorer.on_demand_precision = moekit::Precision::skip;  // transfer precisions only, no upgrade
  return run_cost_aware(rp, tr, FateSpec::scorer(cfg), FateSpec::pipeline_config(rp.config, cfg),
                        "cost-aware belady with Fate's precisions (q4, prefill tail q2)");
}
inline PresetResult run_belady_cost_edgemoe(const RunParams& given,
                                            const moekit::sim::RoutingTrace& tr) {
  using moekit::presets::EdgeMoeSpec;
  const RunParams rp = edgemoe_params(given);
  moekit::Precision common = moekit::Precision::q4;
  const moekit::PrecisionTable t = edgemoe_table(rp, &common);
  return run_cost_aware(rp, tr, EdgeMoeSpec::scorer(t),
                        EdgeMoeSpec::pipeline_config(rp.config, {.sizing = common}, t),
                        "cost-aware belady with EdgeMoE's bit widths");
}

// ---- the presets moe-sim replays ----------------------------------------------------------------

/// One row of moe-sim's list: a preset (or a reference) and how to replay it.
struct SimEntry {
  std::string_view name;
  std::string_view what;
  RunFn run;
  bool uses_t1_t2 = false;                ///< sweeps of t1/t2 apply
  bool uses_fallback = false;             ///< sweeps of the fallback ratio apply
  std::string_view reference = "belady";  ///< the reference its penalty is compared with
  const moekit::presets::PresetEntry* preset = nullptr;  ///< null for a reference
};

/// How moe-sim replays the registry's preset `Spec`: `replayed` is false for one it does not.
template <class Spec>
struct SimPreset {
  static constexpr bool replayed = false;
};
template <>
struct SimPreset<moekit::presets::BaselineSpec> {
  static constexpr bool replayed = true;
  static constexpr SimEntry entry{
      "", "LRU cache, on-demand loads at the base precision (--precision), no prediction",
      &run_baseline};
};
template <>
struct SimPreset<moekit::presets::HobbitSpec> {
  static constexpr bool replayed = true;
  static constexpr SimEntry entry{"",
                                  "HOBBIT: T1/T2 mixed precision, stacked-gate prefetch (or "
                                  "noisy oracle), multidimensional cache",
                                  &run_hobbit,
                                  true,
                                  false,
                                  "belady-hobbit"};
};
template <>
struct SimPreset<moekit::presets::FateSpec> {
  static constexpr bool replayed = true;
  static constexpr SimEntry entry{"",
                                  "Fate: cross-layer gate prefetch (or noisy oracle), q4 cache, "
                                  "shallow-favoring ARC, ready-first",
                                  &run_fate,
                                  false,
                                  false,
                                  "belady-fate"};
};
template <>
struct SimPreset<moekit::presets::EdgeMoeSpec> {
  static constexpr bool replayed = true;
  static constexpr SimEntry entry{"",
                                  "EdgeMoE: static bit widths, activation-path preload (profile: "
                                  "the calibration half), distance-aware eviction, buffer "
                                  "filled at start",
                                  &run_edgemoe,
                                  false,
                                  false,
                                  "belady-edgemoe"};
};
template <>
struct SimPreset<moekit::presets::MobileSpec> {
  static constexpr bool replayed = true;
  static constexpr SimEntry entry{"",
                                  "MoBiLE: big-little experts, fixed fallback share without "
                                  "output logits, router replay (logits made from the records "
                                  "where the trace has none)",
                                  &run_mobile, false, true};
};
template <>
struct SimPreset<moekit::presets::FiddlerSpec> {
  static constexpr bool replayed = true;
  static constexpr SimEntry entry{"",
                                  "Fiddler: popular experts placed up front (profiled on the "
                                  "trace), misses on the CPU when cheaper",
                                  &run_fiddler};
};

template <>
struct SimPreset<moekit::presets::NextUseSpec> {
  static constexpr bool replayed = true;
  static constexpr SimEntry entry{"",
                                  "nextuse: T1/T2 precisions over ExpectedNextUse with its "
                                  "default statistics, no prediction",
                                  &run_nextuse<moekit::presets::NextUseSpec>,
                                  true,
                                  false,
                                  "belady-hobbit"};
};
template <>
struct SimPreset<moekit::presets::NextUseFitSpec> {
  static constexpr bool replayed = true;
  static constexpr SimEntry entry{"",
                                  "nextuse-fit: T1/T2 precisions over ExpectedNextUse with "
                                  "(gamma, prior) fitted on real Mixtral routing, no prediction",
                                  &run_nextuse<moekit::presets::NextUseFitSpec>,
                                  true,
                                  false,
                                  "belady-hobbit"};
};

/// The registry's presets moe-sim replays, in registry order.
inline const std::vector<SimEntry>& sim_presets() {
  static const std::vector<SimEntry> all = [] {
    std::vector<SimEntry> v;
    moekit::presets::for_each([&]<class S>(std::type_identity<S>) {
      if constexpr (SimPreset<S>::replayed) {
        SimEntry e = SimPreset<S>::entry;
        e.name = S::name;
        e.preset = &moekit::presets::entry_of<S>;
        v.push_back(e);
      }
    });
    return v;
  }();
  return all;
}

/// moe-sim's row of registry preset `p`, or nullptr when moe-sim does not replay it.
inline const SimEntry* sim_preset(const moekit::presets::PresetEntry& p) {
  for (const SimEntry& e : sim_presets())
    if (e.preset == &p) return &e;
  return nullptr;
}

/// The reference line every comparison adds.
inline constexpr SimEntry belady_entry{
    "belady",    "Belady's offline optimum (baseline components, future-aware eviction)",
    &run_belady, false,
    false,       "belady"};

/// Cost-aware Belady references, one per mixed-precision preset (added next to it).
inline constexpr SimEntry cost_aware_table[] = {
    {"belady-hobbit", "cost-aware Belady with HOBBIT's precisions (greedy reference)",
     &run_belady_cost_hobbit, true, false, "belady-hobbit"},
    {"belady-fate", "cost-aware Belady with Fate's precisions and q4 sizing", &run_belady_cost_fate,
     false, false, "belady-fate"},
    {"belady-edgemoe", "cost-aware Belady with EdgeMoE's bit widths", &run_belady_cost_edgemoe,
     false, false, "belady-edgemoe"},
};

/// The reference named `name` (nullptr if none).
inline const SimEntry* find_reference(std::string_view name) {
  for (const auto& p : cost_aware_table)
    if (p.name == name) return &p;
  if (name == belady_entry.name) return &belady_entry;
  return nullptr;
}

}  // namespace moekit::sim::preset_runs
