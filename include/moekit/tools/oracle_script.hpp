#pragma once
/// \file The OraclePredictor's script for a routing trace: the layer calls `sim::replay` makes.
///
/// Forwards as replay walks them: per sequence, its prefill tokens as one forward, then one
/// forward per decode token; per forward and layer, the distinct experts of the tokens whose
/// record is present. A layer where no token of the forward has a record is not routed by replay,
/// so it has no call here either. The script assumes the full top-k (a token policy that narrows
/// k or recomputes tokens, like MoBiLE's, makes other calls).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "moekit/predict/oracle.hpp"
#include "moekit/sim/trace.hpp"

namespace moekit::tools {

/// Every layer call of replaying `trace` with the full top-k, in order.
[[nodiscard]] inline std::vector<OracleCall> oracle_calls(const sim::RoutingTrace& trace) {
  std::vector<OracleCall> calls;
  const std::uint32_t L = trace.dims().n_layers;
  auto forward = [&](std::size_t first, std::size_t n) {
    for (std::uint32_t l = 0; l < L; ++l) {
      OracleCall c{l, {}};
      for (std::size_t t = first; t < first + n; ++t)
        if (trace.valid(t, l))
          for (std::uint32_t e : trace.experts(t, l)) c.experts.push_back(e);
      if (c.experts.empty()) continue;
      std::sort(c.experts.begin(), c.experts.end());
      c.experts.erase(std::unique(c.experts.begin(), c.experts.end()), c.experts.end());
      calls.push_back(std::move(c));
    }
  };
  for (std::size_t s = 0; s < trace.sequence_count(); ++s) {
    const std::size_t first = trace.global_token(s, 0), len = trace.sequence_length(s);
    const std::size_t pre = trace.prefill_length(s);
    if (pre > 0) forward(first, pre);
    for (std::size_t t = pre; t < len; ++t) forward(first + t, 1);
  }
  return calls;
}

}  // namespace moekit::tools
