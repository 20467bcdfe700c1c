// Every moe-run preset, configured for full precision and exact routing (HOBBIT/NextUse
// T1 = T2 = 1, Fate without a low-precision share, MoBiLE γ = 0 with the full top-k in the little
// pass, EdgeMoE with a uniform table, Fiddler with its CPU path), must give baseline's logits bit
// for bit on the transformers fixtures — under a budget that forces evictions, so the prefetches,
// cache policies, staging and Fiddler's CPU execution all run.

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/precision/thread_pool.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/calibration.hpp"
#include "moekit/engine/cli.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Precision;
namespace presets = moekit::presets;

namespace {

// The settings under which every preset must equal baseline.
OffloadSettings exact_settings(std::size_t budget, Precision p, std::uint32_t top_k) {
  OffloadSettings o{budget, p};
  o.preset.t1 = 1.0f;
  o.preset.t2 = 1.0f;
  o.preset.low = Precision::q4;
  o.preset.fate_low_fraction = 0.0;
  o.preset.gamma = 0.0f;
  o.preset.k_little = top_k;
  return o;
}

}  // namespace

TEST_CASE("every preset at full precision and exact routing equals baseline bit for bit",
          "[engine][offload][presets]") {
  moekit::ThreadPool pool(2);
  int ran = 0;
  for (const auto& dir : engine_test::architecture_fixtures()) {
    REQUIRE(std::filesystem::exists(dir / "reference.json"));
    ++ran;
    const std::string fixture = dir.filename().string();
    const ModelConfig cfg = load_config(dir);
    const moekit::ModelShape s = cfg.shape();
    // Half the experts fit: every layer evicts.
    const std::size_t budget = std::max(all_resident_budget(s, Precision::f32) / 2,
                                        minimum_expert_budget(s, Precision::f32));
    OffloadSettings o = exact_settings(budget, Precision::f32, s.top_k);
    const ModelWeights w = load_weights(cfg, dir, {Precision::f32, Precision::q4});
    const std::vector<float> routers = router_stack(cfg, w.dense);
    const auto ref = engine_test::load_reference(dir);
    const int steps = 12;
    const ExpertBacking backing{&w.experts, nullptr, {}};

    PresetInputs in;
    in.routers = routers;
    // The progress hook hears of every layer of the prefill and of the 4 greedy decodes, in
    // order, against a total known from the first call (moe-run's calibration progress line).
    std::vector<std::uint64_t> heard;
    std::uint64_t total = 0;
    const LayerProgress progress = [&](std::uint64_t done, std::uint64_t t) {
      heard.push_back(done);
      total = t;
    };
    const Calibration cal =
        calibrate(cfg, w.dense, o, backing, ref.prompt_ids, 4, &pool, {}, nullptr, progress);
    CHECK(total == std::uint64_t{5} * s.n_layers);
    REQUIRE(heard.size() == total);
    for (std::size_t i = 0; i < heard.size(); ++i) CHECK(heard[i] == i + 1);
    in.popularity = cal.counts;
    in.paths = cal.paths;
    REQUIRE(cal.paths);
    double routed = 0;
    for (double c : cal.counts) routed += c;
    CHECK(routed == double(cal.tokens) * s.n_layers * s.top_k);

    const std::vector<float> base =
        with_pipeline<presets::BaselineSpec>(s, o, backing.make_loader(), in, [&](auto& p) {
          return engine_test::greedy(cfg, w.dense, p, ref.prompt_ids, steps, &pool).logits;
        });
    for (const presets::PresetEntry& preset : presets::entries) {
      if (presets::is<presets::BaselineSpec>(preset)) continue;
      if (preset.needs.lookahead) continue;  // needs a replayed trace: routing_replay_test.cpp
      {
        INFO(fixture << " / " << preset.name);
        // Fiddler: CPU cheaper than a load, so every miss in decode runs from host memory.
        in.cpu_seconds_per_token = 1e-6;
        in.copy_seconds = 1e-3;
        moekit::PipelineStats stats{};
        const std::vector<float> got =
            with_pipeline(preset, s, o, backing.make_loader(), in, [&](auto& p) {
              auto r = engine_test::greedy(cfg, w.dense, p, ref.prompt_ids, steps, &pool).logits;
              stats = p.stats();
              return r;
            });
        REQUIRE(got.size() == base.size());
        CHECK(std::memcmp(got.data(), base.data(), got.size() * sizeof(float)) == 0);
        CHECK(stats.skipped == 0);
        CHECK(stats.cache.evictions + stats.staged + stats.host_cpu_runs > 0);  // offloading ran
        if (presets::is<presets::FiddlerSpec>(preset)) CHECK(stats.host_cpu_runs > 0);
        if (presets::is<presets::MobileSpec>(preset)) CHECK(stats.fallbacks == 0);
      }
    }
    // The comparison has teeth: HOBBIT's default thresholds run some experts at q4 or skip them.
    OffloadSettings lossy = o;
    lossy.preset = PresetParams{};
    const std::vector<float> hobbit =
        with_pipeline<presets::HobbitSpec>(s, lossy, backing.make_loader(), in, [&](auto& p) {
          return engine_test::greedy(cfg, w.dense, p, ref.prompt_ids, steps, &pool).logits;
        });
    CHECK(std::memcmp(hobbit.data(), base.data(),
                      std::min(hobbit.size(), base.size()) * sizeof(float)) != 0);
  }
  CHECK(ran == 3);
}

