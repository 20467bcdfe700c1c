#pragma once
/// \file replay: runs an OffloadPipeline — the same type the engine runs — over a RoutingTrace,
/// with a SimLoader and a compute-time model, and reports what it would have cost.
///
/// Per sequence: `begin_sequence`; its prefill tokens form one forward, then each decode token is
/// one forward. Per forward, per layer: the clock advances by the dense part (gate, attention,
/// norms), the trace's records become a GateView, `route` plans the layer, then the plan's experts
/// run in the scheduler's order: a device expert first waits for its load (the SimLoader advances
/// the clock to the completion; that wait is stall) and then runs for its device time at its
/// precision, a skipped one costs nothing. So compute of resident experts overlaps the loading of
/// later misses, as OnDemandScheduler intends; loads and prefetches otherwise overlap compute only
/// through the link running while the clock advances; what the link reads meanwhile delays that
/// compute by its paths' compute_s_per_byte (the loader's CPU work on the kernels' cores,
/// SimLoader::compute; 0 on a link that costs the CPU nothing). host_cpu experts (Fiddler) run one
/// after another on the host CPU *beside* the device side, from the start of the layer's expert
/// phase: the layer's expert time is max(CPU side, device side) as in Fiddler's objective (§3.2),
/// not their sum; the part of the CPU side the device side does not cover counts as compute. Then
/// `resolve`, `end_layer`, and after the last layer `end_token` (with no output logits: traces do
/// not store them). On `fallback` the forward is replayed again (MoBiLE's recomputation).
///
/// A token policy that narrows top-k (MoBiLE) gets the first `active_top_k` experts of each
/// record, weights renormalised; that is exactly what the router would select from the same logits.
/// A decode layer call whose experts the predictor fixed in advance (`planned_experts`: MoBiLE's
/// big pass on the little pass's plan) routes exactly those, each with weight 1/k (the record's
/// logits and hidden state are passed on unchanged).
///
/// Missing records (e.g. the shared Mixtral traces drop ties at 0.5/0.5): in a forward of several
/// tokens, a token whose record is missing at a layer is left out of that layer's GateView (the
/// layer is routed with the records present); when no token of the forward has a record at a
/// layer, that layer call is not routed at all (its dense time still counts, no expert is touched).
/// Both are counted in the report (`records_missing`, `layer_calls_unrouted`).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "moekit/core/concepts.hpp"
#include "moekit/core/gate_view.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/layer_context.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/error.hpp"
#include "moekit/layer_call.hpp"
#include "moekit/pipeline.hpp"
#include "moekit/sim/sim_loader.hpp"
#include "moekit/sim/trace.hpp"
#include "moekit/sim/trace_walk.hpp"

namespace moekit::sim {

/// Compute time, in seconds, of the parts of a layer the replay accounts for. Every cost is
/// `fixed + per_token · n` for a call over n tokens (a decode call: n = 1): the fixed part is the
/// weight read that a call pays once, the per-token part the arithmetic that grows with the batch.
struct ComputeModel {
  std::array<double, precision_count> device_expert_s{};        ///< one routed expert, per call
  std::array<double, precision_count> device_expert_token_s{};  ///< ... plus per token
  std::array<double, precision_count> cpu_expert_s{};           ///< the same on the host CPU
  std::array<double, precision_count> cpu_expert_token_s{};
  double layer_s = 0.0;        ///< dense part of a layer (gate, attention, norms), per forward
  double layer_token_s = 0.0;  ///< ... plus per token
  /// host_cpu experts run beside the device side (a GPU machine); false: on the device's cores,
  /// one after another with the device experts in the plan's order (a CPU-only machine).
  bool cpu_beside_device = true;
  /// host_cpu experts are read over the link first (the SimLoader's host reads) and run after
  /// their read; false: they cost only `cpu_expert_s`.
  bool cpu_reads_over_link = false;
  /// A layer's experts start once every load of its plan has arrived (moe-run's engine); false:
  /// each device expert after its own load.
  bool experts_after_all_loads = false;
  /// The fixed parts are a one-token call (measured so): a call over n tokens costs
  /// fixed + per_token · (n − 1). False: fixed + per_token · n.
  bool first_token_in_fixed = false;
  /// What a one-token call (a decode step's) costs when it differs from the fixed parts above
  /// (HardwareModel::solo: moe-run runs most offloaded decode steps on one thread). Unset: the
  /// fixed parts.
  struct OneToken {
    std::array<double, precision_count> device_expert_s{};
    std::array<double, precision_count> cpu_expert_s{};
    double layer_s = 0.0;
  };
  std::optional<OneToken> one_token;

