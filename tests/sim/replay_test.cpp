// replay(): the OffloadPipeline over a RoutingTrace with a SimLoader. Miss counts are checked
// against independent brute-force simulations (LRU and Belady written here from scratch, with
// their own demand extraction), times against closed forms.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "moekit/cache/belady.hpp"
#include "moekit/cache/lru.hpp"
#include "moekit/error.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/presets.hpp"
#include "moekit/sched/fiddler.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/uniform.hpp"
#include "moekit/sim/replay.hpp"
#include "moekit/sim/report.hpp"
#include "moekit/sim/sim_loader.hpp"
#include "moekit/sim/trace.hpp"
#include "moekit/sim/trace_jsonl.hpp"

using namespace moekit;
using namespace moekit::sim;

namespace {

using LruSim = presets::Baseline<SimLoader>;
using BeladySim = OffloadPipeline<UniformScorer, NoPredictor, CallOrderedPolicy<BeladyPolicy>,
                                  SimLoader, OnDemandScheduler>;

ModelShape shape_for(const TraceDims& d) {
  return ModelShape{
      .n_layers = d.n_layers, .n_experts = d.n_experts, .top_k = d.top_k, .hidden = 32, .ffn = 32};
}
PipelineConfig config_slots(const ModelShape& s, std::size_t slots) {
  return PipelineConfig{.expert_budget_bytes = slots * s.expert_bytes(Precision::f16)};
}

/// Random trace: `seqs` sequences, each with a prefill of `prefill` tokens then `decode` tokens;
/// each record missing with probability `p_missing`. Experts drawn from a skewed distribution so
/// that caching matters.
RoutingTrace random_trace(std::uint32_t seed, TraceDims d, int seqs, int prefill, int decode,
                          double p_missing = 0.0) {
  std::mt19937 rng(seed);
  RoutingTrace tr(d, "random-" + std::to_string(seed), true);
  std::vector<double> pop(d.n_experts);
  for (std::uint32_t e = 0; e < d.n_experts; ++e) pop[e] = 1.0 / (1.0 + e);
  std::bernoulli_distribution miss(p_missing);
  std::vector<float> w(d.top_k);
  float sum = 0;
  for (std::uint32_t j = 0; j < d.top_k; ++j) sum += float(d.top_k - j);
  for (std::uint32_t j = 0; j < d.top_k; ++j) w[j] = float(d.top_k - j) / sum;
  for (int s = 0; s < seqs; ++s) {
    std::string name = std::to_string(s);
    name.insert(0, 1, 's');  // (not "s" + ...: g++ 12 -Wrestrict false positive)
    tr.begin_sequence(name);
    for (int t = 0; t < prefill + decode; ++t) {
      const std::size_t g = tr.append_token(t < prefill ? Phase::prefill : Phase::decode);
      for (std::uint32_t l = 0; l < d.n_layers; ++l) {
        if (miss(rng)) continue;
        std::vector<double> p = pop;
        std::vector<std::uint32_t> ids;
        for (std::uint32_t j = 0; j < d.top_k; ++j) {
          std::discrete_distribution<std::uint32_t> pick(p.begin(), p.end());
          const std::uint32_t e = pick(rng);
          ids.push_back(e);
          p[e] = 0;
        }
        tr.set_route(g, l, ids, w);
      }
    }
  }
  return tr;
}

/// Independent demand extraction: per forward (prefill = one forward), per layer, the distinct
/// experts of the present records in first-seen order; layer calls without records are dropped.
std::vector<std::vector<ExpertKey>> brute_calls(const RoutingTrace& tr) {
  std::vector<std::vector<ExpertKey>> calls;
  const auto& d = tr.dims();
  for (std::size_t s = 0; s < tr.sequence_count(); ++s) {
    const std::size_t len = tr.sequence_length(s), pre = tr.prefill_length(s);
    std::vector<std::pair<std::size_t, std::size_t>> fwds;
    if (pre) fwds.push_back({0, pre});
    for (std::size_t t = pre; t < len; ++t) fwds.push_back({t, 1});
    for (auto [t0, n] : fwds)
      for (std::uint32_t l = 0; l < d.n_layers; ++l) {
        std::vector<ExpertKey> call;
        for (std::size_t t = t0; t < t0 + n; ++t) {
          const std::size_t g = tr.global_token(s, t);
          if (!tr.valid(g, l)) continue;
          for (std::uint32_t e : tr.experts(g, l)) {
            const ExpertKey k{l, e};
            if (std::find(call.begin(), call.end(), k) == call.end()) call.push_back(k);
          }
        }
        if (!call.empty()) calls.push_back(call);
      }
  }
  return calls;
}

/// Brute-force cache of `slots` equal-size entries. Per call: hits are touched (in call order),
/// then misses are inserted (in call order), each evicting the `pick`ed resident outside the
/// call; a miss with no evictable resident is served without insertion (staged).
template <class Pick>
std::uint64_t brute_misses(const std::vector<std::vector<ExpertKey>>& calls, std::size_t slots,
                           Pick pick) {
  std::vector<ExpertKey> res;  // residents
  std::uint64_t misses = 0;
  for (std::size_t c = 0; c < calls.size(); ++c) {
    const auto& call = calls[c];
    auto in_call = [&](ExpertKey k) {
      return std::find(call.begin(), call.end(), k) != call.end();
    };
    std::vector<ExpertKey> miss;
    for (ExpertKey k : call) {
      if (std::find(res.begin(), res.end(), k) != res.end())
        pick.touch(k);
      else
        miss.push_back(k);
    }
    for (ExpertKey k : miss) {
      ++misses;
      if (res.size() == slots) {
        std::vector<ExpertKey> cand;
        for (ExpertKey r : res)
          if (!in_call(r)) cand.push_back(r);
        if (cand.empty()) continue;  // staged
        const ExpertKey v = pick.victim(cand, calls, c);
        res.erase(std::find(res.begin(), res.end(), v));
      }
      res.push_back(k);
      pick.touch(k);
    }
  }
  return misses;
}

struct BruteLru {
  std::vector<ExpertKey> order;  // most recent at the back
  void touch(ExpertKey k) {
    order.erase(std::remove(order.begin(), order.end(), k), order.end());
    order.push_back(k);
  }
  ExpertKey victim(const std::vector<ExpertKey>& cand, const auto&, std::size_t) {
    for (ExpertKey k : order)
      if (std::find(cand.begin(), cand.end(), k) != cand.end()) return k;
    throw std::logic_error("BruteLru: no candidate in the recency list");
  }
};

struct BruteBelady {
  void touch(ExpertKey) {}
  // Farthest next use (in calls); never used again = farthest of all.
  ExpertKey victim(const std::vector<ExpertKey>& cand,
                   const std::vector<std::vector<ExpertKey>>& calls, std::size_t now) {
    ExpertKey best{};
    std::size_t best_next = 0;
    bool first = true;
    for (ExpertKey k : cand) {
      std::size_t next = std::numeric_limits<std::size_t>::max();
      for (std::size_t c = now + 1; c < calls.size(); ++c)
        if (std::find(calls[c].begin(), calls[c].end(), k) != calls[c].end()) {
          next = c;
          break;
        }
      if (first || next > best_next) best = k, best_next = next, first = false;
    }
    return best;
  }
};

ComputeModel zero_compute() { return ComputeModel{}; }

}  // namespace

