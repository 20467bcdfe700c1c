#pragma once
/// \file OffloadPipeline: the one type an engine talks to.
///
/// Per layer call the engine hands the router's output to `route`, which
///  1. feeds the truth to the predictor (`observe`) and scores the last predictions against it,
///  2. asks the scorer for a precision per needed expert (or `skip`),
///  3. looks each expert up in the cache (hits are pinned for the layer),
///  4. lets the scheduler place and order the misses (device or host CPU),
///  5. inserts device misses into the cache (the policy names victims) and submits their loads,
///  6. asks the predictor for prefetches of later layers, admits and submits them,
/// and returns the layer's plan. `resolve` waits for the plan's loads and returns a weight view per
/// expert; `end_layer` releases the layer's pins; `end_token` asks the token policy whether to keep
/// the token. `layer(ctx, gate)` holds one layer call in a scoped `LayerCall` (route on creation,
/// `resolve` of its own plan, end_layer when it goes out of scope), so the order cannot be got
/// wrong. Nothing on this path allocates once the pipeline is warm.
///
/// A load is started in one place (`start_load`: submitted, marked loading in the cache, which
/// keeps the entry until the load is seen complete, and tracked). The cache owns the arena behind
/// its slots, so an eviction recycles its slot's memory without calling back into the pipeline.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "moekit/cache/expert_arena.hpp"
#include "moekit/cache/expert_cache.hpp"
#include "moekit/cache/lazy_upgrade.hpp"
#include "moekit/cache/prefetch_staging.hpp"
#include "moekit/core/concepts.hpp"
#include "moekit/core/gate_view.hpp"
#include "moekit/core/hooks.hpp"
#include "moekit/core/layer_context.hpp"
#include "moekit/core/matrix_order.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/core/prefetch_list.hpp"
#include "moekit/error.hpp"
#include "moekit/layer_call.hpp"
#include "moekit/score/full_top_k.hpp"

namespace moekit {

/// Run-time settings of an OffloadPipeline.
struct PipelineConfig {
  std::size_t expert_budget_bytes = 0;        ///< bytes of expert cache (fast memory)
  Precision base_precision = Precision::f16;  ///< the model's own precision ("high")
  /// Precision the cache policy assumes when it turns bytes into expert counts (default: base).
  Precision sizing_precision = Precision::skip;
  /// Transient slots outside the budget for demanded experts the cache cannot admit (every
  /// resident pinned, or a policy's per-layer pool smaller than a prefill layer's needs).
  /// 0 = the number of experts per layer.
  std::uint32_t staging_slots = 0;
  /// Prefetches further ahead are dropped; at most `max_prediction_distance` (core/plan.hpp).
  std::uint32_t max_prefetch_distance = max_prediction_distance;
  /// A `skip` from the scorer drops only misses by default; true drops resident experts too.
  bool skip_even_if_resident = false;
  /// > 0: prefetches wait in this many staging slots outside the cache (Fate; see
  /// cache/prefetch_staging.hpp), whose bytes at `sizing_precision` come out of
  /// `expert_budget_bytes`; the cache never sees a prefetch. A prefetch that finds every slot
  /// taken waits for one (issued when a layer's slots are released), and is dropped when its layer
  /// comes first. 0: prefetches enter the cache.
  std::uint32_t prefetch_staging_slots = 0;
  /// Not `skip`: a demand admitted to the cache below this precision is re-fetched at it in the
  /// background, once no other load is pending, and replaced in place (Fate's lazy int2 → int4;
  /// cache/lazy_upgrade.hpp). `skip`: no upgrades.
  Precision upgrade_precision = Precision::skip;
  /// Experts of a layer call the token policy narrowed (MoBiLE's little pass) stay soft-pinned
  /// until the token's verdict; on a fallback until the recomputation has run their layer.
  bool retain_narrowed_experts = false;
};

/// Precision and recall of prefetches, per distance (layers ahead).
struct PredictionStats {
  std::uint64_t true_positive = 0;
  std::uint64_t false_positive = 0;
  std::uint64_t false_negative = 0;
  [[nodiscard]] double precision() const noexcept {
    const auto n = true_positive + false_positive;
    return n ? double(true_positive) / double(n) : 0.0;
  }
  [[nodiscard]] double recall() const noexcept {
    const auto n = true_positive + false_negative;
    return n ? double(true_positive) / double(n) : 0.0;
  }
};

/// Counters of an OffloadPipeline (the cache's own are in `cache`).
struct PipelineStats {
  std::uint64_t layer_calls = 0;
  std::uint64_t tokens_accepted = 0;
  std::uint64_t fallbacks = 0;  ///< tokens recomputed by the token policy
  std::uint64_t demands = 0;    ///< (expert, layer call) pairs needed
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;  ///< demanded, not resident at a serving precision
  std::array<std::uint64_t, precision_slots> misses_by_precision{};
  std::uint64_t skipped = 0;          ///< demanded but skipped by the scorer
  std::uint64_t host_cpu_runs = 0;    ///< misses run on the CPU instead of loaded
  std::uint64_t staged = 0;           ///< misses loaded into transient staging slots
  std::uint64_t late_prefetches = 0;  ///< demanded while its prefetch was still loading
  std::uint64_t prefetches_issued = 0;
  std::uint64_t prefetches_redundant = 0;  ///< predicted, already resident
  std::uint64_t prefetches_dropped = 0;    ///< no room, or outside the model / distance limit
  /// Found every prefetch staging slot taken and waited for one (issued later, or dropped when
  /// its layer came first: counted in `prefetches_dropped` too).
  std::uint64_t prefetches_waited = 0;
  std::uint64_t prefetches_cancelled = 0;
  std::uint64_t prefetches_unused = 0;     ///< staged, not asked for, load not withdrawn in time
  std::uint64_t staged_prefetch_hits = 0;  ///< demands served from prefetch staging
  std::uint64_t upgrades = 0;              ///< cache entries raised to `upgrade_precision`
  std::uint64_t upgrades_dropped = 0;      ///< re-fetched, but the entry could not take it
  std::uint64_t bytes_upgraded = 0;        ///< bytes of the re-fetches
  std::uint64_t bytes_demand_loaded = 0;
  std::uint64_t bytes_prefetched = 0;
  std::uint64_t bytes_preloaded = 0;  ///< start-up placement (`preload`)
  /// Seconds `resolve` spent waiting for loads of the experts it serves: the I/O a decode did
  /// not hide behind compute (decode time less this is the compute it ran).
  double stall_seconds = 0.0;
  /// HOBBIT's miss penalty: a miss at the base precision costs 1, at a lower one bits/base bits.
  double miss_penalty = 0.0;
  /// Index = distance 1..max_prediction_distance (0 unused).
  std::array<PredictionStats, max_prediction_distance + 1> prediction{};
  CacheStats cache{};

