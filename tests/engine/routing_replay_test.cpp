// moe-run --routing-trace (engine/routing_replay.hpp): the experts and gate weights of a trace
// replace the router's for every MoE layer, so the pipeline routes, loads and runs the trace's
// experts; the token mapping (walks, wrap-around, shared cursor, fallbacks), missing records,
// dims checks and the readers of every trace format, on the tiny Mixtral fixture (2 MoE layers,
// 4 experts, top-2).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "moekit/precision/thread_pool.hpp"
#include "moekit/presets.hpp"
#include "moekit/sim/trace.hpp"
#include "moekit/sim/trace_binary.hpp"
#include "moekit/sim/trace_file.hpp"

#include "engine_test_support.hpp"
#include "moekit/engine/calibration.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/routing_replay.hpp"
#include "moekit/engine/trace_recorder.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
using moekit::Phase;
using moekit::Precision;
using moekit::sim::RoutingTrace;
using moekit::sim::TraceDims;
namespace fs = std::filesystem;
namespace presets = moekit::presets;
using Baseline = moekit::presets::Baseline<moekit::MemoryLoader>;
using BigLittle = moekit::OffloadPipeline<moekit::UniformScorer, moekit::NoPredictor,
                                          moekit::LruPolicy, moekit::MemoryLoader,
                                          moekit::OnDemandScheduler, moekit::BigLittlePolicy>;

namespace {

const fs::path replay_fixture = engine_test::data_dir() / "mixtral";
const fs::path tiny_jsonl =
    fs::path(MOEKIT_SOURCE_DIR) / "tests/engine/data/routing_replay_tiny.jsonl";

// Prompt and decode tokens of a run (teacher-forced: the tokens do not depend on the logits, so
// that two runs see the same inputs whatever their routing).
struct Tokens {
  std::vector<Token> prompt, decode;
};

// Prefill of `t.prompt`, then one decode step per `t.decode` token, through `pipeline` behind a
// TracingPipeline; returns what the pipeline saw as a trace.
template <class P>
RoutingTrace run(const engine_test::LoadedModel& m, P& pipeline, const Tokens& t,
                 RoutingReplay* replay, moekit::ThreadPool& pool) {
  TraceRecorder rec(m.cfg, "seen");
  TracingPipeline<P> traced(pipeline, rec);
  Model<TracingPipeline<P>> model(m.cfg, m.weights.dense, traced,
                                  static_cast<std::uint32_t>(t.prompt.size() + t.decode.size() + 1),
                                  &pool);
  model.set_routing_replay(replay);
  model.begin_sequence();
  model.prefill(t.prompt);
  for (Token x : t.decode) model.decode(x);
  return rec.trace();
}

Baseline baseline(const engine_test::LoadedModel& m, moekit::MemoryLoader loader) {
  const auto shape = m.cfg.shape();
  return Baseline(shape, pipeline_config(shape, {0, Precision::f32}), std::move(loader),
                  moekit::UniformScorer({Precision::f32}));
}

// A loader over the model's experts that remembers which experts it was asked for.
moekit::MemoryLoader recording_loader(const engine_test::LoadedModel& m,
                                      std::set<std::pair<std::uint32_t, std::uint32_t>>& loaded) {
  return moekit::MemoryLoader([&m, &loaded](moekit::ExpertKey k, Precision p) {
    loaded.insert({k.layer, k.expert});
    return m.weights.experts.bytes(k, p);
  });
}

std::vector<std::uint32_t> ids(const RoutingTrace& t, std::size_t token, std::uint32_t layer) {
  const auto e = t.experts(token, layer);
  return {e.begin(), e.end()};
}

// Trace dims of the fixture's MoE layers.
TraceDims dims_of(const ModelConfig& cfg) {
  return TraceDims{.n_layers = cfg.n_moe_layers, .n_experts = cfg.n_experts, .top_k = cfg.top_k};
}

// A hand-made trace whose token i has, at every layer, experts {i mod E, (i+1) mod E} with
// weights (0.55 + 0.05·i, rest): the weight tells which trace token was replayed.
RoutingTrace numbered_trace(const ModelConfig& cfg, std::size_t prefill, std::size_t decode) {
  RoutingTrace t(dims_of(cfg), "numbered", true);
  t.begin_sequence("s");
  const std::uint32_t E = cfg.n_experts;
  for (std::size_t i = 0; i < prefill + decode; ++i) {
    const std::size_t g = t.append_token(i < prefill ? Phase::prefill : Phase::decode);
    const auto a = static_cast<std::uint32_t>(i % E);
    const std::vector<std::uint32_t> e{a, (a + 1) % E};
    const float w0 = 0.55f + 0.05f * static_cast<float>(i);
    const std::vector<float> w{w0, 1.f - w0};
    for (std::uint32_t l = 0; l < cfg.n_moe_layers; ++l) t.set_route(g, l, e, w);
  }
  return t;
}

// The numbered trace token (see numbered_trace) whose record the pipeline saw at (token, layer).
int numbered_token(const RoutingTrace& seen, std::size_t token, std::uint32_t layer) {
  return static_cast<int>(std::lround((seen.weights(token, layer)[0] - 0.55f) / 0.05f));
}

}  // namespace

