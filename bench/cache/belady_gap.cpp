// The LRU → Belady gap on the real Mixtral-8x7B routing traces (issue 25), in one run: how far each
// source of routing-only information gets, fitted on one trace and scored on the other, and what
// the misses that remain are.
//
//  0. The reference numbers (LRU, ExpectedNextUse, Belady) in trace_replay.cpp's unit
//     replay, and ExpectedNextUse with (gamma, prior) searched in-sample vs on the other trace.
//  1. Ablation (sim::replay, the pipeline moe-sim runs; every demand at f16, 64/128/192 of 256
//     slots): per row demand misses, GB moved over the link (prefetches included), wasted GB
//     (prefetched, evicted unused) and decode tokens/s on the rtx4090-pcie4 and jetson-orin-ssd
//     hardware models. Rows add one information source at a time: recency (LRU), layer position
//     (FLD), frequency (LFU), frequency + layer position (ExpectedNextUse without transitions),
//     + per-layer transitions (ExpectedNextUse), its (gamma, prior) searched on the *other* trace
//     ("fit"), + routing-history prefetch (EdgeMoE's activation paths, profiled on the other
//     trace), and Belady's offline optimum. The gap closed is (LRU − row) / (LRU − Belady).
//     sim::replay (the pipeline) looks up and pins a layer call's resident experts before it loads
//     the call's misses; trace_replay's loop serves the demands in order, so an insertion may evict
//     an expert the same call demands next: the miss counts differ somewhat (most at 64 slots),
//     section 0 has the issue's.
//  2. Predictability of each source of routing history: how often the 2 experts an online
//     estimate ranks first at a decode (token, layer) are the ones chosen (top-2 precision),
//     against uniform (k/E) and an oracle (1).
//  3. The misses of ExpectedNextUse at 128 slots, split: first touches (never demanded before in
//     the sequence), misses Belady has too, and the rest (avoidable with the future known) by
//     reuse distance (tokens since the expert's last use at its layer) and by whether the policy's
//     own estimate of p at that visit was below uniform (a surprise) or not.
//
// Fitting: the grid runs on the fitting trace only (GSM8K fits HumanEval's rows and HumanEval
// decode fits GSM8K's), then the chosen values score the other trace once.
//
// Usage: moekit_bench_belady_gap [--data DIR] [--hardware-file F]
//   --data: the shared data (default MOEKIT_SOURCE_DIR/../shared/data)
//   --hardware-file: a third hardware model, this machine's (written by moe-calibrate)

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moekit/cache/belady.hpp"
#include "moekit/cache/expected_next_use.hpp"
#include "moekit/cache/expert_cache.hpp"
#include "moekit/cache/fld.hpp"
#include "moekit/cache/lfu.hpp"
#include "moekit/cache/lru.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/activation_path.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/presets/nextuse_fit.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/uniform.hpp"
#include "moekit/sim/hardware.hpp"
#include "moekit/sim/replay.hpp"
#include "moekit/sim/sim_loader.hpp"
#include "moekit/sim/trace_jsonl.hpp"
#include "moekit/tools/activation_profile.hpp"

using namespace moekit;