TEST_CASE("replay: every expert fits -> only compulsory misses, none after warm-up",
          "[sim][replay]") {
  const TraceDims d{.n_layers = 4, .n_experts = 8, .top_k = 2};
  const RoutingTrace tr = random_trace(7, d, 3, 5, 40, 0.05);
  const ModelShape s = shape_for(d);
  LruSim p(s, config_slots(s, s.expert_count()), SimLoader(s, LinkModel{}));
  const ReplayReport first = replay(p, tr, zero_compute());
  std::set<ExpertKey> distinct;
  for (const auto& c : brute_calls(tr)) distinct.insert(c.begin(), c.end());
  CHECK(first.misses() == distinct.size());
  const ReplayReport second = replay(p, tr, zero_compute());  // warm cache
  CHECK(second.misses() == first.misses());                   // counters are cumulative
  CHECK(second.pipeline.hits > first.pipeline.hits);
  CHECK(second.bytes_moved() == first.bytes_moved());
}

TEST_CASE("replay: LRU and Belady miss counts equal a brute-force count", "[sim][replay]") {
  struct Case {
    std::uint32_t seed;
    TraceDims d;
    int seqs, prefill, decode;
    double p_missing;
    std::size_t slots;
  };
  const Case cases[] = {
      {1, {.n_layers = 3, .n_experts = 6, .top_k = 2}, 1, 0, 60, 0.0, 4},
      {2, {.n_layers = 4, .n_experts = 8, .top_k = 2}, 2, 0, 50, 0.0, 9},
      {3, {.n_layers = 2, .n_experts = 10, .top_k = 3}, 2, 4, 40, 0.03, 7},
      {4, {.n_layers = 5, .n_experts = 4, .top_k = 1}, 3, 3, 30, 0.1, 3},
      {5, {.n_layers = 4, .n_experts = 8, .top_k = 2}, 2, 6, 50, 0.02, 16},
      {6, {.n_layers = 6, .n_experts = 16, .top_k = 4}, 1, 8, 40, 0.0, 30},
  };
  for (const Case& c : cases) {
    CAPTURE(c.seed, c.slots);
    const RoutingTrace tr = random_trace(c.seed, c.d, c.seqs, c.prefill, c.decode, c.p_missing);
    const ModelShape s = shape_for(c.d);
    const auto calls = brute_calls(tr);

    LruSim lru(s, config_slots(s, c.slots), SimLoader(s, LinkModel{}));
    const ReplayReport r_lru = replay(lru, tr, zero_compute());
    CHECK(r_lru.misses() == brute_misses(calls, c.slots, BruteLru{}));

    BeladySim bel(s, config_slots(s, c.slots), SimLoader(s, LinkModel{}), UniformScorer{},
                  NoPredictor{}, CallOrderedPolicy<BeladyPolicy>(demand_sequence(tr)));
    const ReplayReport r_bel = replay(bel, tr, zero_compute());
    CHECK(r_bel.misses() == brute_misses(calls, c.slots, BruteBelady{}));
    CHECK(r_bel.misses() <= r_lru.misses());
    CHECK(r_lru.pipeline.demands == r_bel.pipeline.demands);
  }
}