TEST_CASE("MoBiLE's big pass: recompute is the exact model, little-plan runs the little plan",
          "[engine][offload][mobile]") {
  // γ = 1: every decode token falls back. Re-routed (BigPass::recompute), every kept token is a
  // full-top-k forward: baseline's logits bit for bit. On the little pass's plan (the paper's
  // reading), the big pass runs the top-K of the little pass's router logits with its own gate
  // weights: the same logits exactly when every plan agreed with its own routing.
  moekit::ThreadPool pool(2);
  for (const auto& dir : engine_test::architecture_fixtures()) {
    INFO(dir.filename().string());
    const ModelConfig cfg = load_config(dir);
    const moekit::ModelShape s = cfg.shape();
    const ModelWeights w = load_weights(cfg, dir, {Precision::f32});
    const auto ref = engine_test::load_reference(dir);
    const ExpertBacking backing{&w.experts, nullptr, {}};
    OffloadSettings o{minimum_expert_budget(s, Precision::f32) * 2, Precision::f32};
    const std::vector<float> base =
        with_pipeline<presets::BaselineSpec>(s, o, backing.make_loader(), {}, [&](auto& p) {
          return engine_test::greedy(cfg, w.dense, p, ref.prompt_ids, 8, &pool).logits;
        });
    o.preset.gamma = 1.0f;
    for (auto mode : {moekit::RouterReplayPredictor::BigPass::recompute,
                      moekit::RouterReplayPredictor::BigPass::little_plan}) {
      o.preset.big_pass = mode;
      double accuracy = -1;
      std::uint64_t fallbacks = 0;
      const std::vector<float> got =
          with_pipeline<presets::MobileSpec>(s, o, backing.make_loader(), {}, [&](auto& p) {
            auto r = engine_test::greedy(cfg, w.dense, p, ref.prompt_ids, 8, &pool).logits;
            accuracy = p.predictor().stats().accuracy();
            fallbacks = p.stats().fallbacks;
            return r;
          });
      REQUIRE(got.size() == base.size());
      CHECK(fallbacks > 0);
      const bool same = std::memcmp(got.data(), base.data(), got.size() * sizeof(float)) == 0;
      if (mode == moekit::RouterReplayPredictor::BigPass::recompute) {
        CHECK(same);
      } else {
        INFO("plan agreement " << accuracy);
        CHECK(accuracy > 0.0);
        CHECK(same == (accuracy == 1.0));
      }
    }
  }
}

TEST_CASE("preset flags are checked against each other", "[engine][offload]") {
  const moekit::ModelShape s{.n_layers = 2, .n_experts = 4, .top_k = 2, .hidden = 32, .ffn = 32};
  OffloadSettings o{0, Precision::q4};
  o.preset.low = Precision::q8;
  const PresetEntry& hobbit = presets::entry_of<presets::HobbitSpec>;
  const PresetEntry& fiddler = presets::entry_of<presets::FiddlerSpec>;
  CHECK_THROWS_WITH(check_preset_params(hobbit, o), Catch::Contains("--low-precision"));
  o.preset.low = Precision::q2;
  o.preset.t1 = 0.95f;
  CHECK_THROWS_WITH(check_preset_params(hobbit, o), Catch::Contains("--t1/--t2"));
  o.preset.t1 = 0.5f;
  CHECK_NOTHROW(check_preset_params(hobbit, o));
  CHECK_THROWS_WITH(find_preset("hobbbit"), Catch::Contains("--preset"));
  const auto need = required_precisions(hobbit, s, o);
  CHECK(need == std::vector<Precision>{Precision::q4, Precision::q2});
  CHECK(required_precisions(presets::entry_of<presets::BaselineSpec>, s, o) ==
        std::vector<Precision>{Precision::q4});
  CHECK(startup_needs(hobbit, o).routers);
  CHECK(startup_needs(fiddler, o).calibration);
  CHECK(startup_needs(fiddler, o).latencies);
  o.preset.cpu_seconds_per_token = 1;
  o.preset.copy_seconds = 2;
  CHECK_FALSE(startup_needs(fiddler, o).latencies);
}

