#pragma once
/// \file The feed-forward half of a decoder layer: the routed MoE block through an
/// OffloadPipeline (plus Qwen2-MoE's gated shared expert), or a dense SwiGLU MLP.
///
/// Router as transformers: logits = W_r·x, p = softmax(logits) over all experts, the top-k of p
/// (descending), renormalised to sum 1 when the config says so. The pipeline gets the whole
/// forward's routing at once (`route` → plan, `views` → one WeightView per distinct expert, with
/// its bytes and where their rows are); each expert runs once on the tokens that chose it
/// (precision/'s fused SwiGLU FFN), the resident ones while the missing ones still load (each
/// missing one once its own load ends); then each token sums weight·expert(x) over its experts in
/// ascending expert id — the order of transformers' index_add_ loop, and independent of the plan's
/// order, so results do not depend on what was resident. Routed experts may run with int8
/// activations (activations.hpp), in decode and prefill; the router, dense MLPs and Qwen2-MoE's
/// shared expert take the dense matrices' options (Model::set_int8_dense_activations; f32 routers
/// stay float). With a RoutingReplay set (routing_replay.hpp, moe-run --routing-trace), a trace's
/// experts and weights replace the router's top-k before the pipeline sees the GateView; the logits
/// stay the router's unless the replay replaces them too. A pipeline whose predictor fixed this
/// layer's experts in advance (`planned_experts`: MoBiLE's big pass on the little pass's plan) gets
/// exactly those, weighted by this pass's router probabilities at them (renormalised when the
/// config says so). A routing replay wins over such a plan when the plan came from the model's own
/// logits (a random model's plan says nothing); when the replay replaced the logits, the plan came
/// from the trace's and wins, as the paper's big pass runs its plan (mobile-oracle).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "moekit/core/gate_view.hpp"
#include "moekit/core/layer_context.hpp"
#include "moekit/error.hpp"
#include "moekit/io/expert_blob.hpp"
#include "moekit/layer_call.hpp"
#include "moekit/pipeline.hpp"  // WeightView
#include "moekit/precision/expert_ffn.hpp"
#include "moekit/precision/gemv.hpp"

#include "moekit/engine/config.hpp"
#include "moekit/engine/ops.hpp"
#include "moekit/engine/routing_replay.hpp"
#include "moekit/engine/token_profile.hpp"
#include "moekit/engine/weights.hpp"

namespace moekit::engine {

/// Where the current forward sits in the sequence, for the pipeline's LayerContext.
struct ForwardInfo {
  std::uint64_t start = 0;  ///< position of the first token
  std::uint32_t n_tokens = 1;
  moekit::Phase phase = moekit::Phase::decode;
  std::uint64_t sequence_id = 0;
};

/// Runs MoE (or dense MLP) blocks; owns scratch buffers reused across calls.
template <class Pipeline>
class MoeLayer {
 public:
  MoeLayer(const ModelConfig& cfg, Pipeline& pipeline) : cfg_(cfg), pipeline_(pipeline) {}

  /// Routed experts with int8 activations (quantized experts on AVX-512 VNNI; ignored elsewhere).
  void set_int8_expert_activations(bool on) noexcept { int8_experts_ = on; }
  [[nodiscard]] bool int8_expert_activations() const noexcept { return int8_experts_; }

  /// Experts and gate weights from a trace instead of the router (routing_replay.hpp; null: the
  /// router's own). The replay must outlive the layer's forwards.
  void set_routing_replay(RoutingReplay* r) noexcept { replay_ = r; }

  /// Times routing and pipeline, routed experts, load waits and dense MLPs (null: off).
  void set_profile(TokenProfile* p) noexcept { profile_ = p; }

