#pragma once
/// \file BeladyPolicy and CostAwareBeladyPolicy: offline references that know the future.
///
/// Belady ("A study of replacement algorithms for a virtual-storage computer", IBM Systems Journal
/// 5(2), 1966; optimality for unit cost: Mattson et al., 1970) evicts the resident whose next use
/// is farthest in the future; with equal sizes and unit miss cost no policy misses less on the same
/// sequence. Both policies are fed the demand sequence of the whole run (`needs_future = true`).
/// Every demand access (a hit, or the insertion that serves a miss) consumes the next entry; an
/// access whose key differs from the next entry skips forward to that key's next occurrence (the
/// skipped entries were demands the cache did not record, e.g. failed insertions); an access with
/// no further occurrence throws. A prefetch insertion consumes nothing.
///
/// CostAwareBeladyPolicy is the mixed-precision reference: HOBBIT's miss penalty weighs a miss by
/// the bytes it loads (B_l/B_h for a low-precision miss). It evicts first a copy that can never
/// serve again (no next use, or its next request wants more bits than it holds, which replaces
/// it), else the copy with the largest (next-use distance) × (bytes it frees) / (bytes its next
/// miss would load). What it guarantees: with one precision it makes exactly Belady's choices
/// (optimal miss count), and it never keeps a dead copy while evicting a live one. What it does
/// NOT guarantee: optimal penalty with mixed sizes and costs (offline caching with sizes and costs
/// is NP-hard; this is a greedy rule), and it never bypasses the cache; so its penalty is a
/// strong reference, not a lower bound: an online policy can in principle beat it.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "moekit/cache/detail/ranked_set.hpp"
#include "moekit/cache/detail/resident_set.hpp"
#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/error.hpp"

namespace moekit {

/// One demand of the future sequence for the cost-aware reference.
struct FutureAccess {
  ExpertKey key{};
  Precision precision = Precision::f16;
};

namespace detail {

/// Positions of each expert's demands in a future sequence, and a cursor into it.
class FutureIndex {
 public:
  static constexpr std::uint64_t never = std::numeric_limits<std::uint64_t>::max();

  void build(std::span<const ExpertKey> future, const ModelShape& shape) {
    n_experts_ = shape.n_experts;
    keys_.assign(future.begin(), future.end());
    next_.assign(keys_.size(), never);
    positions_.assign(shape.expert_count(), {});
    std::vector<std::uint64_t> last(shape.expert_count(), never);
    for (std::size_t i = keys_.size(); i-- > 0;) {
      MOEKIT_EXPECTS(shape.contains(keys_[i]), "future access " + std::to_string(i) +
                                                   " names an expert outside the model shape");
      const std::uint32_t k = dense_index(keys_[i], n_experts_);
      next_[i] = last[k];
      last[k] = i;
    }
    for (std::size_t i = 0; i < keys_.size(); ++i)
      positions_[dense_index(keys_[i], n_experts_)].push_back(i);
    pos_ = 0;
  }

  /// Consumes the demand of `key`; returns the position of its following demand (or `never`).
  std::uint64_t consume(ExpertKey key) {
    if (pos_ >= keys_.size() || keys_[pos_] != key) {
      const std::uint64_t at = next_at_or_after(key, pos_);
      if (at == never)
        detail::fail(ErrorKind::invalid_argument,
                     "offline cache policy: demand of expert (" + std::to_string(key.layer) +
                         "," + std::to_string(key.expert) +
                         ") is not in the rest of the future sequence it was given");
      pos_ = at;
    }
    return next_[pos_++];
  }
  /// First demand of `key` at position >= `from` (O(log n)).
  [[nodiscard]] std::uint64_t next_at_or_after(ExpertKey key, std::uint64_t from) const noexcept {
    const auto& v = positions_[dense_index(key, n_experts_)];
    const auto it = std::lower_bound(v.begin(), v.end(), from);
    return it == v.end() ? never : *it;
  }
  [[nodiscard]] std::uint64_t position() const noexcept { return pos_; }
  [[nodiscard]] std::size_t size() const noexcept { return keys_.size(); }

 private:
  std::uint32_t n_experts_ = 1;
  std::vector<ExpertKey> keys_;
  std::vector<std::uint64_t> next_;
  std::vector<std::vector<std::uint64_t>> positions_;
  std::uint64_t pos_ = 0;
};

}  // namespace detail

/// Belady's offline optimal eviction (unit cost). O(log n) per access and per eviction.
class BeladyPolicy {
 public:
  static constexpr bool needs_future = true;

  /// Run-time knobs.
  struct Config {
    std::vector<ExpertKey> future{};  ///< the demand sequence, in access order
  };

  BeladyPolicy() = default;
  explicit BeladyPolicy(Config cfg) : cfg_(std::move(cfg)) {}

  void bind(const ModelShape& shape) {
    shape_ = shape;
    bound_ = true;
    rebuild();
  }
  /// Replaces the future (before the first access of the run it describes).
  void set_future(std::span<const ExpertKey> future) {
    cfg_.future.assign(future.begin(), future.end());
    if (bound_) rebuild();
  }

