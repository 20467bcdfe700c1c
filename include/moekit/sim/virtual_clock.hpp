#pragma once
/// \file VirtualClock: simulated time, in seconds, for the replay simulator.
///
/// The clock only moves forward, and only when told: the replay advances it by compute time, the
/// simulated loader advances it to a load's completion when the pipeline waits for it (that wait
/// is counted as stall). Nothing reads the wall clock, so a replay is deterministic.

#include <string>

#include "moekit/error.hpp"

namespace moekit::sim {

/// Monotone simulated time with a stall counter.
class VirtualClock {
 public:
  /// Current simulated time in seconds since the clock was created.
  [[nodiscard]] double now() const noexcept { return now_; }
  /// Total time spent waiting for loads (advanced by `stall_until`).
  [[nodiscard]] double stall() const noexcept { return stall_; }

  /// Advances by `seconds` of work (compute). Throws on a negative or non-finite duration.
  void advance(double seconds) {
    MOEKIT_EXPECTS(
        seconds >= 0 && seconds < 1e300,
        "VirtualClock::advance: duration must be finite and >= 0, got " + std::to_string(seconds));
    now_ += seconds;
  }
  /// Advances to time `t` if it is later, counting the difference as stall (waiting for I/O).
  /// Returns the stall added.
  double stall_until(double t) noexcept {
    if (!(t > now_)) return 0.0;
    const double d = t - now_;
    now_ = t;
    stall_ += d;
    return d;
  }

 private:
  double now_ = 0.0;
  double stall_ = 0.0;
};

}  // namespace moekit::sim
