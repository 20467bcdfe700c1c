// expect: moekit::Hooks: the wrapper does not forward prepare_insert, which its wrapped component
// declares A wrapper around ArcPolicy that forwards bind but forgets prepare_insert (ARC would then
// adapt on prefetches): it must not compile.
#include "moekit/cache/arc.hpp"
#include "moekit/cache/expert_cache.hpp"

struct CountingArc {
  using wrapped_component = moekit::ArcPolicy;
  static constexpr moekit::Hooks consumed_hooks =
      moekit::Hook::pool_capacities | moekit::Hook::pool_of | moekit::Hook::set_layer_capacities;
  static constexpr moekit::Hooks hooks = moekit::Hook::bind;
  void bind(const moekit::ModelShape& s) { inner.bind(s); }
  void on_hit(moekit::ExpertKey k, const moekit::AccessInfo& a) { ++hits, inner.on_hit(k, a); }
  void on_insert(moekit::ExpertKey k, const moekit::AccessInfo& a) { inner.on_insert(k, a); }
  void on_evict(moekit::ExpertKey k) { inner.on_evict(k); }
  std::optional<moekit::ExpertKey> victim(const moekit::EvictionQuery& q) {
    return inner.victim(q);
  }
  moekit::ArcPolicy inner;
  int hits = 0;
};
using C = moekit::ExpertCache<CountingArc>;
int main() { return sizeof(C) > 0 ? 0 : 1; }
