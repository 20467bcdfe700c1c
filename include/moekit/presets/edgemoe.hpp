#pragma once
/// \file EdgeMoE (Yi et al., 2023): expert-wise bit widths from a table, activation-path
/// preloading, layer-aware eviction with a popularity prior.

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/cache/edgemoe.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/activation_path.hpp"
#include "moekit/presets/preset_spec.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/static_bitwidth.hpp"

namespace moekit::presets {

struct EdgeMoeSpec : PresetDefaults {
  static constexpr std::string_view name = "edgemoe";
  static constexpr std::string_view summary =
      "EdgeMoE: per-expert bit widths (--bitwidth-table, default uniform --precision), "
      "activation-path preloading (profile from a calibration run), EdgeMoE eviction";
  static constexpr PresetNeeds needs{.popularity = true, .paths = true, .bitwidths = true};

  template <class Loader>
  using Pipeline = OffloadPipeline<StaticBitwidthScorer, ActivationPathPredictor, EdgeMoePolicy,
                                   Loader, OnDemandScheduler>;

  /// The predictor's profile and precisions come from the inputs (`paths`, `bitwidths`), and so
  /// does the cache's prior (`popularity`).
  struct Config {
    ActivationPathPredictor::Config predictor{};
    EdgeMoePolicy::Config cache{};
    Precision sizing = Precision::skip;  ///< the cache's sizing precision (skip: the base's)
  };
  static Config configure(const ModelShape&, Precision, const PresetParams&) { return {}; }

  /// `in.bitwidths`, or every expert at `base`.
  static PrecisionTable table(const ModelShape& s, Precision base, const PresetInputs& in) {
    return in.bitwidths ? *in.bitwidths : PrecisionTable(s.n_layers, s.n_experts, base);
  }
  static std::vector<Precision> precisions(const ModelShape& s, Precision base, const PresetParams&,
                                           const PresetInputs& in) {
    std::vector<Precision> out{base};
    const PrecisionTable t = table(s, base, in);
    for (Precision p : t.all()) add_precision(out, p);
    return out;
  }

  /// `pc` with slots that fit the widest precision of `t`, sized at `c.sizing`.
  static PipelineConfig pipeline_config(PipelineConfig pc, const Config& c,
                                        const PrecisionTable& t) {
    pc.sizing_precision = c.sizing == Precision::skip ? pc.base_precision : c.sizing;
    for (Precision p : t.all())
      if (bits(p) > bits(pc.base_precision)) pc.base_precision = p;
    return pc;
  }
  /// Out of line: inlined into a caller's lambda, g++ 12 -O3 reports a false
  /// -Wfree-nonheap-object on the table's vector.
  [[gnu::noinline]] static StaticBitwidthScorer scorer(const PrecisionTable& t) {
    return StaticBitwidthScorer({.table = t});
  }

  template <class Loader>
  static std::unique_ptr<Pipeline<Loader>> build(const ModelShape& s, const PipelineConfig& pc,
                                                 Loader loader, const Config& c,
                                                 const PresetInputs& in) {
    if (!in.paths)
      moekit::detail::fail(
          ErrorKind::internal,
          "--preset edgemoe: no activation-path profile (calibration run missing)");
    const PrecisionTable t = table(s, pc.base_precision, in);
    ActivationPathPredictor::Config pred = c.predictor;
    pred.profile = in.paths;
    pred.precisions.assign(t.all().begin(), t.all().end());
    EdgeMoePolicy::Config cache = c.cache;
    cache.prior_counts = in.popularity;
    return std::make_unique<Pipeline<Loader>>(s, pipeline_config(pc, c, t), std::move(loader),
                                              scorer(t), ActivationPathPredictor(std::move(pred)),
                                              EdgeMoePolicy(std::move(cache)));
  }
};

/// EdgeMoE (Yi et al., 2023): expert-wise bit widths, activation-path preloading, layer-aware
/// eviction.
template <class Loader>
using EdgeMoe = EdgeMoeSpec::Pipeline<Loader>;

}  // namespace moekit::presets
