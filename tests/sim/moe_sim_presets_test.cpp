// moe-sim's presets (include/moekit/sim/preset_runs.hpp, the registry's presets it replays),
// through the same functions moe-sim calls: every preset and reference replays a small synthetic
// Mixtral trace to finite, sane numbers; the substitutes say what they are; the real gate
// predictors run when the trace has hidden states and router weights are given; the noisy
// oracle's recall and seed behave.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moekit/sim/hardware.hpp"
#include "moekit/sim/preset_runs.hpp"
#include "moekit/sim/synthetic_trace.hpp"
#include "moekit/sim/trace_binary.hpp"

using namespace moekit;
using namespace moekit::sim::preset_runs;

namespace {

// data/stats of the source tree. Appended in place: g++ 12 -O3 reports a false -Warray-bounds on
// `std::string(MOEKIT_SOURCE_DIR) + "/data/stats"` inlined into these tests.
const std::string& presets_stats_dir() {
  static const std::string d = [] {
    std::string s = MOEKIT_SOURCE_DIR;
    s.append("/data/stats");
    return s;
  }();
  return d;
}

// 2 sequences of 8 prefill + 24 decode tokens of synthetic Mixtral routing.
sim::RoutingTrace synthetic_mixtral(unsigned seed) {
  sim::SyntheticConfig c;
  c.sequences = 2;
  c.prefill_tokens = 8;
  c.decode_tokens = 24;
  c.seed = seed;
  return sim::generate_synthetic_trace("mixtral-8x7b", presets_stats_dir(), c);
}

const sim::RoutingTrace& mixtral_trace() {
  static const sim::RoutingTrace t = synthetic_mixtral(7);
  return t;
}

// Another draw of the same statistics: the routing edgemoe and fiddler calibrate on, distinct from
// the replayed one.
std::shared_ptr<const sim::RoutingTrace> calibration_trace() {
  static const auto t = std::make_shared<const sim::RoutingTrace>(synthetic_mixtral(8));
  return t;
}

RunParams mixtral_params(double budget_share = 0.25) {
  RunParams rp;
  rp.calibration = calibration_trace();
  rp.shape = mixtral_8x7b;
  const sim::HardwareModel hw = sim::rtx4090_pcie4();
  rp.link = hw.link;
  rp.compute = hw.compute_model(rp.shape, sim::mixtral_8x7b_dense());
  rp.config.base_precision = Precision::f16;
  rp.config.expert_budget_bytes =
      static_cast<std::size_t>(budget_share * double(rp.shape.expert_count())) *
      rp.shape.expert_bytes(Precision::f16);
  return rp;
}

void check_sane(const PresetResult& r, const sim::RoutingTrace& tr, const std::string& name) {
  INFO(name << ": " << r.label);
  const auto& s = r.report.pipeline;
  CHECK_FALSE(r.label.empty());
  CHECK(s.demands > 0);
  CHECK(s.hits + s.misses + s.skipped == s.demands);
  CHECK(std::isfinite(s.miss_penalty));
  CHECK(s.miss_penalty >= 0.0);
  CHECK(s.miss_penalty <= double(s.misses) + 1e-9);  // no miss costs more than a base one
  CHECK(r.report.hit_rate() >= 0.0);
  CHECK(r.report.hit_rate() <= 1.0);
  CHECK(std::isfinite(r.report.total_s));
  CHECK(r.report.total_s > 0.0);
  CHECK(r.report.stall_s <= r.report.total_s + 1e-12);
  CHECK(std::isfinite(r.report.decode_tokens_per_s()));
  CHECK(r.report.decode_tokens_per_s() > 0.0);
  CHECK(r.report.decode_tokens == 2 * 24);
  CHECK(r.report.prefill_tokens == 2 * 8);
  CHECK(r.report.forwards >= tr.sequence_count() * 25);  // fallbacks add forwards
  for (int d = 1; d <= 3; ++d) {
    CHECK(s.prediction[d].precision() >= 0.0);
    CHECK(s.prediction[d].precision() <= 1.0);
    CHECK(s.prediction[d].recall() <= 1.0);
  }
}

}  // namespace