TEST_CASE("replay: demand_sequence lists each routed call's experts in first-seen order",
          "[sim][replay]") {
  const TraceDims d{.n_layers = 3, .n_experts = 8, .top_k = 2};
  const RoutingTrace tr = random_trace(11, d, 2, 3, 10, 0.1);
  const DemandSequence ds = demand_sequence(tr);
  const auto calls = brute_calls(tr);
  REQUIRE(ds.call_end.size() == calls.size());
  std::size_t at = 0;
  for (std::size_t c = 0; c < calls.size(); ++c) {
    const std::vector<ExpertKey> got(ds.keys.begin() + static_cast<std::ptrdiff_t>(at),
                                     ds.keys.begin() + static_cast<std::ptrdiff_t>(ds.call_end[c]));
    CHECK(got == calls[c]);
    at = ds.call_end[c];
  }
}

TEST_CASE("replay: a pure on-demand run takes bytes/bandwidth + compute exactly",
          "[sim][replay][time]") {
  // top-1, one slot, every layer call names a different key: every access misses and nothing
  // overlaps, so the time is the plain sum.
  const TraceDims d{.n_layers = 4, .n_experts = 4, .top_k = 1};
  const RoutingTrace tr = random_trace(3, d, 2, 0, 25);
  const ModelShape s = shape_for(d);
  const double bw = 1073741824.0;  // 2^30 B/s
  ComputeModel cm;
  cm.device_expert_s[std::size_t(Precision::f16)] = 1.0 / 4096;
  cm.layer_s = 1.0 / 8192;
  LruSim p(s, config_slots(s, 1), SimLoader(s, LinkModel{bw, 0.0}));
  const ReplayReport r = replay(p, tr, cm);
  const std::uint64_t calls = 2 * 25 * 4;
  REQUIRE(r.misses() == calls);
  REQUIRE(r.pipeline.hits == 0);
  const double bytes = double(r.bytes_moved());
  CHECK(bytes == double(calls * s.expert_bytes(Precision::f16)));
  const double expect = bytes / bw + double(calls) * (1.0 / 4096 + 1.0 / 8192);
  CHECK(r.total_s == Approx(expect).epsilon(1e-12));
  CHECK(r.stall_s == Approx(bytes / bw).epsilon(1e-12));
  CHECK(r.compute_s == Approx(double(calls) * (1.0 / 4096 + 1.0 / 8192)).epsilon(1e-12));
  CHECK(r.decode_tokens == 50);
  CHECK(r.decode_tokens_per_s() == Approx(50.0 / expect).epsilon(1e-12));
  CHECK(r.prefill_latency_s() == 0.0);
}