namespace {

const ModelShape shape = mixtral_8x7b;
constexpr std::size_t slot_counts[] = {64, 128, 192};

struct Trace {
  std::string name;
  sim::RoutingTrace trace;
  std::size_t fit = 0;  ///< index of the trace its parameters are fitted on
};

// ---- fast replay (the unit mode of trace_replay.cpp): fitting and the miss breakdown ------------

/// One layer call of a forward: the demanded experts in order, and the forward's token count.
struct Call {
  std::uint32_t layer = 0, n_tokens = 1;
  std::uint64_t seq = 0, token = 0;  ///< sequence index, token (forward) index in the sequence
  bool first_of_seq = false, first_of_forward = false;
  std::vector<std::uint32_t> experts;
};

/// The trace's layer calls in replay order (prefill forwards: the union of their tokens' experts,
/// as sim::replay and trace_replay.cpp route them).
std::vector<Call> calls_of(const sim::RoutingTrace& t) {
  std::vector<Call> out;
  const std::uint32_t L = t.dims().n_layers;
  for (std::size_t s = 0; s < t.sequence_count(); ++s) {
    const std::size_t n_pre = t.prefill_length(s), len = t.sequence_length(s);
    std::uint64_t fwd = 0;
    const auto forward = [&](std::size_t first, std::size_t end) {
      for (std::uint32_t l = 0; l < L; ++l) {
        Call c;
        c.layer = l;
        c.n_tokens = static_cast<std::uint32_t>(end - first);
        c.seq = s;
        c.token = fwd;
        c.first_of_seq = fwd == 0 && l == 0;
        c.first_of_forward = l == 0;
        std::vector<bool> seen(shape.n_experts, false);
        for (std::size_t i = first; i < end; ++i) {
          const std::size_t g = t.global_token(s, i);
          if (!t.valid(g, l)) continue;
          for (auto e : t.experts(g, l)) seen[e] = true;
          if (end - first == 1)  // decode: the router's order
            for (auto e : t.experts(g, l))
              if (std::find(c.experts.begin(), c.experts.end(), e) == c.experts.end())
                c.experts.push_back(e);
        }
        if (end - first > 1)
          for (std::uint32_t e = 0; e < shape.n_experts; ++e)
            if (seen[e]) c.experts.push_back(e);
        out.push_back(std::move(c));
      }
      ++fwd;
    };
    if (n_pre > 0) forward(0, n_pre);
    for (std::size_t i = n_pre; i < len; ++i) forward(i, i + 1);
  }
  return out;
}

/// Replays `calls` through ExpertCache<P> at `slots` f16 slots; `on_demand(index, hit, cache)` is
/// called at every demand before the cache is touched.
template <class P, class F>
std::uint64_t replay_calls(const std::vector<Call>& calls, std::size_t slots, P policy,
                           F&& on_demand) {
  ExpertCache<P> cache(shape, slots * shape.expert_bytes(Precision::f16), Precision::f16,
                       std::move(policy));
  std::uint64_t misses = 0, index = 0;
  std::vector<ExpertKey> pinned;
  for (const Call& c : calls) {
    if (c.first_of_seq) cache.begin_sequence();
    if (c.first_of_forward) cache.begin_token(c.n_tokens);
    for (std::uint32_t e : c.experts) {
      const ExpertKey k{c.layer, e};
      const bool hit = cache.resident_at(k, Precision::f16);
      on_demand(index++, hit, cache);
      if (hit) {
        cache.on_hit(k, cache.access(Precision::f16, c.layer, c.n_tokens));
      } else {
        ++misses;
        cache.count_miss();
        if (!cache.insert(k, cache.access(Precision::f16, c.layer, c.n_tokens)).ok()) continue;
      }
      cache.pin_hard(k);
      pinned.push_back(k);
    }
    for (ExpertKey k : pinned) cache.unpin_hard(k);
    pinned.clear();
  }
  return misses;
}
template <class P>
std::uint64_t replay_calls(const std::vector<Call>& calls, std::size_t slots, P policy) {
  return replay_calls(calls, slots, std::move(policy), [](std::uint64_t, bool, const auto&) {});
}

BeladyPolicy belady_of(const std::vector<Call>& calls) {
  BeladyPolicy::Config c;
  for (const Call& call : calls)
    for (std::uint32_t e : call.experts) c.future.push_back({call.layer, e});
  return BeladyPolicy(std::move(c));
}

/// ExpectedNextUse's (gamma, prior) with the fewest misses on `calls` at `slots` (grid search).
ExpectedNextUsePolicy::Config fit_enu(const std::vector<Call>& calls, std::size_t slots) {
  ExpectedNextUsePolicy::Config best{};
  std::uint64_t best_m = replay_calls(calls, slots, ExpectedNextUsePolicy(best));
  for (double gamma : {0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 1.0})
    for (double prior : {0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0}) {
      const ExpectedNextUsePolicy::Config c{.gamma = gamma, .prior = prior};
      const std::uint64_t m = replay_calls(calls, slots, ExpectedNextUsePolicy(c));
      if (m < best_m) best_m = m, best = c;
    }
  return best;
}

// ---- the ablation table, through sim::replay --------------------------------------------------

struct Hardware {
  std::string name;
  sim::LinkModel link;
  sim::ComputeModel compute;
};

struct Cell {
  std::uint64_t demands = 0, misses = 0;
  double gb_moved = 0, gb_wasted = 0;
  std::vector<double> tok_s;  ///< decode tokens/s per hardware model
};

template <class Make>
Cell run_cell(const sim::RoutingTrace& tr, std::size_t slots, const std::vector<Hardware>& hw,
              Make make) {
  Cell c;
  c.tok_s.resize(hw.size());
  for (std::size_t h = 0; h < hw.size(); ++h) {
    PipelineConfig pc;
    pc.base_precision = Precision::f16;
    pc.expert_budget_bytes = slots * shape.expert_bytes(Precision::f16);
    auto p = make(pc, sim::SimLoader(shape, hw[h].link));
    const sim::ReplayReport r = sim::replay(*p, tr, hw[h].compute);
    c.demands = r.pipeline.demands;
    c.misses = r.misses();
    c.gb_moved = double(r.bytes_moved()) / 1e9;
    c.gb_wasted = double(r.wasted_bytes()) / 1e9;
    c.tok_s[h] = r.decode_tokens_per_s();
  }
  return c;
}

/// A pipeline of UniformScorer(f16) + `Pred` + `Pol`, on demand.
template <class Pred, class Pol>
auto pipeline(const PipelineConfig& pc, sim::SimLoader loader, Pred pred, Pol pol) {
  return std::make_unique<
      OffloadPipeline<UniformScorer, Pred, Pol, sim::SimLoader, OnDemandScheduler>>(
      shape, pc, std::move(loader), UniformScorer({.precision = Precision::f16}), std::move(pred),
      std::move(pol));
}

struct Row {
  std::string name;
  /// (trace, fitting trace, slots) → a pipeline factory run by run_cell.
  std::function<Cell(const Trace&, const Trace&, std::size_t, const std::vector<Hardware>&)> run;
};

template <class Pol>
Row policy_row(std::string name, Pol pol) {
  return {std::move(name), [pol](const Trace& t, const Trace&, std::size_t s, const auto& hw) {
            return run_cell(t.trace, s, hw, [&](const PipelineConfig& pc, sim::SimLoader l) {
              return pipeline(pc, std::move(l), NoPredictor{}, pol);
            });
          }};
}

/// ExpectedNextUse fitted as above + EdgeMoE's activation-path prefetch of up to `preload` experts
/// of the next layer whose profiled probability is at least `min_prob`, profiled on `fit`.
Row activation_path_row(std::uint32_t preload, float min_prob = 0.0f) {
  std::string name = "+ activation-path prefetch " + std::to_string(preload);
  if (min_prob > 0) name += ", p >= " + std::to_string(min_prob).substr(0, 3);
  return {name + " (fit)",
          [preload, min_prob](const Trace& t, const Trace& fit, std::size_t s, const auto& hw) {
            auto profile = std::make_shared<const ActivationPathProfile>(
                tools::build_activation_profile(fit.trace));
            const auto enu = fit_enu(calls_of(fit.trace), s);
            return run_cell(t.trace, s, hw, [&](const PipelineConfig& pc, sim::SimLoader l) {
              return pipeline(pc, std::move(l),
                              ActivationPathPredictor({.profile = profile,
                                                       .max_preload = preload,
                                                       .min_prob = min_prob,
                                                       .precision = Precision::f16}),
                              ExpectedNextUsePolicy(enu));
            });
          }};
}

std::vector<Row> rows() {
  std::vector<Row> r;
  r.push_back(policy_row("lru: recency", LruPolicy{}));
  r.push_back(policy_row("fld: layer position", FldPolicy{}));
  r.push_back(policy_row("lfu model: frequency", LfuPolicy({CountScope::model})));
  // A prior far above any visit count: p is the decayed frequency alone (no transitions).
  r.push_back(policy_row("enu: frequency + position", ExpectedNextUsePolicy({.prior = 1e12})));
  r.push_back(policy_row("enu: + transitions (default)", ExpectedNextUsePolicy{}));
  r.push_back({"enu: (gamma, prior) fit",
               [](const Trace& t, const Trace& fit, std::size_t s, const auto& hw) {
                 const auto cfg = fit_enu(calls_of(fit.trace), s);
                 return run_cell(t.trace, s, hw, [&](const PipelineConfig& pc, sim::SimLoader l) {
                   return pipeline(pc, std::move(l), NoPredictor{}, ExpectedNextUsePolicy(cfg));
                 });
               }});
  // The nextuse-fit preset's constants: fitted on GSM8K at 128 slots (in-sample there only).
  r.push_back(policy_row("nextuse-fit (0.5, 8: gsm8k@128)",
                         ExpectedNextUsePolicy(presets::NextUseFitSpec::fitted)));
  r.push_back(activation_path_row(1, 0.5f));
  r.push_back(activation_path_row(1));
  r.push_back(activation_path_row(2));
  r.push_back({"belady (offline)", [](const Trace& t, const Trace&, std::size_t s, const auto& hw) {
                 return run_cell(t.trace, s, hw, [&](const PipelineConfig& pc, sim::SimLoader l) {
                   using Belady = sim::CallOrderedPolicy<BeladyPolicy>;
                   return pipeline(pc, std::move(l), NoPredictor{},
                                   Belady(sim::demand_sequence(t.trace)));
                 });
               }});
  return r;
}

void print_ablation(const std::vector<Trace>& traces, const std::vector<Hardware>& hw) {
  const std::vector<Row> rs = rows();
  std::printf(
      "\n=== 1. ablation: every demand f16; gap closed = (LRU - row) / (LRU - Belady) ===\n");
  for (const Trace& t : traces) {
    const Trace& fit = traces[t.fit];
    std::printf("\n-- %s (fit rows: parameters from %s) --\n", t.name.c_str(), fit.name.c_str());
    std::printf("%-44s %5s %7s %7s %6s %8s %8s", "row", "slots", "miss%", "gap", "misses",
                "GB moved", "GB waste");
    for (const Hardware& h : hw) std::printf(" %16s", ("tok/s " + h.name).c_str());
    std::printf("\n");
    for (std::size_t s : slot_counts) {
      const Cell lru = rs.front().run(t, fit, s, hw), bel = rs.back().run(t, fit, s, hw);
      for (const Row& r : rs) {
        const Cell c = r.run(t, fit, s, hw);
        const double gap =
            double(lru.misses - std::min(lru.misses, c.misses)) / double(lru.misses - bel.misses);
        std::printf("%-44s %5zu %6.1f%% %6.0f%% %6llu %8.1f %8.1f", r.name.c_str(), s,
                    100.0 * double(c.misses) / double(c.demands),
                    c.misses > lru.misses
                        ? -100.0 * double(c.misses - lru.misses) / double(lru.misses - bel.misses)
                        : 100.0 * gap,
                    static_cast<unsigned long long>(c.misses), c.gb_moved, c.gb_wasted);
        for (double v : c.tok_s) std::printf(" %16.4f", v);
        std::printf("\n");
      }
    }
  }
}

// ---- 0. the reference numbers, in trace_replay.cpp's replay ----------------------------

/// Miss ratios in the unit-mode replay of trace_replay.cpp (the numbers), with
/// ExpectedNextUse fitted in-sample (on the scored trace itself) and held out (on the other).
void print_reference(const std::vector<Trace>& traces) {
  std::printf(
      "=== 0. miss ratio in trace_replay's unit replay (the issue's reference numbers) ===\n");
  std::printf("%-26s %5s %7s %7s %11s %9s %9s %7s   %s\n", "trace", "slots", "lru", "enu",
              "nextuse-fit", "enu fit-in", "enu held", "belady",
              "fitted (gamma, prior): in-sample | held out");
  for (const Trace& t : traces) {
    const std::vector<Call> calls = calls_of(t.trace), fit = calls_of(traces[t.fit].trace);
    std::uint64_t n = 0;
    for (const Call& c : calls) n += c.experts.size();
    for (std::size_t s : slot_counts) {
      const auto in = fit_enu(calls, s), out = fit_enu(fit, s);
      const auto pct = [&](std::uint64_t m) { return 100.0 * double(m) / double(n); };
      std::printf(
          "%-26s %5zu %6.1f%% %6.1f%% %10.1f%% %8.1f%% %8.1f%% %6.1f%%   (%.2f, %g) | "
          "(%.2f, %g)\n",
          t.name.c_str(), s, pct(replay_calls(calls, s, LruPolicy{})),
          pct(replay_calls(calls, s, ExpectedNextUsePolicy{})),
          pct(replay_calls(calls, s, ExpectedNextUsePolicy(presets::NextUseFitSpec::fitted))),
          pct(replay_calls(calls, s, ExpectedNextUsePolicy(in))),
          pct(replay_calls(calls, s, ExpectedNextUsePolicy(out))),
          pct(replay_calls(calls, s, belady_of(calls))), in.gamma, in.prior, out.gamma, out.prior);
    }
  }
}

// ---- 2. predictability and 3. the remaining misses ---------------------------------------------

/// Online per-layer transition counts with a decayed-frequency backoff (ExpectedNextUse's
/// estimate, for any source set): p(e) = (Σ_{a ∈ src} T[l][a][e] + prior·f(e)) / (Σ N[l][a] +
/// prior).
struct TransitionEstimate {
  double gamma = 0.8, prior = 4.0;
  std::vector<double> trans = std::vector<double>(shape.expert_count() * shape.n_experts, 0.0);
  std::vector<double> from = std::vector<double>(shape.expert_count(), 0.0);
  std::vector<double> count = std::vector<double>(shape.expert_count(), 0.0);
  std::vector<double> visits = std::vector<double>(shape.n_layers, 0.0);