  [[nodiscard]] double hit_rate() const noexcept {
    const auto n = hits + misses;
    return n ? double(hits) / double(n) : 0.0;
  }
  [[nodiscard]] std::uint64_t bytes_loaded() const noexcept {
    return bytes_demand_loaded + bytes_prefetched + bytes_upgraded;
  }
};

/// A resolved expert: where its weights are and how to run it.
struct WeightView {
  ExpertKey key{};
  Precision precision = Precision::f16;
  Placement placement = Placement::device;
  std::span<const std::byte> bytes{};  ///< the expert's stored bytes (empty when skipped, or
                                       ///< when the loader keeps no bytes)
  std::uint32_t n_tokens = 0;
  float weight_sum = 0.0f;
  /// Where the rows of `bytes`' matrices are: what the loader's `matrix_order` hook says for
  /// `precision` (rows for a loader without it); io/expert_blob.hpp's `expert_view` reads it.
  MatrixOrder order = MatrixOrder::rows;
};

template <class ScorerT, class PredictorT, class CachePolicyT, class LoaderT, class SchedulerT,
          class TokenPolicyT = FullTopK>
class OffloadPipeline {
  static_assert(assert_scorer<ScorerT>());
  static_assert(assert_predictor<PredictorT>());
  static_assert(assert_cache_policy<CachePolicyT>());
  static_assert(assert_loader<LoaderT>());
  static_assert(assert_scheduler<SchedulerT>());
  static_assert(assert_token_policy<TokenPolicyT>());

 public:
  using Scorer = ScorerT;
  using Predictor = PredictorT;
  using CachePolicy = CachePolicyT;
  using Loader = LoaderT;
  using Scheduler = SchedulerT;
  using TokenPolicy = TokenPolicyT;
  using Cache = ExpertCache<CachePolicyT>;

  /// True unless the loader declares `static constexpr bool keeps_bytes = false`.
  static constexpr bool keeps_bytes = [] {
    if constexpr (requires { LoaderT::keeps_bytes; }) return bool(LoaderT::keeps_bytes);
    return true;
  }();

  OffloadPipeline(const ModelShape& shape, const PipelineConfig& config, LoaderT loader,
                  ScorerT scorer = ScorerT{}, PredictorT predictor = PredictorT{},
                  CachePolicyT policy = CachePolicyT{}, SchedulerT scheduler = SchedulerT{},
                  TokenPolicyT token_policy = TokenPolicyT{})
      : shape_(validated(shape, config)),
        cfg_(normalised(config, shape)),
        cache_(shape_, cfg_.expert_budget_bytes - staging_bytes(shape_, cfg_),
               cfg_.sizing_precision, std::move(policy), make_arena(shape_, cfg_)),
        scorer_(std::move(scorer)),
        predictor_(std::move(predictor)),
        loader_(std::move(loader)),
        scheduler_(std::move(scheduler)),
        token_policy_(std::move(token_policy)),
        staging_(cfg_.prefetch_staging_slots,
                 static_cast<std::uint32_t>(shape_.expert_count() + cfg_.staging_slots)),
        upgrade_(cfg_.upgrade_precision,
                 static_cast<std::uint32_t>(shape_.expert_count() + cfg_.staging_slots +
                                            cfg_.prefetch_staging_slots),
                 cfg_.upgrade_precision == Precision::skip ? 0 : shape_.expert_count()) {
    const std::size_t E = shape_.n_experts;
    const std::size_t N = shape_.expert_count();
    demand_slot_.assign(E, -1);
    tokens_asking_.assign(E, 0);
    demands_.reserve(E);
    precisions_.resize(E);
    plan_.experts.reserve(E);
    plan_.prefetches.reserve(prefetch_capacity());
    views_.reserve(E);
    awaited_.reserve(E);
    prefetch_buf_.resize(prefetch_capacity());
    if (staging_.enabled()) waiting_.reserve(prefetch_capacity());
    in_flight_.reserve(N + cfg_.staging_slots);
    truth_.assign(E, 0);
    for (auto& p : predicted_) p.assign(N, 0);
    for (auto& p : pending_predictions_) p.assign(shape_.n_layers, 0);
    soft_by_layer_.resize(shape_.n_layers);
    for (auto& v : soft_by_layer_) v.reserve(2 * E);  // predictions + retained experts
    retained_.reserve(N);
    for (std::size_t i = 0; i < bytes_.size(); ++i)  // every Precision, `skip` included
      bytes_[i] = shape_.expert_bytes(static_cast<Precision>(i));
  }

  OffloadPipeline(const OffloadPipeline&) = delete;
  OffloadPipeline& operator=(const OffloadPipeline&) = delete;

  // ---- sequence and token boundaries -----------------------------------------------------------
  /// A new sequence (request) begins: per-sequence records reset, pins and predictions cleared.
  void begin_sequence() {
    cache_.begin_sequence();
    call_begin_sequence(scorer_);
    call_begin_sequence(predictor_);
    call_begin_sequence(scheduler_);
    call_begin_sequence(token_policy_);
    for (std::uint32_t l = 0; l < shape_.n_layers; ++l) release_soft_pins(l);
    free_unused_staged(none_layer);
    issue_waiting_prefetches(none_layer);
    release_retained();
    for (auto& p : predicted_) std::fill(p.begin(), p.end(), std::uint8_t{0});
    for (auto& p : pending_predictions_) std::fill(p.begin(), p.end(), 0u);
  }

