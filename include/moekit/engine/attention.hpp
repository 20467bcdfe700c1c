#pragma once
/// \file Grouped-query self-attention with a KV cache, for the n tokens of one forward.
///
/// q/k/v projections (optional biases; OLMoE's q_norm/k_norm over the whole projected q and k and
/// its clip_qkv clamp), RoPE at each token's position, keys/values appended to the cache, then per
/// query head h (kv head h / (heads / kv_heads)) a causal softmax(q·kᵀ/√d)·v over the cached
/// positions — restricted to the last `window` positions on sliding-window layers (transformers:
/// query p sees keys k with p − window < k ≤ p) — and o_proj.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "moekit/precision/gemv.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "moekit/engine/config.hpp"
#include "moekit/engine/kv_cache.hpp"
#include "moekit/engine/kv_rows.hpp"
#include "moekit/engine/ops.hpp"
#include "moekit/engine/token_profile.hpp"
#include "moekit/engine/weights.hpp"

namespace moekit::engine {

/// Runs attention for one layer; owns its scratch buffers (reused across calls).
class Attention {
 public:
  explicit Attention(const ModelConfig& cfg) : cfg_(cfg), rope_(cfg.head_dim, cfg.rope_theta) {}

  /// Times the projections as dense matrices and the rest as attention (null: off).
  void set_profile(TokenProfile* p) noexcept { profile_ = p; }

  /// out = attention(x) for the n rows of x (already normalised), tokens at positions
  /// kv.size() .. kv.size()+n−1. Writes their keys/values into `kv` (the caller advances it).
  /// `batched`: every projection through the batched kernel (ops.hpp: for_rows; prefill).
  void forward(std::uint32_t layer, const LayerWeights& w, KvCache& kv, std::span<const float> x,
               std::uint32_t n, std::span<float> out, const moekit::KernelOptions& opts,
               bool batched = false) {
    const std::uint32_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
    q_.resize(std::size_t{n} * qd);
    k_.resize(std::size_t{n} * kvd);
    v_.resize(std::size_t{n} * kvd);
    {
      const TokenProfile::Scope dense(profile_, TokenPart::dense);
      linear(w.q, x, n, q_, opts, batched);
      linear(w.k, x, n, k_, opts, batched);
      linear(w.v, x, n, v_, opts, batched);
    }
    attend(layer, w, kv, n, opts);
    const TokenProfile::Scope dense(profile_, TokenPart::dense);
    linear(w.o, ctx_, n, out, opts, batched);
  }

 private:
  // ctx_ = softmax(q·kᵀ/√d)·v per token and head (after q/k norms, clamp and RoPE); the keys and
  // values of the forward's tokens go into the cache.
  void attend(std::uint32_t layer, const LayerWeights& w, KvCache& kv, std::uint32_t n,
              const moekit::KernelOptions& opts) {
    const TokenProfile::Scope part(profile_, TokenPart::attention);
    const std::uint32_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
    if (cfg_.qk_norm) {
      rms_norm(q_, w.q_norm, cfg_.rms_norm_eps, q_);
      rms_norm(k_, w.k_norm, cfg_.rms_norm_eps, k_);
    }
    if (cfg_.clip_qkv) {
      const float c = *cfg_.clip_qkv;
      for (auto* buf : {&q_, &k_, &v_})
        for (float& f : *buf) f = std::clamp(f, -c, c);
    }
    const std::uint32_t start = kv.size();
    for (std::uint32_t t = 0; t < n; ++t) {
      rope_.apply(q_.data() + std::size_t{t} * qd, cfg_.n_heads, start + t);
      rope_.apply(k_.data() + std::size_t{t} * kvd, cfg_.n_kv_heads, start + t);
    }

    if (kv.type() == KvType::f16) {
      // What the cache will return for them: this forward's own keys and values, read from the
      // scratch, round as the older ones read from the cache did (results do not depend on how a
      // prompt is split into forwards).
      kv_rows::round_to_f16(k_.data(), k_.size());
      kv_rows::round_to_f16(v_.data(), v_.size());
    }
    ctx_.assign(std::size_t{n} * qd, 0.f);
    const std::size_t jobs = std::size_t{n} * cfg_.n_kv_heads;
    auto body = [&](std::size_t b, std::size_t e) {
      for (std::size_t job = b; job < e; ++job)
        if (kv.type() == KvType::f16)
          attend_job<moekit::Float16>(layer, kv, start, job);
        else
          attend_job<float>(layer, kv, start, job);
    };
    if (opts.pool)
      opts.pool->parallel_for(0, jobs, 1, body);
    else
      body(0, jobs);
    // Into the cache: the last positions of this forward that the layer retains.
    const std::uint32_t keep = std::min(n, kv.slots(layer));
    for (std::uint32_t t = n - keep; t < n; ++t)
      kv.store(layer, start + t, k_.data() + std::size_t{t} * kvd,
               v_.data() + std::size_t{t} * kvd);
  }

