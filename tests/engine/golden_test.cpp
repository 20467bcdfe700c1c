// moe-run's forward pass against transformers: the fixtures in tests/data (made by
// scripts/make_fixtures.py) hold tiny random-weight Mixtral / Qwen2-MoE / OLMoE checkpoints with
// the reference logits at every position and 32 greedy tokens.

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "moekit/precision/thread_pool.hpp"
#include "moekit/presets.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;
using Baseline = moekit::presets::Baseline<moekit::MemoryLoader>;

namespace {

// tests/data (shared fixtures) and tests/engine/data (engine-only: Qwen2-MoE with dense MLP layers,
// a sliding-window layer and tied embeddings; see make_engine_fixtures.py there).
const std::vector<std::filesystem::path> golden_fixtures = {
    engine_test::data_dir() / "mixtral", engine_test::data_dir() / "mixtral_swa",
    engine_test::data_dir() / "qwen2_moe", engine_test::data_dir() / "olmoe",
    std::filesystem::path(MOEKIT_SOURCE_DIR) / "tests/engine/data/qwen2_moe_dense"};

// Greedy run of the reference prompt for as many tokens as the reference generated.
engine_test::GreedyRun greedy_reference(const engine_test::LoadedModel& m, Baseline& pipeline,
                                        const engine_test::Reference& ref,
                                        moekit::ThreadPool* pool) {
  return engine_test::greedy(m.cfg, m.weights.dense, pipeline, ref.prompt_ids,
                             static_cast<int>(ref.generated_ids.size()) - 1, pool);
}

}  // namespace

TEST_CASE("f32 forward pass matches transformers' logits and greedy tokens", "[engine][golden]") {
  moekit::ThreadPool pool(2);
  for (const auto& dir : golden_fixtures) {
    const std::string name = dir.filename().string();
    DYNAMIC_SECTION(name) {
      const auto m = engine_test::load_model(dir);
      if (!m) {
        WARN("fixture " << dir << " is missing (run scripts/make_fixtures.py); skipped");
        continue;
      }
      const auto ref = engine_test::load_reference(dir);
      REQUIRE(ref.vocab == m->cfg.vocab_size);
      const auto shape = m->cfg.shape();
      Baseline pipeline(shape, pipeline_config(shape, {0, Precision::f32}),
                        host_loader(m->weights.experts), moekit::UniformScorer({Precision::f32}));
      const auto r = greedy_reference(*m, pipeline, ref, &pool);
      CHECK(r.tokens == std::vector<Token>(ref.generated_ids.begin(), ref.generated_ids.end()));
      const std::size_t V = ref.vocab;
      REQUIRE(r.logits.size() == ref.logits.size());
      double worst = 0;
      for (std::size_t t = 0; t < r.logits.size() / V; ++t) {
        const double e =
            engine_test::relative_error(r.logits.data() + t * V, ref.logits.data() + t * V, V);
        worst = std::max(worst, e);
        INFO("position " << t);
        CHECK(e <= 1e-4);
      }
      INFO(name << ": worst relative error " << worst);
      CHECK(worst <= 1e-4);
    }
  }
}

TEST_CASE("an expert budget forcing evictions gives the all-resident logits bit for bit",
          "[engine][golden]") {
  moekit::ThreadPool pool(2);
  for (const auto& dir : golden_fixtures) {
    const std::string name = dir.filename().string();
    DYNAMIC_SECTION(name) {
      const auto m = engine_test::load_model(dir);
      if (!m) {
        WARN("fixture " << dir << " is missing; skipped");
        continue;
      }
      const auto ref = engine_test::load_reference(dir);
      const auto shape = m->cfg.shape();
      Baseline all(shape, pipeline_config(shape, {0, Precision::f32}),
                   host_loader(m->weights.experts), moekit::UniformScorer({Precision::f32}));
      const OffloadSettings tight{minimum_expert_budget(shape, Precision::f32), Precision::f32};
      Baseline few(shape, pipeline_config(shape, tight), host_loader(m->weights.experts),
                   moekit::UniformScorer({Precision::f32}));
      const auto a = greedy_reference(*m, all, ref, &pool);
      const auto b = greedy_reference(*m, few, ref, &pool);
      CHECK(all.stats().cache.evictions == 0);
      CHECK(few.stats().cache.evictions > 0);
      CHECK(a.tokens == b.tokens);
      REQUIRE(a.logits.size() == b.logits.size());
      CHECK(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)) == 0);
    }
  }
}