TEST_CASE("moe-sim presets: every preset and reference replays a synthetic trace",
          "[sim][moe-sim]") {
  const auto& tr = mixtral_trace();
  const RunParams rp = mixtral_params();
  std::vector<const SimEntry*> all;
  for (const SimEntry& p : sim_presets()) all.push_back(&p);
  for (const auto& p : cost_aware_table) all.push_back(&p);
  all.push_back(&belady_entry);
  for (const SimEntry* p : all) {
    REQUIRE(p->run != nullptr);
    check_sane(p->run(rp, tr), tr, std::string(p->name));
    if (p->reference != "belady") CHECK(find_reference(p->reference) != nullptr);
  }
  // Every registered preset but the oracle stand-ins (moe-sim's HOBBIT, Fate and MoBiLE are them
  // on traces without hidden states or logits), in registry order, found from its registry entry.
  CHECK(sim_presets().size() + 3 == presets::entries.size());
  CHECK(sim_preset(presets::entry_of<presets::NextUseSpec>) != nullptr);
  CHECK(sim_preset(presets::entry_of<presets::HobbitOracleSpec>) == nullptr);
  CHECK(sim_preset(presets::entry_of<presets::FateOracleSpec>) == nullptr);
  CHECK(sim_preset(presets::entry_of<presets::MobileOracleSpec>) == nullptr);
  for (const SimEntry& p : sim_presets()) {
    REQUIRE(p.preset != nullptr);
    CHECK(p.preset->name == p.name);
    CHECK(sim_preset(*p.preset) == &p);
  }
  const auto base = run_baseline(rp, tr), bel = run_belady(rp, tr);
  CHECK(bel.report.misses() <= base.report.misses());  // same components, optimal eviction
  // Substitutes name themselves: the synthetic trace has no hidden states or router logits.
  CHECK(run_hobbit(rp, tr).label.find("noisy-oracle predictor, paper (Fig. 7 top-1; lower ranks "
                                      "assumed equal) recall: top-1 0.96/0.90/0.90, ranks 2+ "
                                      "0.96/0.90/0.90 at +1/+2/+3, precisions by T1/T2 on the "
                                      "predicted gate weights") != std::string::npos);
  CHECK(run_hobbit(rp, tr).label.find("high pool 69% of the slots") != std::string::npos);
  CHECK(run_fate(rp, tr).label.find("noisy-oracle predictor, recall 0.9715") != std::string::npos);
  // Fate's staging: one slot per expert of a layer by default, --fate-staging-slots sets it.
  const std::string slots = std::to_string(rp.shape.n_experts) + " staging slots";
  CHECK(run_fate(rp, tr).label.find(slots) != std::string::npos);
  RunParams one = rp;
  one.fate_staging_slots = 1;
  CHECK(run_fate(one, tr).label.find(", 1 staging slots") != std::string::npos);
  CHECK(run_mobile(rp, tr).note.find("router logits made from each record's top-k") !=
        std::string::npos);
  CHECK(run_mobile(rp, tr).label.find("router replay, big pass little-plan, plan accuracy 0.8") !=
        std::string::npos);
  CHECK(run_edgemoe(rp, tr).label.find("from 48 calibration decode tokens") != std::string::npos);
}

