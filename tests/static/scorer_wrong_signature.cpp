// expect: moekit::Scorer: missing member `void score
#include "moekit/io/memory_loader.hpp"
#include "moekit/presets.hpp"

struct OldScorer {  // takes a single token's ids: not the Scorer interface
  void score(std::span<const std::uint32_t>, std::span<moekit::Precision>) {}
};
using P = moekit::OffloadPipeline<OldScorer, moekit::NoPredictor, moekit::LruPolicy,
                                  moekit::MemoryLoader, moekit::OnDemandScheduler>;
int main() { return sizeof(P) > 0 ? 0 : 1; }