  [[nodiscard]] double p(std::uint32_t l, std::uint32_t e,
                         std::span<const std::uint32_t> src) const {
    const std::size_t b = std::size_t{l} * shape.n_experts;
    double num = prior * (count[b + e] + double(shape.top_k) / shape.n_experts) / (visits[l] + 1);
    double den = prior;
    for (std::uint32_t a : src) num += trans[(b + a) * shape.n_experts + e], den += from[b + a];
    return num / den;
  }
  void learn(std::uint32_t l, std::span<const std::uint32_t> src,
             std::span<const std::uint32_t> chosen) {
    const std::size_t b = std::size_t{l} * shape.n_experts;
    for (std::uint32_t a : src) {
      from[b + a] += 1;
      for (std::uint32_t e : chosen) trans[(b + a) * shape.n_experts + e] += 1;
    }
    visits[l] = gamma * visits[l] + 1;
    for (std::uint32_t e = 0; e < shape.n_experts; ++e) count[b + e] *= gamma;
    for (std::uint32_t e : chosen) count[b + e] += 1;
  }
};

/// Share of the chosen experts among the 2 highest of `p` [expert].
std::uint64_t in_top2(const std::vector<double>& p, std::span<const std::uint32_t> chosen) {
  std::vector<std::uint32_t> order(p.size());
  for (std::uint32_t e = 0; e < order.size(); ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return p[a] > p[b]; });
  std::uint64_t n = 0;
  for (std::uint32_t e : chosen) n += e == order[0] || e == order[1];
  return n;
}