TEST_CASE("replay: top-2 misses overlap the second load with the first expert's compute",
          "[sim][replay][time]") {
  const TraceDims d{.n_layers = 3, .n_experts = 8, .top_k = 2};
  const ModelShape s = shape_for(d);
  // one token, layers use disjoint experts, two slots: every access misses
  RoutingTrace tr(d, "disjoint");
  tr.begin_sequence("s");
  const std::size_t g = tr.append_token(Phase::decode);
  const std::vector<float> w{0.75f, 0.25f};
  for (std::uint32_t l = 0; l < 3; ++l) {
    const std::vector<std::uint32_t> ids{2 * l, 2 * l + 1};
    tr.set_route(g, l, ids, w);
  }
  const double bw = 1073741824.0;
  const double load = double(s.expert_bytes(Precision::f16)) / bw;
  ComputeModel cm;
  cm.device_expert_s[std::size_t(Precision::f16)] = load / 4;  // compute faster than a load
  LruSim p(s, config_slots(s, 2), SimLoader(s, LinkModel{bw, 0.0}));
  const ReplayReport r = replay(p, tr, cm);
  CHECK(r.misses() == 6);
  // per layer: load, load (first expert's compute hidden under the second load), compute
  CHECK(r.total_s == Approx(3 * (2 * load + load / 4)).epsilon(1e-12));
  CHECK(r.stall_s == Approx(3 * (2 * load - load / 4)).epsilon(1e-12));
}

TEST_CASE("replay: prefill is one forward; its latency and token counts are reported",
          "[sim][replay][time]") {
  const TraceDims d{.n_layers = 2, .n_experts = 8, .top_k = 2};
  const ModelShape s = shape_for(d);
  const RoutingTrace tr = random_trace(5, d, 2, 6, 4);
  ComputeModel cm;
  cm.layer_s = 1.0 / 1024;
  cm.layer_token_s = 1.0 / 4096;
  LruSim p(s, config_slots(s, s.expert_count()), SimLoader(s, LinkModel{1e30, 0.0}));
  const ReplayReport r = replay(p, tr, cm);
  CHECK(r.prefill_tokens == 12);
  CHECK(r.decode_tokens == 8);
  CHECK(r.forwards == 2 + 8);
  CHECK(r.prefill_sequences == 2);
  CHECK(r.prefill_latency_s() == Approx(2 * (1.0 / 1024 + 6.0 / 4096)).epsilon(1e-9));
  CHECK(r.decode_s == Approx(8 * 2 * (1.0 / 1024 + 1.0 / 4096)).epsilon(1e-9));
}

