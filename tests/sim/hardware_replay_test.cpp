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
