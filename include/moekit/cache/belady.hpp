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
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/cache/detail/dense_index.hpp"
#include "moekit/cache/detail/ranked_set.hpp"
#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
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
                     "offline cache policy: demand of expert (" + std::to_string(key.layer) + "," +
                         std::to_string(key.expert) +
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
  static constexpr std::string_view name = "belady";
  static constexpr bool needs_future = true;
  static constexpr Hooks hooks = Hook::bind;

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
    reschedule(
        key, a.prefetch ? future_.next_at_or_after(key, future_.position()) : future_.consume(key));
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
/// comment for what it guarantees). O(log n) per access; a victim costs O(classes + pinned · log
/// n).
///
/// Indexing: the keep score (j − now + 1) · freed / cost changes with `now`, but for residents
/// holding the same precision whose next demand wants the same precision (a *class*: freed and
/// cost are common) it only grows with j. So each (held, wanted) class keeps a heap on j, largest
/// first, and copies that can never serve again sit in one more set ordered by key; the victim is
/// the best of the classes' heads, searched exactly (a class heap is walked while its score, as
/// computed in doubles, can still tie or win; ties: smaller (layer, expert)).
class CostAwareBeladyPolicy {
 public:
  static constexpr std::string_view name = "cost-aware-belady";
  static constexpr bool needs_future = true;
  static constexpr Hooks hooks = Hook::bind;

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
    const std::uint32_t i = detail::dense_index(key, shape_.n_experts);
    place(i, held_[i], future_.consume(key));
  }
  void on_insert(ExpertKey key, const AccessInfo& a) {
    const std::uint32_t i = detail::dense_index(key, shape_.n_experts);
    place(i, a.precision,
          a.prefetch ? future_.next_at_or_after(key, future_.position()) : future_.consume(key));
  }
  void on_evict(ExpertKey key) noexcept {
    const std::uint32_t i = detail::dense_index(key, shape_.n_experts);
    if (class_[i] != none) classes_[class_[i]].erase(i);
    class_[i] = none;
  }

  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    const auto evictable = [&](std::uint32_t j) {
      return q.evictable(detail::dense_key(j, shape_.n_experts));
    };
    // A copy that cannot serve again scores +inf: the smallest evictable key of them wins.
    if (const auto d = classes_[dead].first(evictable))
      return detail::dense_key(*d, shape_.n_experts);
    std::optional<std::uint32_t> best;
    double best_s = 0.0;
    const double now = double(future_.position());
    for (std::uint32_t c = 0; c < dead; ++c) {
      const auto& set = classes_[c];
      if (set.size() == 0) continue;
      const double freed = double(shape_.expert_bytes(held_of(c)));
      const double cost = double(shape_.expert_bytes(wanted_of(c)));
      // Children have j <= their parent's, hence scores <= (rounding is monotone).
      set.walk([&](std::uint32_t i) {
        const double s = (double(next_[i]) - now + 1.0) * freed / cost;
        if (best && s < best_s) return false;
        if (!evictable(i)) return true;
        if (!best || s > best_s || i < *best) best = i, best_s = s;
        return true;
      });
    }
    if (!best) return std::nullopt;
    return detail::dense_key(*best, shape_.n_experts);
  }

 private:
  static constexpr std::uint32_t none = 0xffffffffu;
  static constexpr std::uint32_t dead = std::uint32_t(precision_slots * precision_slots);
  [[nodiscard]] static Precision held_of(std::uint32_t c) noexcept {
    return static_cast<Precision>(c / precision_slots);
  }
  [[nodiscard]] static Precision wanted_of(std::uint32_t c) noexcept {
    return static_cast<Precision>(c % precision_slots);
  }

  /// Records that `i` holds `held` and is next demanded at position `j`, and files it in its class.
  void place(std::uint32_t i, Precision held, std::uint64_t j) {
    held_[i] = held;
    next_[i] = j;
    std::uint32_t c = dead;
    if (j != detail::FutureIndex::never && satisfies(held, cfg_.future[j].precision))
      c = std::uint32_t(held) * precision_slots + std::uint32_t(cfg_.future[j].precision);
    if (class_[i] != none && class_[i] != c) classes_[class_[i]].erase(i);
    class_[i] = c;
    if (classes_[c].capacity() == 0) classes_[c].reset(shape_.expert_count());  // first use only
    classes_[c].update(i, Later{c == dead ? 0 : j});
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
    class_.assign(shape_.expert_count(), none);
    classes_.assign(dead + 1, {});
    classes_[dead].reset(shape_.expert_count());
  }

  Config cfg_{};
  ModelShape shape_{};
  bool bound_ = false;
  detail::FutureIndex future_;
  std::vector<std::uint64_t> next_;
  std::vector<Precision> held_;
  /// Heap rank inside a class: the later the next demand, the lower (first evicted); ties: smaller
  /// index. The dead set ranks every member equal, so it is ordered by index alone.
  struct Later {
    std::uint64_t next = 0;
    friend bool operator<(const Later& a, const Later& b) noexcept { return a.next > b.next; }
  };
  std::vector<std::uint32_t> class_;  ///< [expert] class of a resident, `none` if not resident
  std::vector<detail::RankedSet<Later>> classes_;  ///< [held · precision_slots + wanted], dead
};
static_assert(CachePolicy<CostAwareBeladyPolicy>);

}  // namespace moekit