  /// Loads `key` at `precision` into the cache ahead of any demand (start-up placement, e.g.
  /// Fiddler's most popular experts). Returns false when the cache cannot admit it. Not counted as
  /// a demand or a prefetch; `stats().bytes_preloaded` counts its bytes.
  bool preload(ExpertKey key, Precision precision) {
    MOEKIT_EXPECTS(shape_.contains(key), "preload: key outside the model shape");
    if (cache_.resident_at(key, precision)) return true;
    const auto r = cache_.insert(key, cache_.access(precision, key.layer));
    if (!r.ok()) return false;
    (void)start_load(key, precision, LoadPriority::prefetch, r.slot);
    in_flight_.back().preload = true;
    stats_.bytes_preloaded += bytes_of(precision);
    return true;
  }

  /// Waits for every load in flight: a start-up placement is complete before the first token.
  void finish_loads() { collect_completed_loads(/*wait_all=*/true); }

  /// Experts each token should select at this layer (a token policy may narrow the model's top-k).
  [[nodiscard]] std::uint32_t active_top_k(const LayerContext& ctx) {
    return token_policy_.active_top_k(ctx, shape_.top_k);
  }

  /// Experts the predictor fixed in advance for this layer call (MoBiLE's big pass on the little
  /// pass's plan): the engine runs exactly these. Empty: route as usual.
  [[nodiscard]] std::span<const std::uint32_t> planned_experts(const LayerContext& ctx) const {
    if constexpr (declares<PredictorT>(Hook::planned_experts))
      return predictor_.planned_experts(ctx.layer);
    return {};
  }

  // ---- the per-layer path ---------------------------------------------------------------------
  /// Plans the layer call described by `ctx` and `gate`. The returned plan stays valid until the
  /// next `route`.
  const LayerPlan& route(const LayerContext& ctx, const GateView& gate) {
    MOEKIT_EXPECTS(ctx.layer < shape_.n_layers, "route: LayerContext.layer >= n_layers");
    MOEKIT_EXPECTS(gate.n_experts == shape_.n_experts,
                   "route: GateView.n_experts differs from the model's experts per layer");
    gate.validate();
    if (ctx.layer == 0) cache_.begin_token(ctx.n_tokens);
    ++stats_.layer_calls;
    narrowed_ = cfg_.retain_narrowed_experts && gate.k < shape_.top_k;
    collect_completed_loads();

    predictor_.observe(ctx, gate);
    build_demands(gate);
    for (const ExpertDemand& d : demands_) truth_[d.expert] = 1;  // read by the next two steps
    score_predictions(ctx.layer);
    cancel_stale_prefetches(ctx.layer);
    free_unused_staged(ctx.layer);
    for (const ExpertDemand& d : demands_) truth_[d.expert] = 0;

    plan_.clear();
    plan_.layer = ctx.layer;
    scorer_.score(ctx, gate, std::span<const ExpertDemand>(demands_),
                  std::span<Precision>(precisions_).first(demands_.size()));
    for (std::size_t i = 0; i < demands_.size(); ++i) {
      std::uint32_t& asking = tokens_asking_[demands_[i].expert];
      asking = demands_[i].n_tokens;
      if constexpr (declares<ScorerT>(Hook::tokens_asking)) asking = scorer_.tokens_asking(i);
    }
    for (std::size_t i = 0; i < demands_.size(); ++i) plan_.experts.push_back(plan_for(ctx, i));

    scheduler_.schedule(ctx, std::span<ExpertPlan>(plan_.experts));
    staging_used_ = 0;
    for (ExpertPlan& p : plan_.experts) {
      if (p.placement == Placement::skipped || p.hit) continue;
      ++stats_.misses;
      ++stats_.misses_by_precision[static_cast<std::size_t>(p.precision)];
      stats_.miss_penalty += double(bits(p.precision)) / double(bits(cfg_.base_precision));
      cache_.count_miss();
      if (p.placement == Placement::host_cpu) {
        ++stats_.host_cpu_runs;
        if constexpr (declares<LoaderT>(Hook::prepare_host_bytes))
          loader_.prepare_host_bytes(p.key, p.precision);
        continue;
      }
      load_demand(ctx, p);
    }

    // Slots freed by this layer's demands go to waiting prefetches first (at layer 0 every one
    // left is from the last forward: dropped).
    issue_waiting_prefetches(ctx.layer == 0 ? none_layer : ctx.layer);
    PrefetchList list{std::span<Prefetch>(prefetch_buf_)};
    const ResidencyView residency(this, &resident_fn);
    predictor_.predict(ctx, gate, residency, list);
    issue_prefetches(ctx.layer, list.items());
    awaited_.assign(plan_.experts.size(), 0);
    return plan_;
  }

  /// One layer call in a scope: routes now; `resolve()` waits for its plan's loads; the layer
  /// ends (`end_layer`) when the returned LayerCall goes out of scope.
  [[nodiscard]] LayerCall<OffloadPipeline> layer(const LayerContext& ctx, const GateView& gate) {
    return LayerCall<OffloadPipeline>(*this, ctx, gate);
  }

  /// Waits for the plan's loads and returns one view per planned expert (same order).
  std::span<const WeightView> resolve(const LayerPlan& plan) {
    views(plan);
    for (std::size_t i = 0; i < plan.experts.size(); ++i) await(plan, i);
    return views_;
  }

  /// As `resolve`, without waiting: each view's bytes are where its load puts them. An expert
  /// whose load is `loading` must be `await`ed before its bytes are read, so an engine can run
  /// the resident experts while the missing ones are still on their way.
  std::span<const WeightView> views(const LayerPlan& plan) {
    views_.clear();
    for (const ExpertPlan& p : plan.experts) {
      WeightView v{p.key, p.precision, p.placement, {}, p.n_tokens, p.weight_sum};
      if constexpr (declares<LoaderT>(Hook::matrix_order))
        if (p.placement != Placement::skipped) v.order = loader_.matrix_order(p.precision);
      if (p.placement == Placement::device) {
        if constexpr (keeps_bytes) v.bytes = cache_.arena().bytes(p.slot, bytes_of(p.precision));
      } else if (p.placement == Placement::host_cpu) {
        if constexpr (declares<LoaderT>(Hook::host_bytes))
          v.bytes = loader_.host_bytes(p.key, p.precision);
      }
      views_.push_back(v);
    }
    return views_;
  }

