#pragma once
/// \file OraclePredictor: knows the future routing and predicts it exactly (an upper bound).
///
/// It is given the sequence of layer calls the engine will make (each call's layer and the
/// distinct experts it selects, in `route` order) and, at each call, pushes the experts of the
/// following calls of the same forward that lie at most `distance` layers ahead. Every `observe`
/// is checked against the script, so a test or simulation that drifts from it fails loudly
/// instead of measuring a wrong bound.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// One scripted layer call: its layer and the distinct experts its tokens select.
struct OracleCall {
  std::uint32_t layer = 0;
  std::vector<std::uint32_t> experts;
};

namespace detail {
/// Checks an observed layer call against the script entry at `cursor` (throws `moekit::Error`
/// naming `who` when the run drifts from it) and advances `cursor`. `seen` is scratch space.
inline void check_script_call(const char* who, const std::vector<OracleCall>& calls,
                              std::size_t& cursor, std::vector<std::uint32_t>& seen,
                              const LayerContext& ctx, const GateView& gate) {
  const std::string where = std::string(who) + ": layer call " + std::to_string(cursor);
  MOEKIT_EXPECTS(cursor < calls.size(), where + " is beyond the script");
  const OracleCall& c = calls[cursor];
  MOEKIT_EXPECTS(c.layer == ctx.layer, where + " is at layer " + std::to_string(ctx.layer) +
                                           ", the script says " + std::to_string(c.layer));
  seen.assign(gate.experts.begin(), gate.experts.end());
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  MOEKIT_EXPECTS(seen == c.experts, where + " selects other experts than the script");
  ++cursor;
}
}  // namespace detail

/// Predicts the scripted future exactly.
class OraclePredictor {
 public:
  static constexpr std::string_view name = "oracle";
  struct Config {
    std::vector<OracleCall> calls;  ///< every layer call, in the order `route` sees them
    std::uint32_t distance = 1;     ///< layers ahead to predict (1..max_prediction_distance)
    Precision precision = Precision::f16;
  };
  explicit OraclePredictor(Config c) : cfg_(std::move(c)) {
    MOEKIT_EXPECTS(cfg_.distance >= 1 && cfg_.distance <= max_prediction_distance,
                   "OraclePredictor: Config.distance must be in [1, " +
                       std::to_string(max_prediction_distance) + "]");
    MOEKIT_EXPECTS(cfg_.precision != Precision::skip,
                   "OraclePredictor: Config.precision must be a stored format");
    for (auto& call : cfg_.calls) std::sort(call.experts.begin(), call.experts.end());
  }

  /// Checks the call against the script and advances.
  void observe(const LayerContext& ctx, const GateView& gate) {
    detail::check_script_call("OraclePredictor", cfg_.calls, cursor_, seen_, ctx, gate);
  }

  void predict(const LayerContext& ctx, const GateView&, const ResidencyView&,
               PrefetchList& out) const {
    if (cursor_ == 0) return;  // nothing observed yet: no position in the script
    // The following calls of the same forward (layers increase) within `distance` layers; a
    // layer the engine does not route (no call) is simply absent.
    std::uint32_t prev = ctx.layer;
    for (std::size_t i = cursor_; i < cfg_.calls.size(); ++i) {
      const std::uint32_t m = cfg_.calls[i].layer;
      if (m <= prev || m > ctx.layer + cfg_.distance) break;
      for (std::uint32_t e : cfg_.calls[i].experts)
        out.push(Prefetch{{m, e}, cfg_.precision, 1.0f, m - ctx.layer});
      prev = m;
    }
  }

  /// Calls observed so far.
  [[nodiscard]] std::size_t position() const noexcept { return cursor_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  Config cfg_;
  std::size_t cursor_ = 0;
  std::vector<std::uint32_t> seen_;
};
static_assert(Predictor<OraclePredictor>);

}  // namespace moekit
