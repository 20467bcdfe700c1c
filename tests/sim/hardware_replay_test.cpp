// Integration: a synthetic trace replayed through the Baseline (LRU) pipeline on a hardware
// preset. Checks that the pieces fit (trace dims ↔ model shape, HardwareModel → LinkModel +
// ComputeModel) and that the simulated time respects bounds every correct replay must meet.

#include <catch2/catch.hpp>

#include "moekit/core/model_shape.hpp"
#include "moekit/presets.hpp"
#include "moekit/sim/hardware.hpp"
#include "moekit/sim/replay.hpp"
#include "moekit/sim/sim_loader.hpp"
#include "moekit/sim/synthetic_trace.hpp"

using namespace moekit;
using namespace moekit::sim;

TEST_CASE("synthetic Mixtral trace on the Fiddler machine: time within physical bounds",
          "[sim][hardware][synthetic]") {
  const RoutingTrace trace = generate_synthetic_trace(
      "mixtral-8x7b", MOEKIT_SOURCE_DIR "/data/stats", {.decode_tokens = 16, .seed = 2});
  const HardwareModel hw = quadro_rtx6000_pcie3();
  const ModelShape shape = mixtral_8x7b;
  const DenseLayerShape dense = mixtral_8x7b_dense();
  const ComputeModel compute = hw.compute_model(shape, dense);
  // Fiddler keeps 56 of 256 experts on the GPU.
  presets::Baseline<SimLoader> pipe(
      shape, PipelineConfig{.expert_budget_bytes = 56 * shape.expert_bytes(Precision::f16)},
      SimLoader(shape, hw.link));
  const ReplayReport r = replay(pipe, trace, compute);

  CHECK(r.synthetic);
  CHECK(r.trace_name.find("synthetic:") == 0);
  CHECK(r.decode_tokens == 16);
  REQUIRE(r.misses() > 0);
  CHECK(r.bytes_moved() == r.misses() * shape.expert_bytes(Precision::f16));
  // Lower bound: the link must move every missed byte. Upper bound: every load and every
  // computation done one after another, with no overlap at all.
  const double link_s = double(r.bytes_moved()) / hw.link.bandwidth_bytes_per_s;
  const double uses = double(r.pipeline.hits + r.misses());
  const double serial = double(r.misses()) * hw.transfer_s(shape.expert_bytes(Precision::f16)) +
                        uses * hw.device.expert_s(shape, Precision::f16, 1) +
                        16.0 * shape.n_layers * hw.dense_layer_s(dense, 1);
  CHECK(r.total_s >= link_s);
  CHECK(r.total_s <= serial * (1 + 1e-9));
  // With most experts missing at ~50 ms each, decode is well below Fiddler's > 3 tokens/s
  // (Fiddler runs misses on the CPU instead; this is the plain offloading baseline).
  CHECK(r.decode_tokens_per_s() < 3.0);
}

TEST_CASE("solo: decode steps at the one-thread rates slow decode only, by the expert count",
          "[sim][hardware][synthetic]") {
  const RoutingTrace trace = generate_synthetic_trace(
      "mixtral-8x7b", MOEKIT_SOURCE_DIR "/data/stats", {.decode_tokens = 8, .seed = 3});
  const ModelShape shape = mixtral_8x7b;
  const DenseLayerShape dense{mixtral_8x7b_dense().params, Precision::q4};
  HardwareModel hw = rtx4080_pcie4();
  hw.cpu = hw.device;
  hw.host_holds_experts = false;
  hw.host_is_device = true;
  hw.experts_after_all_loads = true;
  hw.fixed_includes_first_token = true;
  auto run = [&](const HardwareModel& h) {
    // Every expert fits (the pipeline's default f16 experts); the loads are the same in both.
    presets::Baseline<SimLoader> pipe(
        shape,
        PipelineConfig{.expert_budget_bytes =
                           shape.expert_count() * shape.expert_bytes(Precision::f16)},
        SimLoader(shape, h.link));
    return replay(pipe, trace, h.compute_model(shape, dense));
  };
  const ReplayReport team = run(hw);
  ProcessorModel one = hw.device;
  for (double& r : one.weight_bytes_per_s) r /= 2;
  hw.solo = one;
  hw.decode_team_fraction = 0.0;
  const ReplayReport solo = run(hw);
  REQUIRE(solo.decode_tokens == team.decode_tokens);
  CHECK(solo.prefill_s == Approx(team.prefill_s));  // batches keep the all-thread rates
  CHECK(solo.stall_s == Approx(team.stall_s));
  // Per decode token and layer: the dense part and top_k experts, each twice as long.
  const double per_layer =
      (one.fixed_s(shape, Precision::f16) - hw.device.fixed_s(shape, Precision::f16)) *
          shape.top_k +
      double(matrix_bytes(1, dense.params, dense.precision)) /
          hw.device.weight_bytes_per_s[static_cast<std::size_t>(Precision::q4)];
  const double extra = solo.decode_s - team.decode_s;
  CHECK(extra > 0);
  CHECK(extra == Approx(double(solo.decode_tokens) * shape.n_layers * per_layer).epsilon(1e-6));
}
