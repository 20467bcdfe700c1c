// Replays the real Mixtral-8x7B routing traces (../shared/data/traces/mixtral-8x7b/) through
// ExpertCache with every cache policy at 25/50/75% of the 256 experts, and prints per policy the
// miss ratio, HOBBIT's miss penalty and the ratio to the offline reference on the same trace:
//  * unit mode: every demand at f16; reference = Belady (optimal miss count).
//  * hobbit mode: HOBBIT's scorer (T1 = 0.6, T2 = 0.9: top-1 always f16; rank 1 f16 if w0 <= 0.6,
//    q4 if <= 0.9, else skipped); penalty = Σ misses bytes(p)/bytes(f16); reference = the
//    lower penalty of Belady and the cost-aware Belady (offline references, not bounds;
//    belady.hpp).
// Replay mirrors OffloadPipeline: per sequence begin_sequence; per forward begin_token(n); per
// layer the demanded experts are looked up (hit) or inserted (miss) and hard-pinned until the
// layer ends. Prefill forwards (raw trace) demand the union of their tokens' experts per layer.
// Finally it searches HOBBIT's weights on one trace and reports them on the other (held out).
//
// Usage: moekit_bench_trace_replay [--quick]   (data read from MOEKIT_SOURCE_DIR/../shared/data)

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "moekit/cache/arc.hpp"
#include "moekit/cache/belady.hpp"
#include "moekit/cache/edgemoe.hpp"
#include "moekit/cache/expected_next_use.hpp"
#include "moekit/cache/expert_cache.hpp"
#include "moekit/cache/fld.hpp"
#include "moekit/cache/lfu.hpp"
#include "moekit/cache/lhu.hpp"
#include "moekit/cache/lru.hpp"
#include "moekit/cache/multidim.hpp"
#include "moekit/cache/shallow_favoring.hpp"
#include "moekit/cache/static_popularity.hpp"
#include "moekit/sim/trace_jsonl.hpp"

using namespace moekit;