  /// Throws `moekit::Error` naming the first negative or non-finite field.
  void validate() const {
    auto ok = [](double v) { return v >= 0 && v < 1e300; };
    for (std::size_t i = 0; i < precision_count; ++i) {
      const std::string p(name(all_precisions[i]));
      MOEKIT_EXPECTS(ok(device_expert_s[i]) && ok(device_expert_token_s[i]),
                     "ComputeModel.device_expert_s[" + p + "] must be finite and >= 0");
      MOEKIT_EXPECTS(ok(cpu_expert_s[i]) && ok(cpu_expert_token_s[i]),
                     "ComputeModel.cpu_expert_s[" + p + "] must be finite and >= 0");
    }
    MOEKIT_EXPECTS(ok(layer_s) && ok(layer_token_s),
                   "ComputeModel.layer_s must be finite and >= 0");
    if (!one_token) return;
    for (std::size_t i = 0; i < precision_count; ++i)
      MOEKIT_EXPECTS(ok(one_token->device_expert_s[i]) && ok(one_token->cpu_expert_s[i]),
                     "ComputeModel.one_token.*_expert_s[" + std::string(name(all_precisions[i])) +
                         "] must be finite and >= 0");
    MOEKIT_EXPECTS(ok(one_token->layer_s),
                   "ComputeModel.one_token.layer_s must be finite and >= 0");
  }
  [[nodiscard]] double device(Precision p, std::uint32_t n_tokens) const noexcept {
    const auto i = static_cast<std::size_t>(p);
    const bool one = n_tokens == 1 && one_token;
    return (one ? one_token->device_expert_s[i] : device_expert_s[i]) +
           device_expert_token_s[i] * extra(n_tokens);
  }
  [[nodiscard]] double cpu(Precision p, std::uint32_t n_tokens) const noexcept {
    const auto i = static_cast<std::size_t>(p);
    const bool one = n_tokens == 1 && one_token;
    return (one ? one_token->cpu_expert_s[i] : cpu_expert_s[i]) +
           cpu_expert_token_s[i] * extra(n_tokens);
  }
  [[nodiscard]] double layer(std::uint32_t n_tokens) const noexcept {
    const bool one = n_tokens == 1 && one_token;
    return (one ? one_token->layer_s : layer_s) + layer_token_s * extra(n_tokens);
  }
  /// Tokens a call pays the per-token part for (first_token_in_fixed: all but the first).
  [[nodiscard]] std::uint32_t extra(std::uint32_t n_tokens) const noexcept {
    return first_token_in_fixed && n_tokens > 0 ? n_tokens - 1 : n_tokens;
  }
};

/// What one replay cost. Pipeline and loader counters are snapshots at the end of the replay
/// (cumulative over the pipeline's life: replay a fresh pipeline to measure one run); times and
/// the token counts are for this replay only.
struct ReplayReport {
  std::string trace_name;
  bool synthetic = false;  ///< the trace was generated, not recorded
  std::uint64_t sequences = 0;
  std::uint64_t prefill_tokens = 0;
  std::uint64_t decode_tokens = 0;
  std::uint64_t forwards = 0;              ///< forwards replayed (fallback recomputations included)
  std::uint64_t records_missing = 0;       ///< (token, layer) records absent from the trace
  std::uint64_t layer_calls_unrouted = 0;  ///< layer calls without any record: not routed
  PipelineStats pipeline{};
  SimLoaderStats loader{};
  double total_s = 0.0;    ///< simulated time of the whole replay
  double prefill_s = 0.0;  ///< in prefill forwards
  double decode_s = 0.0;   ///< in decode forwards
  double stall_s = 0.0;    ///< waiting for loads
  double compute_s = 0.0;  ///< dense + expert compute
  /// Bytes of the transfers started, and the stall, during decode forwards (what moe-run's
  /// decode_bytes_loaded and decode_stall_seconds count).
  std::uint64_t decode_bytes = 0;
  double decode_stall_s = 0.0;

