#pragma once
/// \file fill_missing_records: the one rule moe-sim and moe-run --routing-trace share for a
/// trace's missing records (sim/trace.hpp: the shared Mixtral traces drop the records whose two
/// weights tied at 0.5).
///
/// The model did route those tokens — to two experts the trace does not name. Leaving them out
/// (no expert read, no expert run) undercounts a token's work and bytes; letting moe-run's
/// random router choose reads experts no real token asked for, so the two tools disagreed by
/// 5–8% of the bytes read on the HumanEval trace (bench/RESULTS.md, "Both read paths measured at
/// once"). Both now replay the same stand-in: a missing record takes the nearest earlier record of
/// its sequence at the same layer (the previous token's experts, weights, logits and hidden
/// state), or, before the sequence's first record at that layer, the nearest later one. A layer
/// with no record in the whole sequence stays missing (each tool's own rule then applies, and
/// counts it).

#include <cstddef>
#include <cstdint>

#include "moekit/sim/trace.hpp"

namespace moekit::sim {

/// Fills every missing record of `trace` that has a record of its sequence at the same layer
/// (see the file comment); returns how many it filled.
inline std::size_t fill_missing_records(RoutingTrace& trace) {
  std::size_t filled = 0;
  const std::uint32_t n_layers = trace.dims().n_layers;
  for (std::size_t s = 0; s < trace.sequence_count(); ++s) {
    const std::size_t len = trace.sequence_length(s);
    if (len == 0) continue;
    const std::size_t first = trace.global_token(s, 0), end = first + len;
    for (std::uint32_t l = 0; l < n_layers; ++l) {
      std::size_t source = end;  // the record the next missing one copies; `end`: none yet
      for (std::size_t t = first; t < end && source == end; ++t)
        if (trace.valid(t, l)) source = t;  // leading gaps copy the first record
      if (source == end) continue;          // no record at this layer in the whole sequence
      for (std::size_t t = first; t < end; ++t) {
        if (trace.valid(t, l)) {
          source = t;
          continue;
        }
        // Distinct records of one array: the spans stay valid while set_route copies.
        trace.set_route(t, l, trace.experts(source, l), trace.weights(source, l),
                        trace.logits(source, l), trace.hidden(source, l));
        ++filled;
      }
    }
  }
  return filled;
}

}  // namespace moekit::sim
