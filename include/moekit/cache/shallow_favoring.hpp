#pragma once
/// \file ShallowFavoring<Inner>: Fate's per-layer cache budget, first layers cached in full.
///
/// Fate (Fang et al., "Fate: Fast Edge Inference of Mixture-of-Experts Models via Cross-Layer
/// Gate", 2025, §4.4, M4a/M4b) predicts the experts of shallow layers worst, so it caches them
/// completely: with cache_total = floor(budget / bytes(sizing)) expert slots, the first L layers
/// get all E experts while memory allows (filled in order when cache_total <= L·E), and the
/// remaining layers share floor((cache_total − L·E)/(layers − L)) slots each; leftover slots go one
/// each to the shallowest deep layers (moekit's choice for the floor remainder). Every layer is its
/// own pool (`pool_of` = layer), managed by `Inner`; if `Inner` declares
/// `set_layer_capacities(span)` it is told the slot counts (ArcPolicy needs them).
/// `ShallowFavoring<ArcPolicy>` is Fate's cache. Inner's other hooks are forwarded; its own pools
/// (`pool_capacities`, `pool_of`) are replaced.

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/cache/arc.hpp"
#include "moekit/core/cache_events.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/model_shape.hpp"

namespace moekit {

/// Fate's shallow-favoring allocation: slots per layer for `cache_total` slots, `n_experts` per
/// layer, `n_layers` layers, the first `shallow` of them favoured. Σ result <= cache_total and
/// every entry <= n_experts.
[[nodiscard]] inline std::vector<std::uint32_t> shallow_favoring_allocation(std::size_t cache_total,
                                                                            std::uint32_t n_experts,
                                                                            std::uint32_t n_layers,
                                                                            std::uint32_t shallow) {
  std::vector<std::uint32_t> cap(n_layers, 0);
  const std::uint32_t L = std::min(shallow, n_layers);
  if (cache_total <= std::size_t{L} * n_experts) {  // memory limited: fill shallow layers in order
    std::size_t rem = cache_total;
    for (std::uint32_t l = 0; l < L; ++l) {
      cap[l] = static_cast<std::uint32_t>(std::min<std::size_t>(n_experts, rem));
      rem -= cap[l];
    }
    return cap;
  }
  for (std::uint32_t l = 0; l < L; ++l) cap[l] = n_experts;
  if (n_layers == L) return cap;
  const std::size_t extra = cache_total - std::size_t{L} * n_experts;
  const std::size_t deep = extra / (n_layers - L);
  std::size_t used = 0;
  for (std::uint32_t l = L; l < n_layers; ++l) {
    cap[l] = static_cast<std::uint32_t>(std::min<std::size_t>(n_experts, deep));
    used += cap[l];
  }
  std::size_t r = extra - used;
  for (std::uint32_t l = L; l < n_layers && r > 0; ++l)
    if (cap[l] < n_experts) ++cap[l], --r;
  return cap;
}

namespace detail {
/// "shallow-" and the inner policy's name ("shallow-arc"), as one constant string; an inner
/// policy without a `name` gives "shallow-favoring".
template <class Inner>
struct ShallowFavoringName {
  static constexpr std::string_view prefix = "shallow-";
  static constexpr std::string_view inner = [] {
    if constexpr (requires { std::string_view(Inner::name); })
      return std::string_view(Inner::name);
    else
      return std::string_view("favoring");
  }();
  static constexpr std::array<char, prefix.size() + inner.size()> chars = [] {
    std::array<char, prefix.size() + inner.size()> a{};
    std::copy(prefix.begin(), prefix.end(), a.begin());
    std::copy(inner.begin(), inner.end(), a.begin() + prefix.size());
    return a;
  }();
  static constexpr std::string_view value{chars.data(), chars.size()};
};
}  // namespace detail

/// Per-layer pools sized by Fate's shallow-favoring allocation, each managed by `Inner`.
template <class Inner = ArcPolicy>
class ShallowFavoring {
  static_assert(assert_cache_policy<Inner>());

 public:
  static constexpr std::string_view name = detail::ShallowFavoringName<Inner>::value;
  using wrapped_component = Inner;
  /// Inner's pools are replaced and its slot counts set here, not forwarded.
  static constexpr Hooks consumed_hooks =
      Hook::pool_capacities | Hook::pool_of | Hook::set_layer_capacities;
  /// Its own pools, and every hook it forwards (a no-op when Inner does not declare it).
  static constexpr Hooks hooks = Hook::bind | Hook::pool_capacities | Hook::pool_of |
                                 Hook::begin_sequence | Hook::begin_token | Hook::prepare_insert;
  /// Run-time knobs.
  struct Config {
    std::uint32_t shallow_layers = 3;  ///< L: layers cached in full (Fate: 3 for Qwen1.5-MoE)
  };

  ShallowFavoring() = default;
  explicit ShallowFavoring(Config cfg, Inner inner = Inner{})
      : cfg_(cfg), inner_(std::move(inner)) {}

  void bind(const ModelShape& shape) {
    if constexpr (declares<Inner>(Hook::bind)) inner_.bind(shape);
  }
  std::vector<std::size_t> pool_capacities(const ModelShape& shape, std::size_t budget,
                                           Precision sizing) {
    const std::size_t bytes = shape.expert_bytes(sizing);
    slots_ = shallow_favoring_allocation(budget / bytes, shape.n_experts, shape.n_layers,
                                         cfg_.shallow_layers);
    if constexpr (declares<Inner>(Hook::set_layer_capacities))
      inner_.set_layer_capacities(std::span<const std::uint32_t>(slots_));
    std::vector<std::size_t> caps(slots_.size());
    for (std::size_t l = 0; l < slots_.size(); ++l) caps[l] = slots_[l] * bytes;
    return caps;
  }
  [[nodiscard]] std::uint32_t pool_of(ExpertKey key, Precision) const noexcept { return key.layer; }

  void begin_sequence() {
    if constexpr (declares<Inner>(Hook::begin_sequence)) inner_.begin_sequence();
  }
  void begin_token(std::uint32_t n) {
    if constexpr (declares<Inner>(Hook::begin_token)) inner_.begin_token(n);
  }
  void on_hit(ExpertKey key, const AccessInfo& a) { inner_.on_hit(key, a); }
  void on_insert(ExpertKey key, const AccessInfo& a) { inner_.on_insert(key, a); }
  void prepare_insert(ExpertKey key, const AccessInfo& a) {
    if constexpr (declares<Inner>(Hook::prepare_insert)) inner_.prepare_insert(key, a);
  }
  void on_evict(ExpertKey key) { inner_.on_evict(key); }
  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) { return inner_.victim(q); }

  /// Slots per layer of the last allocation.
  [[nodiscard]] const std::vector<std::uint32_t>& layer_slots() const noexcept { return slots_; }
  [[nodiscard]] Inner& inner() noexcept { return inner_; }
  [[nodiscard]] const Inner& inner() const noexcept { return inner_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

 private:
  Config cfg_{};
  Inner inner_{};
  std::vector<std::uint32_t> slots_;
};

/// Fate's cache: shallow-favoring per-layer budgets, ARC in each layer.
using ShallowFavoringArcPolicy = ShallowFavoring<ArcPolicy>;
static_assert(CachePolicy<ShallowFavoringArcPolicy>);

}  // namespace moekit