TEST_CASE("preset and store flags parse, and bad values name their flag",
          "[engine][offload][cli]") {
  auto parse = [](std::vector<const char*> args, std::string* err = nullptr) {
    args.insert(args.begin(), "moe-run");
    Cli cli;
    std::ostringstream out, e;
    const int rc = cli.parse(static_cast<int>(args.size()), args.data(), out, e);
    if (err) *err = e.str();
    return std::pair<int, Options>{rc, cli.options()};
  };
  const auto [rc, o] = parse({"--preset",
                              "hobbit",
                              "--t1",
                              "0.5",
                              "--t2",
                              "0.8",
                              "--low-precision",
                              "q2",
                              "--lookahead",
                              "3",
                              "--gamma",
                              "0.4",
                              "--k-little",
                              "1",
                              "--shallow-layers",
                              "2",
                              "--store",
                              "x.moestore",
                              "--pread",
                              "--no-direct",
                              "--io-threads",
                              "3",
                              "--cpu-latency",
                              "0.001"});
  REQUIRE(rc == 0);
  CHECK(&find_preset(o.preset) == &presets::entry_of<presets::HobbitSpec>);
  CHECK(o.preset_params.t1 == 0.5f);
  CHECK(o.preset_params.t2 == 0.8f);
  CHECK(o.preset_params.low == Precision::q2);
  CHECK(o.preset_params.lookahead == 3);
  CHECK(o.preset_params.gamma == 0.4f);
  CHECK(o.preset_params.k_little == 1);
  CHECK(o.preset_params.shallow_layers == 2);
  CHECK(o.preset_params.cpu_seconds_per_token == 0.001);
  CHECK(o.store == "x.moestore");
  CHECK_FALSE(o.uring);
  CHECK_FALSE(o.direct);
  CHECK(o.io_threads == 3);
  const auto d = parse({});
  CHECK(d.second.uring);
  CHECK(d.second.direct);
  CHECK_FALSE(d.second.in_memory);
  for (const auto& p : presets::entries) CHECK(parse({"--preset", p.name.data()}).first == 0);
  std::string err;
  CHECK(parse({"--low-precision", "q9"}, &err).first != 0);
  CHECK_THAT(err, Catch::Contains("--low-precision"));
  CHECK(parse({"--store", "a", "--in-memory"}, &err).first != 0);
  CHECK_THAT(err, Catch::Contains("--in-memory"));
  CHECK(parse({"--preset", "fidler"}, &err).first != 0);
  CHECK_THAT(err, Catch::Contains("--preset"));
}

namespace {
// One token per byte: enough to count what calibration_text reads.
struct ByteTokenizer {
  std::vector<Token> encode(const std::string& s, bool) const {
    return std::vector<Token>(s.begin(), s.end());
  }
};
}  // namespace