  /// True when planned expert `i`'s bytes are still being loaded (`await` them first).
  [[nodiscard]] bool loading(const LayerPlan& plan, std::size_t i) const noexcept {
    const ExpertPlan& p = plan.experts[i];
    return p.placement == Placement::device && p.ticket.valid() && !awaited_[i];
  }

  /// Waits for planned expert `i`'s load (at once when it has none or was awaited); rethrows the
  /// load's error.
  void await(const LayerPlan& plan, std::size_t i) {
    if (!loading(plan, i)) return;
    const ExpertPlan& p = plan.experts[i];
    awaited_[i] = 1;
    const auto t0 = std::chrono::steady_clock::now();
    loader_.wait(p.ticket);
    stats_.stall_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!is_staging(p.slot) && cache_.entry(p.key).ticket == p.ticket)
      cache_.mark_loaded(p.key);  // evictable again once end_layer drops the layer pin
  }

  /// The layer's experts have run: their pins are released, staging slots recycled, and soft pins
  /// of predictions for this layer dropped.
  void end_layer(const LayerContext& ctx) noexcept {
    await_unawaited_staging();
    for (const ExpertPlan& p : plan_.experts) {
      if (narrowed_ && p.placement == Placement::device && !is_staging(p.slot)) {
        cache_.pin_soft(p.key);  // retained until the token's verdict
        retained_.push_back(p.key);
      }
      if (p.hit) {
        cache_.unpin_hard(p.key);
      } else if (p.placement == Placement::device) {
        if (is_staging(p.slot)) {
          if constexpr (keeps_bytes) cache_.arena().release(p.slot);
        } else {
          cache_.unpin_hard(p.key);
        }
      }
    }
    release_soft_pins(ctx.layer);
    release_served_staging(ctx.layer);
    issue_waiting_after_layer(ctx.layer);
  }

  /// The token's forward is complete; `output_logits` are the model's output for it. On
  /// `fallback` the engine recomputes the token (its KV rolled back) with `active_top_k` again.
  TokenVerdict end_token(std::span<const float> output_logits) {
    const TokenVerdict v = token_policy_.end_token(output_logits);
    if (v == TokenVerdict::fallback) {
      ++stats_.fallbacks;
      retain_for_recomputation();
      if constexpr (declares<PredictorT>(Hook::on_verdict)) {
        PrefetchList list{std::span<Prefetch>(prefetch_buf_)};
        predictor_.on_verdict(v, list);
        issue_prefetches(none_layer, list.items());
      }
    } else {
      ++stats_.tokens_accepted;
      release_retained();
    }
    return v;
  }

  // ---- observation ------------------------------------------------------------------------------
  [[nodiscard]] PipelineStats stats() const {
    PipelineStats s = stats_;
    s.cache = cache_.stats();
    return s;
  }
  [[nodiscard]] const ModelShape& shape() const noexcept { return shape_; }
  [[nodiscard]] const PipelineConfig& config() const noexcept { return cfg_; }
  [[nodiscard]] const Cache& cache() const noexcept { return cache_; }
  [[nodiscard]] Cache& cache() noexcept { return cache_; }
  [[nodiscard]] ScorerT& scorer() noexcept { return scorer_; }
  [[nodiscard]] PredictorT& predictor() noexcept { return predictor_; }
  [[nodiscard]] const PredictorT& predictor() const noexcept { return predictor_; }
  [[nodiscard]] LoaderT& loader() noexcept { return loader_; }
  [[nodiscard]] const LoaderT& loader() const noexcept { return loader_; }
  [[nodiscard]] SchedulerT& scheduler() noexcept { return scheduler_; }
  [[nodiscard]] TokenPolicyT& token_policy() noexcept { return token_policy_; }
  /// Bytes of expert memory held (cache + staging), when the loader keeps bytes.
  [[nodiscard]] std::size_t memory_held_bytes() const noexcept {
    if constexpr (keeps_bytes) return cache_.arena().held_bytes();
    return 0;
  }
  /// The most expert memory held at once (cache + staging), when the loader keeps bytes.
  [[nodiscard]] std::size_t memory_peak_bytes() const noexcept {
    if constexpr (keeps_bytes) return cache_.arena().peak_bytes();
    return 0;
  }

 private:
  static constexpr std::uint32_t none_layer = 0xffffffffu;

  struct InFlight {
    ExpertKey key;
    LoadTicket ticket;
    bool preload = false;  ///< a start-up placement: not a guess, never withdrawn
  };

