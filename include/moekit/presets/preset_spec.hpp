#pragma once
/// \file What a preset is. Each header of this folder defines one `PresetSpec`: a struct that holds
///
///  * `name` (as `--preset` spells it) and a one-line `summary`;
///  * `Pipeline<Loader>`, the `OffloadPipeline` it combines;
///  * `Config`, its components' Configs, defaulted to theirs (each default is written once, in
///    its component; docs/presets.md marks it paper / authors' code / moekit), and
///    `configure(shape, base, params)`, which fills them from the shared knobs (`PresetParams`);
///  * `needs`, what it takes from the model and the machine beyond the knobs (`PresetInputs`);
///  * `quant_group_size`, the codec of the experts an engine quantizes for it (0: per channel);
///  * `precisions(...)`, the stored precisions it reads;
///  * `check(base, params)`, its own checks of the knobs;
///  * `build(shape, pipeline_config, loader, config, inputs)`, its pipeline;
///  * `place(pipeline, inputs)`, its start-up placement.
///
/// A spec derives from `PresetDefaults` for the members it does not need (no inputs, reads only
/// the base precision, no own checks, no placement). `registry.hpp` lists the specs.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/cache/arc.hpp"
#include "moekit/cache/multidim.hpp"
#include "moekit/cache/shallow_favoring.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/memory_loader.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/activation_path.hpp"
#include "moekit/predict/cross_layer_gate.hpp"
#include "moekit/predict/lookahead_oracle.hpp"
#include "moekit/predict/router_replay.hpp"
#include "moekit/predict/stacked_gate.hpp"
#include "moekit/presets/hobbit_recall.hpp"
#include "moekit/score/big_little.hpp"
#include "moekit/score/hobbit_threshold.hpp"
#include "moekit/score/popularity.hpp"
#include "moekit/score/static_bitwidth.hpp"