TEST_CASE("moe-sim presets: substitutes behave as documented", "[sim][moe-sim]") {
  const auto& tr = mixtral_trace();
  RunParams rp = mixtral_params();

  SECTION("hobbit's noisy oracle: recall 1 never mispredicts, recall 0 never predicts right") {
    rp.hobbit_recall = parse_hobbit_recall("1");
    const auto one = run_hobbit(rp, tr).report.pipeline.prediction[1];
    CHECK(one.true_positive > 0);
    CHECK(one.false_positive == 0);
    rp.hobbit_recall = parse_hobbit_recall("0");
    const auto zero = run_hobbit(rp, tr).report.pipeline.prediction[1];
    CHECK(zero.true_positive == 0);
    CHECK(zero.false_positive > 0);
  }
  SECTION("hobbit's noisy oracle keeps each rank at its own recall") {
    // The top-1 always, rank 2 never: decode calls (2 distinct experts each) are half right.
    rp.hobbit_recall = parse_hobbit_recall("1/0");
    const auto r = run_hobbit(rp, tr).report.pipeline.prediction[1];
    CHECK(r.true_positive > 0);
    CHECK(r.false_negative > 0);
    rp.hobbit_recall = parse_hobbit_recall("0/1");
    const auto s = run_hobbit(rp, tr).report.pipeline.prediction[1];
    CHECK(s.true_positive > 0);
    CHECK(s.false_negative > 0);
    CHECK(s.false_positive > 0);
  }
  SECTION("--hobbit-recall: profiles, figures per rank, and clear refusals") {
    CHECK(parse_hobbit_recall("paper").top1 == std::vector<double>{0.96, 0.90, 0.90});
    CHECK(parse_hobbit_recall("measured").lower == std::vector<double>{0.764, 0.726, 0.665});
    const auto r = parse_hobbit_recall("0.9,0.8/0.7");
    CHECK(r.top1 == std::vector<double>{0.9, 0.8});
    CHECK(r.lower == std::vector<double>{0.7});
    CHECK(r.source == "given");
    CHECK_THROWS_WITH(parse_hobbit_recall("1.2"), Catch::Contains("--hobbit-recall"));
    CHECK_THROWS_WITH(parse_hobbit_recall("0.9,x"), Catch::Contains("not a number"));
    CHECK_THROWS_WITH(parse_hobbit_recall("1,1,1,1"), Catch::Contains("1 to 3 figures"));
    CHECK(run_hobbit(rp, tr).label.find("paper (Fig. 7") != std::string::npos);
    rp.hobbit_recall = parse_hobbit_recall("measured");
    CHECK(run_hobbit(rp, tr).label.find("measured (moekit-tiny-moe traces) recall: top-1 "
                                        "0.94/0.85/0.83, ranks 2+ 0.76/0.73/0.67") !=
          std::string::npos);
  }
  SECTION("hobbit's pools: the high one larger by default, settable") {
    const auto dflt = run_hobbit(rp, tr);
    rp.hobbit_high_slots = 0.5;
    const auto equal = run_hobbit(rp, tr);
    CHECK(equal.label.find("high pool 50% of the slots") != std::string::npos);
    CHECK(dflt.report.pipeline.misses != equal.report.pipeline.misses);
  }
  SECTION("hobbit's noisy oracle predicts p = 2 layers ahead, each distance at its own recall") {
    rp.hobbit_recall = parse_hobbit_recall("1,0");
    const auto r = run_hobbit(rp, tr).report.pipeline;
    CHECK(r.prediction[1].true_positive > 0);
    CHECK(r.prediction[1].false_positive == 0);
    CHECK(r.prediction[2].true_positive == 0);
    CHECK(r.prediction[2].false_positive > 0);
    CHECK(r.prediction[3].true_positive + r.prediction[3].false_positive == 0);
  }
  SECTION("the noisy oracle is deterministic per seed") {
    rp.hobbit_recall = parse_hobbit_recall("0.7");
    const auto a = run_hobbit(rp, tr).report, b = run_hobbit(rp, tr).report;
    CHECK(a.pipeline.prediction[1].true_positive == b.pipeline.prediction[1].true_positive);
    CHECK(a.pipeline.misses == b.pipeline.misses);
    CHECK(a.total_s == b.total_s);
    rp.seed = 99;
    const auto c = run_hobbit(rp, tr).report;
    CHECK((c.pipeline.prediction[1].true_positive != a.pipeline.prediction[1].true_positive ||
           c.pipeline.prediction[1].false_positive != a.pipeline.prediction[1].false_positive));
  }
  SECTION("mobile falls back on the configured share of decode tokens") {
    rp.fallback_ratio = 0.25;
    const auto r = run_mobile(rp, tr).report;
    CHECK(r.pipeline.fallbacks == Approx(0.25 * 48).margin(1.0));
    CHECK(r.forwards == 2 + 48 + r.pipeline.fallbacks);
    rp.fallback_ratio = 0.0;
    CHECK(run_mobile(rp, tr).report.pipeline.fallbacks == 0);
  }
  SECTION("fiddler's placement is preloaded before the clock starts") {
    // Decode only: every miss runs on the CPU (cheaper than a copy for one token), so any stall
    // would be the placement's transfers.
    sim::SyntheticConfig c;
    c.decode_tokens = 24;
    const auto dec = sim::generate_synthetic_trace("mixtral-8x7b", presets_stats_dir(), c);
    const auto r = run_fiddler(rp, dec).report;
    const std::size_t placed =
        rp.config.expert_budget_bytes / rp.shape.expert_bytes(Precision::f16);
    CHECK(r.pipeline.bytes_preloaded == placed * rp.shape.expert_bytes(Precision::f16));
    CHECK(r.loader.bytes >= r.pipeline.bytes_preloaded);
    CHECK(r.pipeline.host_cpu_runs > 0);
    CHECK(r.stall_s == 0.0);
  }
  SECTION("edgemoe and fiddler refuse to run without a calibration trace") {
    rp.calibration = nullptr;
    CHECK_THROWS_WITH(run_edgemoe(rp, tr), Catch::Contains("no calibration trace"));
    CHECK_THROWS_WITH(run_fiddler(rp, tr), Catch::Contains("no calibration trace"));
  }
  SECTION("the cost-aware reference with one precision is Belady") {
    const auto ca = run_cost_aware(rp, tr, UniformScorer({.precision = Precision::f16}), rp.config,
                                   "cost-aware, one precision");
    CHECK(ca.report.misses() == run_belady(rp, tr).report.misses());
    // With HOBBIT's precisions the reference's penalty is below its miss count (q4 misses).
    const auto h = run_belady_cost_hobbit(rp, tr).report;
    CHECK(h.miss_penalty() < double(h.misses()));
  }
}