  static const ModelShape& validated(const ModelShape& shape, const PipelineConfig& cfg) {
    shape.validate();
    MOEKIT_EXPECTS(cfg.base_precision != Precision::skip,
                   "PipelineConfig.base_precision must be a stored format, not skip");
    MOEKIT_EXPECTS(cfg.max_prefetch_distance <= max_prediction_distance,
                   "PipelineConfig.max_prefetch_distance must be <= " +
                       std::to_string(max_prediction_distance) +
                       " (max_prediction_distance: the farthest the pipeline admits and scores "
                       "prefetches)");
    const std::size_t one = shape.expert_bytes(cfg.base_precision);
    if (cfg.expert_budget_bytes < std::size_t{shape.top_k} * one)
      detail::fail(ErrorKind::invalid_argument,
                   "expert budget of " + std::to_string(cfg.expert_budget_bytes) +
                       " bytes is too small: one token needs top_k = " +
                       std::to_string(shape.top_k) + " experts of " + std::to_string(one) +
                       " bytes at " + std::string(name(cfg.base_precision)) +
                       "; the minimum budget is " + std::to_string(shape.top_k * one) + " bytes");
    return shape;
  }
  static PipelineConfig normalised(PipelineConfig c, const ModelShape& shape) {
    if (c.sizing_precision == Precision::skip) c.sizing_precision = c.base_precision;
    if (c.staging_slots == 0) c.staging_slots = shape.n_experts;
    return c;
  }
  // The arena behind the cache slots and the staging slots, when the loader keeps bytes. Its
  // limit, what it may hold in live and idle buffers together, is the budget plus one expert: a
  // transient slot in use beyond the budget makes the arena free idle buffers instead of keeping
  // them (kept up to the budget plus every transient slot, a mix of q2 and q4 buffers held 1.7 GB
  // more than Fate's budget on Mixtral and OOM-killed it: bench/RESULTS.md, "The gate predictors
  // on real routing").
  static ExpertArena make_arena(const ModelShape& shape, const PipelineConfig& cfg) {
    if constexpr (!keeps_bytes) return ExpertArena{};
    const std::size_t max_bytes = shape.expert_bytes(cfg.base_precision);
    const std::size_t transient = std::size_t{cfg.staging_slots} + cfg.prefetch_staging_slots +
                                  (cfg.upgrade_precision != Precision::skip);
    return ExpertArena(shape.expert_count() + transient, cfg.expert_budget_bytes + max_bytes);
  }
  // The budget's share held by prefetch staging (the cache gets the rest).
  static std::size_t staging_bytes(const ModelShape& shape, const PipelineConfig& cfg) {
    const std::size_t b =
        std::size_t{cfg.prefetch_staging_slots} * shape.expert_bytes(cfg.sizing_precision);
    if (b > cfg.expert_budget_bytes)
      detail::fail(
          ErrorKind::invalid_argument,
          "PipelineConfig.prefetch_staging_slots: " + std::to_string(cfg.prefetch_staging_slots) +
              " slots of " + std::to_string(shape.expert_bytes(cfg.sizing_precision)) +
              " bytes exceed the expert budget of " + std::to_string(cfg.expert_budget_bytes) +
              " bytes");
    return b;
  }
  [[nodiscard]] std::size_t prefetch_capacity() const noexcept {
    return std::size_t{shape_.n_experts} * (cfg_.max_prefetch_distance + 1) +
           std::size_t{shape_.n_layers} * shape_.top_k;
  }
  [[nodiscard]] std::size_t bytes_of(Precision p) const noexcept {
    return bytes_[static_cast<std::size_t>(p)];
  }
  [[nodiscard]] bool is_staging(std::uint32_t slot) const noexcept {
    return slot >= shape_.expert_count();
  }

  template <class C>
  static void call_begin_sequence(C& c) {
    if constexpr (declares<C>(Hook::begin_sequence)) c.begin_sequence();
  }

  static bool resident_fn(const void* self, ExpertKey key, Precision want) noexcept {
    const auto* p = static_cast<const OffloadPipeline*>(self);
    if (!p->shape_.contains(key)) return false;
    return p->cache_.resident_at(key, want) ||
           (p->staging_.enabled() && p->staging_.find(key, want) != PrefetchStaging::none);
  }

  // Unique experts of the layer call, with token counts and weights, in first-seen order.
  void build_demands(const GateView& gate) { collect_demands(gate, demand_slot_, demands_); }

  // Scores the predictions made for this layer (at every distance) against its true demand
  // (`truth_` marks the layer's demanded experts).
  void score_predictions(std::uint32_t layer) {
    const std::size_t base = std::size_t{layer} * shape_.n_experts;
    for (std::uint32_t dist = 1; dist <= max_prediction_distance; ++dist) {
      if (layer < dist) continue;
      PredictionStats& s = stats_.prediction[dist];
      std::uint32_t& pending = pending_predictions_[dist][layer];
      if (pending == 0) {  // nothing predicted for this layer at this distance: all misses
        s.false_negative += demands_.size();
        continue;
      }
      pending = 0;
      std::vector<std::uint8_t>& pred = predicted_[dist];
      for (std::uint32_t e = 0; e < shape_.n_experts; ++e) {
        const bool p = pred[base + e] != 0, t = truth_[e] != 0;
        s.true_positive += p && t;
        s.false_positive += p && !t;
        s.false_negative += !p && t;
        pred[base + e] = 0;
      }
    }
  }

  // A demand's access: asked at `asked` by `n_tokens` tokens, of which those the scorer counted
  // asked `asked` themselves (HOBBIT's LHU counts only them as high-precision uses).
  AccessInfo demand_access(Precision asked, std::uint32_t layer, std::uint32_t expert,
                           std::uint32_t n_tokens) {
    AccessInfo a = cache_.access(asked, layer, n_tokens);
    a.n_tokens_asking = tokens_asking_[expert];
    return a;
  }

  ExpertPlan plan_for(const LayerContext& ctx, std::size_t i) {
    const ExpertDemand& d = demands_[i];
    ExpertPlan p;
    p.key = {ctx.layer, d.expert};
    p.precision = precisions_[i];
    p.n_tokens = d.n_tokens;
    p.weight_sum = d.weight_sum;
    ++stats_.demands;
    // `skip` drops a miss; a resident copy runs anyway (its compute is free: HOBBIT §2.2), unless
    // the config asks for unconditional skips.
    const bool skip = p.precision == Precision::skip;
    if (skip && (cfg_.skip_even_if_resident || !cache_.resident(p.key))) {
      p.placement = Placement::skipped;
      ++stats_.skipped;
      return p;
    }
    const Precision want = skip ? Precision::q2 : p.precision;  // any resident copy serves
    if (cache_.resident_at(p.key, want)) {
      const auto& e = cache_.entry(p.key);
      p.hit = true;
      p.precision = e.precision;  // a more precise resident copy is used as is
      p.slot = e.slot;
      if (e.loading) {
        p.in_flight = true;
        p.ticket = e.ticket;
        ++stats_.late_prefetches;
      }
      // The policy learns what was asked (a skip or a low request served by a more precise copy
      // is not a high-precision use: HOBBIT's LHU, §3.3).
      cache_.on_hit(p.key, demand_access(precisions_[i], ctx.layer, d.expert, d.n_tokens));
      cache_.pin_hard(p.key);
      ++stats_.hits;
    } else if (staging_.enabled()) {
      serve_from_staging(ctx, p, want);
    }
    return p;
  }

