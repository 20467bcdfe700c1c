#pragma once
/// \file TokenBucket: a bandwidth cap that makes a fast tier behave like a slower link.
///
/// Classic token bucket: tokens (bytes) accrue at `rate` per second up to `burst`; taking n
/// tokens may drive the balance negative ("debt"), and the caller then sleeps until the debt is
/// repaid, so a transfer larger than the burst is paced, not refused. `reserve` is the pure,
/// clock-injected core (testable without sleeping); `acquire` sleeps on the steady clock.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

#include "moekit/error.hpp"

namespace moekit::io {

/// Thread-safe token bucket over bytes.
class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;

  /// `bytes_per_second` > 0; `burst_bytes` = most bytes that pass without waiting after idling.
  TokenBucket(double bytes_per_second, double burst_bytes, Clock::time_point now = Clock::now())
      : rate_(bytes_per_second), burst_(burst_bytes), tokens_(burst_bytes), last_(now) {
    MOEKIT_EXPECTS(bytes_per_second > 0, "TokenBucket: bytes_per_second must be > 0");
    MOEKIT_EXPECTS(burst_bytes >= 0, "TokenBucket: burst_bytes must be >= 0");
  }

  /// Takes `bytes` tokens at time `now`; returns how long the caller must wait before using them.
  std::chrono::nanoseconds reserve(std::uint64_t bytes, Clock::time_point now) {
    std::lock_guard lock(m_);
    if (now > last_) {
      tokens_ =
          std::min(burst_, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
      last_ = now;
    }
    tokens_ -= static_cast<double>(bytes);
    if (tokens_ >= 0) return std::chrono::nanoseconds{0};
    return std::chrono::nanoseconds{static_cast<std::int64_t>(-tokens_ / rate_ * 1e9)};
  }

  /// Takes `bytes` tokens, sleeping as long as the cap requires.
  void acquire(std::uint64_t bytes) {
    const auto wait = reserve(bytes, Clock::now());
    if (wait.count() > 0) std::this_thread::sleep_for(wait);
  }

  [[nodiscard]] double rate() const noexcept { return rate_; }

 private:
  std::mutex m_;
  double rate_, burst_, tokens_;
  Clock::time_point last_;
};

}  // namespace moekit::io