TEST_CASE("a replayed trace routes every layer to the recorded experts and weights",
          "[engine][replay]") {
  REQUIRE(fs::exists(replay_fixture / "reference.json"));
  moekit::ThreadPool pool(2);
  const auto m = engine_test::load_model(replay_fixture);
  REQUIRE(m);
  const auto ref = engine_test::load_reference(replay_fixture);
  const Tokens original{ref.prompt_ids,
                        {ref.sequence_ids.begin() + ref.prompt_ids.size(), ref.sequence_ids.end()}};
  // Other inputs of the same lengths: the router routes them differently.
  Tokens other = original;
  for (Token& x : other.prompt) x = (x * 7 + 11) % m->cfg.vocab_size;
  for (Token& x : other.decode) x = (x * 13 + 5) % m->cfg.vocab_size;

  auto p0 = baseline(*m, host_loader(m->weights.experts));
  const RoutingTrace recorded = run(*m, p0, original, nullptr, pool);
  auto p1 = baseline(*m, host_loader(m->weights.experts));
  const RoutingTrace unreplayed = run(*m, p1, other, nullptr, pool);
  REQUIRE(unreplayed.all_experts().size() == recorded.all_experts().size());
  CHECK_FALSE(std::equal(unreplayed.all_experts().begin(), unreplayed.all_experts().end(),
                         recorded.all_experts().begin()));  // the check below has teeth

  // Through a .mktrace file, as moe-run --trace-out writes it.
  const fs::path dir = engine_test::scratch("routing-replay", "recorded");
  const std::string file = (dir / "recorded.mktrace").string();
  moekit::sim::write_trace_binary(recorded, file);
  RoutingReplay replay = RoutingReplay::from_file(file, m->cfg);
  auto p2 = baseline(*m, host_loader(m->weights.experts));
  const RoutingTrace seen = run(*m, p2, other, &replay, pool);
  REQUIRE(seen.token_count() == recorded.token_count());
  for (std::size_t t = 0; t < seen.token_count(); ++t) {
    CHECK(seen.phase(t) == recorded.phase(t));
    for (std::uint32_t l = 0; l < m->cfg.n_moe_layers; ++l) {
      INFO("token " << t << " layer " << l);
      CHECK(ids(seen, t, l) == ids(recorded, t, l));
      for (std::uint32_t j = 0; j < m->cfg.top_k; ++j)
        CHECK(seen.weights(t, l)[j] == Approx(recorded.weights(t, l)[j]).margin(1e-6));
      // The router's logits stay the model's own: those of the unreplayed run at layer 0, whose
      // input does not depend on any expert.
      if (l == 0)
        CHECK(engine_test::relative_error(seen.logits(t, 0).data(), unreplayed.logits(t, 0).data(),
                                          m->cfg.n_experts) <= 1e-6);
    }
  }
  CHECK(replay.tokens() == recorded.token_count());
  CHECK(replay.replayed() == recorded.record_count());
  CHECK(replay.missing() == 0);
  CHECK(p2.stats().hits + p2.stats().misses == p0.stats().hits + p0.stats().misses);
}