  [[nodiscard]] double hit_rate() const noexcept { return pipeline.hit_rate(); }
  [[nodiscard]] std::uint64_t misses() const noexcept { return pipeline.misses; }
  [[nodiscard]] double miss_penalty() const noexcept { return pipeline.miss_penalty; }
  /// Bytes moved over the link (started transfers; cancelled prefetches moved nothing).
  [[nodiscard]] std::uint64_t bytes_moved() const noexcept { return loader.bytes; }
  /// Prefetched bytes evicted before any use.
  [[nodiscard]] std::uint64_t wasted_bytes() const noexcept {
    return pipeline.cache.wasted_prefetch_bytes;
  }
  /// Bytes of prefetches still in flight when they were needed.
  [[nodiscard]] std::uint64_t late_bytes() const noexcept { return loader.late_bytes; }
  /// Decode tokens per simulated second (0 without decode tokens).
  [[nodiscard]] double decode_tokens_per_s() const noexcept {
    return decode_s > 0 ? double(decode_tokens) / decode_s : 0.0;
  }
  /// Mean simulated latency of a sequence's prefill forward (0 without prefill).
  [[nodiscard]] double prefill_latency_s() const noexcept {
    return prefill_sequences ? prefill_s / double(prefill_sequences) : 0.0;
  }
  std::uint64_t prefill_sequences = 0;  ///< sequences with a prefill forward
};

/// Replay knobs.
struct ReplayOptions {
  /// Called after each sequence with (sequences done, sequences in the trace); may be empty.
  void (*progress)(void* ctx, std::size_t done, std::size_t total) = nullptr;
  void* progress_ctx = nullptr;
};

/// The demand sequence a replay with the full top-k produces: per routed layer call, its distinct
/// experts in first-seen order (tokens in order, ranks in order), which is the order in which
/// OffloadPipeline builds its demands. `call_end[c]` is the end of call c in `keys`. This is what
/// offline policies (Belady) are fed as their future.
struct DemandSequence {
  std::vector<ExpertKey> keys;
  std::vector<std::size_t> call_end;
};

/// The demand sequence of `trace` replayed with its full top-k (see DemandSequence).
[[nodiscard]] inline DemandSequence demand_sequence(const RoutingTrace& trace) {
  DemandSequence out;
  const TraceDims& d = trace.dims();
  std::vector<std::uint8_t> seen(d.n_experts, 0);
  std::uint64_t missing = 0;
  GateGatherer buf;
  ForwardWalker(trace).for_each_forward([&](std::size_t, std::size_t first, std::size_t n, Phase) {
    for (std::uint32_t l = 0; l < d.n_layers; ++l) {
      const GateView g = buf.gather(trace, first, n, l, d.top_k, missing);
      if (g.n_tokens == 0) continue;
      const std::size_t begin = out.keys.size();
      for (std::uint32_t e : g.experts)
        if (!seen[e]) seen[e] = 1, out.keys.push_back(ExpertKey{l, e});
      for (std::size_t i = begin; i < out.keys.size(); ++i) seen[out.keys[i].expert] = 0;
      out.call_end.push_back(out.keys.size());
    }
  });
  return out;
}

/// Adapts an offline policy (`needs_future`, fed a DemandSequence) to the order in which the
/// pipeline reports accesses. Within one layer call the pipeline reports hits first and misses
/// after, while the future lists the call's experts in demand order; an offline policy that
/// consumes its future in order would mistake that for skipped demands. This adapter holds the
/// demand accesses of the current call and passes them on in future order when the replay
/// signals the end of the call (`end_layer_call`). Holding them is safe: every expert of the call
/// is pinned until then, so no victim choice depends on them. Prefetch insertions pass at once.
template <class Inner>
class CallOrderedPolicy {
  static_assert(assert_cache_policy<Inner>());