TEST_CASE(
    "moe-sim presets: HOBBIT and Fate run their gate predictors with hidden states and "
    "routers",
    "[sim][moe-sim]") {
  // 4 layers × 4 experts, hidden 4, identity routers: the gate input of layer l is built so that
  // the router of layer l+1 scores layer l+1's true experts highest.
  const std::uint32_t L = 4, E = 4, H = 4;
  sim::RoutingTrace tr(sim::TraceDims{.n_layers = L, .n_experts = E, .top_k = 2, .hidden = H},
                       "hidden");
  std::mt19937 g(5);
  std::vector<std::array<std::uint32_t, 2>> route(L);
  tr.begin_sequence("s");
  for (int t = 0; t < 60; ++t) {
    const std::size_t tok = tr.append_token(Phase::decode);
    for (auto& r : route) {
      r[0] = g() % E;
      r[1] = (r[0] + 1 + g() % (E - 1)) % E;
    }
    for (std::uint32_t l = 0; l < L; ++l) {
      std::vector<float> h(H, 0.0f);
      if (l + 1 < L) h[route[l + 1][0]] = 3.0f, h[route[l + 1][1]] = 2.0f;
      const float w[2] = {0.7f, 0.3f};
      tr.set_route(tok, l, route[l], w, {}, h);
    }
  }
  RunParams rp;
  rp.shape = ModelShape{.n_layers = L, .n_experts = E, .top_k = 2, .hidden = 64, .ffn = 128};
  rp.link = {.bandwidth_bytes_per_s = 1e9, .latency_s = 0};
  rp.compute.device_expert_s.fill(1e-6);
  rp.compute.cpu_expert_s.fill(1e-5);
  rp.config.expert_budget_bytes = 8 * rp.shape.expert_bytes(Precision::f16);
  auto routers = std::make_shared<std::vector<float>>(std::size_t{L} * E * H, 0.0f);
  for (std::uint32_t l = 0; l < L; ++l)
    for (std::uint32_t e = 0; e < E; ++e) (*routers)[(l * E + e) * H + e] = 1.0f;

  // Without routers: the substitute, and it says why.
  const auto sub = run_hobbit(rp, tr);
  CHECK(sub.note.find("no --routers") != std::string::npos);

  rp.routers = routers;
  const auto hob = run_hobbit(rp, tr);
  CHECK(hob.label.find("stacked-gate") != std::string::npos);
  CHECK(hob.note.empty());
  // Layer l's gate input names layer l+1's experts exactly: every distance-1 prediction is right.
  const auto& p1 = hob.report.pipeline.prediction[1];
  CHECK(p1.true_positive > 0);
  CHECK(p1.false_positive == 0);

  const auto fate = run_fate(rp, tr);
  CHECK(fate.label.find("cross-layer gate") != std::string::npos);
  CHECK(std::isfinite(fate.report.miss_penalty()));

  // Routers of the wrong size: refused with the sizes, the substitute runs and says so.
  rp.routers = std::make_shared<std::vector<float>>(7, 0.0f);
  CHECK(run_hobbit(rp, tr).note.find("holds 7 floats") != std::string::npos);
}