TEST_CASE("the calibration text is the first tokens of a file, never the evaluated one",
          "[engine][offload][calibration]") {
  const auto dir = std::filesystem::temp_directory_path() / "moekit_calibration_text_test";
  std::filesystem::create_directories(dir);
  const std::string cal = (dir / "cal.txt").string(), eval = (dir / "eval.txt").string();
  std::ofstream(cal) << "abcdefgh";
  std::ofstream(eval) << "xyz";
  const CalibrationText t = calibration_text(cal, ByteTokenizer{}, Token{1}, 5, eval);
  CHECK(t.tokens == std::vector<Token>{1, 'a', 'b', 'c', 'd', 'e'});
  CHECK(t.source == "the first 5 tokens of " + cal);
  CHECK(calibration_text(cal, ByteTokenizer{}, std::nullopt, 100).tokens.size() == 8);
  // The evaluated text (moe-run --perplexity) is refused, also under another spelling.
  CHECK_THROWS_WITH(calibration_text(eval, ByteTokenizer{}, Token{1}, 5, eval),
                    Catch::Contains("--calib-text") && Catch::Contains("evaluated text"));
  CHECK_THROWS_WITH(
      calibration_text((dir / "." / "eval.txt").string(), ByteTokenizer{}, Token{1}, 5, eval),
      Catch::Contains("evaluated text"));
  CHECK_THROWS_WITH(calibration_text((dir / "none.txt").string(), ByteTokenizer{}, Token{1}, 5),
                    Catch::Contains("cannot be opened"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("the warm start leaves EdgeMoE's placed experts at their stored widths",
          "[engine][offload][edgemoe]") {
  // Every expert fits at the base precision, so the warm start runs; EdgeMoE's placement has
  // already put each expert in at its table's width (q2 here), which a q8 warm start would
  // replace (then every expert ran at q8 whatever the table said).
  const moekit::ModelShape s{.n_layers = 2, .n_experts = 4, .top_k = 2, .hidden = 32, .ffn = 64};
  auto table = std::make_shared<moekit::PrecisionTable>(2, 4, Precision::q2);
  table->set({1, 3}, Precision::q8);
  auto paths = std::make_shared<moekit::ActivationPathProfile>(2, 4, 2);
  const std::uint32_t e01[] = {0, 1};
  const std::span<const std::uint32_t> path[] = {e01, e01};
  paths->add_path(path);
  const PresetInputs in{
      .popularity = std::vector<double>(8, 1.0), .paths = paths, .bitwidths = table};
  moekit::MemoryLoader loader([&](moekit::ExpertKey, Precision p) {
    static std::vector<std::byte> bytes(1 << 20);
    return std::span<const std::byte>(bytes.data(), s.expert_bytes(p));
  });
  auto p = presets::make_pipeline<presets::EdgeMoeSpec>(
      s,
      {.expert_budget_bytes = all_resident_budget(s, Precision::q8),
       .base_precision = Precision::q8},
      {}, std::move(loader), in);
  CHECK(load_all_experts(*p) == 0);  // the placement holds every expert already
  CHECK(p->cache().entry({0, 0}).precision == Precision::q2);
  CHECK(p->cache().entry({1, 2}).precision == Precision::q2);
  CHECK(p->cache().entry({1, 3}).precision == Precision::q8);
}

TEST_CASE("moe-run parses --group-size, --calib-text and --calib-tokens",
          "[engine][offload][cli]") {
  auto parse = [](std::vector<const char*> args) {
    args.insert(args.begin(), "moe-run");
    Cli cli;
    std::ostringstream out, err;
    const int rc = cli.parse(static_cast<int>(args.size()), args.data(), out, err);
    return std::pair<int, Options>{rc, cli.options()};
  };
  const auto [rc0, none] = parse({});
  REQUIRE(rc0 == 0);
  CHECK_FALSE(none.group_size.has_value());  // auto: the preset's codec
  CHECK(none.calib_text.empty());            // moe-run's built-in calibration text
  CHECK(none.calib_tokens == -1);            // 128 text tokens, or 16 greedy after the prompt
  const auto [rc1, o] =
      parse({"--group-size", "0", "--calib-text", "prompt", "--calib-tokens", "8"});
  REQUIRE(rc1 == 0);
  CHECK(o.group_size == 0u);
  CHECK(o.calib_text == "prompt");
  CHECK(o.calib_tokens == 8);
  CHECK(parse({"--group-size", "32"}).second.group_size == 32u);
  CHECK(parse({"--group-size", "16"}).first != 0);  // not a codec moekit has
}

TEST_CASE("EdgeMoE's experts are quantized per output channel unless --group-size says otherwise",
          "[engine][offload][edgemoe]") {
  // Issue 22: the preset's codec is the paper's (one scale per output channel); the others, and
  // EdgeMoE with --group-size 32, group by 32. What moe-run quantizes itself follows the preset;
  // experts that arrive quantized (a GGUF file, a store) keep their groups of 32.
  const PresetEntry& edgemoe = find_preset("edgemoe");
  const PresetEntry& baseline = find_preset("baseline");
  CHECK(expert_codec(std::nullopt, edgemoe).group_size == 0);
  CHECK_FALSE(expert_codec(std::nullopt, edgemoe).zero_point);
  CHECK(expert_codec(32u, edgemoe).group_size == 32);
  CHECK(expert_codec(std::nullopt, baseline).group_size == 32);
  CHECK(expert_codec(0u, baseline).group_size == 0);
  CHECK(expert_codec(std::nullopt, edgemoe, "a GGUF file").group_size == 32);
  CHECK(expert_codec(32u, edgemoe, "--store e.moestore").group_size == 32);
  CHECK_THROWS_WITH(expert_codec(0u, edgemoe, "--store e.moestore"),
                    Catch::Contains("--group-size 0") && Catch::Contains("--store e.moestore"));
}
