#pragma once
// Helpers of the per-policy worked-example tests (tests/cache/<policy>_test.cpp): a small model
// shape and `use`, one demand through an ExpertCache as OffloadPipeline makes it.

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>

#include "moekit/cache/expert_cache.hpp"

namespace moekit::test {

inline constexpr ModelShape small{
    .n_layers = 4, .n_experts = 8, .top_k = 2, .hidden = 64, .ffn = 128};
inline const std::size_t f16b = small.expert_bytes(Precision::f16);
inline const std::size_t q4b = small.expert_bytes(Precision::q4);

/// One demand: a hit if a copy serves it, else an insertion. Returns true on a hit.
template <class P>
bool use(ExpertCache<P>& c, ExpertKey k, Precision p = Precision::f16,
         std::uint32_t layer = 0xffffffffu) {
  const std::uint32_t l = layer == 0xffffffffu ? k.layer : layer;
  if (c.resident_at(k, p)) {
    c.on_hit(k, c.access(p, l));
    return true;
  }
  c.count_miss();
  REQUIRE(c.insert(k, c.access(p, l)).ok());
  c.check_invariants();
  return false;
}

/// HOBBIT's miss penalty of one demand, in units of a full-precision load.
inline double penalty(const ModelShape& s, Precision p) {
  return double(s.expert_bytes(p)) / double(s.expert_bytes(Precision::f16));
}

}  // namespace moekit::test
