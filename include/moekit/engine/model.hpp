#pragma once
/// \file Model: the decoder forward pass (embeddings → layers of attention and MoE → final norm →
/// LM head) over a KV cache, with the routed experts served by an OffloadPipeline.
///
/// `prefill` runs the prompt in forwards of at most `ubatch` tokens (llama.cpp's -ub; 0 = one
/// forward), Phase::prefill with GateViews of n_tokens > 1, every row through the batched kernels
/// (ops.hpp: for_rows), so the logits are the same bit for bit however the prompt is split;
/// `decode`
/// runs one token and then asks the pipeline's token policy whether to keep it — on `fallback`
/// the KV cache is rolled back one position and the token recomputed (MoBiLE).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moekit/core/layer_context.hpp"
#include "moekit/core/plan.hpp"
#include "moekit/error.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "moekit/engine/attention.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/kv_cache.hpp"
#include "moekit/engine/moe_layer.hpp"
#include "moekit/engine/ops.hpp"
#include "moekit/engine/routing_replay.hpp"
#include "moekit/engine/token_profile.hpp"
#include "moekit/engine/weights.hpp"

namespace moekit::engine {

/// How a Model's kernels run beyond its weights (moe-run's --activations, --kv-type and
/// --row-streaming). The measured run and every start-up run that times or records it
/// (calibration, Fate's decode timing) apply the same, so a start-up timing is of the kernels the
/// run will use.
struct ModelKernels {
  bool int8_experts = false;  ///< routed experts with int8 activations (activations.hpp)
  bool int8_dense = false;    ///< quantized dense matrices with int8 activations
  KvType kv_type = KvType::f32;
  std::optional<moekit::RowStreaming> row_streaming;  ///< nullopt: the table for this core

  /// Sets them on `m` (a Model, before its first forward).
  template <class M>
  void apply(M& m) const {
    m.set_kv_type(kv_type);
    m.set_int8_expert_activations(int8_experts);
    m.set_int8_dense_activations(int8_dense);
    m.set_row_streaming(row_streaming);
  }
};

/// Token id type of the vocabulary.
using Token = std::uint32_t;

/// The engine's model: dense weights, a KV cache, and the pipeline that serves experts.
template <class Pipeline>
class Model {
 public:
  /// Most recomputations of one token a token policy may ask for before it is an error.
  static constexpr int max_fallbacks = 4;

  Model(const ModelConfig& cfg, const DenseWeights& dense, Pipeline& pipeline,
        std::uint32_t context_length, moekit::ThreadPool* pool = nullptr,
        KvType kv_type = KvType::f32)
      : cfg_(cfg),
        w_(dense),
        pipeline_(pipeline),
        kv_(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, context_length, cfg.window, kv_type),
        attention_(cfg),
        moe_(cfg, pipeline) {
    opts_.pool = pool;
  }

  /// Starts a new sequence: empty KV cache, pipeline's per-sequence state reset.
  void begin_sequence() {
    kv_.clear();
    ++sequence_id_;
    pipeline_.begin_sequence();
  }

  /// Rebuilds the (empty) KV cache with elements of type `t` (kv_cache.hpp); only before the
  /// first forward of a sequence.
  void set_kv_type(KvType t) {
    MOEKIT_EXPECTS(kv_.size() == 0, "set_kv_type: the KV cache holds positions already");
    if (t != kv_.type())
      kv_ = KvCache(cfg_.n_layers, cfg_.n_kv_heads, cfg_.head_dim, kv_.capacity(), cfg_.window, t);
  }

  /// Most tokens per prefill forward (0 = the whole prompt in one).
  void set_ubatch(std::uint32_t n) noexcept { ubatch_ = n; }
  [[nodiscard]] std::uint32_t ubatch() const noexcept { return ubatch_; }

  /// How the int8-activation kernels stream rows (nullopt: the table for this CPU core).
  void set_row_streaming(std::optional<moekit::RowStreaming> s) noexcept { opts_.streaming = s; }

  /// Routed experts with int8 activations (activations.hpp: quantized experts, decode and
  /// prefill forwards; default off).
  void set_int8_expert_activations(bool on) noexcept { moe_.set_int8_expert_activations(on); }
  [[nodiscard]] bool int8_expert_activations() const noexcept {
    return moe_.int8_expert_activations();
  }
  /// MoE layer forwards whose experts ran each whole on one thread of the pool (decode steps
  /// with experts of one format filling the threads; moe_layer.hpp).
  [[nodiscard]] std::uint64_t experts_apart_layers() const noexcept {
    return moe_.experts_apart_layers();
  }
  /// Quantized dense matrices (attention, LM head, shared experts, dense MLPs) with int8
  /// activations, decode and prefill forwards; float matrices are unaffected (default off).
  void set_int8_dense_activations(bool on) noexcept { opts_.int8_activations = on; }
  [[nodiscard]] bool int8_dense_activations() const noexcept { return opts_.int8_activations; }

  /// Every MoE layer takes its experts and gate weights from `r`'s trace instead of the router
  /// (routing_replay.hpp; null: the router's own). `r` must outlive the model's forwards.
  void set_routing_replay(RoutingReplay* r) noexcept {
    replay_ = r;
    moe_.set_routing_replay(r);
  }