  void load_demand(const LayerContext& ctx, ExpertPlan& p) {
    const std::size_t bytes = bytes_of(p.precision);
    const auto r =
        cache_.insert(p.key, demand_access(p.precision, ctx.layer, p.key.expert, p.n_tokens));
    if (r.ok()) {
      p.slot = r.slot;
      p.ticket = start_load(p.key, p.precision, LoadPriority::on_demand, r.slot);
      cache_.pin_hard(p.key);  // layer pin (released by end_layer)
      if (upgrade_.below_target(p.precision)) upgrade_.request(p.key);
    } else {
      if (staging_used_ >= cfg_.staging_slots)
        detail::fail(ErrorKind::invalid_argument,
                     "expert budget too small for layer " + std::to_string(ctx.layer) +
                         ": it needs more experts at once than the cache (" +
                         std::to_string(cache_.capacity_bytes()) + " bytes) plus " +
                         std::to_string(cfg_.staging_slots) +
                         " staging slots can hold; raise the expert budget, the staging slots "
                         "or split the prefill into smaller chunks");
      p.slot = static_cast<std::uint32_t>(shape_.expert_count() + staging_used_++);
      p.ticket = submit(p.key, p.precision, LoadPriority::on_demand, p.slot, bytes);
      ++stats_.staged;
    }
    stats_.bytes_demand_loaded += bytes;
  }

  LoadTicket submit(ExpertKey key, Precision prec, LoadPriority prio, std::uint32_t slot,
                    std::size_t bytes) {
    LoadRequest req{key, prec, prio, {}};
    if constexpr (keeps_bytes)
      req.dest = cache_.arena().acquire(slot, bytes);
    else
      (void)slot, (void)bytes;
    return loader_.submit(req);
  }

  // Starts the load of `key`, just inserted at `slot`: submitted, marked loading (the cache keeps
  // the entry until the load is seen complete) and tracked until then.
  LoadTicket start_load(ExpertKey key, Precision prec, LoadPriority prio, std::uint32_t slot) {
    const LoadTicket t = submit(key, prec, prio, slot, bytes_of(prec));
    cache_.mark_loading(key, t);
    in_flight_.push_back({key, t});
    return t;
  }

  // Prefetches: validated, recorded for the prediction metrics, admitted if there is room. A
  // prefetch of a layer call lies `distance` layers after it, within the distance limit; one of
  // `on_verdict` (from_layer none) has no predicting layer and is not scored.
  void issue_prefetches(std::uint32_t from_layer, std::span<const Prefetch> items) {
    for (const Prefetch& pf : items) {
      const bool placed = from_layer == none_layer ||
                          (pf.distance >= 1 && pf.distance <= cfg_.max_prefetch_distance &&
                           pf.key.layer == from_layer + pf.distance);
      if (!shape_.contains(pf.key) || !placed || pf.precision == Precision::skip) {
        ++stats_.prefetches_dropped;
        continue;
      }
      const std::uint32_t dist = from_layer == none_layer ? 0 : pf.distance;
      if (dist >= 1) {
        std::uint8_t& bit = predicted_[dist][shape_.index(pf.key)];
        if (!bit) ++pending_predictions_[dist][pf.key.layer];
        bit = 1;
      }
      if (cache_.resident_at(pf.key, pf.precision)) {
        ++stats_.prefetches_redundant;
        soft_pin(pf.key);
        continue;
      }
      if (staging_.enabled()) {
        stage_prefetch(pf);
        continue;
      }
      if (cache_.pinned(pf.key)) {  // a lower-precision copy is in use: do not replace it
        ++stats_.prefetches_dropped;
        continue;
      }
      const std::size_t bytes = bytes_of(pf.precision);
      const auto r = cache_.insert(
          pf.key, cache_.access(pf.precision, from_layer == none_layer ? 0 : from_layer, 1,
                                /*prefetch=*/true));
      if (!r.ok()) {
        ++stats_.prefetches_dropped;
        continue;
      }
      (void)start_load(pf.key, pf.precision, LoadPriority::prefetch, r.slot);
      soft_pin(pf.key);
      ++stats_.prefetches_issued;
      stats_.bytes_prefetched += bytes;
      plan_.prefetches.push_back(pf);
    }
  }

  // A predicted expert is soft-pinned once, until its layer ends (or it leaves the cache, which
  // forgets its pins). Only the pipeline soft-pins entries of its cache.
  void soft_pin(ExpertKey key) {
    if (cache_.entry(key).soft_pins > 0) return;
    cache_.pin_soft(key);
    soft_by_layer_[key.layer].push_back(key);
  }
  // A layer that ends before its engine awaited every load (its computation threw): a load into
  // a staging slot still writes into the slot end_layer is about to release, so it ends first
  // (a load into a cache slot is kept by the cache until seen complete). Errors are dropped: the
  // engine is already unwinding with its own.
  void await_unawaited_staging() noexcept {
    for (std::size_t i = 0; i < plan_.experts.size(); ++i) {
      if (!loading(plan_, i) || !is_staging(plan_.experts[i].slot)) continue;
      try {
        await(plan_, i);
      } catch (...) {  // NOLINT(bugprone-empty-catch): see above
      }
    }
  }

  void release_soft_pins(std::uint32_t layer) noexcept {
    for (ExpertKey k : soft_by_layer_[layer])
      if (cache_.entry(k).soft_pins > 0) cache_.unpin_soft(k);
    soft_by_layer_[layer].clear();
  }
  // Retained experts (`retain_narrowed_experts`) of an accepted token are released; on a fallback
  // each still resident one moves to its layer's soft pins, released when the recomputation ends
  // that layer.
  void release_retained() noexcept {
    for (ExpertKey k : retained_)
      if (cache_.entry(k).soft_pins > 0) cache_.unpin_soft(k);
    retained_.clear();
  }
  void retain_for_recomputation() {
    for (ExpertKey k : retained_) {
      if (!cache_.resident(k) || cache_.entry(k).soft_pins == 0) continue;  // evicted meanwhile
      soft_by_layer_[k.layer].push_back(k);
    }
    retained_.clear();
  }

