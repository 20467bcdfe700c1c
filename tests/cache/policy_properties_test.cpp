// One typed property suite run against every cache policy of tests/support/policy_list.hpp,
// through ExpertCache, on random skewed routing streams with mixed precisions and random pins.

#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "moekit/cache/expert_cache.hpp"
#include "support/eviction_observed.hpp"
#include "support/named_component.hpp"
#include "support/policy_list.hpp"

using namespace moekit;
using moekit::test::AllPolicies;

namespace {

constexpr ModelShape shape_a{.n_layers = 4, .n_experts = 8, .top_k = 2, .hidden = 64, .ffn = 128};
constexpr ModelShape shape_b{.n_layers = 3, .n_experts = 16, .top_k = 4, .hidden = 64, .ffn = 96};

/// One layer call of a token: the experts it demands, at which precision.
struct Step {
  std::uint32_t sequence = 0;
  std::uint32_t token = 0;
  std::uint32_t layer = 0;
  std::vector<FutureAccess> demands;
  std::vector<ExpertKey> extra_hard;  ///< residents pinned as if loading for this step
  std::vector<ExpertKey> soft;        ///< predicted for the next layer (soft pins)
};

/// Random routing: per layer a skewed (Zipf-like) preference, k distinct experts per token,
/// f16 at 65% and q4 otherwise, and random pins.
std::vector<Step> random_stream(const ModelShape& s, std::uint32_t seed, std::uint32_t sequences,
                                std::uint32_t tokens) {
  std::mt19937 rng(seed);
  std::vector<Step> out;
  for (std::uint32_t q = 0; q < sequences; ++q) {
    std::vector<std::vector<double>> w(s.n_layers, std::vector<double>(s.n_experts));
    for (auto& layer : w) {
      std::vector<std::uint32_t> perm(s.n_experts);
      for (std::uint32_t e = 0; e < s.n_experts; ++e) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (std::uint32_t r = 0; r < s.n_experts; ++r) layer[perm[r]] = 1.0 / (1.0 + r);
    }
    for (std::uint32_t t = 0; t < tokens; ++t)
      for (std::uint32_t l = 0; l < s.n_layers; ++l) {
        Step st{q, t, l, {}, {}, {}};
        std::vector<double> ww = w[l];
        for (std::uint32_t j = 0; j < s.top_k; ++j) {
          std::discrete_distribution<std::uint32_t> d(ww.begin(), ww.end());
          const std::uint32_t e = d(rng);
          ww[e] = 0.0;
          const Precision p =
              std::bernoulli_distribution(0.65)(rng) ? Precision::f16 : Precision::q4;
          st.demands.push_back({{l, e}, p});
        }
        std::uniform_int_distribution<std::uint32_t> any_l(0, s.n_layers - 1),
            any_e(0, s.n_experts - 1);
        if (std::bernoulli_distribution(0.3)(rng))
          st.extra_hard.push_back({any_l(rng), any_e(rng)});
        const std::uint32_t next = (l + 1) % s.n_layers;
        for (int i = 0; i < 2; ++i)
          if (std::bernoulli_distribution(0.5)(rng)) st.soft.push_back({next, any_e(rng)});
        out.push_back(std::move(st));
      }
  }
  return out;
}

std::vector<FutureAccess> demands_of(const std::vector<Step>& steps) {
  std::vector<FutureAccess> f;
  for (const Step& s : steps)
    for (const FutureAccess& d : s.demands) f.push_back(d);
  return f;
}

struct Eviction {
  std::size_t step;
  ExpertKey key;
  friend bool operator==(const Eviction&, const Eviction&) = default;
};

/// Pin state of an evicted entry and of its pool at the moment of eviction.
struct EvictionCheck {
  bool hard_pinned = false;
  bool soft_pinned = false;
  bool pool_had_unpinned = false;  ///< another resident of the pool had no pin at all
  bool upgrade = false;            ///< the key being inserted replaced its own lower copy
};

/// Replays `steps` like OffloadPipeline does and checks the cache's invariants after every step.
template <class P>
struct Harness {
  ExpertCache<test::EvictionObserved<P>> cache;
  std::vector<Eviction> evictions;
  std::set<ExpertKey> hard;  // our record of hard pins
  ExpertKey inserting{0xffffffffu, 0};
  std::size_t step = 0;
  std::uint64_t misses = 0, failures = 0;

  Harness(const ModelShape& s, std::size_t budget, std::span<const FutureAccess> future)
      : cache(s, budget, Precision::f16,
              test::EvictionObserved<P>(test::make_policy<P>(s, future))) {
    cache.policy().observe = [this](ExpertKey key) { on_evicted(key); };
  }

  std::vector<EvictionCheck> checks;