TEST_CASE("a replayed trace decides which experts are loaded", "[engine][replay]") {
  REQUIRE(fs::exists(replay_fixture / "reference.json"));
  moekit::ThreadPool pool(2);
  const auto m = engine_test::load_model(replay_fixture);
  REQUIRE(m);
  const auto ref = engine_test::load_reference(replay_fixture);
  const Tokens tokens{ref.prompt_ids,
                      {ref.sequence_ids.begin() + ref.prompt_ids.size(), ref.sequence_ids.end()}};
  // Layer 0 always experts {3, 2}, layer 1 always {0, 1}, whatever the router says.
  RoutingTrace fixed(dims_of(m->cfg), "fixed", true);
  fixed.begin_sequence("s");
  const std::size_t g = fixed.append_token(Phase::decode);
  fixed.set_route(g, 0, std::vector<std::uint32_t>{3, 2}, std::vector<float>{0.7f, 0.3f});
  fixed.set_route(g, 1, std::vector<std::uint32_t>{0, 1}, std::vector<float>{0.6f, 0.4f});

  std::set<std::pair<std::uint32_t, std::uint32_t>> by_router, by_trace;
  auto p0 = baseline(*m, recording_loader(*m, by_router));
  run(*m, p0, tokens, nullptr, pool);
  RoutingReplay replay(fixed, m->cfg);
  auto p1 = baseline(*m, recording_loader(*m, by_trace));
  const RoutingTrace seen = run(*m, p1, tokens, &replay, pool);

  const std::set<std::pair<std::uint32_t, std::uint32_t>> want{{0, 2}, {0, 3}, {1, 0}, {1, 1}};
  CHECK(by_trace == want);
  CHECK(by_router != want);
  // Every expert resident: each of the four is loaded once, and every other access hits.
  const auto s = p1.stats();
  CHECK(s.misses == 4);
  CHECK(s.bytes_loaded() == 4 * m->cfg.shape().expert_bytes(Precision::f32));
  // Each layer call (the prompt's one forward, then each decode token) demands its two experts.
  CHECK(s.hits + s.misses == (1 + tokens.decode.size()) * m->cfg.n_moe_layers * m->cfg.top_k);
  CHECK(seen.token_count() == tokens.prompt.size() + tokens.decode.size());
  // One trace token, wrapped around for every prompt and decode token.
  CHECK(replay.tokens() == tokens.prompt.size() + tokens.decode.size());
}

