// The expert-store path of moe-run: stores built from the fixtures (safetensors and GGUF) hold the
// engine's own blob layout, and generation reading experts from the store with O_DIRECT through
// io::AsyncLoader (io_uring and pread) gives the in-memory path's logits bit for bit.

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "moekit/io/byte_source.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/calibration.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return engine_test::scratch("engine-store", name); }

std::vector<std::byte> read_blob(const moekit::io::ExpertStore& st, moekit::ExpertKey k,
                                 Precision p) {
  const auto& b = st.blob(k, p);
  std::vector<std::byte> out(b.bytes);
  moekit::io::PreadSource(st.path()).read({b.offset, b.bytes}, out);
  return out;
}

}  // namespace

TEST_CASE(
    "store from a checkpoint holds the engine's expert blobs; store path equals the "
    "in-memory path bit for bit",
    "[engine][store]") {
  moekit::ThreadPool pool(2);
  for (const char* fixture : {"mixtral", "qwen2_moe", "olmoe"}) {
    INFO(fixture);
    const fs::path dir = engine_test::data_dir() / fixture;
    const ModelConfig cfg = load_config(dir);
    const moekit::ModelShape s = cfg.shape();
    const std::vector<Precision> ps{Precision::f16, Precision::q4};
    const fs::path out = scratch(fixture) / "experts.moestore";
    const auto report = build_store_from_checkpoint(cfg, dir, ps, out, {});
    CHECK(report.blobs_encoded == 2 * s.expert_count());
    auto store =
        std::make_shared<moekit::io::ExpertStore>(moekit::io::ExpertStore::open(out.string(), s));
    CHECK(store->manifest().meta.at("checkpoint_dir") ==
          fs::absolute(dir).lexically_normal().string());
    CHECK(is_expert_store(out));
    CHECK_FALSE(is_expert_store(dir / "config.json"));

    // The same bytes as the engine's host-memory encoding.
    const ModelWeights w = load_weights(cfg, dir, ps);
    for (Precision p : ps)
      for (std::uint32_t l = 0; l < s.n_layers; ++l)
        for (std::uint32_t e = 0; e < s.n_experts; ++e) {
          const auto a = read_blob(*store, {l, e}, p);
          const auto b = w.experts.bytes({l, e}, p);
          REQUIRE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
        }

    // Refuses to overwrite.
    CHECK_THROWS_WITH(build_store_from_checkpoint(cfg, dir, ps, out, {}),
                      Catch::Contains("refusing to overwrite"));

    // Generation: host memory vs store (io_uring and pread, O_DIRECT), budget at 50%.
    const auto ref = engine_test::load_reference(dir);
    const ModelWeights dense_only = load_weights(cfg, dir, {});
    CHECK(dense_only.experts.total_bytes() == 0);
    const std::vector<float> routers = router_stack(cfg, w.dense);
    OffloadSettings o{all_resident_budget(s, Precision::f16) / 2, Precision::f16};
    o.preset.t1 = o.preset.t2 = 1.0f;  // HOBBIT exact: prefetches only at f16
    PresetInputs in;
    in.routers = routers;
    in.popularity.assign(s.expert_count(), 1.0);
    in.cpu_seconds_per_token = 1e-6;
    in.copy_seconds = 1e-3;
    const ExpertBacking host{&w.experts, nullptr, {}};
    for (const moekit::presets::PresetEntry* preset :
         {&moekit::presets::entry_of<moekit::presets::BaselineSpec>,
          &moekit::presets::entry_of<moekit::presets::HobbitSpec>,
          &moekit::presets::entry_of<moekit::presets::FiddlerSpec>,
          &moekit::presets::entry_of<moekit::presets::NextUseSpec>}) {
      INFO(preset->name);
      std::string kind;
      const auto mem = with_pipeline(*preset, s, o, host.make_loader(), in, [&](auto& p) {
        return engine_test::greedy(cfg, w.dense, p, ref.prompt_ids, 8, &pool).logits;
      });
      for (bool uring : {true, false}) {
        const ExpertBacking disk{
            nullptr, store,
            StoreIo{.direct = true, .uring = uring, .io_threads = 2, .verify_checksums = true}};
        const auto got = with_pipeline(*preset, s, o, disk.make_loader(), in, [&](auto& p) {
          kind = p.loader().kind();
          return engine_test::greedy(cfg, dense_only.dense, p, ref.prompt_ids, 8, &pool).logits;
        });
        REQUIRE(got.size() == mem.size());
        CHECK(std::memcmp(got.data(), mem.data(), got.size() * sizeof(float)) == 0);
        if (!uring) CHECK(kind == std::string("pread"));
      }
    }
  }
}