// --replay-slice replays the tokens moe-run --routing-trace replays: the same walks as
// tests/engine/routing_replay_test.cpp's "replayed tokens" case, with the same expectations.
TEST_CASE("moe-sim --replay-slice: moe-run's replayed tokens, the rest calibrates",
          "[sim][moe-sim]") {
  const sim::TraceDims d{.n_layers = 2, .n_experts = 16, .top_k = 1};
  auto numbered = [&](std::size_t prefill, std::size_t decode) {  // token g routes to expert g
    sim::RoutingTrace t(d, "numbered");
    t.begin_sequence("s");
    for (std::size_t g = 0; g < prefill + decode; ++g) {
      const std::size_t i = t.append_token(g < prefill ? Phase::prefill : Phase::decode);
      const std::uint32_t id[] = {static_cast<std::uint32_t>(g)};
      const float w[] = {1.0f};
      for (std::uint32_t l = 0; l < d.n_layers; ++l) t.set_route(i, l, id, w, {}, {});
    }
    return t;
  };
  auto replayed = [](const sim::RoutingTrace& t) {
    std::vector<int> out;
    for (std::size_t i = 0; i < t.token_count(); ++i)
      out.push_back(static_cast<int>(t.experts(i, 0)[0]));
    return out;
  };
  SECTION("a decode-only trace: the prompt takes its first tokens, decode goes on after them") {
    const CalibrationSplit s = slice_like_routing_replay(numbered(0, 4), 3, 6);
    CHECK(replayed(s.evaluation) == std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3, 0});
    CHECK(s.evaluation.prefill_length(0) == 3);
    CHECK(s.calibration.token_count() == 0);
  }
  SECTION("prefill and decode tokens: each phase walks its own, wrapping around") {
    const CalibrationSplit s = slice_like_routing_replay(numbered(2, 4), 3, 6);
    CHECK(replayed(s.evaluation) == std::vector<int>{0, 1, 0, 2, 3, 4, 5, 2, 3});
  }
  SECTION("the tokens not replayed calibrate") {
    const CalibrationSplit s = slice_like_routing_replay(numbered(4, 8), 2, 3);
    CHECK(replayed(s.evaluation) == std::vector<int>{0, 1, 4, 5, 6});
    CHECK(replayed(s.calibration) == std::vector<int>{2, 3, 7, 8, 9, 10, 11});
    CHECK(s.calibration.sequence_count() == 2);
    CHECK(s.text.find("16-token") == std::string::npos);
    CHECK(s.text.find("2-token prompt and 3 decode tokens") != std::string::npos);
  }
}