 public:
  static constexpr bool needs_future = true;
  using wrapped_component = Inner;
  /// end_layer_call is its own; the others are forwarded (no-ops when Inner does not declare them).
  static constexpr Hooks hooks = Hook::bind | Hook::begin_sequence | Hook::begin_token |
                                 Hook::prepare_insert | Hook::end_layer_call;

  explicit CallOrderedPolicy(DemandSequence future, Inner inner = Inner{})
      : inner_(std::move(inner)), future_(std::move(future)) {
    inner_.set_future(std::span<const ExpertKey>(future_.keys));
  }

  void bind(const ModelShape& shape) {
    if constexpr (declares<Inner>(Hook::bind)) inner_.bind(shape);
    pending_.reserve(shape.n_experts);
  }
  void begin_sequence() {
    if constexpr (declares<Inner>(Hook::begin_sequence)) inner_.begin_sequence();
  }
  void begin_token(std::uint32_t n) {
    if constexpr (declares<Inner>(Hook::begin_token)) inner_.begin_token(n);
  }

  void prepare_insert(ExpertKey key, const AccessInfo& a) {
    if constexpr (declares<Inner>(Hook::prepare_insert)) inner_.prepare_insert(key, a);
  }
  void on_hit(ExpertKey key, const AccessInfo& a) { pending_.push_back({key, a, false, 0}); }
  void on_insert(ExpertKey key, const AccessInfo& a) {
    if (a.prefetch)
      inner_.on_insert(key, a);
    else
      pending_.push_back({key, a, true, 0});
  }
  void on_evict(ExpertKey key) {
    for (std::size_t i = 0; i < pending_.size(); ++i)
      if (pending_[i].key == key && pending_[i].insert) {  // never seen by the inner policy
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
    inner_.on_evict(key);
  }
  [[nodiscard]] std::optional<ExpertKey> victim(const EvictionQuery& q) const {
    return inner_.victim(q);
  }

  /// The replay finished a routed layer call: pass its accesses on in future order.
  void end_layer_call() {
    const std::size_t begin = call_ == 0 ? 0 : future_.call_end[call_ - 1];
    const std::size_t end = call_ < future_.call_end.size() ? future_.call_end[call_] : begin;
    ++call_;
    for (Pending& p : pending_) {
      p.order = end - begin;  // not in this call's future: after the call's own entries
      for (std::size_t i = begin; i < end; ++i)
        if (future_.keys[i] == p.key) p.order = i - begin;
    }
    std::stable_sort(pending_.begin(), pending_.end(),
                     [](const Pending& x, const Pending& y) { return x.order < y.order; });
    for (const Pending& p : pending_) {
      if (p.insert)
        inner_.on_insert(p.key, p.access);
      else
        inner_.on_hit(p.key, p.access);
    }
    pending_.clear();
  }

  [[nodiscard]] Inner& inner() noexcept { return inner_; }

 private:
  struct Pending {
    ExpertKey key;
    AccessInfo access;
    bool insert;
    std::size_t order;
  };
  Inner inner_;
  DemandSequence future_;
  std::vector<Pending> pending_;
  std::size_t call_ = 0;
};

namespace detail {

/// One replay in progress: what `replay` does per forward and per layer call.
template <class Pipeline>
class Replayer {
 public:
  Replayer(Pipeline& pipeline, const RoutingTrace& trace, const ComputeModel& compute,
           const ReplayOptions& options, ReplayReport& rep)
      : pipeline_(pipeline),
        loader_(pipeline.loader()),
        clock_(loader_.clock()),
        trace_(trace),
        compute_(compute),
        options_(options),
        rep_(rep) {}

