// ExpertCache (cache/expert_cache.hpp): residency, pools, pins and the checks on a policy's
// victims.

#include <catch2/catch.hpp>

#include "moekit/cache/expert_cache.hpp"
#include "moekit/cache/lru.hpp"

using namespace moekit;

namespace {
constexpr ModelShape tiny{.n_layers = 2, .n_experts = 4, .top_k = 2, .hidden = 64, .ffn = 128};
const std::size_t f16_bytes = tiny.expert_bytes(Precision::f16);

AccessInfo acc(ExpertCache<LruPolicy>& c, Precision p = Precision::f16, std::uint32_t layer = 0) {
  return c.access(p, layer);
}
}  // namespace

TEST_CASE("ExpertCache evicts the least recently used unpinned expert", "[cache][expert_cache]") {
  ExpertCache<LruPolicy> c(tiny, 2 * f16_bytes, Precision::f16);
  REQUIRE(c.insert({0, 0}, acc(c)).ok());
  REQUIRE(c.insert({0, 1}, acc(c)).ok());
  c.on_hit({0, 0}, acc(c));  // 0 is now the most recent
  REQUIRE(c.insert({0, 2}, acc(c)).ok());
  CHECK(c.resident({0, 0}));
  CHECK_FALSE(c.resident({0, 1}));
  CHECK(c.resident({0, 2}));
  CHECK(c.stats().evictions == 1);
  c.check_invariants();

  c.pin_hard({0, 0});
  c.pin_hard({0, 2});
  const auto r = c.insert({1, 3}, acc(c));
  CHECK(r.status == InsertStatus::all_pinned);
  CHECK(c.resident({0, 0}));
  CHECK(c.resident({0, 2}));
  c.unpin_hard({0, 2});
  REQUIRE(c.insert({1, 3}, acc(c)).ok());
  CHECK_FALSE(c.resident({0, 2}));
  c.check_invariants();
}

TEST_CASE("ExpertCache serves low-precision requests from high-precision copies",
          "[cache][expert_cache]") {
  ExpertCache<LruPolicy> c(tiny, 4 * f16_bytes, Precision::f16);
  REQUIRE(c.insert({0, 1}, acc(c, Precision::q4)).ok());
  CHECK(c.resident_at({0, 1}, Precision::q4));
  CHECK_FALSE(c.resident_at({0, 1}, Precision::f16));
  REQUIRE(c.insert({0, 1}, acc(c, Precision::f16)).ok());  // upgrade replaces the q4 copy
  CHECK(c.entry({0, 1}).precision == Precision::f16);
  CHECK(c.resident_at({0, 1}, Precision::q2));
  CHECK(c.resident_count() == 1);
  CHECK(c.used_bytes() == f16_bytes);
  c.check_invariants();
}

TEST_CASE("ExpertCache evicts soft-pinned experts only when nothing else is left",
          "[cache][expert_cache]") {
  ExpertCache<LruPolicy> c(tiny, 2 * f16_bytes, Precision::f16);
  REQUIRE(c.insert({0, 0}, acc(c)).ok());
  REQUIRE(c.insert({0, 1}, acc(c)).ok());
  c.pin_soft({0, 0});  // the LRU entry is predicted for use
  REQUIRE(c.insert({1, 0}, acc(c)).ok());
  CHECK(c.resident({0, 0}));
  CHECK_FALSE(c.resident({0, 1}));
  c.pin_hard({1, 0});
  REQUIRE(c.insert({1, 1}, acc(c)).ok());  // only the soft-pinned one can go
  CHECK_FALSE(c.resident({0, 0}));
  c.check_invariants();
}

TEST_CASE("ExpertCache refuses experts larger than their pool", "[cache][expert_cache]") {
  ExpertCache<LruPolicy> c(tiny, f16_bytes - 1, Precision::f16);
  CHECK(c.insert({0, 0}, acc(c)).status == InsertStatus::too_large);
  CHECK(c.insert({0, 0}, acc(c, Precision::q8)).ok());
  CHECK(c.stats().insert_failures == 1);
}

namespace {
// A policy that names a pinned victim: the cache must refuse it loudly.
struct LyingPolicy {
  void on_hit(ExpertKey, const AccessInfo&) {}
  void on_insert(ExpertKey k, const AccessInfo&) { last = k; }
  void on_evict(ExpertKey) {}
  std::optional<ExpertKey> victim(const EvictionQuery&) const { return last; }
  ExpertKey last{};
};
}  // namespace