namespace {

const ModelShape shape = mixtral_8x7b;

struct Demand {
  ExpertKey key;
  Precision precision;
  std::uint32_t n_tokens;
};
struct Forward {
  std::uint32_t n_tokens = 1;
  std::vector<std::vector<Demand>> layers;  // [n_layers]
};
struct Sequence {
  std::vector<Forward> forwards;
};
struct Workload {
  std::string name;
  std::vector<Sequence> sequences;
  std::vector<FutureAccess> future;  // every demand in replay order
};

enum class Mode { unit, hobbit };

Precision hobbit_precision(std::size_t rank, double cumulative, Mode mode) {
  if (mode == Mode::unit || rank == 0 || cumulative <= 0.6) return Precision::f16;
  return cumulative <= 0.9 ? Precision::q4 : Precision::skip;
}

Workload build(const sim::RoutingTrace& t, const std::string& name, Mode mode) {
  Workload w{name, {}, {}};
  const std::uint32_t L = t.dims().n_layers;
  for (std::size_t s = 0; s < t.sequence_count(); ++s) {
    Sequence seq;
    const std::size_t n_pre = t.prefill_length(s), len = t.sequence_length(s);
    if (n_pre > 0) {  // one prefill forward: the union of its tokens' experts per layer, at f16
      Forward f{static_cast<std::uint32_t>(n_pre), std::vector<std::vector<Demand>>(L)};
      for (std::uint32_t l = 0; l < L; ++l) {
        std::vector<std::uint32_t> count(shape.n_experts, 0);
        for (std::size_t i = 0; i < n_pre; ++i) {
          const std::size_t g = t.global_token(s, i);
          if (!t.valid(g, l)) continue;
          for (auto e : t.experts(g, l)) ++count[e];
        }
        for (std::uint32_t e = 0; e < shape.n_experts; ++e)
          if (count[e] > 0) f.layers[l].push_back({{l, e}, Precision::f16, count[e]});
      }
      seq.forwards.push_back(std::move(f));
    }
    for (std::size_t i = n_pre; i < len; ++i) {
      const std::size_t g = t.global_token(s, i);
      Forward f{1, std::vector<std::vector<Demand>>(L)};
      for (std::uint32_t l = 0; l < L; ++l) {
        if (!t.valid(g, l)) continue;
        const auto ids = t.experts(g, l);
        const auto ws = t.weights(g, l);
        double cum = 0.0;
        for (std::size_t r = 0; r < ids.size(); ++r) {
          const Precision p = hobbit_precision(r, cum, mode);
          cum += ws[r];
          if (p != Precision::skip) f.layers[l].push_back({{l, ids[r]}, p, 1});
        }
      }
      seq.forwards.push_back(std::move(f));
    }
    w.sequences.push_back(std::move(seq));
  }
  for (const auto& s : w.sequences)
    for (const auto& f : s.forwards)
      for (const auto& layer : f.layers)
        for (const auto& d : layer) w.future.push_back({d.key, d.precision});
  return w;
}

struct Result {
  std::uint64_t demands = 0, misses = 0;
  double penalty = 0.0;
  [[nodiscard]] double miss_ratio() const { return demands ? double(misses) / double(demands) : 0; }
};

template <class P>
Result replay(const Workload& w, std::size_t budget, P policy) {
  ExpertCache<P> cache(shape, budget, Precision::f16, std::move(policy));
  const double full = double(shape.expert_bytes(Precision::f16));
  Result r;
  std::vector<ExpertKey> pinned;
  for (const auto& s : w.sequences) {
    cache.begin_sequence();
    for (const auto& f : s.forwards) {
      cache.begin_token(f.n_tokens);
      for (std::uint32_t l = 0; l < f.layers.size(); ++l) {
        for (const Demand& d : f.layers[l]) {
          ++r.demands;
          if (cache.resident_at(d.key, d.precision)) {
            cache.on_hit(d.key, cache.access(d.precision, l, d.n_tokens));
          } else {
            ++r.misses;
            r.penalty += double(shape.expert_bytes(d.precision)) / full;
            cache.count_miss();
            if (!cache.insert(d.key, cache.access(d.precision, l, d.n_tokens)).ok()) continue;
          }
          cache.pin_hard(d.key);
          pinned.push_back(d.key);
        }
        for (ExpertKey k : pinned) cache.unpin_hard(k);
        pinned.clear();
      }
    }
  }
  return r;
}

std::vector<double> load_npy_f64(const std::string& path, std::size_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || bytes.compare(1, 5, "NUMPY") != 0) return {};
  const std::size_t hlen = std::uint8_t(bytes[8]) | (std::size_t(std::uint8_t(bytes[9])) << 8);
  const std::string header = bytes.substr(10, hlen);
  if (header.find("'<f8'") == std::string::npos || header.find("False") == std::string::npos)
    return {};
  if (bytes.size() < 10 + hlen + n * 8) return {};
  std::vector<double> v(n);
  std::memcpy(v.data(), bytes.data() + 10 + hlen, n * 8);
  return v;
}

struct Row {
  std::string name;
  std::function<Result(const Workload&, std::size_t)> run;
};