  // Called before the entry is cleared, so it still shows the victim's pins.
  void on_evicted(ExpertKey key) {
    Harness* h = this;
    h->evictions.push_back({h->step, key});
    const auto& c = h->cache;
    const auto& e = c.entry(key);
    EvictionCheck chk{e.hard_pins > 0, e.soft_pins > 0, false, key == h->inserting};
    for (std::uint32_t l = 0; l < c.shape().n_layers; ++l)
      for (std::uint32_t x = 0; x < c.shape().n_experts; ++x) {
        const auto& o = c.entry({l, x});
        if (ExpertKey{l, x} != key && o.resident() && o.pool == e.pool && o.hard_pins == 0 &&
            o.soft_pins == 0)
          chk.pool_had_unpinned = true;
      }
    h->checks.push_back(chk);
  }

  /// Checked in the test body (not inside the cache's eviction): no hard-pinned victim; a
  /// soft-pinned victim only when nothing unpinned was left in its pool.
  void check_eviction_rules(std::size_t from) {
    for (std::size_t i = from; i < checks.size(); ++i) {
      CAPTURE(i, evictions[i].key.layer, evictions[i].key.expert);
      REQUIRE_FALSE(checks[i].hard_pinned);
      if (checks[i].soft_pinned && !checks[i].upgrade) REQUIRE_FALSE(checks[i].pool_had_unpinned);
    }
  }

  void run(const std::vector<Step>& steps, bool with_reset_checks = true) {
    std::uint32_t seq = steps.empty() ? 0 : steps.front().sequence;
    std::uint32_t token = 0xffffffffu;
    for (step = 0; step < steps.size(); ++step) {
      const Step& s = steps[step];
      if (s.sequence != seq) {
        seq = s.sequence;
        // Sequence reset: records may reset, contents must be kept.
        std::vector<Precision> before;
        for (std::uint32_t l = 0; l < cache.shape().n_layers; ++l)
          for (std::uint32_t e = 0; e < cache.shape().n_experts; ++e)
            before.push_back(cache.entry({l, e}).precision);
        cache.begin_sequence();
        if (with_reset_checks) {
          std::size_t i = 0;
          for (std::uint32_t l = 0; l < cache.shape().n_layers; ++l)
            for (std::uint32_t e = 0; e < cache.shape().n_experts; ++e)
              REQUIRE(cache.entry({l, e}).precision == before[i++]);
        }
      }
      if (s.token != token) {
        token = s.token;
        cache.begin_token();
      }
      for (ExpertKey k : s.extra_hard)
        if (cache.resident(k) && hard.insert(k).second) cache.pin_hard(k);
      for (ExpertKey k : s.soft) cache.pin_soft(k);
      const std::size_t ev0 = evictions.size();
      for (const FutureAccess& d : s.demands) {
        if (cache.resident_at(d.key, d.precision)) {
          cache.on_hit(d.key, cache.access(d.precision, s.layer));
        } else {
          cache.count_miss();
          ++misses;
          inserting = d.key;
          const auto r = cache.insert(d.key, cache.access(d.precision, s.layer));
          inserting = ExpertKey{0xffffffffu, 0};
          if (!r.ok()) {
            ++failures;
            check_failure(d, r.status);
            continue;
          }
        }
        if (hard.insert(d.key).second) cache.pin_hard(d.key);
      }
      check_eviction_rules(ev0);
      for (ExpertKey k : s.soft) cache.unpin_soft(k);
      for (ExpertKey k : hard) cache.unpin_hard(k);
      hard.clear();
      cache.check_invariants();
    }
  }

  void check_failure(const FutureAccess& d, InsertStatus st) {
    const std::uint32_t pool = cache.pool_of(d.key, d.precision);
    const auto& p = cache.pools()[pool];
    const std::size_t bytes = cache.shape().expert_bytes(d.precision);
    if (st == InsertStatus::too_large) {
      REQUIRE(bytes > p.capacity_bytes);
      return;
    }
    REQUIRE(st == InsertStatus::all_pinned);
    const auto& self = cache.entry(d.key);
    if (self.resident() && self.hard_pins > 0) return;  // an in-use lower copy is not replaced
    if constexpr (test::PolicySetup<P>::always_finds_victim) {
      // The policy gave up: then nothing in the pool may have been evictable.
      for (std::uint32_t l = 0; l < cache.shape().n_layers; ++l)
        for (std::uint32_t e = 0; e < cache.shape().n_experts; ++e) {
          const auto& en = cache.entry({l, e});
          if (en.resident() && en.pool == pool) REQUIRE(en.hard_pins > 0);
        }
    }
  }
};

}  // namespace

