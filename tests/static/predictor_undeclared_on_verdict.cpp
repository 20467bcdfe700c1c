// expect: moekit::Hooks: the component defines on_verdict but does not declare it
// A predictor whose on_verdict is not declared: the pipeline would never call it after a fallback.
#include "moekit/io/memory_loader.hpp"
#include "moekit/presets.hpp"

struct Forgetful {
  void observe(const moekit::LayerContext&, const moekit::GateView&) {}
  void predict(const moekit::LayerContext&, const moekit::GateView&, const moekit::ResidencyView&,
               moekit::PrefetchList&) {}
  void on_verdict(moekit::TokenVerdict, moekit::PrefetchList&) {}
};
using P = moekit::OffloadPipeline<moekit::UniformScorer, Forgetful, moekit::LruPolicy,
                                  moekit::MemoryLoader, moekit::OnDemandScheduler>;
int main() { return sizeof(P) > 0 ? 0 : 1; }