std::vector<Row> rows(const std::vector<double>& profile, Mode mode) {
  std::vector<Row> out;
  auto add = [&](std::string name, auto make) {
    out.push_back({std::move(name),
                   [make](const Workload& w, std::size_t b) { return replay(w, b, make(w)); }});
  };
  const double high_fraction = mode == Mode::unit ? 1.0 : 0.5;  // unit mode has no low copies
  add("lru (global)", [](const Workload&) { return LruPolicy{}; });
  add("lfu seq", [](const Workload&) { return LfuPolicy({CountScope::sequence}); });
  add("lfu model", [](const Workload&) { return LfuPolicy({CountScope::model}); });
  add("lhu seq", [](const Workload&) { return LhuPolicy{}; });
  add("fld", [](const Workload&) { return FldPolicy{}; });
  add("hobbit multidim .25x4",
      [=](const Workload&) { return MultiDimPolicy({.high_slot_fraction = high_fraction}); });
  add("arc per layer, uniform", [](const Workload&) { return ArcPolicy{}; });
  add("fate shallow(3)+arc", [](const Workload&) { return ShallowFavoringArcPolicy({3}); });
  add("edgemoe forward", [](const Workload&) { return EdgeMoePolicy{}; });
  add("edgemoe as printed",
      [](const Workload&) { return EdgeMoePolicy({.distance = EdgeMoeDistance::as_printed}); });
  if (!profile.empty()) {
    add("edgemoe fwd + prior",
        [=](const Workload&) { return EdgeMoePolicy({.prior_counts = profile}); });
    add("fiddler static (profile)",
        [=](const Workload&) { return StaticPopularityPolicy({.counts = profile}); });
  }
  // Combinations beyond the papers.
  add("per-layer lru", [](const Workload&) { return ShallowFavoring<LruPolicy>({0}); });
  add("per-layer lfu seq", [](const Workload&) { return ShallowFavoring<LfuPolicy>({0}); });
  add("per-layer lfu model", [](const Workload&) {
    return ShallowFavoring<LfuPolicy>({0}, LfuPolicy({CountScope::model}));
  });
  add("lfu+fld .5/.5", [=](const Workload&) {
    return MultiDimPolicy(
        {.w_lru = 0, .w_lfu = 0.5, .w_lhu = 0, .w_fld = 0.5, .high_slot_fraction = high_fraction});
  });
  add("expected next use (moekit)", [](const Workload&) { return ExpectedNextUsePolicy{}; });
  add("expected next use, g=.9 p=1",
      [](const Workload&) { return ExpectedNextUsePolicy({.gamma = 0.9, .prior = 1.0}); });
  add("expected next use, g=1 p=16",
      [](const Workload&) { return ExpectedNextUsePolicy({.gamma = 1.0, .prior = 16.0}); });
  add("belady (offline)", [](const Workload& w) {
    BeladyPolicy::Config c;
    for (const auto& f : w.future) c.future.push_back(f.key);
    return BeladyPolicy(std::move(c));
  });
  add("cost-aware belady (offline)",
      [](const Workload& w) { return CostAwareBeladyPolicy({.future = w.future}); });
  return out;
}