  // One job per (token, KV head): the `group` query heads that share a KV head read each key
  // and value row once, not once per head (decode over a long context reads the whole cache
  // per token). Each head's scores, softmax and sums are those of a job per head, in the same
  // order, so the result does not depend on the grouping. Keys/values of this forward's tokens
  // come from k_/v_, older ones from the cache (which may keep only the window: kv_cache.hpp),
  // whose rows (`T`: its element type) are consecutive until its ring wraps.
  template <class T>
  void attend_job(std::uint32_t layer, const KvCache& kv, std::uint32_t start, std::size_t job) {
    thread_local std::vector<float> scores;  // `group` rows of the positions attended
    const std::uint32_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), D = cfg_.head_dim;
    const std::uint32_t group = cfg_.n_heads / cfg_.n_kv_heads;
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    const std::uint32_t window = cfg_.window[layer];
    const std::uint32_t t = static_cast<std::uint32_t>(job / cfg_.n_kv_heads);
    const std::uint32_t kvh = static_cast<std::uint32_t>(job % cfg_.n_kv_heads);
    const std::uint32_t pos = start + t;
    const std::uint32_t first = window && pos + 1 > window ? pos + 1 - window : 0;
    const std::size_t len = pos + 1 - first;
    const float* q = q_.data() + std::size_t{t} * qd + std::size_t{kvh} * group * D;
    float* o = ctx_.data() + std::size_t{t} * qd + std::size_t{kvh} * group * D;
    scores.resize(group * len);
    // The positions in runs of consecutive rows: cached ones up to the ring's wrap, then this
    // forward's.
    auto for_runs = [&](auto&& cached, auto&& own) {
      for (std::uint32_t j = first; j < std::min(start, pos + 1);) {
        const std::uint32_t slots = kv.slots(layer);
        const std::uint32_t run = std::min(std::min(start, pos + 1) - j, slots - j % slots);
        cached(j, run, kv.template keys<T>(layer, kvh, j), kv.template values<T>(layer, kvh, j));
        j += run;
      }
      const std::uint32_t own_first = std::max(first, start);
      if (own_first <= pos)
        own(own_first, pos + 1 - own_first,
            k_.data() + std::size_t{own_first - start} * kvd + std::size_t{kvh} * D,
            v_.data() + std::size_t{own_first - start} * kvd + std::size_t{kvh} * D);
    };
    float* s = scores.data();
    for_runs(
        [&](std::uint32_t j, std::uint32_t run, const T* k, const T*) {
          kv_rows::scores(q, group, k, D, run, D, scale, s + (j - first), len);
        },
        [&](std::uint32_t j, std::uint32_t run, const float* k, const float*) {
          kv_rows::scores(q, group, k, kvd, run, D, scale, s + (j - first), len);
        });
    for (std::uint32_t g = 0; g < group; ++g)
      softmax(std::span<float>(scores).subspan(g * len, len));
    for_runs([&](std::uint32_t j, std::uint32_t run, const T*,
                 const T* v) { kv_rows::accumulate(s + (j - first), len, group, v, D, run, D, o); },
             [&](std::uint32_t j, std::uint32_t run, const float*, const float* v) {
               kv_rows::accumulate(s + (j - first), len, group, v, kvd, run, D, o);
             });
  }

  const ModelConfig& cfg_;
  TokenProfile* profile_ = nullptr;
  RopeTable rope_;
  std::vector<float> q_, k_, v_, ctx_;
};

}  // namespace moekit::engine