  /// The forward of tokens [first, first + n) of sequence `seq`; replayed once more when the
  /// token policy rejects it (MoBiLE's fallback).
  void forward(std::size_t seq, std::size_t first, std::size_t n, Phase phase) {
    if (seq != last_seq_) {
      if (options_.progress && last_seq_ != static_cast<std::size_t>(-1))
        options_.progress(options_.progress_ctx, last_seq_ + 1, trace_.sequence_count());
      pipeline_.begin_sequence();
      last_seq_ = seq;
      if (phase == Phase::prefill) ++rep_.prefill_sequences;
    }
    (phase == Phase::prefill ? rep_.prefill_tokens : rep_.decode_tokens) += n;
    const double f_start = clock_.now(), stall0 = clock_.stall();
    const std::uint64_t bytes0 = loader_.stats().bytes;
    const std::uint64_t token_index = first - trace_.global_token(seq, 0);
    const std::uint32_t n_layers = trace_.dims().n_layers;
    for (int attempt = 0;; ++attempt) {
      ++rep_.forwards;
      for (std::uint32_t l = 0; l < n_layers; ++l)
        layer(LayerContext{l, n_layers, token_index, phase, seq, static_cast<std::uint32_t>(n)},
              first, n, attempt);
      if (pipeline_.end_token(std::span<const float>{}) == TokenVerdict::accept) break;
      if (attempt >= 1)
        ::moekit::detail::fail(ErrorKind::internal,
                               "replay: the token policy rejected a recomputed forward");
    }
    (phase == Phase::prefill ? rep_.prefill_s : rep_.decode_s) += clock_.now() - f_start;
    if (phase == Phase::decode) {
      rep_.decode_bytes += loader_.stats().bytes - bytes0;
      rep_.decode_stall_s += clock_.stall() - stall0;
    }
  }

  /// Simulated seconds of compute so far.
  [[nodiscard]] double compute_s() const noexcept { return compute_s_; }

 private:
  // One layer call: the dense part, then the plan's experts in the scheduler's order, each
  // device expert after its load.
  void layer(LayerContext ctx, std::size_t first, std::size_t n, int attempt) {
    run(compute_.layer(static_cast<std::uint32_t>(n)));
    const std::uint32_t k =
        std::clamp<std::uint32_t>(pipeline_.active_top_k(ctx), 1, trace_.dims().top_k);
    std::uint64_t missing = 0;
    const std::span<const std::uint32_t> planned = pipeline_.planned_experts(ctx);
    const GateView gate = planned.empty() || n != 1
                              ? buf_.gather(trace_, first, n, ctx.layer, k, missing)
                              : planned_gate(planned, first, ctx.layer, missing);
    if (attempt == 0) rep_.records_missing += missing;
    if (gate.n_tokens == 0) {
      ++rep_.layer_calls_unrouted;
      return;
    }
    ctx.n_tokens = gate.n_tokens;
    {
      LayerCall<Pipeline> call(pipeline_, ctx, gate);  // the layer ends with the scope
      run_experts(call.plan());
      (void)call.resolve();
    }
    loader_.clear_host_reads();
    if constexpr (declares<typename Pipeline::CachePolicy>(Hook::end_layer_call))
      pipeline_.cache().policy().end_layer_call();
  }

  // The plan's experts in the scheduler's order: each device expert after its load (or, with
  // experts_after_all_loads, once every load of the plan is in), host_cpu ones beside the device
  // side or, on a CPU-only machine, on the same clock after their reads.
  void run_experts(const LayerPlan& plan) {
    if (compute_.experts_after_all_loads)
      for (const ExpertPlan& p : plan.experts) wait_for(p);
    double cpu_free_at = clock_.now();  // the host CPU side, when it runs beside the device side
    for (const ExpertPlan& p : plan.experts) {
      if (p.placement == Placement::device) {
        wait_for(p);
        run(compute_.device(p.precision, p.n_tokens));
      } else if (p.placement == Placement::host_cpu) {
        if (!compute_.cpu_beside_device) {
          wait_for(p);
          run(compute_.cpu(p.precision, p.n_tokens));
        } else {
          cpu_free_at += compute_.cpu(p.precision, p.n_tokens);
        }
      }
    }
    if (cpu_free_at > clock_.now()) run(cpu_free_at - clock_.now());
  }