  /// out = ffn(x) for the n rows of x (already normalised) at decoder layer `layer`.
  void forward(std::uint32_t layer, const LayerWeights& w, std::span<const float> x,
               const ForwardInfo& info, std::span<float> out, const moekit::KernelOptions& opts) {
    const std::uint32_t n = info.n_tokens;
    batched_ = info.phase == moekit::Phase::prefill;  // ops.hpp: for_rows
    std::fill(out.begin(), out.end(), 0.f);
    if (cfg_.moe_index[layer] < 0) {
      const TokenProfile::Scope dense(profile_, TokenPart::dense);
      ffn(w.mlp.view(), x, n, out, opts);
      return;
    }
    const moekit::LayerContext ctx{.layer = static_cast<std::uint32_t>(cfg_.moe_index[layer]),
                                   .n_layers = cfg_.n_moe_layers,
                                   .token_index = info.start,
                                   .phase = info.phase,
                                   .sequence_id = info.sequence_id,
                                   .n_tokens = n};
    std::optional<TokenProfile::Scope> routing(std::in_place, profile_, TokenPart::routing);
    std::uint32_t k = route(w, x, n, pipeline_.active_top_k(ctx), opts);
    if (replay_) {
      replay_->apply(ctx.layer, k, experts_, weights_);  // before the pipeline sees it
      replay_->apply_logits(ctx.layer, logits_);
    }
    if (n == 1 && (!replay_ || replay_->replaces_logits())) k = impose_plan(ctx, k);
    const moekit::GateView gate{.n_tokens = n,
                                .k = k,
                                .n_experts = cfg_.n_experts,
                                .logits = logits_,
                                .experts = experts_,
                                .weights = weights_,
                                .hidden = x};
    {
      moekit::LayerCall<Pipeline> call(pipeline_, ctx, gate);  // the layer ends with the scope
      double stalled = profile_ ? stall_seconds() : 0;
      const auto views = lazy_views(call);
      if (profile_) routing->move_out(TokenPart::load_wait, stall_seconds() - stalled);
      routing.reset();
      {
        TokenProfile::Scope experts(profile_, TokenPart::experts);
        stalled = profile_ ? stall_seconds() : 0;
        run_experts(call, views, x, n, k, opts);
        if (profile_) experts.move_out(TokenPart::load_wait, stall_seconds() - stalled);
      }
      routing.emplace(profile_, TokenPart::routing);  // end_layer, as the scope closes
    }
    combine(n, k, out);
    routing.reset();
    const TokenProfile::Scope dense(profile_, TokenPart::dense);
    if (!w.shared.empty()) add_shared_expert(w, x, n, out, opts);
  }

  /// Layer forwards whose experts ran each whole on one thread (run_experts_apart).
  [[nodiscard]] std::uint64_t experts_apart_layers() const noexcept { return apart_layers_; }

  /// The pipeline's load-wait seconds so far (0 for a pipeline without statistics).
  [[nodiscard]] double stall_seconds() const {
    if constexpr (requires { pipeline_.stats().stall_seconds; })
      return pipeline_.stats().stall_seconds;
    else
      return 0;
  }

 private:
  // Router: logits, softmax, top-k (descending, ties to the lower id), optional renormalisation.
  std::uint32_t route(const LayerWeights& w, std::span<const float> x, std::uint32_t n,
                      std::uint32_t k, const moekit::KernelOptions& opts) {
    const std::uint32_t E = cfg_.n_experts;
    MOEKIT_EXPECTS(k >= 1 && k <= E,
                   "MoeLayer: the token policy's top-k is outside [1, n_experts]");
    logits_.resize(std::size_t{n} * E);
    linear(w.router, x, n, logits_, opts, batched_);
    experts_.resize(std::size_t{n} * k);
    weights_.resize(std::size_t{n} * k);
    probs_.resize(E);
    order_.resize(E);
    for (std::uint32_t t = 0; t < n; ++t) {
      std::copy_n(logits_.data() + std::size_t{t} * E, E, probs_.data());
      softmax(probs_);
      std::iota(order_.begin(), order_.end(), 0u);
      std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                        [&](std::uint32_t a, std::uint32_t b) {
                          return probs_[a] > probs_[b] || (probs_[a] == probs_[b] && a < b);
                        });
      float sum = 0.f;
      for (std::uint32_t j = 0; j < k; ++j) sum += probs_[order_[j]];
      for (std::uint32_t j = 0; j < k; ++j) {
        experts_[std::size_t{t} * k + j] = order_[j];
        const float p = probs_[order_[j]];
        weights_[std::size_t{t} * k + j] = cfg_.norm_topk_prob ? p / sum : p;
      }
    }
    return k;
  }

  // The single token's experts become the pipeline's plan for this layer, if it has one, weighted
  // by this token's router probabilities at them; returns the experts per token.
  std::uint32_t impose_plan(const moekit::LayerContext& ctx, std::uint32_t k) {
    if constexpr (requires { pipeline_.planned_experts(ctx); }) {
      const std::span<const std::uint32_t> plan = pipeline_.planned_experts(ctx);
      if (plan.empty()) return k;
      std::copy_n(logits_.data(), cfg_.n_experts, probs_.data());
      softmax(probs_);
      experts_.assign(plan.begin(), plan.end());
      weights_.resize(plan.size());
      float sum = 0.f;
      for (std::uint32_t e : plan) sum += probs_[e];
      for (std::size_t j = 0; j < plan.size(); ++j)
        weights_[j] = cfg_.norm_topk_prob ? probs_[plan[j]] / sum : probs_[plan[j]];
      return static_cast<std::uint32_t>(plan.size());
    }
    return k;
  }

