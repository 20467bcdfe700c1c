#pragma once
/// \file ForwardingPipeline: the base of the engine's pipeline wrappers (LayerClock, RouteRecorder,
/// TracingPipeline), which watch what a Model does with its pipeline. It forwards every call Model
/// and MoeLayer make on a pipeline to the wrapped one; a wrapper derives from it and hides, with a
/// member of the same name, only the calls it observes (Model<Wrapper> calls the wrapper's by
/// name: nothing is virtual). The queries a pipeline may lack (`planned_experts`, `stats`, ...)
/// exist exactly when the wrapped pipeline has them, so `Model<Wrapper>` runs as `Model<P>`.

#include <cstddef>
#include <cstdint>
#include <span>

#include "moekit/core/gate_view.hpp"
#include "moekit/core/layer_context.hpp"
#include "moekit/core/plan.hpp"

namespace moekit::engine {

template <class Pipeline>
class ForwardingPipeline {
 public:
  explicit ForwardingPipeline(Pipeline& inner) noexcept : inner_(inner) {}

  void begin_sequence() { inner_.begin_sequence(); }
  [[nodiscard]] std::uint32_t active_top_k(const moekit::LayerContext& ctx) {
    return inner_.active_top_k(ctx);
  }
  [[nodiscard]] decltype(auto) planned_experts(const moekit::LayerContext& ctx) const requires
      requires(const Pipeline& p, const moekit::LayerContext& c) {
    p.planned_experts(c);
  }
  { return inner_.planned_experts(ctx); }
  decltype(auto) route(const moekit::LayerContext& ctx, const moekit::GateView& gate) {
    return inner_.route(ctx, gate);
  }
  decltype(auto) resolve(const moekit::LayerPlan& plan) { return inner_.resolve(plan); }
  decltype(auto) views(const moekit::LayerPlan& plan) requires
      requires(Pipeline& p, const moekit::LayerPlan& l) {
    p.views(l);
  }
  { return inner_.views(plan); }
  [[nodiscard]] bool loading(const moekit::LayerPlan& plan, std::size_t i) const requires
      requires(const Pipeline& p, const moekit::LayerPlan& l) {
    p.loading(l, std::size_t{0});
  }
  { return inner_.loading(plan, i); }
  void await(const moekit::LayerPlan& plan, std::size_t i) requires
      requires(Pipeline& p, const moekit::LayerPlan& l) {
    p.await(l, std::size_t{0});
  }
  { inner_.await(plan, i); }
  void end_layer(const moekit::LayerContext& ctx) { inner_.end_layer(ctx); }
  moekit::TokenVerdict end_token(std::span<const float> logits) { return inner_.end_token(logits); }

  [[nodiscard]] decltype(auto) stats() const requires requires(const Pipeline& p) { p.stats(); }
  { return inner_.stats(); }
  [[nodiscard]] decltype(auto) config() const noexcept requires requires(const Pipeline& p) {
    p.config();
  }
  { return inner_.config(); }
  [[nodiscard]] decltype(auto) shape() const noexcept requires requires(const Pipeline& p) {
    p.shape();
  }
  { return inner_.shape(); }
  [[nodiscard]] decltype(auto) loader() const noexcept requires requires(const Pipeline& p) {
    p.loader();
  }
  { return inner_.loader(); }
  [[nodiscard]] std::size_t memory_peak_bytes() const noexcept requires
      requires(const Pipeline& p) {
    p.memory_peak_bytes();
  }
  { return inner_.memory_peak_bytes(); }

  /// The wrapped pipeline (for its own statistics, or for a wrapper's observations).
  [[nodiscard]] Pipeline& inner() noexcept { return inner_; }
  [[nodiscard]] const Pipeline& inner() const noexcept { return inner_; }

 private:
  Pipeline& inner_;
};

}  // namespace moekit::engine