TEST_CASE("replay: missing records are left out, record-less layer calls are not routed",
          "[sim][replay][missing]") {
  const TraceDims d{.n_layers = 2, .n_experts = 4, .top_k = 1};
  const ModelShape s = shape_for(d);
  RoutingTrace tr(d, "gaps");
  tr.begin_sequence("s");
  const std::vector<float> one{1.0f};
  const std::size_t a = tr.append_token(Phase::prefill);
  const std::size_t b = tr.append_token(Phase::prefill);
  const std::size_t c = tr.append_token(Phase::decode);
  tr.set_route(a, 0, std::vector<std::uint32_t>{1}, one);  // a: layer 1 missing
  tr.set_route(b, 0, std::vector<std::uint32_t>{2}, one);
  tr.set_route(b, 1, std::vector<std::uint32_t>{3}, one);
  tr.set_route(c, 1, std::vector<std::uint32_t>{0}, one);  // c: layer 0 missing
  LruSim p(s, config_slots(s, 8), SimLoader(s, LinkModel{}));
  const ReplayReport r = replay(p, tr, zero_compute());
  CHECK(r.records_missing == 2);
  CHECK(r.layer_calls_unrouted == 1);  // token c, layer 0
  CHECK(r.pipeline.layer_calls == 3);
  CHECK(r.pipeline.demands == 4);
}

TEST_CASE("replay: the shared-format snippet replays, LRU count matches brute force",
          "[sim][replay][mixtral]") {
  const RoutingTrace tr =
      read_mixtral_raw_jsonl(std::string(MOEKIT_TEST_DATA_DIR) + "/mixtral_raw_snippet.jsonl");
  const ModelShape s = shape_for(tr.dims());
  for (std::size_t slots : {2u, 4u, 8u}) {
    LruSim p(s, config_slots(s, slots), SimLoader(s, LinkModel{}));
    const ReplayReport r = replay(p, tr, zero_compute());
    CHECK(r.misses() == brute_misses(brute_calls(tr), slots, BruteLru{}));
  }
}

TEST_CASE("replay rejects a trace that does not fit the model", "[sim][replay]") {
  const TraceDims d{.n_layers = 2, .n_experts = 4, .top_k = 1};
  const RoutingTrace tr = random_trace(1, d, 1, 0, 3);
  ModelShape s = shape_for(d);
  s.n_experts = 8;
  LruSim p(s, config_slots(s, 4), SimLoader(s, LinkModel{}));
  CHECK_THROWS_AS(replay(p, tr, zero_compute()), Error);
  ComputeModel bad;
  bad.layer_s = -1;
  const ModelShape s2 = shape_for(d);
  LruSim p2(s2, config_slots(s2, 4), SimLoader(s2, LinkModel{}));
  CHECK_THROWS_AS(replay(p2, tr, bad), Error);
}

namespace {
/// A MoBiLE-shaped token policy double: the first pass of each decode token uses top-1 and is
/// rejected; the recomputation uses the full top-k and is accepted.
struct NarrowThenFallback {
  bool recomputing = false;
  Phase phase = Phase::decode;
  std::uint32_t active_top_k(const LayerContext& ctx, std::uint32_t k) {
    phase = ctx.phase;
    return ctx.phase == Phase::decode && !recomputing ? 1 : k;
  }
  TokenVerdict end_token(std::span<const float>) {
    if (phase == Phase::prefill || recomputing) {
      recomputing = false;
      return TokenVerdict::accept;
    }
    recomputing = true;
    return TokenVerdict::fallback;
  }
};
}  // namespace

TEST_CASE("replay: a narrowing token policy sees top-1 first, fallbacks are recomputed",
          "[sim][replay][token-policy]") {
  const TraceDims d{.n_layers = 2, .n_experts = 8, .top_k = 2};
  const ModelShape s = shape_for(d);
  const RoutingTrace tr = random_trace(9, d, 1, 3, 5);
  using P = OffloadPipeline<UniformScorer, NoPredictor, LruPolicy, SimLoader, OnDemandScheduler,
                            NarrowThenFallback>;
  P p(s, config_slots(s, s.expert_count()), SimLoader(s, LinkModel{}));
  const ReplayReport r = replay(p, tr, zero_compute());
  CHECK(r.forwards == 1 + 2 * 5);
  CHECK(r.pipeline.fallbacks == 5);
  CHECK(r.pipeline.tokens_accepted == 1 + 5);
  CHECK(r.decode_tokens == 5);
  // demands: the prefill's two layer calls, then per decode token and layer 1 (little pass) +
  // 2 (recomputation with the full top-2)
  const auto calls = brute_calls(tr);
  CHECK(r.pipeline.demands == calls[0].size() + calls[1].size() + 5 * 2 * (1 + 2));
}

