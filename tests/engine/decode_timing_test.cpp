// Fate's decode timing (engine/decode_timing.hpp) and the cap moe-run derives from it: T is
// measured between consecutive layers' routing in decode tokens, t_expert through the run's
// loader, and the Fate preset built with them caps its decode prefetches at floor(T / t_expert).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "moekit/precision/thread_pool.hpp"
#include "moekit/presets/registry.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/decode_timing.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;

TEST_CASE("Fate's decode cap comes from measured T and t_expert", "[engine][fate]") {
  const ModelConfig cfg = load_config(engine_test::data_dir() / "mixtral");
  const moekit::ModelShape s = cfg.shape();
  const ModelWeights w = load_weights(cfg, engine_test::data_dir() / "mixtral", {Precision::f16});
  moekit::ThreadPool pool(1);
  const ExpertBacking host{&w.experts, nullptr, {}};
  const OffloadSettings o{all_resident_budget(s, Precision::f16) / 2, Precision::f16};
  const std::vector<Token> prompt{1, 5, 9};
  const DecodeTiming t =
      measure_decode_timing(cfg, w.dense, o, host, prompt, 4, Precision::f16, &pool, {}, 5);
  CHECK(t.layer_samples == 4u * (s.n_layers - 1));  // layers 1.. of each decode token
  CHECK(t.layer_seconds > 0);
  CHECK(t.expert_load_seconds > 0);

  // moe-run hands them to the preset as inputs; the predictor's cap follows.
  CHECK(moekit::presets::FateSpec::needs.decode_timing);
  PresetInputs in;
  const std::vector<float> routers = router_stack(cfg, w.dense);
  in.routers = routers;
  in.layer_seconds = 3.5e-3;
  in.expert_load_seconds = 1e-3;
  const auto p = moekit::presets::make_pipeline<moekit::presets::FateSpec>(
      s, pipeline_config(s, o), o.preset, host_loader(w.experts), in);
  const std::uint32_t m = p->predictor().candidate_count();
  CHECK(p->predictor().transfer_cap() == std::min<std::uint32_t>(3, m));
  in.layer_seconds = 0.5e-3;  // less than one load: no prefetch transfer in decode
  const auto q = moekit::presets::make_pipeline<moekit::presets::FateSpec>(
      s, pipeline_config(s, o), o.preset, host_loader(w.experts), in);
  CHECK(q->predictor().transfer_cap() == 0);
}