  // Waits (stall) for the load `p` runs after: its cache load, or its host read.
  void wait_for(const ExpertPlan& p) {
    if (p.placement == Placement::device && p.ticket.valid()) loader_.wait(p.ticket);
    if (p.placement == Placement::host_cpu && compute_.cpu_reads_over_link) {
      const LoadTicket t = loader_.host_read(p.key, p.precision);
      if (t.valid()) loader_.wait(t);
    }
  }

  // The GateView of decode token `token` at `layer` with the planned experts (weights 1/k), the
  // record's logits and hidden state; n_tokens = 0 when the record is missing.
  GateView planned_gate(std::span<const std::uint32_t> planned, std::size_t token,
                        std::uint32_t layer, std::uint64_t& missing) {
    GateView g;
    g.k = static_cast<std::uint32_t>(planned.size());
    g.n_experts = trace_.dims().n_experts;
    if (!trace_.valid(token, layer)) {
      ++missing;
      g.n_tokens = 0;
      return g;
    }
    plan_weights_.assign(planned.size(), 1.0f / float(planned.size()));
    g.experts = planned;
    g.weights = plan_weights_;
    g.logits = trace_.logits(token, layer);
    g.hidden = trace_.hidden(token, layer);
    return g;
  }

  // dt of compute, delayed by what the loader reads meanwhile (SimLoader::compute).
  void run(double dt) { compute_s_ += loader_.compute(dt); }

  Pipeline& pipeline_;
  SimLoader& loader_;
  VirtualClock& clock_;
  const RoutingTrace& trace_;
  const ComputeModel& compute_;
  const ReplayOptions& options_;
  ReplayReport& rep_;
  GateGatherer buf_;
  std::vector<float> plan_weights_;
  std::size_t last_seq_ = static_cast<std::size_t>(-1);
  double compute_s_ = 0.0;
};

}  // namespace detail

/// Replays `trace` through `pipeline` (whose loader must be a SimLoader) and reports the cost;
/// see the file comment for the model. The trace's dims must match the pipeline's shape.
template <class Pipeline>
ReplayReport replay(Pipeline& pipeline, const RoutingTrace& trace, const ComputeModel& compute,
                    const ReplayOptions& options = {}) {
  static_assert(std::is_same_v<typename Pipeline::Loader, SimLoader>,
                "moekit::sim::replay: the pipeline's Loader must be moekit::sim::SimLoader");
  compute.validate();
  const TraceDims& d = trace.dims();
  const ModelShape& shape = pipeline.shape();
  MOEKIT_EXPECTS(d.n_layers == shape.n_layers && d.n_experts == shape.n_experts,
                 "replay: trace '" + trace.name() + "' has " + std::to_string(d.n_layers) +
                     " layers × " + std::to_string(d.n_experts) + " experts, the model " +
                     std::to_string(shape.n_layers) + " × " + std::to_string(shape.n_experts));
  MOEKIT_EXPECTS(d.top_k == shape.top_k, "replay: trace '" + trace.name() + "' records top-" +
                                             std::to_string(d.top_k) + ", the model selects top-" +
                                             std::to_string(shape.top_k));

  SimLoader& loader = pipeline.loader();
  loader.set_host_reads(compute.cpu_reads_over_link);
  VirtualClock& clock = loader.clock();
  ReplayReport rep;
  rep.trace_name = trace.name();
  rep.synthetic = trace.synthetic();
  rep.sequences = trace.sequence_count();
  const double t_start = clock.now(), stall_start = clock.stall();
  detail::Replayer<Pipeline> replayer(pipeline, trace, compute, options, rep);
  ForwardWalker(trace).for_each_forward(
      [&](std::size_t seq, std::size_t first, std::size_t n, Phase phase) {
        replayer.forward(seq, first, n, phase);
      });
  if (options.progress)
    options.progress(options.progress_ctx, trace.sequence_count(), trace.sequence_count());

  rep.pipeline = pipeline.stats();
  rep.loader = loader.stats();
  rep.total_s = clock.now() - t_start;
  rep.stall_s = clock.stall() - stall_start;
  rep.compute_s = replayer.compute_s();
  return rep;
}

}  // namespace moekit::sim