TEST_CASE("report writers: CSV quoting, JSON fields", "[sim][report]") {
  CsvTable csv({"a", "b"});
  csv.add_row({"x,y", "say \"hi\""});
  CHECK(csv.text() == "a,b\n\"x,y\",\"say \"\"hi\"\"\"\n");
  CHECK_THROWS_AS(csv.add_row({"only one"}), Error);
  CHECK(CsvTable::num(0.6) == "0.6");

  const TraceDims d{.n_layers = 2, .n_experts = 4, .top_k = 1};
  const ModelShape s = shape_for(d);
  LruSim p(s, config_slots(s, 2), SimLoader(s, LinkModel{}));
  const ReplayReport r = replay(p, random_trace(2, d, 1, 0, 6), zero_compute());
  const auto j = report_json(r);
  CHECK(j["misses"].get<std::uint64_t>() == r.misses());
  CHECK(j["prediction"].size() == 3);
}

TEST_CASE("replay: Fiddler's CPU experts run beside the device side (max, not sum)",
          "[sim][replay][time][fiddler]") {
  // One decode token over 3 layers, experts {0, 1} each. Expert 0 of every layer is placed up
  // front; expert 1 misses and FiddlerScheduler runs it on the CPU (copy 100 s ≫ CPU 1 s). Per
  // layer the device runs expert 0 for `dev` s while the CPU runs expert 1 for `cpu` s: the layer
  // takes max(dev, cpu) (Fiddler §3.2: CPU and GPU work in parallel), not dev + cpu.
  const TraceDims d{.n_layers = 3, .n_experts = 4, .top_k = 2};
  const ModelShape s = shape_for(d);
  RoutingTrace tr(d, "fiddler");
  tr.begin_sequence("s");
  const std::size_t g = tr.append_token(Phase::decode);
  const std::vector<std::uint32_t> ids{0, 1};
  const std::vector<float> w{0.5f, 0.5f};
  for (std::uint32_t l = 0; l < 3; ++l) tr.set_route(g, l, ids, w);
  for (auto [dev, cpu] : {std::pair{1.0, 1.0}, std::pair{1.0, 3.0}, std::pair{2.0, 0.5}}) {
    INFO("device " << dev << " s, CPU " << cpu << " s");
    ComputeModel cm;
    cm.device_expert_s[std::size_t(Precision::f16)] = dev;
    cm.cpu_expert_s[std::size_t(Precision::f16)] = cpu;
    OffloadPipeline<UniformScorer, NoPredictor, LruPolicy, SimLoader, FiddlerScheduler> p(
        s, config_slots(s, 3), SimLoader(s, LinkModel{1e18, 0.0}), UniformScorer{}, NoPredictor{},
        LruPolicy{},
        FiddlerScheduler(
            {.cpu_seconds_per_token = 1e-9, .copy_seconds = 100, .cpu_seconds_per_expert = 1}));
    for (std::uint32_t l = 0; l < 3; ++l) REQUIRE(p.preload({l, 0}, Precision::f16));
    p.finish_loads();
    const ReplayReport r = replay(p, tr, cm);
    REQUIRE(r.pipeline.host_cpu_runs == 3);
    REQUIRE(r.pipeline.hits == 3);
    CHECK(r.total_s == Approx(3 * std::max(dev, cpu)).epsilon(1e-9));
    CHECK(r.compute_s == Approx(3 * std::max(dev, cpu)).epsilon(1e-9));
  }
}

