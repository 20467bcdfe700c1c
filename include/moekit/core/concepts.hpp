#pragma once
/// \file The six component concepts, and the checks that explain a failed one.
///
/// Every component is a plain class. `OffloadPipeline` checks each of its parameters with the
/// `assert_*` functions below: a type that misses a member fails with a `static_assert` whose text
/// names the concept and the member, instead of a page of template backtrace.
///
/// Optional hooks (`begin_sequence()`, `prepare_insert(...)`, ... listed per concept) are declared
/// by the component (`static constexpr moekit::Hooks hooks = ...`, core/hooks.hpp) and checked here
/// with the concept: a declared hook must exist, a hook-named member must be declared.

#include <concepts>
#include <cstdint>
#include <optional>
#include <span>

#include "moekit/core/cache_events.hpp"
#include "moekit/core/gate_view.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/layer_context.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/core/prefetch_list.hpp"

namespace moekit {

namespace detail {
// ---- building blocks, one requirement each (named so diagnostics can point at them) ----------
template <class S>
concept has_score = requires(S& s, const LayerContext& ctx, const GateView& g,
                             std::span<const ExpertDemand> d, std::span<Precision> out) {
  s.score(ctx, g, d, out);
};
template <class T>
concept has_active_top_k = requires(T& t, const LayerContext& ctx, std::uint32_t k) {
  { t.active_top_k(ctx, k) } -> std::convertible_to<std::uint32_t>;
};
template <class T>
concept has_end_token = requires(T& t, std::span<const float> logits) {
  { t.end_token(logits) } -> std::same_as<TokenVerdict>;
};
template <class P>
concept has_predict = requires(P& p, const LayerContext& ctx, const GateView& g,
                               const ResidencyView& r, PrefetchList& out) {
  p.predict(ctx, g, r, out);
};
template <class P>
concept has_observe = requires(P& p, const LayerContext& ctx, const GateView& g) {
  p.observe(ctx, g);
};
template <class C>
concept has_on_hit = requires(C& c, ExpertKey k, const AccessInfo& a) {
  c.on_hit(k, a);
};
template <class C>
concept has_on_insert = requires(C& c, ExpertKey k, const AccessInfo& a) {
  c.on_insert(k, a);
};
template <class C>
concept has_on_evict = requires(C& c, ExpertKey k) {
  c.on_evict(k);
};
template <class C>
concept has_victim = requires(C& c, const EvictionQuery& q) {
  { c.victim(q) } -> std::same_as<std::optional<ExpertKey>>;
};
template <class L>
concept has_submit = requires(L& l, const LoadRequest& r) {
  { l.submit(r) } -> std::same_as<LoadTicket>;
};
template <class L>
concept has_poll = requires(L& l, LoadTicket t) {
  { l.poll(t) } -> std::same_as<bool>;
};
template <class L>
concept has_wait = requires(L& l, LoadTicket t) {
  l.wait(t);
};
template <class L>
concept has_cancel = requires(L& l, LoadTicket t) {
  { l.cancel(t) } -> std::same_as<bool>;
};
template <class S>
concept has_schedule = requires(S& s, const LayerContext& ctx, std::span<ExpertPlan> plans) {
  s.schedule(ctx, plans);
};
}  // namespace detail

/// **Scorer** — decides the precision of each expert a layer call needs (or `skip`).
/// 1. `s.score(ctx, gate, demands, out)` writes `out[i]` for `demands[i]`.
/// Declared hooks: `begin_sequence()`; `tokens_asking(i)`: of `demands[i]`'s tokens in the last
/// `score`, how many asked for `out[i]` itself (the rest asked for less; undeclared: all of them),
/// which a policy counting high-precision uses reads (HOBBIT's LHU).
/// Not checked: `score` must not allocate; it must be deterministic for the same inputs.
template <class S>
concept Scorer = detail::has_score<S>;

/// **TokenPolicy** — sets how many experts a token uses and judges the token afterwards (MoBiLE).
/// 1. `t.active_top_k(ctx, model_top_k)` → experts the engine selects per token at this layer.
/// 2. `t.end_token(output_logits)` → `TokenVerdict::accept` or `fallback`.
/// Declared hook: `begin_sequence()`.
template <class T>
concept TokenPolicy = detail::has_active_top_k<T> && detail::has_end_token<T>;

/// **Predictor** — proposes experts of later layers to load ahead of use.
/// 1. `p.predict(ctx, gate, residency, out)` pushes `Prefetch`es for layers after `ctx.layer`.
/// 2. `p.observe(ctx, gate)` receives the true routing of every layer call (before `predict`).
/// Declared hooks: `begin_sequence()`; `on_verdict(TokenVerdict, PrefetchList&)` to prefetch for a
/// recomputed token.
template <class P>
concept Predictor = detail::has_predict<P> && detail::has_observe<P>;

/// **CachePolicy** — ranks resident experts and names victims; owns no memory.
/// 1. `c.on_hit(key, access)`, 2. `c.on_insert(key, access)`, 3. `c.on_evict(key)`,
/// 4. `c.victim(query)` → an evictable resident of `query.pool`, or `nullopt` if it knows none.
/// Declared hooks (core/hooks.hpp): `bind(shape)` (called once by the cache, to size state);
/// `pool_capacities(shape, budget_bytes, precision)` → per-pool byte capacities; `pool_of(key,
/// precision)` → pool index; `begin_sequence()`; `begin_token(n)`; `prepare_insert(key, access)`
/// (called before the victims of an insertion are asked for, so a policy can tell a prefetch from a
/// demand: ARC adapts only on demands); `set_layer_capacities(span)` (called by ShallowFavoring);
/// `end_layer_call()` (called by sim::replay). Wrappers forward their inner policy's hooks.
/// Optional trait: `static constexpr bool needs_future` (offline policies fed the whole trace). Not
/// checked: `victim` must return a key for which `query.evictable(key)` holds.
template <class C>
concept CachePolicy = detail::has_on_hit<C> && detail::has_on_insert<C> &&
    detail::has_on_evict<C> && detail::has_victim<C>;

/// **Loader** — moves expert bytes into cache memory asynchronously.
/// 1. `l.submit(request)` → ticket, 2. `l.poll(ticket)` → done?, 3. `l.wait(ticket)` blocks until
/// done and rethrows the load's error, 4. `l.cancel(ticket)` → true if a queued (not started)
/// load was withdrawn.
/// Declared hook: `host_bytes(key, precision)` → `std::span<const std::byte>` of the expert in host
/// memory (needed by schedulers that run experts on the CPU); `prepare_host_bytes(key, precision)`,
/// called when an expert is placed on the CPU, before its `host_bytes` (a loader that must read the
/// bytes first starts the read there); `matrix_order(precision) const` → the `MatrixOrder` of the
/// blobs it delivers at that precision (carried by the pipeline's `WeightView`; rows when not
/// declared). Optional trait: `static constexpr bool keeps_bytes = false` for loaders that move no
/// data (the simulator's).
/// Not checked: on-demand requests are served before queued prefetches.
template <class L>
concept Loader =
    detail::has_submit<L> && detail::has_poll<L> && detail::has_wait<L> && detail::has_cancel<L>;

/// **Scheduler** — places and orders the experts of a layer call.
/// 1. `s.schedule(ctx, plans)` may set `placement` of misses (`device` or `host_cpu`) and reorder
/// `plans`; it must not change keys or precisions.
/// Declared hook: `begin_sequence()`.
template <class S>
concept Scheduler = detail::has_schedule<S>;

// ---- explanations: one static_assert per requirement --------------------------------------------

template <class S>
consteval bool assert_scorer() {
  static_assert(detail::has_score<S>,
                "moekit::Scorer: missing member `void score(const LayerContext&, const GateView&, "
                "std::span<const ExpertDemand>, std::span<Precision>)`");
  static_assert(assert_hooks<S, scorer_hooks>());
  return true;
}
template <class T>
consteval bool assert_token_policy() {
  static_assert(detail::has_active_top_k<T>,
                "moekit::TokenPolicy: missing member `std::uint32_t active_top_k(const "
                "LayerContext&, std::uint32_t model_top_k)`");
  static_assert(detail::has_end_token<T>,
                "moekit::TokenPolicy: missing member `TokenVerdict end_token(std::span<const "
                "float> logits)`");
  static_assert(assert_hooks<T, sequence_hooks>());
  return true;
}
template <class P>
consteval bool assert_predictor() {
  static_assert(detail::has_predict<P>,
                "moekit::Predictor: missing member `void predict(const LayerContext&, const "
                "GateView&, const ResidencyView&, PrefetchList&)`");
  static_assert(detail::has_observe<P>,
                "moekit::Predictor: missing member `void observe(const LayerContext&, const "
                "GateView&)`");
  static_assert(assert_hooks<P, predictor_hooks>());
  return true;
}
template <class C>
consteval bool assert_cache_policy() {
  static_assert(detail::has_on_hit<C>,
                "moekit::CachePolicy: missing member `void on_hit(ExpertKey, const AccessInfo&)`");
  static_assert(detail::has_on_insert<C>,
                "moekit::CachePolicy: missing member `void on_insert(ExpertKey, const "
                "AccessInfo&)`");
  static_assert(detail::has_on_evict<C>,
                "moekit::CachePolicy: missing member `void on_evict(ExpertKey)`");
  static_assert(detail::has_victim<C>,
                "moekit::CachePolicy: missing member `std::optional<ExpertKey> victim(const "
                "EvictionQuery&)`");
  static_assert(assert_hooks<C, cache_policy_hooks>());
  return true;
}
template <class L>
consteval bool assert_loader() {
  static_assert(detail::has_submit<L>,
                "moekit::Loader: missing member `LoadTicket submit(const LoadRequest&)`");
  static_assert(detail::has_poll<L>, "moekit::Loader: missing member `bool poll(LoadTicket)`");
  static_assert(detail::has_wait<L>, "moekit::Loader: missing member `void wait(LoadTicket)`");
  static_assert(detail::has_cancel<L>, "moekit::Loader: missing member `bool cancel(LoadTicket)`");
  static_assert(assert_hooks<L, loader_hooks>());
  return true;
}
template <class S>
consteval bool assert_scheduler() {
  static_assert(detail::has_schedule<S>,
                "moekit::Scheduler: missing member `void schedule(const LayerContext&, "
                "std::span<ExpertPlan>)`");
  static_assert(assert_hooks<S, sequence_hooks>());
  return true;
}

}  // namespace moekit
