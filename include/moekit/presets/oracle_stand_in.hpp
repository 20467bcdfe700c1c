#pragma once
/// \file What the oracle stand-ins of the gate predictors share (hobbit-oracle, fate-oracle).
///
/// A model with random weights cannot predict a trained model's recorded routing from its own
/// gates, so replaying real routing (moe-run --routing-trace) through HOBBIT or Fate measures a
/// predictor that is never right. A stand-in keeps every component of its parent preset and
/// replaces only the gate predictor by a noisy oracle over the routing known ahead
/// (predict/lookahead_oracle.hpp), at the accuracy its paper reports for the real predictor, as
/// moe-sim's stand-ins do on traces without gate inputs.
///
/// `OracleStandIn<Parent, Self, Oracle, Recall>` is the shape both share: the parent's `Config`
/// with the oracle's `recall` figures beside it, the parent's pipeline around the `Oracle`
/// predictor, and `build` through the parent's `build_with`. `Self` defines `paper_recall()` (the
/// default figures), `recall(params)` (the figures the knobs ask for) and `predictor(shape,
/// config, inputs)`.

#include <memory>
#include <utility>

#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/presets/preset_spec.hpp"

namespace moekit::presets {

template <class Parent, class Self, class Oracle, class Recall>
struct OracleStandIn : Parent {
  using Predictor = Oracle;
  /// The parent's Config and the oracle's recall figures (default: the paper's).
  struct Config : Parent::Config {
    Recall recall = Self::paper_recall();
  };
  template <class Loader>
  using Pipeline = typename Parent::template PipelineWith<Loader, Oracle>;

  static Config configure(const ModelShape& s, Precision base, const PresetParams& q) {
    Config c{Parent::configure(s, base, q)};
    c.recall = Self::recall(q);
    return c;
  }

  template <class Loader>
  static std::unique_ptr<Pipeline<Loader>> build(const ModelShape& s, const PipelineConfig& pc,
                                                 Loader loader, const Config& c,
                                                 const PresetInputs& in) {
    return Parent::build_with(s, pc, std::move(loader), c, Self::predictor(s, c, in));
  }
};

}  // namespace moekit::presets
