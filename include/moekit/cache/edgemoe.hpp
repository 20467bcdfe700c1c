#pragma once
/// \file EdgeMoePolicy: EdgeMoE's frequency / layer-distance eviction score.
///
/// EdgeMoE (Yi et al., "EdgeMoE: Empowering Sparse Large Language Models on Mobile Devices",
/// 2023/2025, §III-C2) evicts the resident expert j of layer i with the highest score
///
///   L_{i,j} = − f_{i,j} / ((S − i + I) mod S)
///
/// where f is the expert's activation frequency, S the number of MoE layers and I the layer being
/// computed: rarely used experts and experts of far layers go first. As printed, the denominator
/// counts layers *since* layer i ran, which protects the layer just computed and exposes the next
/// one, the opposite of the paper's stated intent ("an expert in a layer that is going to be
/// executed soon shall be endowed with a higher score for not being evicted"). moekit offers both:
/// `EdgeMoeDistance::forward` (default) uses d = (i − I) mod S, the layers until layer i runs
/// again; `as_printed` uses d = (I − i) mod S. **i == I** (d = 0, a division by zero as printed):
/// the current layer's experts that are not in use are next needed one full pass later, so d := S.
/// f = online uses (token-uses since the policy was created, never reset: EdgeMoE keeps counts
/// across inferences) + prior_weight × the expert's share of its layer in an optional offline
/// profile. Ties: larger d, then least recently used, then larger (layer, expert).

#include <cstdint>
#include <limits>
#include <optional>
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

/// Which layer distance EdgeMoE's score divides by.
enum class EdgeMoeDistance : std::uint8_t {
  forward,     ///< (i − I) mod S: layers until layer i runs again (the paper's intent)
  as_printed,  ///< (I − i) mod S: the formula as printed
};

/// EdgeMoE's eviction score.
class EdgeMoePolicy {
 public:
  static constexpr std::string_view name = "edgemoe";
  static constexpr Hooks hooks = Hook::bind;
  /// Run-time knobs.
  struct Config {
    EdgeMoeDistance distance = EdgeMoeDistance::forward;
    /// Optional offline profile: activation counts per (layer, expert), row-major
    /// [n_layers × n_experts]; empty = no prior.
    std::vector<double> prior_counts{};
    double prior_weight = 100.0;  ///< pseudo-uses the profile is worth (w0)
  };

  EdgeMoePolicy() = default;
  explicit EdgeMoePolicy(Config cfg) : cfg_(std::move(cfg)) {}

  void bind(const ModelShape& shape) {
    n_experts_ = shape.n_experts;
    n_layers_ = shape.n_layers;
    freq_.assign(shape.expert_count(), 0.0);
    last_tick_.assign(shape.expert_count(), 0);
    ranked_.assign(n_layers_, {});
    for (auto& r : ranked_) r.reset(n_experts_);
    bound_.assign(n_layers_, 0.0);
    min_f_.assign(n_layers_, std::numeric_limits<double>::infinity());
    if (cfg_.prior_counts.empty()) return;
    MOEKIT_EXPECTS(cfg_.prior_counts.size() == shape.expert_count(),
                   "EdgeMoePolicy::Config.prior_counts must hold n_layers × n_experts counts");
    MOEKIT_EXPECTS(cfg_.prior_weight >= 0.0, "EdgeMoePolicy::Config.prior_weight must be >= 0");
    for (std::uint32_t l = 0; l < shape.n_layers; ++l) {
      double sum = 0.0;
      for (std::uint32_t e = 0; e < n_experts_; ++e) {
        const double c = cfg_.prior_counts[l * n_experts_ + e];
        MOEKIT_EXPECTS(c >= 0.0, "EdgeMoePolicy::Config.prior_counts must be >= 0");
        sum += c;
      }
      if (sum <= 0.0) continue;
      for (std::uint32_t e = 0; e < n_experts_; ++e)
        freq_[l * n_experts_ + e] = cfg_.prior_weight * cfg_.prior_counts[l * n_experts_ + e] / sum;
    }
  }