  // Pipelines that can hand out views before their loads end (OffloadPipeline::views).
  static constexpr bool lazy = requires(Pipeline & p, const moekit::LayerPlan& l) {
    p.views(l);
    p.loading(l, std::size_t{0});
    p.await(l, std::size_t{0});
  };

  template <class Call>
  decltype(auto) lazy_views(Call& call) {
    if constexpr (lazy)
      return call.views();
    else
      return call.resolve();
  }

  // Each planned expert runs once on the rows of the tokens that selected it; its output for
  // (token t, rank j) lands in y_[(t·k + j) × hidden] (unscaled). The resident ones run first,
  // while the missing ones load; each of those runs as soon as its load ends, in the order the
  // loads were issued. Each expert's rows land in their own place, so the order changes nothing
  // in the result.
  template <class Call>
  void run_experts(Call& call, std::span<const moekit::WeightView> views, std::span<const float> x,
                   std::uint32_t n, std::uint32_t k, const moekit::KernelOptions& opts) {
    y_.assign(std::size_t{n} * k * cfg_.hidden, 0.f);
    ran_.assign(std::size_t{n} * k, 0);
    moekit::KernelOptions expert_opts = opts;
    expert_opts.int8_activations = int8_experts_;
    ready_.clear();
    late_.clear();
    for (std::uint32_t i = 0; i < views.size(); ++i) {
      const moekit::WeightView& v = views[i];
      if (v.placement == moekit::Placement::skipped) continue;
      if (v.bytes.empty())
        moekit::detail::fail(moekit::ErrorKind::internal,
                             "pipeline resolved an expert without bytes (a loader that keeps no "
                             "bytes cannot drive the engine)");
      bool loading = false;
      if constexpr (lazy) loading = call.loading(i);
      if (loading)
        late_.push_back(i);
      else
        ready_.push_back(v);
    }
    if (!(n == 1 && !batched_ && run_experts_apart(ready_, x, k, expert_opts)))
      for (const moekit::WeightView& v : ready_) run_expert(v, x, n, k, expert_opts);
    if constexpr (lazy)
      for (const std::uint32_t i : late_) {
        call.await(i);
        run_expert(views[i], x, n, k, expert_opts);
      }
  }

  // One expert on the rows of the tokens that selected it.
  void run_expert(const moekit::WeightView& v, std::span<const float> x, std::uint32_t n,
                  std::uint32_t k, const moekit::KernelOptions& opts) {
    const std::size_t H = cfg_.hidden;
    rows_.clear();
    for (std::uint32_t i = 0; i < n * k; ++i)
      if (experts_[i] == v.key.expert) rows_.push_back(i);
    const std::size_t m = rows_.size();
    in_.resize(m * H);
    res_.assign(m * H, 0.f);
    for (std::size_t r = 0; r < m; ++r)
      std::copy_n(x.data() + std::size_t{rows_[r] / k} * H, H, in_.data() + r * H);
    ffn(moekit::io::expert_view(cfg_.shape(), v.bytes, v.precision, v.order), in_, m, res_, opts);
    for (std::size_t r = 0; r < m; ++r) {
      std::copy_n(res_.data() + r * H, H, y_.data() + std::size_t{rows_[r]} * H);
      ran_[rows_[r]] = 1;
    }
  }