/// Top-2 precision, at each decode (token, layer), of online estimates from each source of routing
/// history: the layer's own frequency, its previous token (same-layer transitions), the previous
/// layer of this token (cross-layer transitions), and both (mean of the two estimates).
void print_predictability(const std::vector<Trace>& traces) {
  std::printf(
      "\n=== 2. predictability: share of chosen experts among an online estimate's 2 highest "
      "(uniform %.2f, oracle 1.00) ===\n",
      double(shape.top_k) / double(shape.n_experts));
  std::printf("%-26s %9s %10s %11s %11s %9s\n", "trace", "frequency", "prev token", "prev layer",
              "both", "demands");
  for (const Trace& t : traces) {
    const sim::RoutingTrace& tr = t.trace;
    std::array<std::uint64_t, 4> hit{};
    std::uint64_t n = 0;
    for (std::size_t s = 0; s < tr.sequence_count(); ++s) {
      TransitionEstimate same, cross;
      std::vector<std::vector<std::uint32_t>> prev_token(shape.n_layers);
      for (std::size_t i = tr.prefill_length(s); i < tr.sequence_length(s); ++i) {
        const std::size_t g = tr.global_token(s, i);
        std::vector<std::uint32_t> prev_layer;
        for (std::uint32_t l = 0; l < shape.n_layers; ++l) {
          if (!tr.valid(g, l)) {
            prev_layer.clear();
            continue;
          }
          const auto ch = tr.experts(g, l);
          std::array<std::vector<double>, 4> p;
          for (std::uint32_t e = 0; e < shape.n_experts; ++e) {
            p[0].push_back(same.p(l, e, {}));
            p[1].push_back(same.p(l, e, prev_token[l]));
            p[2].push_back(cross.p(l, e, prev_layer));
            p[3].push_back(0.5 * (p[1].back() + p[2].back()));
          }
          for (std::size_t k = 0; k < 4; ++k) hit[k] += in_top2(p[k], ch);
          n += ch.size();
          same.learn(l, prev_token[l], ch);
          cross.learn(l, prev_layer, ch);
          prev_token[l].assign(ch.begin(), ch.end());
          prev_layer.assign(ch.begin(), ch.end());
        }
      }
    }
    const auto r = [&](std::size_t k) { return double(hit[k]) / double(n); };
    std::printf("%-26s %9.3f %10.3f %11.3f %11.3f %9llu\n", t.name.c_str(), r(0), r(1), r(2), r(3),
                static_cast<unsigned long long>(n));
  }
  std::printf(
      "(decode traces: after a dropped record a layer's tokens shift by one, so 'prev layer' "
      "is only approximately this token's there; the prefill+decode trace is aligned)\n");
}