TEST_CASE("moe-sim calibration: the first half calibrates, the second half is replayed",
          "[sim][moe-sim]") {
  SECTION("several sequences: the first half of them, then the rest") {
    const auto& tr = mixtral_trace();  // 2 sequences of 8 prefill + 24 decode tokens
    const CalibrationSplit s = split_for_calibration(tr);
    REQUIRE(s.calibration.sequence_count() == 1);
    REQUIRE(s.evaluation.sequence_count() == 1);
    CHECK(s.calibration.sequence_name(0) == tr.sequence_name(0));
    CHECK(s.evaluation.sequence_name(0) == tr.sequence_name(1));
    CHECK(s.evaluation.name() == tr.name());
    for (std::uint32_t l = 0; l < tr.dims().n_layers; ++l) {
      const std::size_t g = tr.global_token(1, 5);
      if (!tr.valid(g, l)) continue;
      CHECK(std::vector<std::uint32_t>(s.evaluation.experts(5, l).begin(),
                                       s.evaluation.experts(5, l).end()) ==
            std::vector<std::uint32_t>(tr.experts(g, l).begin(), tr.experts(g, l).end()));
    }
    CHECK(s.text.find("calibration: sequences 1-1 of 2") != std::string::npos);
  }
  SECTION("one sequence: the prefill and half the decode tokens, then the other decode tokens") {
    sim::SyntheticConfig c;
    c.prefill_tokens = 10;
    c.decode_tokens = 21;
    const auto one = sim::generate_synthetic_trace("mixtral-8x7b", presets_stats_dir(), c);
    const CalibrationSplit s = split_for_calibration(one);
    CHECK(s.calibration.token_count() == 10 + 10);
    CHECK(s.calibration.prefill_length(0) == 10);
    CHECK(s.evaluation.token_count() == 11);
    CHECK(s.evaluation.prefill_length(0) == 0);
    CHECK(s.calibration.token_count() + s.evaluation.token_count() == one.token_count());
  }
  SECTION("fiddler places the calibration's popular experts, not the replayed trace's") {
    // 2 layers x 4 experts, top-1: calibration always routes to expert 0, the replay to 3.
    const sim::TraceDims d{.n_layers = 2, .n_experts = 4, .top_k = 1};
    auto build = [&](std::uint32_t e, const char* name) {
      sim::RoutingTrace t(d, name);
      t.begin_sequence("s");
      for (int i = 0; i < 16; ++i) {
        const std::size_t g = t.append_token(Phase::decode);
        const std::uint32_t id[] = {e};
        const float w[] = {1.0f};
        for (std::uint32_t l = 0; l < 2; ++l) t.set_route(g, l, id, w);
      }
      return t;
    };
    const sim::RoutingTrace replayed = build(3, "replayed");
    RunParams rp;
    rp.shape = ModelShape{.n_layers = 2, .n_experts = 4, .top_k = 1, .hidden = 64, .ffn = 128};
    const sim::HardwareModel hw = sim::rtx4090_pcie4();
    rp.link = hw.link;
    rp.compute = hw.compute_model(rp.shape, sim::mixtral_8x7b_dense());
    rp.config.base_precision = Precision::f16;
    rp.config.expert_budget_bytes = 2 * rp.shape.expert_bytes(Precision::f16);
    rp.calibration = std::make_shared<const sim::RoutingTrace>(build(0, "calibration"));
    const auto r = run_fiddler(rp, replayed).report;
    CHECK(r.pipeline.hits == 0);  // placed (0, 0) and (1, 0): the replay's expert 3 never is
    CHECK(r.pipeline.demands == 32);
    // Calibrated on the replayed routing itself, the placement would serve every demand.
    rp.calibration = std::make_shared<const sim::RoutingTrace>(replayed);
    CHECK(run_fiddler(rp, replayed).report.pipeline.hits == 32);
  }
}