TEST_CASE("replay: experts_after_all_loads starts a layer's experts once all its loads are in",
          "[sim][replay][time]") {
  // The top-2 case above with moe-run's engine: per layer both loads, then both computes.
  const TraceDims d{.n_layers = 3, .n_experts = 8, .top_k = 2};
  const ModelShape s = shape_for(d);
  RoutingTrace tr(d, "disjoint");
  tr.begin_sequence("s");
  const std::size_t g = tr.append_token(Phase::decode);
  const std::vector<float> w{0.75f, 0.25f};
  for (std::uint32_t l = 0; l < 3; ++l) {
    const std::vector<std::uint32_t> ids{2 * l, 2 * l + 1};
    tr.set_route(g, l, ids, w);
  }
  const double bw = 1073741824.0;
  const double load = double(s.expert_bytes(Precision::f16)) / bw;
  ComputeModel cm;
  cm.device_expert_s[std::size_t(Precision::f16)] = load / 4;
  cm.experts_after_all_loads = true;
  LruSim p(s, config_slots(s, 2), SimLoader(s, LinkModel{bw, 0.0}));
  const ReplayReport r = replay(p, tr, cm);
  CHECK(r.total_s == Approx(3 * (2 * load + 2 * load / 4)).epsilon(1e-12));
  CHECK(r.stall_s == Approx(3 * 2 * load).epsilon(1e-12));
  // Two readers: the two loads share the link and end together, at the same 2 loads' time.
  LruSim p2(s, config_slots(s, 2), SimLoader(s, LinkModel{bw, 0.0, 2}));
  CHECK(replay(p2, tr, cm).total_s == Approx(3 * (2 * load + 2 * load / 4)).epsilon(1e-12));
}

TEST_CASE("replay: on a CPU-only machine Fiddler's CPU experts run in line, after their reads",
          "[sim][replay][time][fiddler]") {
  // The Fiddler case above with the host CPU as the device and experts outside host memory:
  // per layer, expert 1's read (over the link, `load` s) and then both computes, one after the
  // other: load + dev + cpu (not max(dev, cpu)).
  const TraceDims d{.n_layers = 3, .n_experts = 4, .top_k = 2};
  const ModelShape s = shape_for(d);
  RoutingTrace tr(d, "fiddler");
  tr.begin_sequence("s");
  const std::size_t g = tr.append_token(Phase::decode);
  const std::vector<std::uint32_t> ids{0, 1};
  const std::vector<float> w{0.5f, 0.5f};
  for (std::uint32_t l = 0; l < 3; ++l) tr.set_route(g, l, ids, w);
  const double bw = 1073741824.0;
  const double load = double(s.expert_bytes(Precision::f16)) / bw;
  const double dev = 2 * load, cpu = 3 * load;
  for (bool after_all : {false, true}) {
    INFO("experts_after_all_loads " << after_all);
    ComputeModel cm;
    cm.device_expert_s[std::size_t(Precision::f16)] = dev;
    cm.cpu_expert_s[std::size_t(Precision::f16)] = cpu;
    cm.cpu_beside_device = false;
    cm.cpu_reads_over_link = true;
    cm.experts_after_all_loads = after_all;
    OffloadPipeline<UniformScorer, NoPredictor, LruPolicy, SimLoader, FiddlerScheduler> p(
        s, config_slots(s, 3), SimLoader(s, LinkModel{bw, 0.0}), UniformScorer{}, NoPredictor{},
        LruPolicy{},
        FiddlerScheduler(
            {.cpu_seconds_per_token = 1e-9, .copy_seconds = 100, .cpu_seconds_per_expert = 1}));
    for (std::uint32_t l = 0; l < 3; ++l) REQUIRE(p.preload({l, 0}, Precision::f16));
    p.finish_loads();
    const ReplayReport r = replay(p, tr, cm);
    REQUIRE(r.pipeline.host_cpu_runs == 3);
    CHECK(r.loader.host_reads == 3);
    // Without waiting for all loads, expert 0 (resident) computes during expert 1's read.
    const double layer = after_all ? load + dev + cpu : std::max(load, dev) + cpu;
    CHECK(r.total_s == Approx(3 * layer).epsilon(1e-9));
    CHECK(r.compute_s == Approx(3 * (dev + cpu)).epsilon(1e-9));
  }
}
