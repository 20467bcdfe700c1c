// Consumer of an installed moekit: a user-defined FIFO policy combined with library parts.
#include <moekit/moekit.hpp>

#include <cstdio>
#include <deque>
#include <vector>

struct FifoPolicy {  // evicts in insertion order
  std::deque<moekit::ExpertKey> order;
  void on_hit(moekit::ExpertKey, const moekit::AccessInfo&) {}
  void on_insert(moekit::ExpertKey k, const moekit::AccessInfo&) { order.push_back(k); }
  void on_evict(moekit::ExpertKey k) { std::erase(order, k); }
  std::optional<moekit::ExpertKey> victim(const moekit::EvictionQuery& q) const {
    for (auto k : order)
      if (q.evictable(k)) return k;
    return std::nullopt;
  }
};

int main() {
  constexpr moekit::ModelShape shape{
      .n_layers = 2, .n_experts = 4, .top_k = 1, .hidden = 32, .ffn = 32};
  std::vector<std::byte> host(shape.expert_bytes(moekit::Precision::f16));
  moekit::MemoryLoader loader(
      [&](moekit::ExpertKey, moekit::Precision) { return std::span<const std::byte>(host); });
  moekit::OffloadPipeline<moekit::UniformScorer, moekit::NoPredictor, FifoPolicy,
                          moekit::MemoryLoader, moekit::OnDemandScheduler>
      p(shape, {.expert_budget_bytes = 2 * host.size()}, std::move(loader));
  const std::uint32_t route[] = {0, 1, 0, 2, 0};  // FIFO evicts 0 at the 4th access, LRU would not
  const float w = 1.0f;
  for (std::uint32_t t = 0; t < 5; ++t) {
    moekit::GateView g{
        .n_tokens = 1, .k = 1, .n_experts = 4, .experts = {&route[t], 1}, .weights = {&w, 1}};
    const moekit::LayerContext c{0, 2, t, moekit::Phase::decode, 0, 1};
    p.resolve(p.route(c, g));
    p.end_layer(c);
  }
  const auto s = p.stats();
  std::printf("consumer: hits=%llu misses=%llu\n", (unsigned long long)s.hits,
              (unsigned long long)s.misses);
  return (s.hits == 1 && s.misses == 4) ? 0 : 1;  // 0 hit once (t=2); evicted at t=3 by FIFO
}