TEST_CASE("store from a GGUF file equals the one from the same weights in safetensors",
          "[engine][store][gguf]") {
  const fs::path dir = engine_test::data_dir() / "mixtral";
  const ModelConfig cfg = load_config(dir);
  const moekit::ModelShape s = cfg.shape();
  const std::vector<Precision> ps{Precision::f32, Precision::q8};
  const fs::path d = scratch("gguf");
  build_store_from_checkpoint(cfg, dir, ps, d / "st.moestore", {});
  build_store_from_gguf(dir / "model-f32.gguf", ps, d / "gguf.moestore", {});
  const auto a = moekit::io::ExpertStore::open((d / "st.moestore").string(), s);
  const auto b = moekit::io::ExpertStore::open((d / "gguf.moestore").string(), s);
  CHECK(gguf_shape(moekit::io::GgufFile((dir / "model-f32.gguf").string())) == s);
  for (Precision p : ps)
    for (std::uint32_t l = 0; l < s.n_layers; ++l)
      for (std::uint32_t e = 0; e < s.n_experts; ++e) {
        INFO("layer " << l << " expert " << e << " " << moekit::name(p));
        CHECK(read_blob(a, {l, e}, p) == read_blob(b, {l, e}, p));
      }
  CHECK_THROWS_WITH(build_store_from_gguf(dir / "config.json", ps, d / "x.moestore", {}),
                    Catch::Contains("config.json"));
}

TEST_CASE(
    "the default model's cached store: built once, reused, rebuilt when the checkpoint "
    "changes",
    "[engine][store]") {
  // A copy of a fixture stands in for the default model (its files are never touched here).
  const fs::path d = scratch("cached");
  const fs::path model = d / "model";
  fs::create_directories(model);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(engine_test::data_dir() / "mixtral" / f, model / f);
  const ModelConfig cfg = load_config(model);
  const fs::path cache = d / "stores";
  const auto a = cached_store(cfg, model, {Precision::f32}, cache, true);
  CHECK(a.built);
  // Only the precisions asked for, never a full set "just in case".
  CHECK(fs::path(a.store->path()).filename() == "model-f32.moestore");
  CHECK(a.store->manifest().precisions.size() == 1);
  const auto b = cached_store(cfg, model, {Precision::q4, Precision::q8}, cache, true);
  CHECK(b.built);
  CHECK_FALSE(cached_store(cfg, model, {Precision::q8, Precision::q4}, cache, true).built);
  CHECK(fs::path(b.store->path()).filename() == "model-q8-q4.moestore");
  const auto c = cached_store(cfg, model, {Precision::f32}, cache, true);
  CHECK_FALSE(c.built);  // reused
  // A changed checkpoint (new modification time) rebuilds the cache file.
  fs::last_write_time(model / "model.safetensors",
                      fs::last_write_time(model / "model.safetensors") + std::chrono::seconds(5));
  const auto e = cached_store(cfg, model, {Precision::f32}, cache, true);
  CHECK(e.built);
  CHECK(e.store->manifest().meta.at("checkpoint_fingerprint") == checkpoint_fingerprint(model));
  // Experts in panels: a cache file of their own beside the one in rows.
  const auto f =
      cached_store(cfg, model, {Precision::f32}, cache, true, moekit::MatrixOrder::panels4);
  CHECK(f.built);
  CHECK(fs::path(f.store->path()).filename() == "model-f32-panels.moestore");
  CHECK(f.store->manifest().order == moekit::MatrixOrder::panels4);
  CHECK_FALSE(
      cached_store(cfg, model, {Precision::f32}, cache, true, moekit::MatrixOrder::panels4).built);
  const auto g =
      cached_store(cfg, model, {Precision::f32}, cache, true, moekit::MatrixOrder::blocked_panels4);
  CHECK(g.built);
  CHECK(fs::path(g.store->path()).filename() == "model-f32-blocked-panels.moestore");
  CHECK(g.store->manifest().order == moekit::MatrixOrder::blocked_panels4);
  CHECK_FALSE(cached_store(cfg, model, {Precision::f32}, cache, true).built);
  CHECK(fs::exists(engine_test::data_dir() / "mixtral" / "model.safetensors"));
}