void print_breakdown(const std::vector<Trace>& traces) {
  std::printf(
      "\n=== 3. misses at 128 slots by kind (share of demands): ExpectedNextUse default, "
      "then nextuse-fit's (0.5, 8) ===\n");
  std::printf(
      "%-26s %7s %7s %7s | Belady hits these; by reuse distance (tokens): %6s %6s %6s "
      "%6s | of them p<k/E\n",
      "trace", "all", "first", "belady", "1", "2-4", "5-16", ">16");
  const double uniform = double(shape.top_k) / double(shape.n_experts);
  for (const ExpectedNextUsePolicy::Config cfg :
       {ExpectedNextUsePolicy::Config{}, presets::NextUseFitSpec::fitted})
    for (const Trace& t : traces) {
      const std::vector<Call> calls = calls_of(t.trace);
      std::vector<bool> belady_hit;
      replay_calls(calls, 128, belady_of(calls),
                   [&](std::uint64_t, bool hit, const auto&) { belady_hit.push_back(hit); });
      // Per demand: its call, to know the token of the last use of the expert at its layer.
      std::vector<std::int64_t> last_token(shape.expert_count(), -1);
      std::uint64_t n = 0, miss = 0, first = 0, both = 0, surprise = 0;
      std::array<std::uint64_t, 4> by_distance{};
      std::size_t ci = 0, in_call = 0;
      std::uint64_t seq = 0;
      replay_calls(calls, 128, ExpectedNextUsePolicy(cfg),
                   [&](std::uint64_t i, bool hit, const auto& cache) {
                     while (in_call == calls[ci].experts.size()) ++ci, in_call = 0;
                     const Call& c = calls[ci];
                     if (c.seq != seq)
                       std::fill(last_token.begin(), last_token.end(), -1), seq = c.seq;
                     const std::uint32_t e = c.experts[in_call++];
                     const std::size_t k = std::size_t{c.layer} * shape.n_experts + e;
                     ++n;
                     if (!hit) {
                       ++miss;
                       if (last_token[k] < 0)
                         ++first;
                       else if (!belady_hit[i])
                         ++both;
                       else {
                         const std::int64_t d = std::int64_t(c.token) - last_token[k];
                         ++by_distance[d <= 1 ? 0 : d <= 4 ? 1 : d <= 16 ? 2 : 3];
                         surprise += cache.policy().probability({c.layer, e}) < uniform;
                       }
                     }
                     last_token[k] = std::int64_t(c.token);
                   });
      const auto pct = [&](std::uint64_t x) { return 100.0 * double(x) / double(n); };
      std::printf(
          "%-26s %6.1f%% %6.1f%% %6.1f%% | %46s %5.1f%% %5.1f%% %5.1f%% %5.1f%% | %5.1f%%\n",
          t.name.c_str(), pct(miss), pct(first), pct(both), "", pct(by_distance[0]),
          pct(by_distance[1]), pct(by_distance[2]), pct(by_distance[3]), pct(surprise));
    }
}

}  // namespace