TEST_CASE("replayed tokens: prefill and decode walks, wrap-around, the shared cursor",
          "[engine][replay]") {
  REQUIRE(fs::exists(replay_fixture / "reference.json"));
  moekit::ThreadPool pool(2);
  const auto m = engine_test::load_model(replay_fixture);
  REQUIRE(m);
  const Tokens tokens{{1, 17, 42}, {5, 9, 33, 70, 101, 2}};  // 3 prompt + 6 decode tokens
  auto trace_tokens = [&](const RoutingTrace& seen) {
    std::vector<int> out;
    for (std::size_t t = 0; t < seen.token_count(); ++t) {
      out.push_back(numbered_token(seen, t, 0));
      CHECK(numbered_token(seen, t, 1) == out.back());
    }
    return out;
  };
  SECTION("a decode-only trace: the prompt takes its first tokens, decode goes on after them") {
    RoutingReplay replay(numbered_trace(m->cfg, 0, 4), m->cfg);
    auto p = baseline(*m, host_loader(m->weights.experts));
    CHECK(trace_tokens(run(*m, p, tokens, &replay, pool)) ==
          std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3, 0});
  }
  SECTION("prefill and decode tokens: each phase walks its own, wrapping around") {
    RoutingReplay replay(numbered_trace(m->cfg, 2, 4), m->cfg);  // trace tokens 0-1 prefill
    auto p = baseline(*m, host_loader(m->weights.experts));
    CHECK(trace_tokens(run(*m, p, tokens, &replay, pool)) ==
          std::vector<int>{0, 1, 0, 2, 3, 4, 5, 2, 3});
    SECTION("the walks go on across sequences until rewound") {
      auto q = baseline(*m, host_loader(m->weights.experts));
      CHECK(trace_tokens(run(*m, q, tokens, &replay, pool)) ==
            std::vector<int>{1, 0, 1, 4, 5, 2, 3, 4, 5});
      replay.rewind();
      CHECK(replay.tokens() == 0);
      auto r = baseline(*m, host_loader(m->weights.experts));
      CHECK(trace_tokens(run(*m, r, tokens, &replay, pool)) ==
            std::vector<int>{0, 1, 0, 2, 3, 4, 5, 2, 3});
    }
  }
  SECTION("a chunked prompt walks the same tokens as one prefill") {
    RoutingReplay replay(numbered_trace(m->cfg, 0, 5), m->cfg);
    auto p = baseline(*m, host_loader(m->weights.experts));
    TraceRecorder rec(m->cfg, "seen");
    TracingPipeline<Baseline> traced(p, rec);
    Model<TracingPipeline<Baseline>> model(m->cfg, m->weights.dense, traced, 16, &pool);
    model.set_routing_replay(&replay);
    model.set_ubatch(2);
    model.begin_sequence();
    model.prefill(tokens.prompt);
    model.decode(tokens.decode[0]);
    CHECK(trace_tokens(rec.trace()) == std::vector<int>{0, 1, 2, 3});
  }
  SECTION("a token recomputed after a fallback replays the same trace token") {
    RoutingReplay replay(numbered_trace(m->cfg, 0, 4), m->cfg);
    const auto shape = m->cfg.shape();
    BigLittle p(shape, pipeline_config(shape, {0, Precision::f32}), host_loader(m->weights.experts),
                moekit::UniformScorer({Precision::f32}), {}, {}, {},
                moekit::BigLittlePolicy({.gamma = 1.0f}));  // every decode token falls back
    CHECK(trace_tokens(run(*m, p, tokens, &replay, pool)) ==
          std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3, 0});
    CHECK(p.stats().fallbacks == tokens.decode.size());
    CHECK(replay.tokens() == tokens.prompt.size() + tokens.decode.size());
  }
}

TEST_CASE("a missing record takes the previous token's; a layer never recorded, the router's",
          "[engine][replay]") {
  REQUIRE(fs::exists(replay_fixture / "reference.json"));
  moekit::ThreadPool pool(2);
  const auto m = engine_test::load_model(replay_fixture);
  REQUIRE(m);
  const Tokens tokens{{1, 17, 42}, {5, 9, 33}};
  auto p0 = baseline(*m, host_loader(m->weights.experts));
  const RoutingTrace own = run(*m, p0, tokens, nullptr, pool);

  RoutingTrace trace = numbered_trace(m->cfg, 0, 6);
  for (std::size_t t = 0; t < 6; ++t) trace.clear_route(t, 0);  // layer 0: no record at all
  trace.clear_route(0, 1);  // before layer 1's first record: takes token 2's
  trace.clear_route(1, 1);
  trace.clear_route(4, 1);  // takes token 3's
  RoutingReplay replay(trace, m->cfg);
  CHECK(replay.filled() == 3);
  auto p1 = baseline(*m, host_loader(m->weights.experts));
  const RoutingTrace seen = run(*m, p1, tokens, &replay, pool);
  CHECK(replay.missing() == 6);
  CHECK(replay.replayed() == 6);
  // Layer 0's routing does not depend on earlier experts: the fallback is the unreplayed run's.
  for (std::size_t t = 0; t < 6; ++t) {
    INFO("token " << t);
    CHECK(ids(seen, t, 0) == ids(own, t, 0));
  }
  std::vector<int> layer1;
  for (std::size_t t = 0; t < 6; ++t) layer1.push_back(numbered_token(seen, t, 1));
  CHECK(layer1 == std::vector<int>{2, 2, 2, 3, 3, 5});
}