TEST_CASE(
    "experts in panels (a store, or host memory packed after loading) run the default "
    "model as experts in rows, bit for bit",
    "[engine][store][panels]") {
  const fs::path dir = fs::path(MOEKIT_SOURCE_DIR) / "models/moekit-tiny-moe";
  if (!fs::exists(dir / "model.safetensors")) {
    WARN(dir.string() << " is missing; skipped");
    return;
  }
  const ModelConfig cfg = load_config(dir);
  const moekit::ModelShape s = cfg.shape();
  const std::vector<Precision> ps{Precision::q4, Precision::q8};
  const fs::path d = scratch("panels");
  moekit::io::ExpertStoreWriteOptions panels;
  panels.order = moekit::MatrixOrder::panels4;
  build_store_from_checkpoint(cfg, dir, ps, d / "rows.moestore", {});
  build_store_from_checkpoint(cfg, dir, ps, d / "panels.moestore", panels);
  const ExpertBacking rows{nullptr,
                           std::make_shared<moekit::io::ExpertStore>(
                               moekit::io::ExpertStore::open((d / "rows.moestore").string(), s))};
  const ExpertBacking in_panels{
      nullptr, std::make_shared<moekit::io::ExpertStore>(
                   moekit::io::ExpertStore::open((d / "panels.moestore").string(), s))};
  CHECK(rows.order() == moekit::MatrixOrder::rows);
  CHECK(in_panels.order() == moekit::MatrixOrder::panels4);
  // w2 (256 x 512) is one 512-column step per row: the panel kernel's step path runs, w1/w3
  // (512 x 256) its tail path.
  CHECK(in_panels.read_expert({0, 0}, Precision::q4) != rows.read_expert({0, 0}, Precision::q4));
  const ModelWeights dense = load_weights(cfg, dir, {});
  // Host-memory experts packed after loading are the panels store's blobs.
  ModelWeights host = load_weights(cfg, dir, ps);
  host.experts.pack_panels(moekit::MatrixOrder::panels4);
  const ExpertBacking host_panels{&host.experts, nullptr, {}};
  CHECK(host_panels.order() == moekit::MatrixOrder::panels4);
  // The default model's rows are at most 512 wide: in blocked panels they lie as in panels.
  ModelWeights host_blocked = load_weights(cfg, dir, ps);
  host_blocked.experts.pack_panels(moekit::MatrixOrder::blocked_panels4);
  const ExpertBacking blocked{&host_blocked.experts, nullptr, {}};
  CHECK(blocked.order() == moekit::MatrixOrder::blocked_panels4);
  CHECK_THROWS_WITH(host_blocked.experts.pack_panels(moekit::MatrixOrder::panels4),
                    Catch::Contains("blocked_panels4") && Catch::Contains("only from rows"));
  for (Precision p : ps) {
    const auto a = host_panels.read_expert({3, 5}, p), b = in_panels.read_expert({3, 5}, p);
    CHECK(a == b);
    CHECK(blocked.read_expert({3, 5}, p) == b);
  }
  // The loaders say so too (what the pipeline's views carry); f16 blobs are always in rows.
  for (const ExpertBacking* b : {&rows, &in_panels, &host_panels, &blocked}) {
    CHECK(b->make_loader().matrix_order(Precision::q4) == b->order());
    CHECK(b->make_loader().matrix_order(Precision::f16) == moekit::MatrixOrder::rows);
  }
  const std::vector<Token> seq{1, 415, 2936, 9060, 285, 1142, 28705, 28770, 28723, 415, 13, 4};
  moekit::ThreadPool pool(2);
  for (Precision p : ps)
    for (bool int8 : {false, true}) {
      INFO(moekit::name(p) << " int8 " << int8);
      const OffloadSettings o{all_resident_budget(s, p) / 2, p};
      auto run = [&](const ExpertBacking& b) {
        return with_pipeline<moekit::presets::BaselineSpec>(
            s, o, b.make_loader(), PresetInputs{}, [&](auto& pipe) {
              return engine_test::teacher_forced(cfg, dense.dense, pipe, seq, 5, &pool, int8);
            });
      };
      const std::vector<float> a = run(rows), c = run(in_panels), h = run(host_panels);
      REQUIRE(a.size() == c.size());
      REQUIRE(a.size() == h.size());
      CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(a.data(), h.data(), a.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("Fiddler's latencies are measured through the run's loader", "[engine][store]") {
  const fs::path dir = engine_test::data_dir() / "mixtral";
  const ModelConfig cfg = load_config(dir);
  const moekit::ModelShape s = cfg.shape();
  const fs::path out = scratch("latency") / "e.moestore";
  build_store_from_checkpoint(cfg, dir, std::vector<Precision>{Precision::f16}, out, {});
  auto store =
      std::make_shared<moekit::io::ExpertStore>(moekit::io::ExpertStore::open(out.string(), s));
  const ModelWeights w = load_weights(cfg, dir, {Precision::f16});
  moekit::ThreadPool pool(1);
  for (const ExpertBacking& b :
       {ExpertBacking{&w.experts, nullptr, {}}, ExpertBacking{nullptr, store, {}}}) {
    const FiddlerLatencies l = measure_fiddler_latencies(s, Precision::f16, b, &pool, {}, 5);
    CHECK(l.cpu_seconds_per_token > 0);
    CHECK(l.copy_seconds > 0);
    CHECK(l.cpu_seconds_per_token < 1.0);
    CHECK(l.copy_seconds < 1.0);
    // a line over several experts and token counts, not one warm expert at one token
    CHECK(l.experts_sampled == std::min<std::uint32_t>(8, s.expert_count()));
    CHECK(l.experts_sampled >= 2);
    CHECK(l.cpu_seconds_per_expert >= 0);
  }
}

TEST_CASE("theil_sen_slope: exact on a line; one burst-hit count does not tip it below zero",
          "[engine][calibration]") {
  const std::vector<double> n{1, 2, 4, 8, 16, 32};
  std::vector<double> t;
  for (double x : n) t.push_back(7e-6 + 8e-7 * x);
  CHECK(theil_sen_slope(n, t) == Approx(8e-7));
  // A CI run's timings (ms) of a 64 x 64 expert, the 4-token call hit by a neighbour: least
  // squares gives a negative slope, the median of the pairwise slopes stays near the others'.
  const std::vector<double> ci{0.005, 0.008, 0.150, 0.012, 0.018, 0.031};
  const double slope = theil_sen_slope(n, ci);
  CHECK(slope > 0.0);
  CHECK(slope < 2e-3);
  CHECK(theil_sen_slope(std::vector<double>{1, 3}, std::vector<double>{1, 2}) == Approx(0.5));
  CHECK_THROWS_AS(theil_sen_slope(std::vector<double>{2, 2}, std::vector<double>{1, 2}),
                  moekit::Error);
}

TEST_CASE("fit_cpu_line: least squares over the token counts; the paper's line when a < 0",
          "[engine][fiddler]") {
  const std::vector<double> n{1, 2, 4, 8, 16, 32};
  std::vector<double> t;
  for (double x : n) t.push_back(5e-3 + 2e-4 * x);  // a fixed weight read + per-token work
  auto [a, c] = fit_cpu_line(n, t);
  CHECK(a == Approx(5e-3));
  CHECK(c == Approx(2e-4));
  t.clear();
  for (double x : n) t.push_back(-1e-3 + 1e-3 * x);  // negative intercept: through 0 instead
  std::tie(a, c) = fit_cpu_line(n, t);
  CHECK(a == 0.0);
  CHECK(c > 0.0);
  CHECK_THROWS_AS(fit_cpu_line(std::vector<double>{1}, std::vector<double>{1}), moekit::Error);
}
