// A user-defined cache policy and predictor, combined with library parts in one pipeline type.
#include <moekit/moekit.hpp>

#include <cstdio>
#include <vector>

using namespace moekit;

struct LowestLayerFirst {  // evict the resident expert of the shallowest layer (ties: lowest id)
  std::vector<ExpertKey> resident;
  static constexpr Hooks hooks = Hook::bind;  // optional calls it wants (core/hooks.hpp)
  void bind(const ModelShape& s) { resident.reserve(s.expert_count()); }
  void on_hit(ExpertKey, const AccessInfo&) {}
  void on_insert(ExpertKey k, const AccessInfo&) { resident.push_back(k); }
  void on_evict(ExpertKey k) { std::erase(resident, k); }
  std::optional<ExpertKey> victim(const EvictionQuery& q) const {
    std::optional<ExpertKey> best;
    for (ExpertKey k : resident)
      if (q.evictable(k) && (!best || k < *best)) best = k;
    return best;
  }
};

struct SameExpertNextLayer {  // guess: the next layer routes to the same experts
  void observe(const LayerContext&, const GateView&) {}
  void predict(const LayerContext& c, const GateView& g, const ResidencyView&, PrefetchList& out) {
    if (c.layer + 1 < c.n_layers)
      for (std::uint32_t e : g.token(0).experts)
        out.push({{c.layer + 1, e}, Precision::q8, 0.5f, 1});
  }
};

int main() {
  constexpr ModelShape shape{.n_layers = 4, .n_experts = 8, .top_k = 2, .hidden = 64, .ffn = 128};
  std::vector<std::byte> host(shape.expert_bytes(Precision::f16));
  MemoryLoader loader([&](ExpertKey, Precision p) {
    return std::span<const std::byte>(host).first(shape.expert_bytes(p));
  });
  OffloadPipeline<UniformScorer, SameExpertNextLayer, LowestLayerFirst, MemoryLoader,
                  OnDemandScheduler>
      p(shape, {.expert_budget_bytes = 6 * host.size()}, std::move(loader),
        UniformScorer({.precision = Precision::q8}));
  const std::uint32_t ids[] = {1, 5};
  const float w[] = {0.7f, 0.3f};
  for (std::uint32_t l = 0; l < shape.n_layers; ++l) {  // every layer routes to experts 1 and 5
    const LayerContext c{l, shape.n_layers, 0, Phase::decode, 0, 1};
    // One layer call: routed, resolved, and ended when the LayerCall goes out of scope.
    (void)p.layer(c, GateView{.n_tokens = 1, .k = 2, .n_experts = 8, .experts = ids, .weights = w})
        .resolve();
  }
  const PipelineStats s = p.stats();
  std::printf("hits %llu, misses %llu, prefetch precision %.2f recall %.2f\n",
              (unsigned long long)s.hits, (unsigned long long)s.misses, s.prediction[1].precision(),
              s.prediction[1].recall());
  const bool ok = s.hits == 6 && s.misses == 2 && s.prediction[1].recall() == 1.0;
  std::puts(ok ? "custom_policy: ok" : "custom_policy: unexpected result");
  return ok ? 0 : 1;
}
