#pragma once
/// \file EdgeMoE (Yi et al., 2023): expert-wise bit widths from a table, activation-path
/// preloading, layer-aware eviction with a popularity prior, per-channel quantization, the
/// capacity guard and the buffer filled at start. What it runs against the paper, with each
/// substitution and each part not done: docs/presets.md, "EdgeMoE".

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
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
  /// The codec of the quantized experts: per output channel (one f16 scale per row), EdgeMoE's
  /// choice (§III-B); moe-run's --group-size 32 selects the group-wise codec instead.
  static constexpr std::uint32_t quant_group_size = 0;
  /// The paper's expert buffer (§IV-A): 10 experts. Not a default here (moe-run sizes the
  /// buffer from --expert-budget, moe-sim from --budget, where `--budget 10` is this buffer).
  static constexpr std::uint32_t paper_buffer_experts = 10;

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
    pred.max_preload = guarded_preloads(s, pc.expert_budget_bytes, t, pred.max_preload);
    EdgeMoePolicy::Config cache = c.cache;
    cache.prior_counts = in.popularity;
    return std::make_unique<Pipeline<Loader>>(s, pipeline_config(pc, c, t), std::move(loader),
                                              scorer(t), ActivationPathPredictor(std::move(pred)),
                                              EdgeMoePolicy(std::move(cache)));
  }

  /// EdgeMoE's capacity guard (design spec edgemoe.md §2.8): the buffer must hold the k on-demand
  /// experts and the preloads at the widest stored precision, so the preloads per layer are
  /// lowered to what fits (down to 0); a buffer that cannot hold the k experts is refused.
  static std::uint32_t guarded_preloads(const ModelShape& s, std::size_t buffer_bytes,
                                        const PrecisionTable& t, std::uint32_t max_preload) {
    std::size_t widest = 0;
    for (Precision p : t.all()) widest = std::max(widest, s.expert_bytes(p));
    const std::size_t fits = widest ? buffer_bytes / widest : 0;
    if (fits < s.top_k)
      moekit::detail::fail(ErrorKind::invalid_argument,
                           "--preset edgemoe: the expert buffer (" + std::to_string(buffer_bytes) +
                               " bytes) holds " + std::to_string(fits) +
                               " experts at the widest stored precision (" +
                               std::to_string(widest) +
                               " bytes each), fewer than top-k = " + std::to_string(s.top_k) +
                               " (EdgeMoE's capacity guard); raise --expert-budget");
    return static_cast<std::uint32_t>(std::min<std::size_t>(max_preload, fits - s.top_k));
  }

  /// Buffer initialisation (EdgeMoE §III-C2; decoder-only models: design spec edgemoe.md §2.9):
  /// the experts with the highest prior share of their layer (`in.popularity`; ties: smaller
  /// layer, then smaller expert) at their stored precision, until the next one would not fit
  /// without evicting (experts never seen come last). Nothing without a prior. Returns how many.
  template <class P>
  static std::size_t place(P& p, const PresetInputs& in) {
    const ModelShape& s = p.shape();
    if (in.popularity.size() != s.expert_count()) return 0;
    std::vector<double> share(s.expert_count(), 0.0);
    for (std::uint32_t l = 0; l < s.n_layers; ++l) {
      const auto row = in.popularity.begin() + std::ptrdiff_t{l} * s.n_experts;
      const double sum = std::accumulate(row, row + s.n_experts, 0.0);
      for (std::uint32_t e = 0; e < s.n_experts && sum > 0; ++e)
        share[std::size_t{l} * s.n_experts + e] = row[e] / sum;
    }
    std::vector<std::uint32_t> order(s.expert_count());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return share[a] > share[b]; });
    const PrecisionTable t = table(s, p.config().base_precision, in);
    std::size_t used = p.cache().used_bytes(), placed = 0;
    for (std::uint32_t i : order) {
      const ExpertKey k{i / s.n_experts, i % s.n_experts};
      const std::size_t bytes = s.expert_bytes(t.at(k));
      if (used + bytes > p.cache().capacity_bytes()) break;
      if (!p.preload(k, t.at(k))) break;
      used += bytes;
      ++placed;
    }
    p.finish_loads();
    return placed;
  }
};

/// EdgeMoE (Yi et al., 2023): expert-wise bit widths, activation-path preloading, layer-aware
/// eviction.
template <class Loader>
using EdgeMoe = EdgeMoeSpec::Pipeline<Loader>;

}  // namespace moekit::presets