  // Loads seen complete (every load, waited for, with `wait_all`) make their entries evictable.
  void collect_completed_loads(bool wait_all = false) {
    std::size_t w = 0;
    for (const InFlight& f : in_flight_) {
      const auto& e = cache_.entry(f.key);
      if (!e.loading || e.ticket != f.ticket) continue;  // resolved, evicted or replaced
      if (wait_all || loader_.poll(f.ticket)) {
        loader_.wait(f.ticket);  // complete: rethrows the load's error, if any
        cache_.mark_loaded(f.key);
        continue;
      }
      in_flight_[w++] = f;
    }
    in_flight_.resize(w);
    for (std::size_t i = 0; i < staging_.capacity(); ++i) {
      const PrefetchStaging::Slot& s = staging_[i];
      if (s.state != PrefetchStaging::State::orphan) continue;
      if (!wait_all && !loader_.poll(s.ticket)) continue;
      loader_.wait(s.ticket);
      free_staging_slot(i);
    }
    advance_upgrades(wait_all);
  }

  // Lazy upgrades (cfg_.upgrade_precision): a finished re-fetch replaces its entry's copy in place
  // (its buffer handed to the entry's slot); the next starts only while no other load is pending.
  void advance_upgrades(bool wait_all) {
    if (!upgrade_.enabled()) return;
    if (upgrade_.busy()) {
      if (!wait_all && !loader_.poll(upgrade_.ticket())) return;
      loader_.wait(upgrade_.ticket());
      upgrade_.finish();
      const ExpertKey k = upgrade_.key();
      const std::uint32_t slot = cache_.entry(k).slot;
      if (cache_.upgrade(k, cache_.access(upgrade_.target(), k.layer))) {
        if constexpr (keeps_bytes) cache_.arena().swap(slot, upgrade_.slot());
        ++stats_.upgrades;
      } else {
        ++stats_.upgrades_dropped;
      }
      if constexpr (keeps_bytes) cache_.arena().release(upgrade_.slot());
    }
    if (wait_all || !in_flight_.empty() || staging_loading()) return;  // the link is busy
    while (const auto k = upgrade_.next()) {
      const auto& e = cache_.entry(*k);
      if (!e.resident() || !upgrade_.below_target(e.precision) || e.loading) continue;
      const std::size_t bytes = bytes_of(upgrade_.target());
      upgrade_.start(*k,
                     submit(*k, upgrade_.target(), LoadPriority::prefetch, upgrade_.slot(), bytes));
      stats_.bytes_upgraded += bytes;
      return;
    }
  }
  [[nodiscard]] bool staging_loading() {
    for (std::size_t i = 0; i < staging_.capacity(); ++i) {
      const PrefetchStaging::Slot& s = staging_[i];
      if (s.state != PrefetchStaging::State::free && s.ticket.valid() && !loader_.poll(s.ticket))
        return true;
    }
    return false;
  }

  // Queued prefetches for this layer that it does not need (`truth_` unmarked) and no one uses
  // (no hard pin) are withdrawn.
  void cancel_stale_prefetches(std::uint32_t layer) {
    std::size_t w = 0;
    for (const InFlight& f : in_flight_) {
      const auto& e = cache_.entry(f.key);
      // A preload is not withdrawn: it is placement, and its bytes are not in bytes_prefetched.
      if (!f.preload && f.key.layer == layer && e.loading && e.ticket == f.ticket &&
          !truth_[f.key.expert] && e.hard_pins == 0 && loader_.cancel(f.ticket)) {
        stats_.bytes_prefetched -= e.bytes;
        cache_.cancel_load(f.key);
        ++stats_.prefetches_cancelled;
        continue;
      }
      in_flight_[w++] = f;
    }
    in_flight_.resize(w);
  }

  // ---- prefetch staging (cfg_.prefetch_staging_slots > 0; cache/prefetch_staging.hpp) ----------
  // A prefetch waits in a free staging slot, or, when none is free, for one (issue_waiting_
  // prefetches); the cache is not touched.
  void stage_prefetch(const Prefetch& pf) {
    if (staging_.find(pf.key, pf.precision) != PrefetchStaging::none) {
      ++stats_.prefetches_redundant;
      return;
    }
    const std::size_t i = staging_.free_slot();
    if (i == PrefetchStaging::none) {
      wait_for_staging_slot(pf);
      return;
    }
    load_staged(i, pf);
    plan_.prefetches.push_back(pf);
  }
  void load_staged(std::size_t i, const Prefetch& pf) {
    const std::size_t bytes = bytes_of(pf.precision);
    const LoadTicket t =
        submit(pf.key, pf.precision, LoadPriority::prefetch, staging_.slot_id(i), bytes);
    staging_.stage(i, pf.key, pf.precision, t, bytes);
    ++stats_.prefetches_issued;
    stats_.bytes_prefetched += bytes;
  }
  // Fate's staging exhaustion: the prefetch waits until a slot is released (design spec fate.md
  // §2.8; the paper does not say), once per expert, the most precise request kept.
  void wait_for_staging_slot(const Prefetch& pf) {
    for (Prefetch& w : waiting_)
      if (w.key == pf.key) {
        if (bits(pf.precision) > bits(w.precision)) w.precision = pf.precision;
        ++stats_.prefetches_redundant;
        return;
      }
    if (waiting_.size() == waiting_.capacity()) {  // bounded: no allocation on the layer path
      ++stats_.prefetches_dropped;
      return;
    }
    waiting_.push_back(pf);
    ++stats_.prefetches_waited;
  }
  // From end_layer (noexcept, and run by LayerCall's destructor, also while an exception
  // unwinds): a prefetch is worth no failure, so one that cannot be submitted is dropped with
  // those still waiting; the demand for it, if any, meets the same error on the normal path.
  void issue_waiting_after_layer(std::uint32_t layer) noexcept {
    if (waiting_.empty()) return;
    try {
      if (std::uncaught_exceptions() == 0) return issue_waiting_prefetches(layer);
    } catch (...) {  // NOLINT(bugprone-empty-catch): dropped below
    }
    stats_.prefetches_dropped += waiting_.size();
    waiting_.clear();
  }
  // Waiting prefetches take the slots free now, first come first served, once `layer` has
  // routed or ended; one for `layer` or an earlier layer (every one, with `none_layer`) is
  // dropped: its layer loads what it needs on demand.
  void issue_waiting_prefetches(std::uint32_t layer) {
    std::size_t w = 0;
    for (const Prefetch& pf : waiting_) {
      const bool stale = layer == none_layer || pf.key.layer <= layer;
      if (stale) {
        ++stats_.prefetches_dropped;
        continue;
      }
      if (cache_.resident_at(pf.key, pf.precision) ||
          staging_.find(pf.key, pf.precision) != PrefetchStaging::none) {
        ++stats_.prefetches_redundant;
        continue;
      }
      const std::size_t i = staging_.free_slot();
      if (i == PrefetchStaging::none) {
        waiting_[w++] = pf;
        continue;
      }
      load_staged(i, pf);
    }
    waiting_.resize(w);
  }