TEST_CASE("a narrowed top-k replays the record's first experts, renormalised", "[engine][replay]") {
  const ModelConfig cfg = load_config(replay_fixture);
  RoutingReplay replay(numbered_trace(cfg, 0, 2), cfg);
  std::vector<std::uint32_t> experts{9};
  std::vector<float> weights{0.f};
  replay.begin_forward(Phase::decode, 1);
  replay.apply(0, 1, experts, weights);  // MoBiLE's little pass: top-1
  CHECK(experts[0] == 0);
  CHECK(weights[0] == 1.f);
  std::vector<std::uint32_t> three(3);
  std::vector<float> three_w(3);
  CHECK_THROWS_WITH(replay.apply(0, 3, three, three_w), Catch::Contains("top-k"));
}

TEST_CASE("replaced logits: the trace's (made from its records when it has none), on request",
          "[engine][replay][mobile]") {
  const ModelConfig cfg = load_config(replay_fixture);   // 4 experts, top-2
  RoutingReplay replay(numbered_trace(cfg, 0, 2), cfg);  // token 0: experts {0, 1}, 0.55 / 0.45
  std::vector<float> logits(cfg.n_experts, 7.f);
  replay.begin_forward(Phase::decode, 1);
  replay.apply_logits(0, logits);
  CHECK(logits == std::vector<float>(cfg.n_experts, 7.f));  // off by default: the router's stay
  replay.set_replace_logits(true);
  replay.apply_logits(0, logits);
  CHECK(logits[0] == Approx(std::log(0.55f)));
  CHECK(logits[1] == Approx(std::log(0.45f)));
  CHECK(logits[2] < logits[1] - 7.f);  // the others far below, distinct, by id
  CHECK(logits[3] < logits[2]);
  std::vector<float> two(2 * cfg.n_experts);
  CHECK_THROWS_WITH(replay.apply_logits(0, two), Catch::Contains("n_tokens × n_experts"));
}

TEST_CASE(
    "mobile-oracle: fallbacks at the set share, the big pass runs the plan made from the "
    "trace at the set accuracy",
    "[engine][replay][mobile]") {
  REQUIRE(fs::exists(replay_fixture / "reference.json"));
  moekit::ThreadPool pool(2);
  const auto m = engine_test::load_model(replay_fixture);
  REQUIRE(m);
  const Tokens tokens{{1, 17, 42}, {5, 9, 33, 70}};
  // Layer 0 always experts {3, 2}, layer 1 always {0, 1}.
  RoutingTrace fixed(dims_of(m->cfg), "fixed", true);
  fixed.begin_sequence("s");
  const std::size_t g = fixed.append_token(Phase::decode);
  fixed.set_route(g, 0, std::vector<std::uint32_t>{3, 2}, std::vector<float>{0.7f, 0.3f});
  fixed.set_route(g, 1, std::vector<std::uint32_t>{0, 1}, std::vector<float>{0.6f, 0.4f});
  using Spec = presets::MobileOracleSpec;
  const auto shape = m->cfg.shape();
  auto run_oracle = [&](double fallback_ratio, double accuracy,
                        std::set<std::pair<std::uint32_t, std::uint32_t>>& loaded) {
    presets::PresetParams q;
    q.fallback_ratio = fallback_ratio;
    q.replay_accuracy = accuracy;
    RoutingReplay replay(fixed, m->cfg);
    replay.set_replace_logits(Spec::needs.replayed_logits);
    auto p =
        Spec::build(shape, pipeline_config(shape, {0, Precision::f32}),
                    recording_loader(*m, loaded), Spec::configure(shape, Precision::f32, q), {});
    run(*m, *p, tokens, &replay, pool);
    return p->token_policy().stats();
  };
  const std::set<std::pair<std::uint32_t, std::uint32_t>> want{{0, 2}, {0, 3}, {1, 0}, {1, 1}};
  SECTION("every token falls back; a plan of accuracy 1 is the trace's experts") {
    std::set<std::pair<std::uint32_t, std::uint32_t>> loaded;
    const auto s = run_oracle(1.0, 1.0, loaded);
    CHECK(s.fallbacks == tokens.decode.size());
    CHECK(loaded == want);
  }
  SECTION("a plan of accuracy 0 swaps the expert the little pass did not run") {
    std::set<std::pair<std::uint32_t, std::uint32_t>> loaded;
    run_oracle(1.0, 0.0, loaded);
    CHECK(loaded.size() > want.size());  // the big passes ran experts outside the record
    CHECK(std::includes(loaded.begin(), loaded.end(), want.begin(), want.end()));  // prefill
  }
  SECTION("the share falls back, whatever the model's confidence") {
    std::set<std::pair<std::uint32_t, std::uint32_t>> loaded;
    CHECK(run_oracle(0.5, 1.0, loaded).fallbacks == tokens.decode.size() / 2);
    CHECK(run_oracle(0.0, 1.0, loaded).fallbacks == 0);
  }
}