TEST_CASE("ExpertCache rejects a policy's victim that is pinned", "[cache][expert_cache]") {
  ExpertCache<LyingPolicy> c(tiny, f16_bytes, Precision::f16);
  REQUIRE(c.insert({0, 0}, c.access(Precision::f16, 0)).ok());
  c.pin_hard({0, 0});
  CHECK_THROWS_WITH(c.insert({0, 1}, c.access(Precision::f16, 0)),
                    Catch::Contains("not resident, unpinned and in the pool"));
}

TEST_CASE("ExpertCache keeps an expert whose load is in flight, without a pin",
          "[cache][expert_cache]") {
  ExpertCache<LruPolicy> c(tiny, 2 * f16_bytes, Precision::f16);
  REQUIRE(c.insert({0, 0}, acc(c)).ok());
  c.mark_loading({0, 0}, LoadTicket{1});
  REQUIRE(c.insert({0, 1}, acc(c)).ok());
  CHECK(c.entry({0, 0}).hard_pins == 0);
  CHECK(c.pinned({0, 0}));                 // in use while loading
  REQUIRE(c.insert({1, 0}, acc(c)).ok());  // LRU is (0,0), but it is loading: (0,1) goes
  CHECK(c.resident({0, 0}));
  CHECK_FALSE(c.resident({0, 1}));
  CHECK(c.insert({0, 0}, acc(c, Precision::f32)).status == InsertStatus::all_pinned);  // no upgrade
  CHECK_THROWS_WITH(c.evict({0, 0}), Catch::Contains("still loading"));
  c.mark_loaded({0, 0});
  REQUIRE(c.insert({1, 1}, acc(c)).ok());  // evictable again: the LRU goes
  CHECK_FALSE(c.resident({0, 0}));
  c.check_invariants();
}

TEST_CASE("ExpertCache::cancel_load drops a loading prefetch without counting it wasted",
          "[cache][expert_cache]") {
  ExpertCache<LruPolicy> c(tiny, 2 * f16_bytes, Precision::f16);
  REQUIRE(c.insert({0, 0}, c.access(Precision::f16, 0, 1, /*prefetch=*/true)).ok());
  CHECK_THROWS_WITH(c.cancel_load({0, 0}), Catch::Contains("not loading"));
  c.mark_loading({0, 0}, LoadTicket{1});
  c.cancel_load({0, 0});
  CHECK_FALSE(c.resident({0, 0}));
  CHECK(c.stats().wasted_prefetches == 0);
  // The same prefetch loaded and evicted unused is wasted.
  REQUIRE(c.insert({0, 0}, c.access(Precision::f16, 0, 1, /*prefetch=*/true)).ok());
  c.evict({0, 0});
  CHECK(c.stats().wasted_prefetches == 1);
  c.check_invariants();
}

TEST_CASE("ExpertCache owns the arena behind its slots: an eviction releases the slot's buffer",
          "[cache][expert_cache]") {
  // A limit of 0 bytes: a released buffer is freed at once.
  ExpertCache<LruPolicy> c(tiny, 2 * f16_bytes, Precision::f16, LruPolicy{},
                           ExpertArena(tiny.expert_count(), 0));
  const auto a = c.insert({0, 0}, acc(c));
  REQUIRE(a.ok());
  (void)c.arena().acquire(a.slot, f16_bytes);
  const std::size_t one = c.arena().held_bytes();
  CHECK(one >= f16_bytes);
  const auto b = c.insert({0, 1}, acc(c));
  (void)c.arena().acquire(b.slot, f16_bytes);
  CHECK(c.arena().held_bytes() == 2 * one);
  REQUIRE(c.insert({1, 0}, acc(c)).ok());  // evicts (0,0): its buffer goes
  CHECK_FALSE(c.resident({0, 0}));
  CHECK(c.arena().held_bytes() == one);
  CHECK_THROWS_WITH(ExpertCache<LruPolicy>(tiny, f16_bytes, Precision::f16, LruPolicy{},
                                           ExpertArena(tiny.expert_count() - 1, 0)),
                    Catch::Contains("a buffer per cache slot"));
}