  // A demand not in the cache that waits in staging is a hit: it is admitted to the cache as a
  // demand miss would be (the policy sees a demand), its buffer handed to the cache slot; when the
  // cache cannot admit it (no slot in its layer, or all pinned) it serves from staging.
  void serve_from_staging(const LayerContext& ctx, ExpertPlan& p, Precision want) {
    const std::size_t i = staging_.find(p.key, want);
    if (i == PrefetchStaging::none) return;
    PrefetchStaging::Slot& s = staging_[i];
    if (s.ticket.valid() && loader_.poll(s.ticket)) {
      loader_.wait(s.ticket);  // complete: rethrows the load's error, if any
      s.ticket = {};
    }
    p.hit = true;
    p.precision = s.precision;
    p.ticket = s.ticket;
    p.in_flight = s.ticket.valid();
    stats_.late_prefetches += p.in_flight;
    ++stats_.hits;
    ++stats_.staged_prefetch_hits;
    const auto r = cache_.insert(p.key, cache_.access(s.precision, ctx.layer, p.n_tokens));
    if (!r.ok()) {
      p.slot = staging_.slot_id(i);
      s.state = PrefetchStaging::State::serving;
      return;
    }
    if constexpr (keeps_bytes) cache_.arena().swap(r.slot, staging_.slot_id(i));
    if (s.ticket.valid()) {
      cache_.mark_loading(p.key, s.ticket);
      in_flight_.push_back({p.key, s.ticket});
    }
    cache_.pin_hard(p.key);
    p.slot = r.slot;
    staging_.free(i);
    if (upgrade_.below_target(p.precision)) upgrade_.request(p.key);
  }

  // Staged prefetches for `layer` it does not need (`truth_` unmarked), any for earlier layers and,
  // at layer 0 (a new forward), any left from the last forward are freed: withdrawn if queued, else
  // freed now or, while loading, once complete. `none_layer` frees every waiting one (a new
  // sequence).
  void free_unused_staged(std::uint32_t layer) {
    for (std::size_t i = 0; i < staging_.capacity(); ++i) {
      PrefetchStaging::Slot& s = staging_[i];
      if (s.state != PrefetchStaging::State::waiting) continue;
      const bool stale = layer == none_layer || s.key.layer < layer ||
                         (s.key.layer == layer && !truth_[s.key.expert]) ||
                         (layer == 0 && s.key.layer > 0);
      if (!stale) continue;
      if (s.ticket.valid() && loader_.cancel(s.ticket)) {
        stats_.bytes_prefetched -= s.bytes;
        ++stats_.prefetches_cancelled;
        free_staging_slot(i);
        continue;
      }
      ++stats_.prefetches_unused;
      if (s.ticket.valid() && !loader_.poll(s.ticket)) {
        s.state = PrefetchStaging::State::orphan;  // collect_completed_loads frees it
        continue;
      }
      if (s.ticket.valid()) loader_.wait(s.ticket);
      free_staging_slot(i);
    }
  }

  // The layer's experts served from staging have run (resolve waited for their loads).
  void release_served_staging(std::uint32_t layer) noexcept {
    for (std::size_t i = 0; i < staging_.capacity(); ++i)
      if (staging_[i].state == PrefetchStaging::State::serving && staging_[i].key.layer == layer)
        free_staging_slot(i);
  }
  void free_staging_slot(std::size_t i) noexcept {
    if constexpr (keeps_bytes) cache_.arena().release(staging_.slot_id(i));
    staging_.free(i);
  }

  ModelShape shape_;
  PipelineConfig cfg_;
  // Declared before the loader so that the cache's arena is destroyed after it: the loader's
  // destructor waits for the loads its threads are writing into the arena (a pipeline unwound by
  // an exception with loads in flight freed their destination first and the loader thread
  // crashed).
  Cache cache_;
  [[no_unique_address]] ScorerT scorer_;
  [[no_unique_address]] PredictorT predictor_;
  LoaderT loader_;
  [[no_unique_address]] SchedulerT scheduler_;
  [[no_unique_address]] TokenPolicyT token_policy_;
  PrefetchStaging staging_;  // empty unless cfg_.prefetch_staging_slots > 0
  LazyUpgrade upgrade_;      // disabled unless cfg_.upgrade_precision is a format

  PipelineStats stats_{};
  LayerPlan plan_;
  std::vector<WeightView> views_;
  std::vector<std::uint8_t> awaited_;  // per planned expert of the layer: its load waited for
  std::vector<ExpertDemand> demands_;
  std::vector<int> demand_slot_;
  std::vector<Precision> precisions_;
  std::vector<std::uint32_t> tokens_asking_;  // per expert of the layer call: the scorer's
  std::vector<Prefetch> prefetch_buf_;
  std::vector<Prefetch> waiting_;  // prefetches waiting for a staging slot, in arrival order
  std::vector<InFlight> in_flight_;
  std::vector<std::uint8_t> truth_;
  // [distance][expert index]: predicted?
  std::array<std::vector<std::uint8_t>, max_prediction_distance + 1> predicted_;
  // [distance][layer]: how many
  std::array<std::vector<std::uint32_t>, max_prediction_distance + 1> pending_predictions_;
  std::vector<std::vector<ExpertKey>> soft_by_layer_;  // soft-pinned keys, by their layer
  std::uint32_t staging_used_ = 0;
  bool narrowed_ = false;            // the current layer call retains its experts
  std::vector<ExpertKey> retained_;  // soft-pinned by retention, until the token's verdict
  std::array<std::size_t, precision_slots> bytes_{};  // expert bytes per Precision
};

}  // namespace moekit
