#pragma once
/// \file FiddlerScheduler: run a missing expert on the CPU when that is faster than moving it.
///
/// Fiddler (Kamahori et al., "Fiddler: CPU-GPU Orchestration for Fast Inference of Mixture-of-
/// Experts Models", ICLR 2025). Per layer, resident experts run on the device; for the missing ones
/// it minimises max(CPU time, transfer time) over partitions into CPU-run and copied experts, with
/// CPU time linear in the expert's tokens (n_i · latency_cpu) and a copy costing latency_gpu
/// whatever the tokens. The exact solver (spec §2.4): sort the misses by tokens, descending;
/// copying the g busiest is optimal for each g; scan g = 0..m. In decode (n_i = 1) this gives
/// Fiddler's decode rule — run every miss on the CPU — whenever k · latency_cpu ≤ latency_gpu. The
/// latencies are measured, not hard-coded: `sim/` calibrates them, the engine measures them (a
/// line fitted over several experts and token counts, engine/calibration.hpp). The CPU time may
/// have a fixed part per expert, `cpu_seconds_per_expert` (the fitted line's intercept: on a CPU
/// an expert's weights are read once per call whatever its tokens; the paper's model has none, the
/// default 0, design spec fiddler.md C14). The scan stays exact with it: for g copies the CPU runs
/// the other m − g experts, so its fixed part depends on g only.

#include <cstdint>
#include <span>
#include <string_view>

#include "moekit/core/concepts.hpp"
#include "moekit/error.hpp"

namespace moekit {

class FiddlerScheduler {
 public:
  static constexpr std::string_view name = "fiddler";
  struct Config {
    double cpu_seconds_per_token = 7e-3;  ///< latency_cpu: one token through one expert on the CPU
    double copy_seconds = 70e-3;          ///< latency_gpu: copy one expert in and run it
    double cpu_seconds_per_expert = 0.0;  ///< fixed CPU time of one expert call (paper: 0)
  };
  FiddlerScheduler() = default;
  explicit FiddlerScheduler(Config c) : cfg_(c) {
    MOEKIT_EXPECTS(c.cpu_seconds_per_token > 0 && c.copy_seconds > 0,
                   "FiddlerScheduler: latencies must be > 0");
    MOEKIT_EXPECTS(c.cpu_seconds_per_expert >= 0 && c.cpu_seconds_per_expert < 1e300,
                   "FiddlerScheduler: Config.cpu_seconds_per_expert must be finite and >= 0");
  }

  void schedule(const LayerContext&, std::span<ExpertPlan> plans) const noexcept {
    // Resident and skipped experts first (their order kept), then the misses by tokens,
    // descending (ties: smaller expert id). Insertion sort: at most one entry per expert.
    std::size_t first_miss = 0;
    for (std::size_t r = 0; r < plans.size(); ++r) {
      if (plans[r].hit || plans[r].placement == Placement::skipped) {
        const ExpertPlan p = plans[r];
        for (std::size_t j = r; j > first_miss; --j) plans[j] = plans[j - 1];
        plans[first_miss++] = p;
      }
    }
    std::span<ExpertPlan> misses = plans.subspan(first_miss);
    for (std::size_t i = 1; i < misses.size(); ++i) {
      const ExpertPlan p = misses[i];
      std::size_t j = i;
      for (; j > 0 && busier(p, misses[j - 1]); --j) misses[j] = misses[j - 1];
      misses[j] = p;
    }
    double cpu_tokens = 0;
    for (const ExpertPlan& p : misses) cpu_tokens += p.n_tokens;
    const std::size_t m = misses.size();
    std::size_t best_g = 0;
    double best = cost(cpu_tokens, 0, m), prefix = 0;
    for (std::size_t g = 1; g <= m; ++g) {
      prefix += misses[g - 1].n_tokens;
      const double c = cost(cpu_tokens - prefix, g, m - g);
      if (c < best) best = c, best_g = g;  // strict: ties keep fewer copies
    }
    for (std::size_t i = 0; i < misses.size(); ++i)
      misses[i].placement = i < best_g ? Placement::device : Placement::host_cpu;
  }

  /// The objective for `cpu_tokens` tokens of `cpu_experts` experts on the CPU and `copies`
  /// experts moved.
  [[nodiscard]] double cost(double cpu_tokens, std::size_t copies,
                            std::size_t cpu_experts = 0) const noexcept {
    const double cpu =
        cpu_tokens * cfg_.cpu_seconds_per_token + double(cpu_experts) * cfg_.cpu_seconds_per_expert;
    const double gpu = double(copies) * cfg_.copy_seconds;
    return cpu > gpu ? cpu : gpu;
  }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  static bool busier(const ExpertPlan& a, const ExpertPlan& b) noexcept {
    return a.n_tokens > b.n_tokens || (a.n_tokens == b.n_tokens && a.key.expert < b.key.expert);
  }
  Config cfg_{};
};
static_assert(Scheduler<FiddlerScheduler>);

}  // namespace moekit
