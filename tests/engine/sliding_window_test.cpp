// Sliding-window attention with a KV cache that keeps only the last W positions (a ring):
// tests/data/mixtral_swa (window 8, a 20-token prompt and 31 decode steps: 51 positions) against
// transformers' logits, token by token as well as prefill + decode, and MoBiLE's one-position
// roll-back on a wrapped ring.

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "moekit/precision/thread_pool.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/kv_cache.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;

TEST_CASE("KvCache: a windowed layer is a ring of W slots", "[engine][swa]") {
  const std::vector<std::uint32_t> window{0, 4};
  for (KvType type : {KvType::f32, KvType::f16}) {
    INFO(name(type));
    KvCache kv(2, 1, 2, 16, window, type);  // 2 layers, one KV head of 2 values
    CHECK(kv.slots(0) == 16);
    CHECK(kv.slots(1) == 4);
    CHECK(kv.bytes() == 2 * (16 + 4) * 2 * kv_element_bytes(type));
    auto key = [&](std::uint32_t l, std::uint32_t p) {  // the first value, widened
      return type == KvType::f16 ? moekit::to_float(kv.keys<moekit::Float16>(l, 0, p)[0])
                                 : kv.keys<float>(l, 0, p)[0];
    };
    auto value = [&](std::uint32_t l, std::uint32_t p) {  // the second value, widened
      return type == KvType::f16 ? moekit::to_float(kv.values<moekit::Float16>(l, 0, p)[1])
                                 : kv.values<float>(l, 0, p)[1];
    };
    for (std::uint32_t p = 0; p < 10; ++p) {
      const float k[2] = {float(p), 0.f}, v[2] = {0.f, float(100 + p)};  // exact in f16
      for (std::uint32_t l = 0; l < 2; ++l) kv.store(l, p, k, v);
      kv.advance(1);
    }
    for (std::uint32_t p = 0; p < 10; ++p) CHECK(key(0, p) == float(p));
    for (std::uint32_t p = 6; p < 10; ++p) {  // the last 4 positions
      CHECK(key(1, p) == float(p));
      CHECK(value(1, p) == float(100 + p));
    }
    auto slot = [&](std::uint32_t p) -> const void* {
      return type == KvType::f16 ? static_cast<const void*>(kv.keys<moekit::Float16>(1, 0, p))
                                 : static_cast<const void*>(kv.keys<float>(1, 0, p));
    };
    CHECK(slot(5) == slot(9));  // position 5 was overwritten by 9
    // One position back is fine (position 9 is recomputed into its own slot) ...
    kv.truncate(9);
    CHECK(kv.size() == 9);
    kv.advance(1);
    // ... more is refused once the ring has wrapped: those positions' slots were reused.
    CHECK_THROWS_WITH(kv.truncate(7), Catch::Contains("sliding-window") &&
                                          Catch::Contains("4 positions") &&
                                          Catch::Contains("roll back 3"));
    CHECK(kv.size() == 10);
  }
  KvCache unwrapped(2, 1, 2, 16, window);
  unwrapped.advance(4);
  CHECK_NOTHROW(unwrapped.truncate(1));
  CHECK(KvCache(1, 1, 2, 3, std::vector<std::uint32_t>{8}).slots(0) == 3);  // window > context
  CHECK_THROWS(KvCache(2, 1, 2, 16, std::vector<std::uint32_t>{1}));
}

TEST_CASE("sliding window: a ring of W positions gives transformers' logits", "[engine][swa]") {
  moekit::ThreadPool pool(2);
  const auto dir = engine_test::data_dir() / "mixtral_swa";
  const ModelConfig cfg = load_config(dir);
  REQUIRE(cfg.window == std::vector<std::uint32_t>{8, 8});
  const ModelWeights w = load_weights(cfg, dir, {Precision::f32});
  const auto ref = engine_test::load_reference(dir);
  REQUIRE(ref.sequence_ids.size() > 2 * cfg.window[0]);  // the ring wraps more than once
  const auto shape = cfg.shape();
  const OffloadSettings all{0, Precision::f32};
  const std::size_t V = cfg.vocab_size;

  SECTION("prefill of 20 tokens (more than the window) then decode") {
    with_pipeline<moekit::presets::BaselineSpec>(shape, all, w.experts, [&](auto& p) {
      const auto run = engine_test::greedy(cfg, w.dense, p, ref.prompt_ids,
                                           static_cast<int>(ref.generated_ids.size()) - 1, &pool);
      CHECK(run.tokens == std::vector<Token>(ref.generated_ids.begin(), ref.generated_ids.end()));
      CHECK(engine_test::worst_relative_error(run.logits, ref.logits, V) <= 1e-4);
      return 0;
    });
  }
  SECTION("token by token: every position read from the ring") {
    with_pipeline<moekit::presets::BaselineSpec>(shape, all, w.experts, [&](auto& p) {
      using P = std::decay_t<decltype(p)>;
      Model<P> model(cfg, w.dense, p, static_cast<std::uint32_t>(ref.sequence_ids.size()), &pool);
      model.begin_sequence();
      CHECK(model.kv_cache().slots(0) == 8);
      CHECK(model.kv_cache().bytes() == 2 * cfg.n_layers * 8 * cfg.kv_dim() * sizeof(float));
      double worst = 0;
      for (std::size_t t = 0; t < ref.sequence_ids.size(); ++t) {
        const auto lg = t == 0 ? model.prefill(std::span(ref.sequence_ids.data(), 1))
                               : model.decode(ref.sequence_ids[t]);
        worst =
            std::max(worst, engine_test::relative_error(lg.data(), ref.logits.data() + t * V, V));
      }
      INFO("worst relative error " << worst);
      CHECK(worst <= 1e-4);
      return 0;
    });
  }
  SECTION("MoBiLE's fallback rolls the ring back one position: baseline's logits bit for bit") {
    const auto base = with_pipeline<moekit::presets::BaselineSpec>(
        shape, all, w.experts,
        [&](auto& p) { return engine_test::greedy(cfg, w.dense, p, ref.prompt_ids, 24, &pool); });
    OffloadSettings o = all;
    o.preset.gamma = 1.0f;  // never confident: every token is recomputed with the full top-k
    o.preset.k_little = 1;
    // the exact big pass (re-routed): the paper's little-plan big pass is not baseline's model
    o.preset.big_pass = moekit::RouterReplayPredictor::BigPass::recompute;
    std::uint64_t fallbacks = 0;
    const auto mobile =
        with_pipeline<moekit::presets::MobileSpec>(shape, o, w.experts, [&](auto& p) {
          auto r = engine_test::greedy(cfg, w.dense, p, ref.prompt_ids, 24, &pool);
          fallbacks = p.stats().fallbacks;
          return r;
        });
    CHECK(fallbacks == 24);
    CHECK(mobile.tokens == base.tokens);
    REQUIRE(mobile.logits.size() == base.logits.size());
    CHECK(std::memcmp(mobile.logits.data(), base.logits.data(), base.logits.size() * 4) == 0);
  }
}