TEST_CASE("moe-sim mobile: the plan's accuracy is a stated stand-in, not the trace's own routing",
          "[sim][moe-sim][mobile]") {
  // A trace holds one forward per token, so the little pass sees the big pass's router logits
  // and its plan would always be right. The stand-in brings it to --replay-accuracy (default the
  // paper's 0.8) and the label says so and gives the agreement reached.
  const sim::RoutingTrace tr = sim::read_trace_binary(std::string(MOEKIT_SOURCE_DIR) +
                                                      "/bench/traces/tiny-heldout-ub1.mktrace");
  REQUIRE(tr.has_logits());
  RunParams rp;
  rp.shape = {.n_layers = tr.dims().n_layers,
              .n_experts = tr.dims().n_experts,
              .top_k = tr.dims().top_k,
              .hidden = 256,
              .ffn = 512};
  const sim::HardwareModel hw = sim::rtx4090_pcie4();
  rp.link = hw.link;
  rp.compute = hw.compute_model(rp.shape, sim::mixtral_8x7b_dense());
  rp.config.expert_budget_bytes =
      rp.shape.expert_count() / 2 * rp.shape.expert_bytes(Precision::f16);
  rp.fallback_ratio = 0.5;
  CHECK(rp.replay_accuracy == mobile_paper_replay_accuracy);
  CHECK(mobile_paper_replay_accuracy == 0.8);
  auto reached = [](const std::string& label) {
    const auto at = label.find("reached ");
    REQUIRE(at != std::string::npos);
    return std::stod(label.substr(at + 8));
  };
  const PresetResult paper = run_mobile(rp, tr);
  INFO(paper.label);
  CHECK_THAT(paper.label, Catch::Contains("plan accuracy 0.80 stand-in"));
  CHECK_THAT(paper.note, Catch::Contains("stand-in"));
  CHECK(reached(paper.label) == Approx(0.8).margin(0.06));
  rp.replay_accuracy = 1.0;
  const PresetResult perfect = run_mobile(rp, tr);
  CHECK(reached(perfect.label) == 1.0);
  // With the paper's big pass the plan runs as is: a wrong plan costs no on-demand load in the
  // big pass; re-routing loads the experts the plan missed.
  rp.replay_accuracy = 0.5;
  const PresetResult plan = run_mobile(rp, tr);
  rp.big_pass = RouterReplayPredictor::BigPass::recompute;
  const PresetResult exact = run_mobile(rp, tr);
  CHECK_THAT(exact.label, Catch::Contains("big pass recompute"));
  CHECK(exact.report.pipeline.bytes_demand_loaded > plan.report.pipeline.bytes_demand_loaded);
  CHECK(exact.report.pipeline.fallbacks == plan.report.pipeline.fallbacks);
}

TEST_CASE("docs/simulator.md states what moe-sim's mobile substitutes (issue 22, claims)",
          "[sim][moe-sim][mobile][docs]") {
  // The run's note says it: on a trace without router logits (the shared Mixtral traces, the
  // synthetic one) MoBiLE plans from logits made from each record's top-k, at the stated accuracy.
  const auto& tr = mixtral_trace();
  REQUIRE_FALSE(tr.has_logits());
  const PresetResult r = run_mobile(mixtral_params(), tr);
  REQUIRE_THAT(r.note, Catch::Contains("router logits made from each record's top-k"));
  // The docs' substitution table says the same (it said "LRU without replay" after the code
  // changed).
  std::ifstream docs(std::string(MOEKIT_SOURCE_DIR) + "/docs/simulator.md");
  REQUIRE(docs);
  std::string line, row;
  while (std::getline(docs, line))
    if (line.rfind("  | mobile |", 0) == 0) row = line;
  REQUIRE_FALSE(row.empty());
  CHECK_THAT(row, Catch::Contains("made from each record's top-k") &&
                      Catch::Contains("`--replay-accuracy`") &&
                      Catch::Contains("`--fallback-ratio`"));
  CHECK_THAT(row, !Catch::Contains("LRU without replay"));
}

// moe-run reading a Q4_0 file in place keeps its groups of 32, where EdgeMoE's own codec scales
// per output channel: sizing the simulated experts by the codec gave EdgeMoE 129 slots where
// moe-run had 114 (bench/RESULTS.md, "The simulator's second read path").
TEST_CASE("edgemoe_params: EdgeMoE's codec sizes the experts unless the run gave its group size",
          "[sim][presets][edgemoe]") {
  RunParams rp;
  rp.shape = mixtral_8x7b;
  const RunParams codec = edgemoe_params(rp);
  CHECK(codec.shape.quant.group_size == presets::EdgeMoeSpec::quant_group_size);
  rp.shape.quant.group_size = 32;
  rp.group_size_given = true;
  const RunParams kept = edgemoe_params(rp);
  CHECK(kept.shape.quant.group_size == 32);
  CHECK(kept.shape.expert_bytes(Precision::q4) > codec.shape.expert_bytes(Precision::q4));
}