TEST_CASE("a trace for another model is refused naming the flag and both values",
          "[engine][replay]") {
  const ModelConfig cfg = load_config(replay_fixture);  // 2 MoE layers, 4 experts, top-2
  auto refused = [&](TraceDims d, const std::string& what) {
    RoutingTrace t(d, "other");
    t.begin_sequence("s");
    t.append_token(Phase::decode);
    CHECK_THROWS_WITH(RoutingReplay(t, cfg, "--routing-trace 'x'"),
                      Catch::Contains("--routing-trace 'x'") && Catch::Contains(what));
  };
  refused({.n_layers = 3, .n_experts = 4, .top_k = 2},
          "n_layers (MoE layers) = 3, the model has 2");
  refused({.n_layers = 2, .n_experts = 8, .top_k = 2}, "n_experts = 8, the model has 4");
  refused({.n_layers = 2, .n_experts = 4, .top_k = 1}, "top_k = 1, the model has 2");
  CHECK_THROWS_WITH(RoutingReplay(RoutingTrace(dims_of(cfg), "empty"), cfg),
                    Catch::Contains("holds no token"));
  // The shared Mixtral format is read at Mixtral-8x7B's dims.
  const std::string mixtral = (engine_test::data_dir() / "mixtral_decode_snippet.jsonl").string();
  CHECK_THROWS_WITH(RoutingReplay::from_file(mixtral, cfg),
                    Catch::Contains("--routing-trace '" + mixtral + "'") &&
                        Catch::Contains("n_layers (MoE layers) = 32, the model has 2"));
  CHECK_THROWS_WITH(RoutingReplay::from_file("/nonexistent/t.mktrace", cfg),
                    Catch::StartsWith("--routing-trace: ") && Catch::Contains("/nonexistent"));
}

TEST_CASE("trace files are read whatever their format", "[engine][replay][sim]") {
  using moekit::sim::TraceFileFormat;
  const auto bytes_of = [](std::string_view s) {
    return std::vector<std::byte>(reinterpret_cast<const std::byte*>(s.data()),
                                  reinterpret_cast<const std::byte*>(s.data()) + s.size());
  };
  const auto detect = [&](std::string_view s) {
    return moekit::sim::detect_trace_format(bytes_of(s), "<test>");
  };
  CHECK(detect(R"({"format": "moekit-trace"})") == TraceFileFormat::moekit_jsonl);
  CHECK(detect("\n{\"layer\": 0, \"token_pos\": 3}") == TraceFileFormat::mixtral_raw);
  CHECK(detect(R"({"layer": 0, "token_idx": 3})") == TraceFileFormat::mixtral_decode);
  CHECK_THROWS_WITH(detect("not json"), Catch::Contains("<test>") && Catch::Contains("neither"));
  CHECK_THROWS_WITH(detect(""), Catch::Contains("neither"));

  const auto raw = moekit::sim::read_trace_file(
      (engine_test::data_dir() / "mixtral_raw_snippet.jsonl").string());
  CHECK(raw.dims() == moekit::sim::mixtral_trace_dims);
  CHECK(raw.prefill_length(0) > 0);

  // The fixture in moekit's JSONL schema, at the tiny model's dims: 2 prefill + 3 decode tokens,
  // decode token 0's layer 1 missing (filled with prefill token 1's).
  const ModelConfig cfg = load_config(replay_fixture);
  RoutingReplay replay = RoutingReplay::from_file(tiny_jsonl.string(), cfg);
  const RoutingTrace& t = replay.trace();
  REQUIRE(t.token_count() == 5);
  CHECK(t.prefill_length(0) == 2);
  CHECK(replay.filled() == 1);
  CHECK(t.missing_count() == 0);
  std::vector<std::uint32_t> e(2);
  std::vector<float> w(2);
  replay.begin_forward(Phase::decode, 1);  // the first decode token: trace token 2
  replay.apply(0, 2, e, w);
  CHECK(e == std::vector<std::uint32_t>{3, 2});
  CHECK(w == std::vector<float>{0.5625f, 0.4375f});
  e = {0, 1};
  replay.apply(1, 2, e, w);  // missing in the file: the previous token's record at layer 1
  CHECK(e == std::vector<std::uint32_t>{3, 2});
  CHECK(w == std::vector<float>{0.875f, 0.125f});
  replay.end_forward();
  CHECK(replay.missing() == 0);
  CHECK(replay.replayed() == 2);
}

