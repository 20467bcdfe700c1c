// moe-run --trace-out (examples/moe-run/trace_recorder.hpp): the recorded routing equals the
// engine's (checked against transformers' router logits in tests/data), the hidden state is the
// gate input (router · hidden = recorded logits), fallbacks keep only the accepted forward, and
// the .mktrace file reads back equal.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "moekit/precision/thread_pool.hpp"
#include "moekit/presets.hpp"
#include "moekit/sim/trace_binary.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/trace_recorder.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;
using Baseline = moekit::presets::Baseline<moekit::MemoryLoader>;
using BigLittle = moekit::OffloadPipeline<moekit::UniformScorer, moekit::NoPredictor,
                                          moekit::LruPolicy, moekit::MemoryLoader,
                                          moekit::OnDemandScheduler, moekit::BigLittlePolicy>;
namespace fs = std::filesystem;

namespace {

// Prefill of the reference prompt, then teacher-forced decode of the rest of sequence_ids.
template <class P>
void run(const engine_test::LoadedModel& m, P& pipeline, TraceRecorder& rec,
         const engine_test::Reference& ref, moekit::ThreadPool& pool) {
  TracingPipeline<P> traced(pipeline, rec);
  Model<TracingPipeline<P>> model(m.cfg, m.weights.dense, traced, 128, &pool);
  rec.name_next_sequence("golden");
  model.begin_sequence();
  model.prefill(ref.prompt_ids);
  for (std::size_t t = ref.prompt_ids.size(); t < ref.sequence_ids.size(); ++t)
    model.decode(ref.sequence_ids[t]);
}

// Top-k (descending, ties → lower id) of softmax(logits), renormalised.
void expected_route(std::span<const float> logits, std::uint32_t k, std::vector<std::uint32_t>& ids,
                    std::vector<float>& w) {
  std::vector<double> p(logits.begin(), logits.end());
  const double mx = *std::max_element(p.begin(), p.end());
  double s = 0;
  for (double& v : p) s += (v = std::exp(v - mx));
  std::vector<std::uint32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return p[a] > p[b]; });
  ids.assign(order.begin(), order.begin() + k);
  double top = 0;
  for (std::uint32_t j = 0; j < k; ++j) top += p[ids[j]];
  w.resize(k);
  for (std::uint32_t j = 0; j < k; ++j) w[j] = static_cast<float>(p[ids[j]] / top);
}

}  // namespace

TEST_CASE("moe-run --trace-out records the engine's routing, router logits and gate inputs",
          "[engine][trace]") {
  moekit::ThreadPool pool(2);
  for (const char* name : {"mixtral", "qwen2_moe", "olmoe"}) {
    DYNAMIC_SECTION(name) {
      const fs::path dir = engine_test::data_dir() / name;
      if (!fs::exists(dir / "reference.json")) {
        WARN("fixture " << dir << " is missing; skipped");
        continue;
      }
      const auto m = engine_test::load_model(dir);
      REQUIRE(m);
      const auto ref = engine_test::load_reference(dir);
      const auto shape = m->cfg.shape();
      Baseline pipeline(shape, pipeline_config(shape, {0, Precision::f32}),
                        host_loader(m->weights.experts), moekit::UniformScorer({Precision::f32}));
      TraceRecorder rec(m->cfg, name);
      run(*m, pipeline, rec, ref, pool);
      const auto& tr = rec.trace();
      const std::size_t T = ref.sequence_ids.size(), L = m->cfg.n_moe_layers, E = m->cfg.n_experts,
                        H = m->cfg.hidden, K = m->cfg.top_k;
      REQUIRE(tr.sequence_count() == 1);
      CHECK(tr.sequence_name(0) == "golden");
      REQUIRE(tr.token_count() == T);
      CHECK(tr.prefill_length(0) == ref.prompt_ids.size());
      CHECK(tr.missing_count() == 0);
      CHECK(tr.has_logits());
      CHECK(tr.dims().hidden == H);
      // transformers' raw router logits [layers, T, E].
      const auto golden = engine_test::read_f32(dir / "router_logits.f32.bin", L * T * E);
      std::vector<std::uint32_t> ids;
      std::vector<float> w, y(E);
      const auto routers = router_stack(m->cfg, m->weights.dense);
      double worst = 0;
      for (std::size_t t = 0; t < T; ++t) {
        CHECK(tr.phase(t) ==
              (t < ref.prompt_ids.size() ? moekit::Phase::prefill : moekit::Phase::decode));
        for (std::uint32_t l = 0; l < L; ++l) {
          const auto g = std::span<const float>(golden).subspan((l * T + t) * E, E);
          worst = std::max(worst, engine_test::relative_error(tr.logits(t, l).data(), g.data(), E));
          expected_route(g, K, ids, w);
          const auto got = tr.experts(t, l);
          INFO("token " << t << " layer " << l);
          CHECK(std::vector<std::uint32_t>(got.begin(), got.end()) == ids);
          for (std::size_t j = 0; j < K; ++j)
            CHECK(tr.weights(t, l)[j] == Approx(w[j]).margin(1e-5));
          // The stored hidden state is the router's input: router · hidden = recorded logits.
          const auto h = tr.hidden(t, l);
          for (std::size_t e = 0; e < E; ++e) {
            double dot = 0;
            for (std::size_t i = 0; i < H; ++i) dot += double(routers[(l * E + e) * H + i]) * h[i];
            y[e] = static_cast<float>(dot);
          }
          CHECK(engine_test::relative_error(y.data(), tr.logits(t, l).data(), E) <= 1e-5);
        }
      }
      INFO(name << ": worst router-logit relative error " << worst);
      CHECK(worst <= 1e-4);

      const fs::path tmp = engine_test::scratch("engine-trace", "" + std::string(name) + "");
      const std::string file = (tmp / "t.mktrace").string();
      rec.write(file, false);
      CHECK_THROWS_WITH(rec.write(file, false), Catch::Contains("refusing to overwrite"));
      rec.write(file, true);
      const auto back = moekit::sim::read_trace_binary(file);
      CHECK(back == tr);
    }
  }
}

