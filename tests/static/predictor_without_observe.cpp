// expect: moekit::Predictor: missing member `void observe
#include "moekit/io/memory_loader.hpp"
#include "moekit/presets.hpp"

struct Blind {
  void predict(const moekit::LayerContext&, const moekit::GateView&, const moekit::ResidencyView&,
               moekit::PrefetchList&) {}
};
using P = moekit::OffloadPipeline<moekit::UniformScorer, Blind, moekit::LruPolicy,
                                  moekit::MemoryLoader, moekit::OnDemandScheduler>;
int main() { return sizeof(P) > 0 ? 0 : 1; }
