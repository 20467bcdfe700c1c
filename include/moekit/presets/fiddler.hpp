#pragma once
/// \file Fiddler (Kamahori et al., 2025): the most popular experts placed at start-up, misses run
/// on the CPU from host memory when that is cheaper than loading them.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/cache/static_popularity.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/presets/preset_spec.hpp"
#include "moekit/sched/fiddler.hpp"
#include "moekit/score/uniform.hpp"

namespace moekit::presets {

struct FiddlerSpec : PresetDefaults {
  static constexpr std::string_view name = "fiddler";
  static constexpr std::string_view summary =
      "Fiddler: most popular experts placed at start (--popularity or a calibration run "
      "on --calib-text), misses run on the CPU from host memory when cheaper than a load "
      "(latencies measured at start-up)";
  static constexpr PresetNeeds needs{.popularity = true, .latencies = true, .host_bytes = true};

  template <class Loader>
  using Pipeline =
      OffloadPipeline<UniformScorer, NoPredictor, StaticPopularityPolicy, Loader, FiddlerScheduler>;

  /// The cache's popularity and the scheduler's latencies are inputs.
  struct Config {
    UniformScorer::Config scorer{};
  };
  static Config configure(const ModelShape&, Precision base, const PresetParams&) {
    return {.scorer = {.precision = base}};
  }

  template <class Loader>
  static std::unique_ptr<Pipeline<Loader>> build(const ModelShape& s, const PipelineConfig& pc,
                                                 Loader loader, const Config& c,
                                                 const PresetInputs& in) {
    if (in.popularity.size() != s.expert_count())
      moekit::detail::fail(ErrorKind::internal, "--preset fiddler: no popularity profile");
    if (!(in.cpu_seconds_per_token > 0 && in.copy_seconds > 0))
      moekit::detail::fail(ErrorKind::internal,
                           "--preset fiddler: CPU/load latencies not measured");
    return std::make_unique<Pipeline<Loader>>(
        s, pc, std::move(loader), UniformScorer(c.scorer), NoPredictor{},
        StaticPopularityPolicy({.counts = in.popularity}),
        FiddlerScheduler({.cpu_seconds_per_token = in.cpu_seconds_per_token,
                          .copy_seconds = in.copy_seconds,
                          .cpu_seconds_per_expert = in.cpu_seconds_per_expert}));
  }

  /// Preloads the most popular experts (ties to the lower index) at the base precision until
  /// the cache refuses one (the policy admits exactly its placement); returns how many.
  template <class P>
  static std::size_t place(P& p, const PresetInputs& in) {
    const ModelShape& s = p.shape();
    std::vector<std::uint32_t> order(s.expert_count());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      return in.popularity[a] > in.popularity[b];
    });
    std::size_t placed = 0;
    for (std::uint32_t i : order) {
      if (!p.preload({i / s.n_experts, i % s.n_experts}, p.config().base_precision)) break;
      ++placed;
    }
    return placed;
  }
};

/// Fiddler (Kamahori et al., 2025): static popular experts; misses run on the CPU when cheaper.
template <class Loader>
using Fiddler = FiddlerSpec::Pipeline<Loader>;

}  // namespace moekit::presets
