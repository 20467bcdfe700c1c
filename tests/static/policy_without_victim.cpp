// expect: moekit::CachePolicy: missing member `std::optional<ExpertKey> victim
// A cache policy that forgets `victim`: the pipeline must say so in words.
#include "moekit/io/memory_loader.hpp"
#include "moekit/presets.hpp"

struct NoVictim {
  void on_hit(moekit::ExpertKey, const moekit::AccessInfo&) {}
  void on_insert(moekit::ExpertKey, const moekit::AccessInfo&) {}
  void on_evict(moekit::ExpertKey) {}
};
using P = moekit::OffloadPipeline<moekit::UniformScorer, moekit::NoPredictor, NoVictim,
                                  moekit::MemoryLoader, moekit::OnDemandScheduler>;
P* instantiate = nullptr;
int main() { return sizeof(P) > 0 ? 0 : 1; }