int main(int argc, char** argv) {
  std::string root = std::string(MOEKIT_SOURCE_DIR) + "/../shared/data", hardware_file;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--data") == 0 && i + 1 < argc)
      root = argv[++i];
    else if (std::strcmp(argv[i], "--hardware-file") == 0 && i + 1 < argc)
      hardware_file = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s [--data DIR] [--hardware-file this_machine.json]   "
                   "(unknown argument '%s')\n",
                   argv[0], argv[i]);
      return 2;
    }
  }
  const std::string dir = root + "/traces/mixtral-8x7b/";
  if (!std::filesystem::exists(dir + "gsm8k-p0-p1.decode.jsonl")) {
    std::printf("SKIPPED: real traces not found under %s (see shared/data/README.md; --data DIR)\n",
                dir.c_str());
    return 0;
  }
  std::vector<Trace> traces;
  traces.push_back(
      {"gsm8k decode", sim::read_mixtral_decode_jsonl(dir + "gsm8k-p0-p1.decode.jsonl"), 1});
  traces.push_back(
      {"humaneval decode", sim::read_mixtral_decode_jsonl(dir + "humaneval-p0.decode.jsonl"), 0});
  traces.push_back({"humaneval prefill+decode",
                    sim::read_mixtral_raw_jsonl(dir + "humaneval-p0.prefill-decode.raw.jsonl"), 0});
  std::vector<sim::HardwareModel> models{sim::rtx4090_pcie4(), sim::jetson_orin_ssd()};
  if (!hardware_file.empty()) models.push_back(sim::read_hardware_json(hardware_file));
  std::vector<Hardware> hw;
  for (const sim::HardwareModel& h : models)
    hw.push_back({h.name, h.link, h.compute_model(shape, sim::mixtral_8x7b_dense())});
  print_reference(traces);
  print_ablation(traces, hw);
  print_predictability(traces);
  print_breakdown(traces);
  return 0;
}
