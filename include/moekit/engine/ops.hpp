#pragma once
/// \file The small numeric operations of the decoder, written to match transformers' f32 path:
/// RMSNorm (x·rsqrt(mean(x²)+eps)·w), the rotary embedding in the rotate_half layout
/// (q·cos + rotate_half(q)·sin, cos/sin tables of cat(freqs, freqs)), dense linear layers through
/// precision/'s kernels, and a numerically stable softmax.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "moekit/precision/gemv.hpp"

#include "moekit/engine/weights.hpp"

namespace moekit::engine {

/// y[t] = rmsnorm(x[t]) ⊙ weight for the n rows of x (width = weight.size()); y may alias x.
inline void rms_norm(std::span<const float> x, std::span<const float> weight, float eps,
                     std::span<float> y) {
  const std::size_t d = weight.size();
  for (std::size_t t = 0; t < x.size() / d; ++t) {
    const float* xr = x.data() + t * d;
    float ss = 0.f;
    for (std::size_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(d) + eps);
    float* yr = y.data() + t * d;
    for (std::size_t i = 0; i < d; ++i) yr[i] = weight[i] * (xr[i] * inv);
  }
}

/// Runs `f(x, n, y)` — a kernel over the n rows of x — with a one-row batch given to it as two
/// copies of the row when `batched` (the first result kept). gemm hands one row to gemv, which
/// sums in another order than its batched kernel (whose per-row result does not depend on the
/// other rows); prefill forwards run every row through the batched kernel, so their logits do
/// not depend on how the prompt was split into chunks (--ubatch) or how many tokens chose an
/// expert.
template <class F>
void for_rows(std::span<const float> x, std::size_t n, std::span<float> y, bool batched, F&& f) {
  if (!batched || n != 1) return f(x, n, y);
  thread_local std::vector<float> x2, y2;
  x2.resize(2 * x.size());
  y2.resize(2 * y.size());
  std::copy(x.begin(), x.end(), x2.begin());
  std::copy(x.begin(), x.end(), x2.begin() + static_cast<std::ptrdiff_t>(x.size()));
  std::copy(y.begin(), y.end(), y2.begin());  // kernels that accumulate into y
  std::copy(y.begin(), y.end(), y2.begin() + static_cast<std::ptrdiff_t>(y.size()));
  f(std::span<const float>(x2), std::size_t{2}, std::span<float>(y2));
  std::copy_n(y2.begin(), y.size(), y.begin());
}

/// y = x·Wᵀ (+ b) for the n rows of x (n × cols → n × rows); `batched` as for_rows.
inline void linear(const Linear& l, std::span<const float> x, std::size_t n, std::span<float> y,
                   const moekit::KernelOptions& opts, bool batched = false) {
  for_rows(x, n, y, batched, [&](std::span<const float> xs, std::size_t m, std::span<float> ys) {
    moekit::gemm(l.view(), xs, m, ys, opts);
  });
  if (!l.bias.empty())
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t r = 0; r < l.rows; ++r) y[t * l.rows + r] += l.bias[r];
}

/// a · b over n floats in 16 interleaved partial sums: a plain `dot += a[i] * b[i]` is one
/// dependent chain the compiler may not reorder (one add latency per element); this form
/// vectorises (attention's q·k over head_dim was a visible share of a long decode).
inline float dot(const float* a, const float* b, std::size_t n) noexcept {
  float part[16] = {};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (std::size_t l = 0; l < 16; ++l) part[l] += a[i + l] * b[i + l];
  float s = 0.f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (float p : part) s += p;
  return s;
}

/// In-place softmax of v.
inline void softmax(std::span<float> v) {
  const float m = *std::max_element(v.begin(), v.end());
  float s = 0.f;
  for (float& x : v) s += (x = std::exp(x - m));
  for (float& x : v) x /= s;
}

/// cos/sin of RoPE's rotation angles for positions 0..max, head dimension `dim`.
class RopeTable {
 public:
  RopeTable(std::uint32_t dim, double theta) : dim_(dim) {
    inv_freq_.resize(dim / 2);
    for (std::uint32_t i = 0; i < dim / 2; ++i)  // as transformers: 1 / theta^(2i/dim) in f32
      inv_freq_[i] = 1.f / static_cast<float>(std::pow(
                               theta, static_cast<float>(2 * i) / static_cast<float>(dim)));
  }

  /// Rotates the `n_heads` heads of `v` (n_heads × dim) for position `pos`.
  void apply(float* v, std::uint32_t n_heads, std::uint64_t pos) const {
    const std::uint32_t half = dim_ / 2;
    thread_local std::vector<float> c, s;
    c.resize(half);
    s.resize(half);
    for (std::uint32_t i = 0; i < half; ++i) {
      const float a = static_cast<float>(pos) * inv_freq_[i];
      c[i] = std::cos(a);
      s[i] = std::sin(a);
    }
    for (std::uint32_t h = 0; h < n_heads; ++h) {
      float* x = v + std::size_t{h} * dim_;
      for (std::uint32_t i = 0; i < half; ++i) {
        const float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c[i] - x2 * s[i];
        x[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
  }

 private:
  std::uint32_t dim_;
  std::vector<float> inv_freq_;
};

}  // namespace moekit::engine