  /// Runs the prompt in forwards of at most ubatch() tokens; returns the logits of every prompt
  /// token (n × vocab) when `all_logits`, else of the last one (vocab).
  std::span<const float> prefill(std::span<const Token> tokens, bool all_logits = false) {
    MOEKIT_EXPECTS(!tokens.empty(), "prefill: empty prompt");
    kv_.check_room(static_cast<std::uint32_t>(tokens.size()));
    const std::size_t step = ubatch_ ? ubatch_ : tokens.size();
    if (step >= tokens.size()) return forward(tokens, moekit::Phase::prefill, all_logits);
    all_.clear();
    std::span<const float> last;
    for (std::size_t at = 0; at < tokens.size(); at += step) {
      const std::size_t n = std::min(step, tokens.size() - at);
      const bool final_chunk = at + n == tokens.size();
      if (!all_logits && !final_chunk) {
        forward(tokens.subspan(at, n), moekit::Phase::prefill, false, /*logits=*/false);
        continue;
      }
      last = forward(tokens.subspan(at, n), moekit::Phase::prefill, all_logits);
      if (all_logits) all_.insert(all_.end(), last.begin(), last.end());
    }
    return all_logits ? std::span<const float>(all_) : last;
  }

  /// Runs one generated token; returns its logits (vocab).
  std::span<const float> decode(Token token) {
    const std::uint32_t pos = kv_.size();
    for (int attempt = 0; attempt <= max_fallbacks; ++attempt) {
      kv_.truncate(pos);
      const auto logits = forward(std::span<const Token>(&token, 1), moekit::Phase::decode, false);
      if (pipeline_.end_token(logits) == moekit::TokenVerdict::accept) {
        if (replay_) replay_->end_forward();  // a recomputation replays the same trace token
        return logits;
      }
    }
    moekit::detail::fail(moekit::ErrorKind::internal, "the token policy rejected a token " +
                                                          std::to_string(max_fallbacks + 1) +
                                                          " times in a row");
  }

  /// Times the parts of each forward into `p` (token_profile.hpp), the pool's waits included;
  /// null (the default) turns it off. `p` must outlive the forwards or be unset first.
  void set_profile(TokenProfile* p) noexcept {
    if (profile_) profile_->attach(nullptr);
    profile_ = p;
    if (p) p->attach(opts_.pool);
    attention_.set_profile(p);
    moe_.set_profile(p);
  }

  [[nodiscard]] const KvCache& kv_cache() const noexcept { return kv_; }
  [[nodiscard]] std::uint32_t position() const noexcept { return kv_.size(); }

 private:
  // One forward of `tokens`; the LM head runs on every row (`all_logits`), the last one, or
  // none (`logits` false: a prefill chunk whose logits nobody reads).
  std::span<const float> forward(std::span<const Token> tokens, moekit::Phase phase,
                                 bool all_logits, bool logits = true) {
    const auto n = static_cast<std::uint32_t>(tokens.size());
    kv_.check_room(n);
    // The pool's workers poll through the serial gaps of the forward instead of sleeping in them;
    // a decode forward is a step of the pool's StepChooser (all threads, or the caller alone if
    // that is faster on this machine now), timed without its waits for expert loads (an
    // offloaded decode's waits would otherwise decide it); a prefill forward always uses every
    // thread.
    std::optional<moekit::ThreadPool::Active> awake;
    if (opts_.pool) awake.emplace(*opts_.pool, phase == moekit::Phase::decode);
    const double stalled_before = moe_.stall_seconds();
    const std::size_t H = cfg_.hidden;
    x_.resize(n * H);
    h_.resize(n * H);
    t_.resize(n * H);
    for (std::uint32_t t = 0; t < n; ++t) {
      if (tokens[t] >= cfg_.vocab_size)
        moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                             "token id " + std::to_string(tokens[t]) + " >= vocab_size " +
                                 std::to_string(cfg_.vocab_size));
      w_.embed.row(tokens[t], x_.data() + t * H);
    }
    const ForwardInfo info{kv_.size(), n, phase, sequence_id_};
    const bool batched = phase == moekit::Phase::prefill;
    if (replay_) replay_->begin_forward(phase, n);
    for (std::uint32_t l = 0; l < cfg_.n_layers; ++l) {
      const LayerWeights& L = w_.layers[l];
      rms_norm(x_, L.attn_norm, cfg_.rms_norm_eps, h_);
      attention_.forward(l, L, kv_, h_, n, t_, opts_, batched);
      for (std::size_t i = 0; i < x_.size(); ++i) x_[i] += t_[i];
      rms_norm(x_, L.ffn_norm, cfg_.rms_norm_eps, h_);
      moe_.forward(l, L, h_, info, t_, opts_);
      for (std::size_t i = 0; i < x_.size(); ++i) x_[i] += t_[i];
    }
    kv_.advance(n);
    if (awake)
      awake->discount(std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::duration<double>(moe_.stall_seconds() - stalled_before)));
    // Prefill forwards are always kept; a decode forward is kept once its token is accepted.
    if (replay_ && phase == moekit::Phase::prefill) replay_->end_forward();
    if (!logits) return {};
    const TokenProfile::Scope head(profile_, TokenPart::lm_head);
    const std::uint32_t rows = all_logits ? n : 1;
    const std::span<const float> last(x_.data() + (n - rows) * H, rows * H);
    h_.resize(rows * H);
    rms_norm(last, w_.final_norm, cfg_.rms_norm_eps, h_);
    logits_.resize(std::size_t{rows} * cfg_.vocab_size);
    linear(w_.output(), h_, rows, logits_, opts_, batched);
    return logits_;
  }

  const ModelConfig& cfg_;
  const DenseWeights& w_;
  Pipeline& pipeline_;
  KvCache kv_;
  Attention attention_;
  MoeLayer<Pipeline> moe_;
  RoutingReplay* replay_ = nullptr;
  TokenProfile* profile_ = nullptr;
  moekit::KernelOptions opts_{};
  std::uint64_t sequence_id_ = 0;
  std::uint32_t ubatch_ = 0;
  std::vector<float> x_, h_, t_, logits_, all_;
};

}  // namespace moekit::engine