TEST_CASE("moe-run --trace-out keeps the accepted forward of a token and the model's full top-k",
          "[engine][trace]") {
  const fs::path dir = engine_test::data_dir() / "mixtral";
  if (!fs::exists(dir / "reference.json")) return;
  moekit::ThreadPool pool(2);
  const auto m = engine_test::load_model(dir);
  REQUIRE(m);
  const auto ref = engine_test::load_reference(dir);
  const auto shape = m->cfg.shape();
  const std::size_t T = ref.sequence_ids.size(), L = m->cfg.n_moe_layers;
  const auto golden =
      engine_test::read_f32(dir / "router_logits.f32.bin", L * T * m->cfg.n_experts);

  TraceRecorder full(m->cfg, "full");
  {
    Baseline p(shape, pipeline_config(shape, {0, Precision::f32}), host_loader(m->weights.experts),
               moekit::UniformScorer({Precision::f32}));
    run(*m, p, full, ref, pool);
  }
  SECTION("gamma = 1: every decode token falls back; the big pass is what is recorded") {
    BigLittle p(shape, pipeline_config(shape, {0, Precision::f32}), host_loader(m->weights.experts),
                moekit::UniformScorer({Precision::f32}), {}, {}, {},
                moekit::BigLittlePolicy({.gamma = 1.0f}));
    TraceRecorder rec(m->cfg, "full");
    run(*m, p, rec, ref, pool);
    CHECK(p.stats().fallbacks == T - ref.prompt_ids.size());
    CHECK(rec.trace() == full.trace());
  }
  SECTION("gamma = 0: little passes are kept; records still hold the model's top-k") {
    BigLittle p(shape, pipeline_config(shape, {0, Precision::f32}), host_loader(m->weights.experts),
                moekit::UniformScorer({Precision::f32}), {}, {}, {},
                moekit::BigLittlePolicy({.gamma = 0.0f}));
    TraceRecorder rec(m->cfg, "little");
    run(*m, p, rec, ref, pool);
    CHECK(p.stats().fallbacks == 0);
    const auto& tr = rec.trace();
    REQUIRE(tr.token_count() == T);
    std::vector<std::uint32_t> ids;
    std::vector<float> w;
    bool differs = false;
    for (std::size_t t = 0; t < T; ++t)
      for (std::uint32_t l = 0; l < L; ++l) {
        REQUIRE(tr.valid(t, l));
        expected_route(tr.logits(t, l), m->cfg.top_k, ids, w);
        const auto got = tr.experts(t, l);
        CHECK(std::vector<std::uint32_t>(got.begin(), got.end()) == ids);
        if (l > 0 && t >= ref.prompt_ids.size())
          differs =
              differs || !std::equal(got.begin(), got.end(), full.trace().experts(t, l).begin());
        if (l == 0)  // layer 0's gate input does not depend on the little pass
          CHECK(std::equal(got.begin(), got.end(), full.trace().experts(t, 0).begin()));
      }
    // A little pass (top-1) changes later layers' inputs, so some routing differs.
    CHECK(differs);
  }
}
