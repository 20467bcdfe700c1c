#pragma once
/// \file What ExpertCache tells a cache policy: accesses, and the question "which entry goes?".

#include <cstdint>

#include "moekit/core/expert_key.hpp"
#include "moekit/core/precision.hpp"

namespace moekit {

/// One access to a cached expert (a hit, an insertion, or a prefetch landing).
struct AccessInfo {
  Precision precision =
      Precision::f16;       ///< precision asked for (`skip`: served by a resident copy)
  std::uint32_t layer = 0;  ///< layer being computed when the access happened
  std::uint32_t n_layers = 0;
  std::uint64_t tick = 0;      ///< monotonically increasing access clock of the cache
  std::uint64_t token = 0;     ///< token counter of the cache (advanced by begin_token)
  std::uint32_t n_tokens = 1;  ///< tokens of the forward that used the expert
  /// Of those, the tokens whose own request was `precision` (the others asked for less and are
  /// served by the copy the most demanding one asked for; Scorer's `tokens_asking`).
  std::uint32_t n_tokens_asking = 1;
  bool prefetch = false;  ///< inserted by a prefetch, not by a demand
};

/// Predicate handed to a policy: may `key` be evicted now? (resident in the pool, not pinned)
class EvictablePredicate {
 public:
  using Fn = bool (*)(const void*, ExpertKey) noexcept;
  constexpr EvictablePredicate(const void* owner, Fn fn) noexcept : owner_(owner), fn_(fn) {}
  [[nodiscard]] bool operator()(ExpertKey key) const noexcept { return fn_(owner_, key); }

 private:
  const void* owner_;
  Fn fn_;
};

/// The question a policy answers when a pool is full.
struct EvictionQuery {
  std::uint32_t pool = 0;  ///< pool that needs room
  ExpertKey incoming{};    ///< expert about to be inserted
  Precision incoming_precision = Precision::f16;
  std::uint32_t layer = 0;  ///< layer being computed (FLD, EdgeMoE distance)
  std::uint32_t n_layers = 0;
  std::uint64_t tick = 0;
  EvictablePredicate evictable;  ///< the victim returned must satisfy this
};

}  // namespace moekit