TEST_CASE("every cache policy says its own name, each a different one", "[cache][properties]") {
  const auto names = test::names_of<AllPolicies>();
  CAPTURE(names);
  CHECK(test::names_distinct(names));
  CHECK(ShallowFavoringArcPolicy::name == "shallow-arc");  // composed from the inner policy's
  CHECK(ShallowFavoring<LruPolicy>::name == "shallow-lru");
}

TEMPLATE_LIST_TEST_CASE("cache policy properties on random streams", "[cache][properties]",
                        AllPolicies) {
  static_assert(test::NamedComponent<TestType>);
  const std::uint32_t seed = GENERATE(1u, 2u, 3u, 4u);
  const int shape_id = GENERATE(0, 1);
  const ModelShape& s = shape_id == 0 ? shape_a : shape_b;
  const std::size_t slots = GENERATE(4u, 9u, 20u);
  CAPTURE(TestType::name, seed, shape_id, slots);
  const auto steps = random_stream(s, seed, 3, 12);
  const auto future = demands_of(steps);
  const std::size_t budget = slots * s.expert_bytes(Precision::f16);

  Harness<TestType> a(s, budget, future);
  REQUIRE_NOTHROW(a.run(steps));
  CHECK(a.cache.used_bytes() <= a.cache.capacity_bytes());
  CHECK(a.cache.capacity_bytes() <= budget);
  const auto& st = a.cache.stats();
  CHECK(st.hits + st.misses == future.size());

  // Determinism: the same stream gives the same evictions, step by step.
  Harness<TestType> b(s, budget, future);
  REQUIRE_NOTHROW(b.run(steps));
  CHECK(a.evictions == b.evictions);
  CHECK(a.misses == b.misses);
}

TEMPLATE_LIST_TEST_CASE("cache policies keep the contents at a sequence reset and work after it",
                        "[cache][properties]", AllPolicies) {
  const std::uint32_t seed = GENERATE(7u, 8u);
  CAPTURE(TestType::name, seed);
  // Many short sequences: every reset is exercised while the cache is full.
  const auto steps = random_stream(shape_a, seed, 8, 4);
  const auto future = demands_of(steps);
  Harness<TestType> h(shape_a, 10 * shape_a.expert_bytes(Precision::f16), future);
  REQUIRE_NOTHROW(h.run(steps));
  CHECK(h.cache.stats().hits > 0);
}

TEMPLATE_LIST_TEST_CASE("cache policies never evict pinned experts and fall back to soft pins",
                        "[cache][properties]", AllPolicies) {
  if constexpr (test::PolicySetup<TestType>::always_finds_victim) {
    // Six slots: one pool, or per-layer pools (uniform 2,2,1,1; shallow-favoring 6,0,0,0).
    const ModelShape s{.n_layers = 4, .n_experts = 8, .top_k = 2, .hidden = 64, .ffn = 128};
    std::vector<FutureAccess> future;
    for (std::uint32_t e = 0; e < 7; ++e)
      for (std::uint32_t l = 0; l < 4; ++l) future.push_back({{l, e}, Precision::f16});
    ExpertCache<TestType> c(s, 6 * s.expert_bytes(Precision::f16), Precision::f16,
                            test::make_policy<TestType>(s, future));
    std::vector<ExpertKey> in;
    for (const FutureAccess& f : future) {
      if (c.resident(f.key)) {
        c.on_hit(f.key, c.access(f.precision, f.key.layer));
        continue;
      }
      const auto r = c.insert(f.key, c.access(f.precision, f.key.layer));
      if (!r.ok()) continue;  // a per-layer pool may be smaller than the stream's layer share
      c.check_invariants();
    }
    // Pin every resident hard but one, which is soft-pinned: the soft one must be the victim.
    std::vector<ExpertKey> res;
    for (std::uint32_t l = 0; l < 4; ++l)
      for (std::uint32_t e = 0; e < 8; ++e)
        if (c.resident({l, e})) res.push_back({l, e});
    REQUIRE(!res.empty());
    const ExpertKey soft = res.back();
    for (ExpertKey k : res) (k == soft ? c.pin_soft(k) : c.pin_hard(k));
    const ExpertKey incoming{soft.layer, 7};
    if (c.resident(incoming)) return;  // nothing to learn for this policy's placement
    const std::uint32_t pool = c.pool_of(incoming, Precision::f16);
    if (c.pools()[pool].used_bytes + s.expert_bytes(Precision::f16) <=
        c.pools()[pool].capacity_bytes)
      return;  // room without eviction
    if constexpr (!test::PolicySetup<TestType>::accepts_unforeseen_demands) {
      return;  // the incoming demand is not in their future
    } else {
      const auto r = c.insert(incoming, c.access(Precision::f16, incoming.layer));
      REQUIRE(r.ok());
      CHECK_FALSE(c.resident(soft));
      for (ExpertKey k : res)
        if (k != soft) CHECK(c.resident(k));
      c.check_invariants();
    }
  }
}
