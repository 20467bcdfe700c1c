#pragma once
/// \file LayerCall: one layer call of an offload pipeline, held in a scope.
///
/// The per-layer protocol is route → resolve → end_layer, once per layer call. A LayerCall routes
/// when it is created, resolves its own plan, and ends the layer when it goes out of scope (also
/// when the experts' computation throws), so the order cannot be got wrong and no plan is used
/// after its layer ended. It works with OffloadPipeline (`pipeline.layer(ctx, gate)`) and with any
/// type that forwards the three calls (the engine's recording wrappers), and allocates nothing.
///
///     auto call = pipeline.layer(ctx, gate);
///     for (const moekit::WeightView& w : call.resolve()) run_expert(w);
///     // the layer's pins are released here

#include <cstddef>

#include "moekit/core/gate_view.hpp"
#include "moekit/core/layer_context.hpp"
#include "moekit/core/plan.hpp"

namespace moekit {

template <class Pipeline>
class LayerCall {
 public:
  /// Routes the layer call (`pipeline.route(ctx, gate)`).
  LayerCall(Pipeline& pipeline, const LayerContext& ctx, const GateView& gate)
      : pipeline_(pipeline), ctx_(ctx), plan_(pipeline.route(ctx, gate)) {}
  LayerCall(const LayerCall&) = delete;
  LayerCall& operator=(const LayerCall&) = delete;
  /// Ends the layer (`pipeline.end_layer(ctx)`): its pins are released.
  ~LayerCall() { pipeline_.end_layer(ctx_); }

  /// The layer's plan: precision, hit or miss and placement of each needed expert.
  [[nodiscard]] const LayerPlan& plan() const noexcept { return plan_; }
  /// Waits for the plan's loads; one weight view per planned expert, in the plan's order.
  [[nodiscard]] decltype(auto) resolve() { return pipeline_.resolve(plan_); }
  /// The views without waiting (OffloadPipeline::views): an expert still `loading` must be
  /// `await`ed before its bytes are read.
  [[nodiscard]] decltype(auto) views() { return pipeline_.views(plan_); }
  [[nodiscard]] bool loading(std::size_t i) const { return pipeline_.loading(plan_, i); }
  void await(std::size_t i) { pipeline_.await(plan_, i); }
  [[nodiscard]] const LayerContext& context() const noexcept { return ctx_; }

 private:
  Pipeline& pipeline_;
  LayerContext ctx_;
  const LayerPlan& plan_;
};

}  // namespace moekit
