#pragma once
// Helpers for predictor tests: a residency set behind a ResidencyView, router banks with chosen
// logits, and a PrefetchList with its own storage.

#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "moekit/core/prefetch_list.hpp"

namespace moekit::test {

/// Keys (at any precision) that count as resident.
struct ResidentSet {
  std::set<ExpertKey> keys;
  static bool fn(const void* self, ExpertKey k, Precision) noexcept {
    return static_cast<const ResidentSet*>(self)->keys.count(k) != 0;
  }
  [[nodiscard]] ResidencyView view() const noexcept { return ResidencyView(this, &fn); }
};

/// A PrefetchList that owns its buffer.
struct OwnedList {
  std::vector<Prefetch> buf = std::vector<Prefetch>(256);
  PrefetchList list{std::span<Prefetch>(buf)};
  [[nodiscard]] std::vector<Prefetch> items() const {
    auto s = list.items();
    return {s.begin(), s.end()};
  }
};

/// Routers [L × E × d] whose logits for the input x = e_0 (one-hot, d columns) are chosen:
/// column 0 of router row (l, e) holds `logit(l, e)`, the other columns random noise that e_0
/// does not see.
struct DesignedRouters {
  std::uint32_t L, E, d;
  std::vector<float> w;
  DesignedRouters(std::uint32_t L_, std::uint32_t E_, std::uint32_t d_, std::uint32_t seed = 7)
      : L(L_), E(E_), d(d_), w(std::size_t{L_} * E_ * d_) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& v : w) v = u(g);
    for (std::uint32_t l = 0; l < L; ++l)
      for (std::uint32_t e = 0; e < E; ++e) set(l, e, -30.0f);  // effectively never selected
  }
  void set(std::uint32_t l, std::uint32_t e, float logit) {
    w[(std::size_t{l} * E + e) * d] = logit;
  }
  /// Layer l routes x = e_0 to {(e, p)}: logits ln p for the listed experts.
  void route(std::uint32_t l, std::initializer_list<std::pair<std::uint32_t, float>> ps) {
    for (auto [e, p] : ps) set(l, e, std::log(p));
  }
  [[nodiscard]] std::vector<float> x() const {
    std::vector<float> v(d, 0.0f);
    v[0] = 1.0f;
    return v;
  }
};

}  // namespace moekit::test
