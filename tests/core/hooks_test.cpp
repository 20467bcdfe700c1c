#include <catch2/catch.hpp>

#include "moekit/cache/arc.hpp"
#include "moekit/cache/expert_cache.hpp"
#include "moekit/cache/lfu.hpp"
#include "moekit/cache/lru.hpp"
#include "moekit/cache/shallow_favoring.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/io/memory_loader.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/predict/none.hpp"
#include "moekit/sched/on_demand.hpp"
#include "moekit/score/uniform.hpp"

using namespace moekit;

namespace {
constexpr ModelShape hook_shape{
    .n_layers = 2, .n_experts = 4, .top_k = 2, .hidden = 64, .ffn = 128};

/// Counts the hook calls it declares; everything else is LRU.
struct CountingPolicy : LruPolicy {
  static constexpr Hooks hooks =
      Hook::bind | Hook::begin_sequence | Hook::begin_token | Hook::prepare_insert;
  void bind(const ModelShape& s) {
    ++binds;
    LruPolicy::bind(s);
  }
  void begin_sequence() { ++sequences; }
  void begin_token(std::uint32_t n) { tokens += n; }
  void prepare_insert(ExpertKey, const AccessInfo& a) { prefetch_inserts += a.prefetch; }
  int binds = 0, sequences = 0, prefetch_inserts = 0;
  std::uint32_t tokens = 0;
};

/// A scorer that declares begin_sequence.
struct CountingScorer : UniformScorer {
  static constexpr Hooks hooks = Hook::begin_sequence;
  void begin_sequence() { ++sequences; }
  int sequences = 0;
};
}  // namespace

static_assert(declares<ArcPolicy>(Hook::prepare_insert));
static_assert(!declares<LruPolicy>(Hook::prepare_insert));
static_assert(declares<LfuPolicy>(Hook::begin_sequence));  // inherited from UseCountPolicy
static_assert(declares<ShallowFavoring<ArcPolicy>>(Hook::prepare_insert));
static_assert(!declares<int>(Hook::bind));
static_assert((Hook::bind | Hook::pool_of) - Hook::bind == Hooks(Hook::pool_of));
static_assert(assert_hooks<CountingPolicy, cache_policy_hooks>());
static_assert(assert_hooks<ShallowFavoring<CountingPolicy>, cache_policy_hooks>());

TEST_CASE("ExpertCache calls the hooks a policy declares", "[core][hooks]") {
  const std::size_t f16 = hook_shape.expert_bytes(Precision::f16);
  ExpertCache<CountingPolicy> c(hook_shape, 2 * f16, Precision::f16);
  CHECK(c.policy().binds == 1);
  c.begin_sequence();
  c.begin_token(3);
  REQUIRE(c.insert({0, 0}, c.access(Precision::f16, 0, 1, /*prefetch=*/true)).ok());
  REQUIRE(c.insert({0, 1}, c.access(Precision::f16, 0)).ok());
  CHECK(c.policy().sequences == 1);
  CHECK(c.policy().tokens == 3);
  CHECK(c.policy().prefetch_inserts == 1);
}

TEST_CASE("ShallowFavoring forwards its inner policy's declared hooks", "[core][hooks]") {
  const std::size_t f16 = hook_shape.expert_bytes(Precision::f16);
  ExpertCache<ShallowFavoring<CountingPolicy>> c(
      hook_shape, 4 * f16, Precision::f16, ShallowFavoring<CountingPolicy>({.shallow_layers = 1}));
  const CountingPolicy& inner = c.policy().inner();
  CHECK(inner.binds == 1);
  c.begin_sequence();
  c.begin_token(2);
  REQUIRE(c.insert({0, 0}, c.access(Precision::f16, 0, 1, /*prefetch=*/true)).ok());
  CHECK(inner.sequences == 1);
  CHECK(inner.tokens == 2);
  CHECK(inner.prefetch_inserts == 1);
}

TEST_CASE("OffloadPipeline calls a component's declared begin_sequence", "[core][hooks]") {
  std::vector<std::byte> host(hook_shape.expert_bytes(Precision::f16));
  MemoryLoader loader([&](ExpertKey, Precision p) {
    return std::span<const std::byte>(host).first(hook_shape.expert_bytes(p));
  });
  OffloadPipeline<CountingScorer, NoPredictor, CountingPolicy, MemoryLoader, OnDemandScheduler> p(
      hook_shape, {.expert_budget_bytes = 4 * host.size()}, std::move(loader));
  p.begin_sequence();
  p.begin_sequence();
  CHECK(p.scorer().sequences == 2);
  CHECK(p.cache().policy().sequences == 2);
}