TEST_CASE("every preset runs the replayed experts", "[engine][replay][presets]") {
  REQUIRE(fs::exists(replay_fixture / "reference.json"));
  moekit::ThreadPool pool(2);
  const auto m = engine_test::load_model(replay_fixture);
  REQUIRE(m);
  const ModelConfig& cfg = m->cfg;
  const moekit::ModelShape s = cfg.shape();
  // Half the experts fit, every preset without narrowing or skipping (as offload_test's
  // exact settings): what each routes is then exactly the trace.
  OffloadSettings o{std::max(all_resident_budget(s, Precision::f32) / 2,
                             minimum_expert_budget(s, Precision::f32)),
                    Precision::f32};
  o.preset.t1 = o.preset.t2 = 1.0f;
  o.preset.fate_low_fraction = 0.0;
  o.preset.gamma = 0.0f;
  o.preset.k_little = s.top_k;
  const ExpertBacking backing{&m->weights.experts, nullptr, {}};
  const Tokens tokens{{1, 17, 42, 7}, {5, 9, 33, 70, 101, 2, 64, 3}};
  const RoutingTrace trace = numbered_trace(cfg, 0, 5);
  RoutingReplay replay(trace, cfg);

  const std::vector<float> routers = router_stack(cfg, m->weights.dense);
  PresetInputs in;
  in.routers = routers;
  const Calibration cal =
      calibrate(cfg, m->weights.dense, o, backing, tokens.prompt, 2, &pool, {}, &replay);
  CHECK(replay.tokens() == 0);  // rewound after calibration
  // The calibration counted the trace's experts: 4 prompt + 2 greedy tokens replay trace tokens
  // 0 1 2 3 4 0, of which 0, 3, 4 and 0 again hold expert 0.
  CHECK(cal.counts[0] == 4);
  CHECK(cal.tokens == 6);
  in.popularity = cal.counts;
  in.paths = cal.paths;
  in.cpu_seconds_per_token = 1e-6;
  in.copy_seconds = 1e-3;
  // The oracle stand-ins read the replay ahead (not owned: it outlives the pipelines).
  in.lookahead = std::shared_ptr<moekit::RoutingLookahead>(std::shared_ptr<void>{}, &replay);
  for (const presets::PresetEntry& preset : presets::entries) {
    INFO(preset.name);
    replay.rewind();
    with_pipeline(preset, s, o, backing.make_loader(), in, [&](auto& p) {
      const RoutingTrace seen = run(*m, p, tokens, &replay, pool);
      // The gate oracles predicted the replayed routing, mostly right (mobile-oracle's plan is
      // tested above).
      if (preset.needs.lookahead && !preset.needs.replayed_logits) {
        const auto d1 = p.stats().prediction[1];
        CHECK(d1.true_positive > 0);
        CHECK(d1.true_positive > d1.false_negative);
      }
      REQUIRE(seen.token_count() == tokens.prompt.size() + tokens.decode.size());
      for (std::size_t t = 0; t < seen.token_count(); ++t)
        for (std::uint32_t l = 0; l < s.n_layers; ++l)
          CHECK(ids(seen, t, l) == ids(trace, t % trace.token_count(), l));
      CHECK(replay.missing() == 0);
      CHECK(replay.replayed() == seen.record_count());
    });
  }
}