namespace moekit::presets {

/// MoBiLE Table II at γ = 0.7: mean of the four fallback ratios 0.11, 0.11, 0.21, 0.12 (paper).
/// The share of tokens that fall back where the model's confidence is not available or means
/// nothing (moe-sim's traces, moe-run's mobile-oracle).
inline constexpr double mobile_paper_fallback_ratio = 0.1375;
/// MoBiLE §III-B: the little pass's plan agrees with the big pass's experts "more than 80 %"
/// (paper): the accuracy of the plan's stand-in (sim/noisy_router_replay.hpp).
inline constexpr double mobile_paper_replay_accuracy = 0.8;

/// The presets' knobs a caller sets (moe-run has one flag per field, named beside it; messages
/// name the flag). Every default is the owning component's own Config default, or a stand-in's
/// paper figure.
struct PresetParams {
  // HOBBIT's T1/T2 rule (NextUse uses it too)
  float t1 = HobbitRule{}.t1;        ///< --t1: cumulative weight run at the base precision
  float t2 = HobbitRule{}.t2;        ///< --t2: cumulative weight run at `low`
  Precision low = HobbitRule{}.low;  ///< --low-precision (HOBBIT low, Fate's int2 share)
  std::uint32_t lookahead = StackedGatePredictor::Config{}.lookahead;  ///< --lookahead
  /// --hobbit-high-pool: HOBBIT's share of cache slots in the high-precision pool
  double high_slot_fraction = MultiDimPolicy::Config{}.high_slot_fraction;
  // Fate
  std::uint32_t shallow_layers =
      ShallowFavoring<ArcPolicy>::Config{}.shallow_layers;                ///< --shallow-layers
  double fate_low_fraction = PopularityScorer::Config{}.int2_fraction;    ///< --fate-low-fraction
  double fate_percentile = CrossLayerGatePredictor::Config{}.percentile;  ///< --fate-percentile
  /// --fate-staging-slots: prefetch staging slots (0: one per expert of a layer, FateSpec's)
  std::uint32_t fate_staging_slots = 0;
  // MoBiLE
  float gamma = BigLittlePolicy::Config{}.gamma;                ///< --gamma
  std::uint32_t k_little = BigLittlePolicy::Config{}.k_little;  ///< --k-little (0 = K/2)
  double fallback_ratio = mobile_paper_fallback_ratio;    ///< --fallback-ratio (mobile-oracle)
  double replay_accuracy = mobile_paper_replay_accuracy;  ///< --replay-accuracy (mobile-oracle)
  // the oracle stand-ins (hobbit-oracle, fate-oracle)
  std::string hobbit_recall = "paper";  ///< --hobbit-recall: hobbit-oracle's figures per rank
  std::vector<double> oracle_recall{};  ///< --oracle-recall: fate-oracle's (empty: the paper's)
  RouterReplayPredictor::BigPass big_pass =
      RouterReplayPredictor::Config{}.big_pass;  ///< --big-pass
  std::uint32_t big_pass_lookahead =
      RouterReplayPredictor::Config{}.lookahead;  ///< --big-pass-lookahead
};

/// What a preset takes from the model and the machine beyond its knobs (the `PresetInputs` field
/// each flag names must be filled).
struct PresetNeeds {
  bool routers = false;     ///< `routers`: every MoE layer's router (gate predictors)
  bool popularity = false;  ///< `popularity`: tokens routed per expert (a profile or calibration)
  bool paths = false;       ///< `paths`: activation paths of a calibration run
  bool latencies = false;   ///< `cpu_seconds_per_token`, `copy_seconds`: CPU vs load latencies
  bool bitwidths = false;   ///< `bitwidths`: a per-expert bit-width table (null: uniform)
  /// `layer_seconds`, `expert_load_seconds`: decode compute per layer and one expert's load
  bool decode_timing = false;
  /// Runs experts on the CPU from the loader's `host_bytes`: free when the experts are in host
  /// memory, else a read outside the cache that the run's memory must hold (io/host_read_ring.hpp).
  bool host_bytes = false;
  /// `lookahead`: the routing of later layers, known ahead (a replayed trace: the oracle
  /// stand-ins of the gate predictors).
  bool lookahead = false;
  /// A layer's misses may not fit its share of the cache (Fate: the deep layers' share of the
  /// shallow-favoring pools is empty): they load into transient staging slots beyond the
  /// budget, up to a layer's experts at once, and the lazy upgrade holds one more. The run's
  /// memory must hold them besides the budget (moe-run's `--expert-budget auto` reserves them).
  bool staged_misses = false;
  /// The replayed trace's router logits in place of the model's (`lookahead` too): a stand-in
  /// whose predictor plans from the logits a trained router gave (mobile-oracle).
  bool replayed_logits = false;
};

/// The inputs of `PresetNeeds`, as plain data (filled by the engine, the simulator or a test).
struct PresetInputs {
  /// Routers of every MoE layer, [n_layers · n_experts · router_hidden] f32; outlives `build`.
  std::span<const float> routers{};
  std::uint32_t router_hidden = 0;  ///< width of a router row (0: the shape's `hidden`)
  /// Tokens routed to each (layer, expert), [n_layers × n_experts].
  std::vector<double> popularity{};
  std::shared_ptr<const ActivationPathProfile> paths{};  ///< activation paths
  std::shared_ptr<const PrecisionTable> bitwidths{};     ///< per-expert precisions (null: uniform)
  double cpu_seconds_per_token = 0;   ///< one token through one expert on the CPU (slope)
  double cpu_seconds_per_expert = 0;  ///< fixed CPU time per expert call (intercept; paper: 0)
  double copy_seconds = 0;            ///< load one expert into the cache and run it
  std::shared_ptr<RoutingLookahead> lookahead{};  ///< the routing ahead (oracle stand-ins)
  /// Decode compute between consecutive layers' routing (Fate's T; engine/decode_timing.hpp).
  double layer_seconds = 0;
  double expert_load_seconds = 0;  ///< one expert's load at the prefetch precision (t_expert)
};

/// What a spec that does not define a member gets.
struct PresetDefaults {
  static constexpr PresetNeeds needs{};
  /// Group size of the experts the engine quantizes (0 = per output channel).
  static constexpr std::uint32_t quant_group_size = QuantScheme{}.group_size;
  static void check(Precision, const PresetParams&) {}
  static std::vector<Precision> precisions(const ModelShape&, Precision base, const PresetParams&,
                                           const PresetInputs&) {
    return {base};
  }
  template <class Pipeline>
  static std::size_t place(Pipeline&, const PresetInputs&) {
    return 0;
  }
};

// ---- helpers the specs share -----------------------------------------------------------------

/// Checks the knobs against each other, whichever preset reads them; names the flag.
inline void check_params(const PresetParams& q) {
  auto bad = [](const std::string& m) { moekit::detail::fail(ErrorKind::invalid_argument, m); };
  if (!(q.t1 >= 0 && q.t1 <= q.t2 && q.t2 <= 1))
    bad("--t1/--t2: need 0 <= t1 <= t2 <= 1 (t1 = " + std::to_string(q.t1) +
        ", t2 = " + std::to_string(q.t2) + ")");
  if (!(q.high_slot_fraction >= 0 && q.high_slot_fraction <= 1))
    bad("--hobbit-high-pool: must be in [0, 1]");
  if (!(q.fate_low_fraction >= 0 && q.fate_low_fraction <= 1))
    bad("--fate-low-fraction: must be in [0, 1]");
  if (!(q.fate_percentile >= 0 && q.fate_percentile < 1))
    bad("--fate-percentile: must be in [0, 1)");
  if (!(q.gamma >= 0 && q.gamma <= 1)) bad("--gamma: must be in [0, 1]");
  if (!(q.fallback_ratio >= 0 && q.fallback_ratio <= 1)) bad("--fallback-ratio: must be in [0, 1]");
  if (!(q.replay_accuracy >= 0 && q.replay_accuracy <= 1))
    bad("--replay-accuracy: must be in [0, 1]");
  if (q.oracle_recall.size() > max_prediction_distance)
    bad("--oracle-recall: at most " + std::to_string(max_prediction_distance) +
        " figures (+1, +2, +3 layers ahead)");
  for (double r : q.oracle_recall)
    if (!(r >= 0 && r <= 1)) bad("--oracle-recall: every figure must be in [0, 1]");
  (void)parse_hobbit_recall(q.hobbit_recall);  // throws naming --hobbit-recall
  if (!(q.big_pass_lookahead >= 1 && q.big_pass_lookahead <= max_prediction_distance))
    bad("--big-pass-lookahead: must be in [1, " + std::to_string(max_prediction_distance) + "]");
}

/// For presets that read `low`: it must not be more precise than the base precision.
inline void check_low_precision(Precision base, const PresetParams& q) {
  if (bits(q.low) > bits(base))
    moekit::detail::fail(ErrorKind::invalid_argument,
                         "--low-precision: " + std::string(name(q.low)) +
                             " is more precise than --precision " + std::string(name(base)));
}

/// Appends `p` to `out` unless it is `skip` or already there (keeps the first-seen order).
inline void add_precision(std::vector<Precision>& out, Precision p) {
  if (p != Precision::skip && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
}

/// The router rows' width, after checking that `in.routers` holds every MoE layer's router.
inline std::uint32_t router_width(std::string_view preset, const ModelShape& s,
                                  const PresetInputs& in) {
  const std::uint32_t h = in.router_hidden ? in.router_hidden : s.hidden;
  if (in.routers.size() != std::size_t{s.n_layers} * s.n_experts * h)
    moekit::detail::fail(ErrorKind::internal, "--preset " + std::string(preset) +
                                                  ": the router weights were not provided");
  return h;
}

/// The routing ahead that an oracle stand-in reads, after checking it was provided.
inline std::shared_ptr<RoutingLookahead> lookahead_of(std::string_view preset,
                                                      const PresetInputs& in) {
  if (!in.lookahead)
    moekit::detail::fail(ErrorKind::invalid_argument,
                         "--preset " + std::string(preset) +
                             ": needs the routing ahead (moe-run --routing-trace FILE): its "
                             "predictor is a noisy oracle over the replayed routing");
  return in.lookahead;
}

// ---- the concept -----------------------------------------------------------------------------

namespace requirements {
template <class S>
concept has_identity = requires {
  { S::name } -> std::convertible_to<std::string_view>;
  { S::summary } -> std::convertible_to<std::string_view>;
  { S::needs } -> std::convertible_to<PresetNeeds>;
};
template <class S>
concept has_pipeline = requires {
  typename S::template Pipeline<MemoryLoader>;
};
template <class S>
concept has_configure = requires(const ModelShape& s, Precision p, const PresetParams& q) {
  typename S::Config;
  { S::configure(s, p, q) } -> std::same_as<typename S::Config>;
};
template <class S>
concept has_checks = requires(const ModelShape& s, Precision p, const PresetParams& q,
                              const PresetInputs& in) {
  S::check(p, q);
  { S::precisions(s, p, q, in) } -> std::same_as<std::vector<Precision>>;
};
template <class S>
concept has_build = requires(const ModelShape& s, const PipelineConfig& pc,
                             const typename S::Config& c, const PresetInputs& in) {
  {
    S::template build<MemoryLoader>(s, pc, std::declval<MemoryLoader>(), c, in)
    } -> std::same_as<std::unique_ptr<typename S::template Pipeline<MemoryLoader>>>;
};
template <class S>
concept has_place = requires(typename S::template Pipeline<MemoryLoader>& p,
                             const PresetInputs& in) {
  { S::place(p, in) } -> std::convertible_to<std::size_t>;
};
}  // namespace requirements

/// **PresetSpec** — one preset, as described in the file comment.
template <class S>
concept PresetSpec = requirements::has_identity<S> && requirements::has_pipeline<S> &&
    requirements::has_configure<S> && requirements::has_checks<S> && requirements::has_build<S> &&
    requirements::has_place<S>;

/// One static_assert per requirement, so a spec missing a member says which.
template <class S>
consteval bool assert_preset_spec() {
  static_assert(requirements::has_identity<S>,
                "moekit::presets::PresetSpec: missing `name`, `summary` or `needs` (static "
                "constexpr members; derive from PresetDefaults for `needs`)");
  static_assert(requirements::has_pipeline<S>,
                "moekit::presets::PresetSpec: missing `template <class Loader> using Pipeline`");
  static_assert(requirements::has_configure<S>,
                "moekit::presets::PresetSpec: missing `struct Config` or `static Config "
                "configure(const ModelShape&, Precision, const PresetParams&)`");
  static_assert(requirements::has_checks<S>,
                "moekit::presets::PresetSpec: missing `check` or `precisions` (derive from "
                "PresetDefaults)");
  static_assert(requirements::has_build<S>,
                "moekit::presets::PresetSpec: missing `template <class Loader> static "
                "std::unique_ptr<Pipeline<Loader>> build(const ModelShape&, const PipelineConfig&, "
                "Loader, const Config&, const PresetInputs&)`");
  static_assert(requirements::has_place<S>,
                "moekit::presets::PresetSpec: missing `place(pipeline, inputs)` (derive from "
                "PresetDefaults)");
  return true;
}

}  // namespace moekit::presets
