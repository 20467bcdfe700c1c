// Resident memory of the store path: with experts read from an expert store (O_DIRECT) under a
// budget that forces offloading, the process's resident set (/proc/self/statm) grows by no more
// than dense weights + KV cache + expert budget + staging slots + a stated overhead — well below
// what holding every expert in memory would take. And an impossible budget is refused with the
// minimum, which does run.

#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "moekit/io/expert_store.hpp"
#include "moekit/pipeline.hpp"  // WeightView, used by moe_layer.hpp
#include "moekit/precision/thread_pool.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;
namespace fs = std::filesystem;

namespace {

/// Stated overhead of a run beyond its weights, KV cache and expert slots: scratch activations,
/// logits, thread pools, io_uring rings, loader slots, allocator slack.
constexpr std::size_t overhead_bytes = 8u << 20;

std::size_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  std::size_t size = 0, resident = 0;
  in >> size >> resident;
  REQUIRE(in);
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

const fs::path tiny_model = fs::path(MOEKIT_SOURCE_DIR) / "models/moekit-tiny-moe";

fs::path tiny_store(const ModelConfig& cfg, std::span<const Precision> ps) {
  const fs::path d = fs::path(MOEKIT_BINARY_DIR) / "test-scratch" / "engine-memory";
  fs::remove_all(d);
  fs::create_directories(d);
  build_store_from_checkpoint(cfg, tiny_model, ps, d / "tiny.moestore", {});
  return d / "tiny.moestore";
}

// Sanitizer runtimes (shadow memory, quarantines) make resident sizes meaningless.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif
#else
constexpr bool sanitized = false;
#endif

}  // namespace

TEST_CASE("store path: resident set stays under dense + KV + expert budget + overhead",
          "[engine][memory]") {
  if (sanitized) {
    WARN("skipped: resident sizes are meaningless under a sanitizer runtime");
    return;
  }
  if (!fs::exists(tiny_model / "model.safetensors")) {
    WARN("skipped: the default model " << tiny_model << " is not there yet");
    return;
  }
  const ModelConfig cfg = load_config(tiny_model);
  const moekit::ModelShape s = cfg.shape();
  const Precision p = Precision::f16;
  const std::vector<Precision> ps{p};
  const fs::path store_path = tiny_store(cfg, ps);
  auto store = std::make_shared<moekit::io::ExpertStore>(
      moekit::io::ExpertStore::open(store_path.string(), s));

  const std::size_t before = resident_bytes();
  const ModelWeights w = load_weights(cfg, tiny_model, {});   // dense part only
  const OffloadSettings o{all_resident_budget(s, p) / 4, p};  // a quarter of the experts
  const ExpertBacking disk{nullptr, store, StoreIo{}};
  moekit::ThreadPool pool(2);
  const std::vector<Token> prompt{1, 415, 3340, 302, 272, 2990, 3125};
  const int steps = 48;
  const std::uint32_t ctx = static_cast<std::uint32_t>(prompt.size() + steps + 1);
  std::size_t peak = 0, kv_bytes = 0, arena_limit = 0;
  moekit::PipelineStats stats{};
  with_pipeline<moekit::presets::BaselineSpec>(
      s, o, disk.make_loader(), PresetInputs{}, [&](auto& pipeline) {
        Model<std::remove_reference_t<decltype(pipeline)>> model(cfg, w.dense, pipeline, ctx,
                                                                 &pool);
        model.begin_sequence();
        auto logits = model.prefill(prompt);
        peak = std::max(peak, resident_bytes());
        for (int i = 0; i < steps; ++i) {
          const auto next =
              static_cast<Token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
          logits = model.decode(next);
          peak = std::max(peak, resident_bytes());
        }
        kv_bytes = model.kv_cache().bytes();
        // The pipeline's slot arena: budget + staging slots + one slot of slack.
        const auto& c = pipeline.config();
        arena_limit = c.expert_budget_bytes + (c.staging_slots + 1) * s.expert_bytes(p);
        stats = pipeline.stats();
        return 0;
      });
  const std::size_t grown = peak - std::min(peak, before);
  const std::size_t bound = w.dense.bytes() + kv_bytes + arena_limit + overhead_bytes;
  const std::size_t all_in_memory = w.dense.bytes() + kv_bytes + all_resident_budget(s, p);
  INFO("grown " << grown << " bytes, bound " << bound << " (dense " << w.dense.bytes() << ", kv "
                << kv_bytes << ", expert slots " << arena_limit << ", overhead " << overhead_bytes
                << "), every expert in memory would be " << all_in_memory);
  CHECK(stats.cache.evictions > 0);  // the budget forced offloading
  CHECK(stats.bytes_loaded() > all_resident_budget(s, p) / 4);
  CHECK(grown <= bound);
  CHECK(bound < all_in_memory);  // the bound would catch experts held in memory
}

TEST_CASE("an impossible budget is refused with the minimum, and the minimum runs",
          "[engine][memory]") {
  const fs::path dir = engine_test::data_dir() / "mixtral";
  const ModelConfig cfg = load_config(dir);
  const moekit::ModelShape s = cfg.shape();
  const Precision p = Precision::f16;
  const std::size_t min = minimum_expert_budget(s, p);
  const OffloadSettings too_small{min - 1, p};
  CHECK_THROWS_WITH(check_budget(s, too_small),
                    Catch::Contains("--expert-budget") && Catch::Contains(std::to_string(min)));

  const fs::path d = fs::path(MOEKIT_BINARY_DIR) / "test-scratch" / "engine-memory-min";
  fs::remove_all(d);
  fs::create_directories(d);
  build_store_from_checkpoint(cfg, dir, std::vector<Precision>{p, Precision::q4}, d / "m.moestore",
                              {});
  auto store = std::make_shared<moekit::io::ExpertStore>(
      moekit::io::ExpertStore::open((d / "m.moestore").string(), s));
  const ModelWeights w = load_weights(cfg, dir, {});
  const std::vector<float> routers = router_stack(cfg, w.dense);
  const auto ref = engine_test::load_reference(dir);
  moekit::ThreadPool pool(2);
  PresetInputs in;
  in.routers = routers;
  in.popularity.assign(s.expert_count(), 1.0);
  in.paths = std::make_shared<moekit::ActivationPathProfile>(s.n_layers, s.n_experts, s.top_k);
  in.cpu_seconds_per_token = 1e-3;
  in.copy_seconds = 1e-4;
  const ExpertBacking disk{nullptr, store, StoreIo{}};
  for (const moekit::presets::PresetEntry& preset : moekit::presets::entries) {
    INFO(preset.name);
    if (preset.needs.lookahead) continue;  // needs a replayed trace: routing_replay_test.cpp
    const OffloadSettings at_min{min, p};
    const std::uint64_t misses =
        with_pipeline(preset, s, at_min, disk.make_loader(), in, [&](auto& pipeline) {
          Model<std::remove_reference_t<decltype(pipeline)>> model(cfg, w.dense, pipeline, 64,
                                                                   &pool);
          model.begin_sequence();
          auto logits = model.prefill(ref.prompt_ids);
          for (int i = 0; i < 8; ++i)
            logits = model.decode(engine_test::argmax(logits.data(), logits.size()));
          return pipeline.stats().misses;
        });
    CHECK(misses > 0);
  }
}
