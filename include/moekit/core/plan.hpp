#pragma once
/// \file The values components exchange: demands, plans, prefetches, load requests and tickets.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "moekit/core/expert_key.hpp"
#include "moekit/core/gate_view.hpp"
#include "moekit/core/precision.hpp"

namespace moekit {

/// One expert that the tokens of a forward selected at the current layer.
struct ExpertDemand {
  std::uint32_t expert = 0;
  std::uint32_t n_tokens = 0;   ///< tokens of the forward that selected it
  float weight_sum = 0.0f;      ///< sum of its normalised weights over those tokens
  float max_weight = 0.0f;      ///< its largest normalised weight
  std::uint32_t best_rank = 0;  ///< best (smallest) rank among the tokens' selections, 0 = top-1
};

/// The distinct experts of a layer call with their token counts and weights, in first-seen order,
/// into `out` (cleared). `slot` is scratch of n_experts entries, all -1, and is left so.
inline void collect_demands(const GateView& gate, std::vector<int>& slot,
                            std::vector<ExpertDemand>& out) {
  out.clear();
  for (std::uint32_t t = 0; t < gate.n_tokens; ++t) {
    const TokenRoute r = gate.token(t);
    for (std::uint32_t j = 0; j < gate.k; ++j) {
      const std::uint32_t e = r.experts[j];
      int& s = slot[e];
      if (s < 0) {
        s = static_cast<int>(out.size());
        out.push_back(ExpertDemand{e, 0, 0.0f, 0.0f, j});
      }
      ExpertDemand& d = out[static_cast<std::size_t>(s)];
      ++d.n_tokens;
      d.weight_sum += r.weights[j];
      d.max_weight = std::max(d.max_weight, r.weights[j]);
      d.best_rank = std::min(d.best_rank, j);
    }
  }
  for (const ExpertDemand& d : out) slot[d.expert] = -1;
}

/// Where a planned expert runs.
enum class Placement : std::uint8_t {
  device,    ///< from the expert cache (fast memory): resident, or loaded into it now
  host_cpu,  ///< on the CPU from host memory, without moving its weights (Fiddler)
  skipped,   ///< not run at all (the scorer decided `skip`)
};

/// Priority of a load: on-demand loads block compute and go before any prefetch.
enum class LoadPriority : std::uint8_t { on_demand = 0, prefetch = 1 };

/// Handle of a submitted load. `id == 0` means "nothing to wait for".
struct LoadTicket {
  std::uint64_t id = 0;
  [[nodiscard]] constexpr bool valid() const noexcept { return id != 0; }
  friend constexpr bool operator==(LoadTicket, LoadTicket) = default;
};

/// A request to bring `key` at `precision` into `dest` (empty when the loader keeps no bytes,
/// as the simulator's loader does).
struct LoadRequest {
  ExpertKey key{};
  Precision precision = Precision::f16;
  LoadPriority priority = LoadPriority::on_demand;
  std::span<std::byte> dest{};
};

/// How far ahead a prefetch may be, in layers: OffloadPipeline admits prefetches and scores
/// predictions at distances 1..max_prediction_distance (`PipelineConfig::max_prefetch_distance`
/// may lower it, not raise it), and the predictors that look further ahead refuse more.
inline constexpr std::uint32_t max_prediction_distance = 3;

/// A predictor's suggestion: load `key` at `precision` ahead of its use.
struct Prefetch {
  ExpertKey key{};
  Precision precision = Precision::f16;
  float confidence = 1.0f;  ///< predictor's belief that `key` will be used, in [0, 1]
  /// Layers ahead of the layer that predicted it (1 = next layer): the pipeline scores the
  /// prediction at this distance, and drops a prefetch whose key is not this many layers after
  /// the predicting layer. (A prefetch pushed by `on_verdict` has no predicting layer.)
  std::uint32_t distance = 1;
};

/// The pipeline's decision for one needed expert of the current layer.
struct ExpertPlan {
  ExpertKey key{};
  Precision precision = Precision::f16;  ///< precision it runs at (the scorer's, or better if a
                                         ///< more precise copy was resident)
  Placement placement = Placement::device;
  bool hit = false;        ///< resident (or already in flight) before this layer asked for it
  bool in_flight = false;  ///< a prefetch for it had been issued but had not completed
  LoadTicket ticket{};     ///< load to wait on before running it (invalid when resident)
  std::uint32_t slot = 0;  ///< cache slot holding it (placement == device)
  std::uint32_t n_tokens = 0;
  float weight_sum = 0.0f;
};

/// The plan for one layer call: one entry per distinct expert the tokens selected, in the order
/// the scheduler wants them run, plus the prefetches issued while planning.
struct LayerPlan {
  std::uint32_t layer = 0;
  std::vector<ExpertPlan> experts;   ///< capacity reserved at construction; reused every call
  std::vector<Prefetch> prefetches;  ///< prefetches issued by this call (loads submitted)

  void clear() noexcept {
    experts.clear();
    prefetches.clear();
  }
};

/// Verdict of a token policy after a token's forward pass.
enum class TokenVerdict : std::uint8_t {
  accept,    ///< keep the token
  fallback,  ///< roll the token back and recompute it with the full expert set (MoBiLE)
};

}  // namespace moekit
