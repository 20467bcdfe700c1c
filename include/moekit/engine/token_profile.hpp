#pragma once
/// \file TokenProfile: where a decode token's time goes (moe-run --profile).
///
/// The engine marks its phases with `TokenProfile::Scope`s: attention (scores, softmax, RoPE, the
/// KV cache), dense matrices (attention projections, dense MLPs, shared experts), routing and
/// pipeline (router, top-k, the pipeline's route/resolve/end_layer, the weighted sum), routed
/// experts, the LM head (final norm and output matrix), and sampling. Two parts are cut out of
/// the scopes they happen in: waiting for expert loads (the pipeline's stall time, inside
/// resolve) and thread synchronisation (the time parallel_for's caller waits for other
/// threads' chunks, ThreadPool::set_wait_sink). "other" is the rest of the token (embedding,
/// norms, residual adds, the token policy), so the parts sum to the token's wall time.
///
/// Off costs nothing but a null test per scope: the engine holds a `TokenProfile*`, null unless
/// profiling, and a Scope on null reads no clock.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "moekit/precision/thread_pool.hpp"

namespace moekit::engine {

/// The parts of a token's time.
enum class TokenPart : std::uint8_t {
  attention,
  dense,
  routing,
  experts,
  lm_head,
  sampling,
  load_wait,
  sync,
  other,
};
inline constexpr std::size_t token_part_count = 9;

/// The part's name in moe-run's --json "profile" object and --profile table.
constexpr std::string_view name(TokenPart p) noexcept {
  constexpr std::array<std::string_view, token_part_count> names{
      "attention", "dense_matrices", "routing_pipeline", "experts", "lm_head",
      "sampling",  "load_wait",      "thread_sync",      "other"};
  return names[static_cast<std::size_t>(p)];
}

/// Accumulates the parts of the tokens between begin_token and end_token.
class TokenProfile {
 public:
  using Clock = std::chrono::steady_clock;

  TokenProfile() = default;
  TokenProfile(const TokenProfile&) = delete;
  TokenProfile& operator=(const TokenProfile&) = delete;
  ~TokenProfile() { attach(nullptr); }

  /// Counts the time `pool`'s caller waits for other threads as thread synchronisation (null:
  /// detach). The profile must be the pool's only wait sink while attached.
  void attach(moekit::ThreadPool* pool) noexcept {
    if (pool_) pool_->set_wait_sink(nullptr);
    pool_ = pool;
    if (pool_) pool_->set_wait_sink(&sync_ns_);
  }

  void begin_token() noexcept { token_start_ = Clock::now(); }
  void end_token() noexcept {
    total_ns_ += ns_since(token_start_);
    ++tokens_;
  }

  /// begin_token at construction, end_token at destruction; nothing on a null profile.
  class Token {
   public:
    explicit Token(TokenProfile* p) noexcept : p_(p) {
      if (p_) p_->begin_token();
    }
    Token(const Token&) = delete;
    Token& operator=(const Token&) = delete;
    ~Token() {
      if (p_) p_->end_token();
    }

   private:
    TokenProfile* p_;
  };

  /// Time from construction to destruction, less what was moved out (`move_out`) and the thread
  /// synchronisation inside it, goes to `part`. A Scope on a null profile does nothing.
  class Scope {
   public:
    Scope(TokenProfile* p, TokenPart part) noexcept : p_(p), part_(part) {
      if (p_) {
        start_ = Clock::now();
        sync_at_start_ = p_->sync_ns_;
      }
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() {
      if (!p_) return;
      const std::uint64_t all = ns_since(start_), sync = p_->sync_ns_ - sync_at_start_;
      const std::uint64_t cut = sync + moved_;
      p_->ns_[static_cast<std::size_t>(part_)] += all > cut ? all - cut : 0;
    }
    /// Moves `seconds` of this scope into `to` (a load wait inside the pipeline's resolve).
    void move_out(TokenPart to, double seconds) noexcept {
      if (!p_ || seconds <= 0) return;
      const auto ns = static_cast<std::uint64_t>(seconds * 1e9);
      p_->ns_[static_cast<std::size_t>(to)] += ns;
      moved_ += ns;
    }

   private:
    TokenProfile* p_;
    TokenPart part_;
    Clock::time_point start_{};
    std::uint64_t sync_at_start_ = 0, moved_ = 0;
  };

  [[nodiscard]] std::uint64_t tokens() const noexcept { return tokens_; }
  /// Wall time of the profiled tokens, seconds.
  [[nodiscard]] double seconds() const noexcept { return static_cast<double>(total_ns_) * 1e-9; }

  /// Fraction of the tokens' wall time in `p`; each ≥ 0 and together 1 (0 with no token).
  /// Timed parts that overran the wall time (clock granularity) leave "other" at 0 and are
  /// scaled to sum to 1.
  [[nodiscard]] double fraction(TokenPart p) const noexcept {
    const std::uint64_t timed = timed_ns();
    const std::uint64_t whole = std::max(total_ns_, timed);
    if (whole == 0) return 0;
    const std::uint64_t ns = p == TokenPart::other ? whole - timed : part_ns(p);
    return static_cast<double>(ns) / static_cast<double>(whole);
  }

 private:
  static std::uint64_t ns_since(Clock::time_point t) noexcept {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
  }
  [[nodiscard]] std::uint64_t part_ns(TokenPart p) const noexcept {
    return p == TokenPart::sync ? sync_ns_ : ns_[static_cast<std::size_t>(p)];
  }
  [[nodiscard]] std::uint64_t timed_ns() const noexcept {
    std::uint64_t s = 0;
    for (std::size_t i = 0; i + 1 < token_part_count; ++i) s += part_ns(static_cast<TokenPart>(i));
    return s;
  }

  std::array<std::uint64_t, token_part_count> ns_{};
  std::uint64_t sync_ns_ = 0;  ///< written by the pool (its caller's waits)
  std::uint64_t total_ns_ = 0, tokens_ = 0;
  Clock::time_point token_start_{};
  moekit::ThreadPool* pool_ = nullptr;
};

}  // namespace moekit::engine
