#pragma once
/// \file Per-expert use records shared by the counting policies (LFU, LHU, HOBBIT, EdgeMoE).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "moekit/core/cache_events.hpp"
#include "moekit/core/precision.hpp"

namespace moekit {

/// Lifetime of a counting policy's records.
enum class CountScope : std::uint8_t {
  sequence,  ///< counts restart at every `begin_sequence()` (HOBBIT's sequence-level LFU)
  model,     ///< counts accumulate for the life of the cache (model-level LFU)
};

namespace detail {

/// What a policy remembers about one expert. Records belong to the expert, not to its resident
/// copy: they survive eviction (a "perfect" count over the scope, as HOBBIT keeps them).
struct UseRecord {
  std::uint64_t uses = 0;        ///< token-uses at any precision (F)
  std::uint64_t high_uses = 0;   ///< token-uses that asked for high precision (H)
  std::uint64_t last_token = 0;  ///< sequence token number of the last use (R)
  std::uint64_t last_tick = 0;   ///< cache tick of the last use or insertion (tie-breaks)
};

/// The records of every expert of a model, dense-indexed.
class UseRecords {
 public:
  void reset(std::size_t n) { records_.assign(n, UseRecord{}); }
  /// Forgets counts and last-use tokens; keeps `last_tick` so recency tie-breaks stay stable.
  void clear_counts() noexcept {
    for (UseRecord& r : records_) r.uses = r.high_uses = r.last_token = 0;
  }
  /// Records a use by `a.n_tokens` tokens at sequence token `token`; a token's use counts as high
  /// when the precision it asked for is at least `high` (of a forward's tokens, those asking
  /// `a.precision`: a prefill token that asked low is not a high use because another asked high).
  void use(std::uint32_t i, const AccessInfo& a, std::uint64_t token, Precision high) noexcept {
    UseRecord& r = records_[i];
    r.uses += a.n_tokens;
    if (bits(a.precision) >= bits(high)) r.high_uses += a.n_tokens_asking;
    r.last_token = token;
    r.last_tick = a.tick;
  }
  /// Marks an insertion that is not a use (a prefetch landing): recency only.
  void touch(std::uint32_t i, const AccessInfo& a) noexcept { records_[i].last_tick = a.tick; }
  [[nodiscard]] const UseRecord& operator[](std::uint32_t i) const noexcept { return records_[i]; }

 private:
  std::vector<UseRecord> records_;
};

}  // namespace detail
}  // namespace moekit