  void on_hit(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    freq_[i] += a.n_tokens;
    last_tick_[i] = a.tick;
    rerank(key);
  }
  /// A prefetch landing is not an activation; a demand insertion is.
  void on_insert(ExpertKey key, const AccessInfo& a) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    if (!a.prefetch) freq_[i] += a.n_tokens;
    last_tick_[i] = a.tick;
    rerank(key);
  }
  void on_evict(ExpertKey key) noexcept {
    ranked_[key.layer].erase(key.expert);
    sync_min(key.layer);
  }

  /// Inside one layer d is common, so the highest score is the lowest f: each layer keeps its
  /// residents ordered by (f, recency, larger id first), and a layer's lowest f bounds its scores.
  /// The layer with the best bound is searched first; another layer is searched only when its
  /// bound is not below the best score found, so a victim usually costs one pass over the layers'
  /// bounds and O(1 + pinned) heap entries. Inside a layer the heap is walked while the score (as
  /// computed, in doubles) can still tie or win, so the documented tie order holds even when two
  /// different f round to the same score.
  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const noexcept {
    Best best;
    std::uint32_t first = n_layers_;
    double first_bound = 0.0;
    const std::uint32_t S = n_layers_, cur = q.layer % S;
    const bool forward = cfg_.distance == EdgeMoeDistance::forward;
    // d of layer 0, then stepped per layer (no modulo): forward grows, as printed shrinks.
    std::uint32_t r = forward ? (S - cur) % S : cur;
    double second_bound = -std::numeric_limits<double>::infinity();
    for (std::uint32_t l = 0; l < S; ++l) {
      const double b = -min_f_[l] / double(r == 0 ? S : r);  // -inf for an empty layer
      bound_[l] = b;
      if (first == S || b > first_bound) {
        if (first != S) second_bound = first_bound;
        first = l, first_bound = b;
      } else if (b > second_bound) {
        second_bound = b;
      }
      r = forward ? (r + 1 == S ? 0 : r + 1) : (r == 0 ? S - 1 : r - 1);
    }
    if (first == S || min_f_[first] == std::numeric_limits<double>::infinity()) return std::nullopt;
    search_layer(q, first, best);
    if (best.key && best.s > second_bound) return best.key;  // no other layer can tie or win
    for (std::uint32_t l = 0; l < S; ++l) {
      if (l == first || min_f_[l] == std::numeric_limits<double>::infinity() ||
          (best.key && bound_[l] < best.s))
        continue;
      search_layer(q, l, best);
    }
    return best.key;
  }

  /// The distance d in the score's denominator, in [1, S].
  [[nodiscard]] std::uint32_t distance(std::uint32_t layer, std::uint32_t current) const noexcept {
    const std::uint32_t S = n_layers_;
    const std::uint32_t d = cfg_.distance == EdgeMoeDistance::forward
                                ? (layer % S + S - current % S) % S
                                : (current % S + S - layer % S) % S;
    return d == 0 ? S : d;
  }
  /// EdgeMoE's score of `key` while `current` runs (higher = evicted first).
  [[nodiscard]] double score(ExpertKey key, std::uint32_t current) const noexcept {
    return -freq_[detail::dense_index(key, n_experts_)] / double(distance(key.layer, current));
  }
  [[nodiscard]] double frequency(ExpertKey key) const noexcept {
    return freq_[detail::dense_index(key, n_experts_)];
  }

 private:
  Config cfg_{};
  std::uint32_t n_experts_ = 0;
  std::uint32_t n_layers_ = 1;
  std::vector<double> freq_;
  std::vector<std::uint64_t> last_tick_;
  /// Rank inside a layer: lower f first, then least recently used, then larger expert id.
  struct Rank {
    double f;
    std::uint64_t tick;
    std::uint32_t inverse_id;
    friend bool operator<(const Rank& a, const Rank& b) noexcept {
      if (a.f != b.f) return a.f < b.f;
      if (a.tick != b.tick) return a.tick < b.tick;
      return a.inverse_id < b.inverse_id;
    }
  };
  std::vector<detail::RankedSet<Rank>> ranked_;  ///< per layer, indexed by expert
  mutable std::vector<double> bound_;  ///< victim's scratch: [layer] best score of the layer
  /// [layer] lowest f of its heap, +inf if empty: the victim's first pass reads this contiguous
  /// array instead of chasing every heap's storage.
  std::vector<double> min_f_;

  /// The best victim so far: highest score, then larger d, least recently used, larger key.
  struct Best {
    std::optional<ExpertKey> key;
    double s = 0.0;
    std::uint32_t d = 0;
    std::uint64_t tick = 0;
  };
  /// Offers every evictable entry of layer `l` that may beat or tie `best`.
  void search_layer(const EvictionQuery& q, std::uint32_t l, Best& best) const noexcept {
    const auto& heap = ranked_[l];
    const std::uint32_t d = distance(l, q.layer);
    heap.walk([&](std::uint32_t e) {
      // Children have f >= their parent's, hence scores <= (rounding is monotone).
      const double s = -heap.rank(e).f / double(d);
      if (best.key && s < best.s) return false;
      const ExpertKey k{l, e};
      if (!q.evictable(k)) return true;
      const std::uint64_t t = last_tick_[detail::dense_index(k, n_experts_)];
      if (!best.key || s > best.s ||
          (d > best.d || (d == best.d && (t < best.tick || (t == best.tick && k > *best.key))))) {
        best = {k, s, d, t};
      }
      return true;
    });
  }

  void rerank(ExpertKey key) noexcept {
    const std::uint32_t i = detail::dense_index(key, n_experts_);
    ranked_[key.layer].update(key.expert, Rank{freq_[i], last_tick_[i], ~key.expert});
    sync_min(key.layer);
  }
  /// Mirrors a layer heap's lowest f into `min_f_` (+inf when empty).
  void sync_min(std::uint32_t l) noexcept {
    const auto& heap = ranked_[l];
    min_f_[l] = heap.size() == 0 ? std::numeric_limits<double>::infinity() : heap.min_rank().f;
  }
};
static_assert(CachePolicy<EdgeMoePolicy>);

}  // namespace moekit