std::array<double, 4> simplex_point(int a, int b, int c, int steps) {
  return {a / double(steps), b / double(steps), c / double(steps),
          (steps - a - b - c) / double(steps)};
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const std::string root = std::string(MOEKIT_SOURCE_DIR) + "/../shared/data";
  const std::string dir = root + "/traces/mixtral-8x7b/";
  if (!std::filesystem::exists(dir + "gsm8k-p0-p1.decode.jsonl")) {
    std::printf("SKIPPED: real traces not found under %s (see shared/data/README.md)\n",
                dir.c_str());
    return 0;
  }
  const std::vector<double> profile =
      load_npy_f64(root + "/stats/expert_activation_counts.npy", shape.expert_count());
  if (profile.empty())
    std::printf("note: stats/expert_activation_counts.npy missing: profile-based rows skipped\n");

  struct Src {
    std::string name;
    sim::RoutingTrace trace;
  };
  std::vector<Src> traces;
  traces.push_back(
      {"gsm8k decode", sim::read_mixtral_decode_jsonl(dir + "gsm8k-p0-p1.decode.jsonl")});
  traces.push_back(
      {"humaneval decode", sim::read_mixtral_decode_jsonl(dir + "humaneval-p0.decode.jsonl")});
  traces.push_back({"humaneval prefill+decode",
                    sim::read_mixtral_raw_jsonl(dir + "humaneval-p0.prefill-decode.raw.jsonl")});

  const std::size_t full = shape.expert_bytes(Precision::f16);
  const std::size_t slot_counts[] = {64, 128, 192};
  for (Mode mode : {Mode::unit, Mode::hobbit}) {
    const bool unit = mode == Mode::unit;
    std::printf(
        "\n=== %s mode: %s ===\n", unit ? "unit" : "hobbit",
        unit ? "every demand f16; ratio = misses / Belady misses"
             : "T1=0.6/T2=0.9 f16|q4|skip; ratio = penalty / min(Belady, cost-aware) penalty");
    for (const auto& src : traces) {
      const Workload w = build(src.trace, src.name, mode);
      std::printf("\n-- %s: %zu demands --\n", src.name.c_str(), w.future.size());
      std::printf("%-28s", "policy");
      for (auto s : slot_counts) std::printf(" | %3zu/256: miss  penalty  ratio", s);
      std::printf("\n");
      const auto rs = rows(profile, mode);
      // Reference: Belady's misses (unit); the lower penalty of Belady and the cost-aware
      // reference (hobbit: neither is a bound on penalty, the better one is the reference).
      std::vector<Result> reference(3);
      for (std::size_t i = 0; i < 3; ++i) {
        reference[i] = rs[rs.size() - 2].run(w, slot_counts[i] * full);
        if (!unit) {
          const Result c = rs[rs.size() - 1].run(w, slot_counts[i] * full);
          if (c.penalty < reference[i].penalty) reference[i] = c;
        }
      }
      for (const auto& row : rs) {
        std::printf("%-28s", row.name.c_str());
        for (std::size_t i = 0; i < 3; ++i) {
          const Result r = row.run(w, slot_counts[i] * full);
          const double ratio = unit ? double(r.misses) / double(reference[i].misses)
                                    : r.penalty / reference[i].penalty;
          std::printf(" |        %5.1f%%  %7.1f  %5.2f", 100.0 * r.miss_ratio(), r.penalty, ratio);
        }
        std::printf("\n");
      }
    }
  }
  // ---- HOBBIT weights: search the simplex on one trace, report on the other (held out) ----------
  const int steps = quick ? 4 : 10;
  std::printf("\n=== multidim weight search (simplex step 1/%d), calibrate -> evaluate ===\n",
              steps);
  for (Mode mode : {Mode::unit, Mode::hobbit}) {
    const bool unit = mode == Mode::unit;
    const double hf = unit ? 1.0 : 0.5;
    for (int dir = 0; dir < 2; ++dir) {
      const Workload cal =
          build(traces[dir == 0 ? 0 : 1].trace, traces[dir == 0 ? 0 : 1].name, mode);
      const Workload eva =
          build(traces[dir == 0 ? 1 : 0].trace, traces[dir == 0 ? 1 : 0].name, mode);
      for (std::size_t slots : slot_counts) {
        const std::size_t budget = slots * full;
        auto cost = [&](const Workload& w, std::array<double, 4> x) {
          const Result r = replay(w, budget,
                                  MultiDimPolicy({.w_lru = x[0],
                                                  .w_lfu = x[1],
                                                  .w_lhu = x[2],
                                                  .w_fld = x[3],
                                                  .high_slot_fraction = hf}));
          return unit ? double(r.misses) : r.penalty;
        };
        std::array<double, 4> best{};
        double best_c = 1e300;
        for (int a = 0; a <= steps; ++a)
          for (int b = 0; a + b <= steps; ++b)
            for (int c = 0; a + b + c <= steps; ++c) {
              auto x = simplex_point(a, b, c, steps);
              x[3] = std::max(0.0, 1.0 - x[0] - x[1] - x[2]);
              const double v = cost(cal, x);
              if (v < best_c) best_c = v, best = x;
            }
        auto reference = [&](const Workload& w) {
          if (unit) {
            BeladyPolicy::Config c;
            for (const auto& f : w.future) c.future.push_back(f.key);
            return double(replay(w, budget, BeladyPolicy(std::move(c))).misses);
          }
          BeladyPolicy::Config c;
          for (const auto& f : w.future) c.future.push_back(f.key);
          return std::min(replay(w, budget, BeladyPolicy(std::move(c))).penalty,
                          replay(w, budget, CostAwareBeladyPolicy({.future = w.future})).penalty);
        };
        const double eq = cost(eva, {0.25, 0.25, 0.25, 0.25});
        const double tuned = cost(eva, best);
        const double ref = reference(eva);
        std::printf(
            "%s %3zu/256 calibrate %-17s best (lru,lfu,lhu,fld)=(%.1f,%.1f,%.1f,%.1f) "
            "| on %-17s: tuned/ref %.2f, equal-weights/ref %.2f\n",
            unit ? "unit  " : "hobbit", slots, cal.name.c_str(), best[0], best[1], best[2], best[3],
            eva.name.c_str(), tuned / ref, eq / ref);
      }
    }
  }
  return 0;
}
