// expect: moekit::TokenPolicy: missing member `TokenVerdict end_token
#include "moekit/io/memory_loader.hpp"
#include "moekit/presets.hpp"

struct HalfPolicy {
  std::uint32_t active_top_k(const moekit::LayerContext&, std::uint32_t k) { return k; }
};
using P = moekit::OffloadPipeline<moekit::UniformScorer, moekit::NoPredictor, moekit::LruPolicy,
                                  moekit::MemoryLoader, moekit::OnDemandScheduler, HalfPolicy>;
int main() { return sizeof(P) > 0 ? 0 : 1; }