  void on_hit(ExpertKey key, const AccessInfo&) { reschedule(key, future_.consume(key)); }
  void on_insert(ExpertKey key, const AccessInfo& a) {
    reschedule(key, a.prefetch ? future_.next_at_or_after(key, future_.position())
                               : future_.consume(key));
  }
  void on_evict(ExpertKey key) noexcept {
    const std::uint32_t i = detail::dense_index(key, shape_.n_experts);
    order_.erase(i);
    next_use_[i] = unset;
  }
  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    const auto i = order_.first(
        [&](std::uint32_t j) { return q.evictable(detail::dense_key(j, shape_.n_experts)); });
    if (!i) return std::nullopt;
    return detail::dense_key(*i, shape_.n_experts);
  }

  /// Position of the next demand of a resident `key` (`FutureIndex::never` if none).
  [[nodiscard]] std::uint64_t next_use(ExpertKey key) const noexcept {
    return next_use_[detail::dense_index(key, shape_.n_experts)];
  }

 private:
  static constexpr std::uint64_t unset = std::numeric_limits<std::uint64_t>::max() - 1;

  void rebuild() {
    future_.build(cfg_.future, shape_);
    next_use_.assign(shape_.expert_count(), unset);
    order_.reset(shape_.expert_count());
  }
  void reschedule(ExpertKey key, std::uint64_t next) {
    const std::uint32_t i = detail::dense_index(key, shape_.n_experts);
    next_use_[i] = next;
    order_.update(i, Farther{next});
  }

  Config cfg_{};
  ModelShape shape_{};
  bool bound_ = false;
  detail::FutureIndex future_;
  std::vector<std::uint64_t> next_use_;
  /// Heap rank: the farther the next use, the lower (first evicted); ties: smaller index.
  struct Farther {
    std::uint64_t next = 0;
    friend bool operator<(const Farther& a, const Farther& b) noexcept { return a.next > b.next; }
  };
  detail::RankedSet<Farther> order_;
};
static_assert(CachePolicy<BeladyPolicy>);

/// Offline reference for mixed precision: misses weighted by the bytes they load (see the file
/// comment for what it guarantees). O(log n) per access, O(residents) per eviction.
class CostAwareBeladyPolicy {
 public:
  static constexpr bool needs_future = true;

  /// Run-time knobs.
  struct Config {
    std::vector<FutureAccess> future{};  ///< the demand sequence with requested precisions
  };

  CostAwareBeladyPolicy() = default;
  explicit CostAwareBeladyPolicy(Config cfg) : cfg_(std::move(cfg)) {}

  void bind(const ModelShape& shape) {
    shape_ = shape;
    bound_ = true;
    rebuild();
  }
  void set_future(std::span<const FutureAccess> future) {
    cfg_.future.assign(future.begin(), future.end());
    if (bound_) rebuild();
  }

  void on_hit(ExpertKey key, const AccessInfo&) {
    next_[detail::dense_index(key, shape_.n_experts)] = future_.consume(key);
  }
  void on_insert(ExpertKey key, const AccessInfo& a) {
    const std::uint32_t i = detail::dense_index(key, shape_.n_experts);
    residents_.insert(i);
    held_[i] = a.precision;
    next_[i] = a.prefetch ? future_.next_at_or_after(key, future_.position())
                          : future_.consume(key);
  }
  void on_evict(ExpertKey key) noexcept {
    residents_.erase(detail::dense_index(key, shape_.n_experts));
  }

  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    std::optional<ExpertKey> best;
    double best_s = -1.0;
    const double now = double(future_.position());
    for (const std::uint32_t i : residents_.items()) {
      const ExpertKey k = detail::dense_key(i, shape_.n_experts);
      if (!q.evictable(k)) continue;
      const double s = keep_score(i, now);
      if (!best || s > best_s || (s == best_s && k < *best)) {
        best = k;
        best_s = s;
      }
    }
    return best;
  }

 private:
  /// Higher = evict first; +inf for a copy that cannot serve again.
  [[nodiscard]] double keep_score(std::uint32_t i, double now) const noexcept {
    const std::uint64_t j = next_[i];
    if (j == detail::FutureIndex::never) return std::numeric_limits<double>::infinity();
    const Precision want = cfg_.future[j].precision;
    if (!satisfies(held_[i], want)) return std::numeric_limits<double>::infinity();
    const double freed = double(shape_.expert_bytes(held_[i]));
    const double cost = double(shape_.expert_bytes(want));
    return (double(j) - now + 1.0) * freed / cost;
  }
  void rebuild() {
    std::vector<ExpertKey> keys(cfg_.future.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      MOEKIT_EXPECTS(cfg_.future[i].precision != Precision::skip,
                     "CostAwareBeladyPolicy: future access " + std::to_string(i) +
                         " has precision skip (a skip is not a demand)");
      keys[i] = cfg_.future[i].key;
    }
    future_.build(keys, shape_);
    next_.assign(shape_.expert_count(), detail::FutureIndex::never);
    held_.assign(shape_.expert_count(), Precision::skip);
    residents_.reset(shape_.expert_count());
  }

  Config cfg_{};
  ModelShape shape_{};
  bool bound_ = false;
  detail::FutureIndex future_;
  std::vector<std::uint64_t> next_;
  std::vector<Precision> held_;
  detail::ResidentSet residents_;
};
static_assert(CachePolicy<CostAwareBeladyPolicy>);

}  // namespace moekit