  // A decode step's experts, each whole on one thread of the pool (its GEMVs not split): one job
  // for the layer instead of one per matrix of each expert, and each thread streams one expert at
  // a time. Taken when the experts share one format (equal work) and fill every thread evenly or
  // twice over. Not in prefill: a one-token chunk keeps the split GEMVs' rounding, so chunked
  // prefill stays bit-identical to one forward (the float multi-row kernels round by how a
  // range is cut). Returns false when not taken.
  bool run_experts_apart(std::span<const moekit::WeightView> views, std::span<const float> x,
                         std::uint32_t k, const moekit::KernelOptions& opts) {
    const std::size_t threads = opts.pool ? opts.pool->team_size() : 1;
    work_.clear();
    for (std::uint32_t i = 0; i < views.size(); ++i) {
      const moekit::WeightView& v = views[i];
      if (v.placement == moekit::Placement::skipped) continue;
      if (!work_.empty() && (v.precision != views[work_[0].first].precision ||
                             v.order != views[work_[0].first].order))
        return false;
      for (std::uint32_t j = 0; j < k; ++j)
        if (experts_[j] == v.key.expert) work_.emplace_back(i, j);
    }
    const std::size_t m = work_.size();
    if (threads < 2 || m < threads || (m % threads != 0 && m < 2 * threads)) return false;
    const moekit::ModelShape shape = cfg_.shape();
    moekit::KernelOptions one = opts;
    one.pool = nullptr;
    const std::size_t H = cfg_.hidden;
    opts.pool->parallel_for(0, m, 1, [&](std::size_t b, std::size_t e) {
      for (std::size_t w = b; w < e; ++w) {
        const auto [i, j] = work_[w];
        const moekit::WeightView& v = views[i];
        moekit::expert_ffn(moekit::io::expert_view(shape, v.bytes, v.precision, v.order), x, 1,
                           std::span<float>(y_.data() + std::size_t{j} * H, H), 1.f, one);
        ran_[j] = 1;
      }
    });
    ++apart_layers_;
    return true;
  }

  // out[t] = Σ_j weight(t, j)·y(t, j) over the token's experts in ascending expert id.
  void combine(std::uint32_t n, std::uint32_t k, std::span<float> out) {
    const std::size_t H = cfg_.hidden;
    rank_.resize(k);
    for (std::uint32_t t = 0; t < n; ++t) {
      const std::size_t base = std::size_t{t} * k;
      std::iota(rank_.begin(), rank_.end(), 0u);
      std::sort(rank_.begin(), rank_.end(), [&](std::uint32_t a, std::uint32_t b) {
        return experts_[base + a] < experts_[base + b];
      });
      float* o = out.data() + t * H;
      for (std::uint32_t j : rank_) {
        if (!ran_[base + j]) continue;  // skipped by the scorer
        const float wt = weights_[base + j];
        const float* y = y_.data() + (base + j) * H;
        for (std::size_t i = 0; i < H; ++i) o[i] += y[i] * wt;
      }
    }
  }

  // Qwen2-MoE: out += sigmoid(shared_expert_gate·x) · shared_expert(x).
  void add_shared_expert(const LayerWeights& w, std::span<const float> x, std::uint32_t n,
                         std::span<float> out, const moekit::KernelOptions& opts) {
    const std::size_t H = cfg_.hidden;
    res_.assign(std::size_t{n} * H, 0.f);
    ffn(w.shared.view(), x, n, res_, opts);
    gate_.resize(n);
    linear(w.shared_gate, x, n, gate_, opts, batched_);
    for (std::uint32_t t = 0; t < n; ++t) {
      const float g = 1.f / (1.f + std::exp(-gate_[t]));
      for (std::size_t i = 0; i < H; ++i) out[t * H + i] += g * res_[t * H + i];
    }
  }

  // out += expert(x) for the n rows of x (through the batched kernel in prefill).
  void ffn(const moekit::ExpertWeights& e, std::span<const float> x, std::size_t n,
           std::span<float> out, const moekit::KernelOptions& opts) {
    for_rows(x, n, out, batched_,
             [&](std::span<const float> xs, std::size_t m, std::span<float> ys) {
               moekit::expert_ffn(e, xs, m, ys, 1.f, opts);
             });
  }

  const ModelConfig& cfg_;
  Pipeline& pipeline_;
  bool batched_ = false;
  bool int8_experts_ = false;
  RoutingReplay* replay_ = nullptr;
  TokenProfile* profile_ = nullptr;
  std::vector<float> logits_, weights_, probs_, y_, in_, res_, gate_;
  std::vector<std::uint32_t> experts_, order_, rank_, rows_;
  std::vector<std::uint8_t> ran_;
  std::vector<moekit::WeightView> ready_;  ///< run_experts: resident (or loaded) experts
  std::vector<std::uint32_t> late_;        ///< run_experts: views still loading, in plan order
  std::vector<std::pair<std::uint32_t, std::uint32_t>>
      work_;  ///< (view, rank) of run_experts_apart
  std::uint64_t apart_layers_ = 0;
};

}  // namespace moekit::engine
