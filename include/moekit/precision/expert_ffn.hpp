#pragma once
/// \file The SwiGLU expert FFN on the CPU: out += scale · w2·(silu(w1·x) ⊙ w3·x), the computation
/// of one routed expert of Mixtral / Qwen-MoE / DeepSeekMoE (scale = the routing weight).
///
/// For one token it is fused: one pass over the rows of w1 and w3 together (row r of both, one
/// prepared x) produces h without storing w1·x or w3·x, then w2's rows accumulate straight into
/// `out`; when w1/w3 are in panels (MatrixOrder::panels4) they go as two GEMVs instead (each is
/// one stream per thread already). Batches (n > 1) go through the small-batch GEMM.
/// `KernelOptions::int8_activations` applies to both: the single-token path (x, then h, rounded
/// to int8 per 32 values for the VNNI kernels) and the batches (int8_gemm.hpp).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/precision/expert_weights.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/thread_pool.hpp"

namespace moekit {

namespace detail {
inline float silu(float a) noexcept { return a / (1.f + std::exp(-a)); }

inline void check_expert(const ExpertWeights& e) {
  check_view(e.w1, "expert_ffn: w1");
  check_view(e.w3, "expert_ffn: w3");
  check_view(e.w2, "expert_ffn: w2");
  MOEKIT_EXPECTS(e.w3.rows == e.w1.rows && e.w3.cols == e.w1.cols,
                 "expert_ffn: w3 must have w1's shape (" + std::to_string(e.w1.rows) + "x" +
                     std::to_string(e.w1.cols) + ")");
  MOEKIT_EXPECTS(e.w2.rows == e.w1.cols && e.w2.cols == e.w1.rows,
                 "expert_ffn: w2 must be hidden x ffn = " + std::to_string(e.w1.cols) + "x" +
                     std::to_string(e.w1.rows));
}
}  // namespace detail

/// out[b] += scale · w2·(silu(w1·x[b]) ⊙ w3·x[b]) for b < n; x and out are n × hidden, row-major.
inline void expert_ffn(const ExpertWeights& e, std::span<const float> x, std::size_t n,
                       std::span<float> out, float scale = 1.f, const KernelOptions& opts = {}) {
  detail::check_expert(e);
  const std::size_t hidden = e.hidden(), ffn = e.ffn();
  MOEKIT_EXPECTS(n > 0 && x.size() == n * hidden && out.size() == n * hidden,
                 "expert_ffn: x and out must be n x " + std::to_string(hidden));
  thread_local std::vector<float> h;
  const bool panels = e.w1.order != MatrixOrder::rows || e.w3.order != MatrixOrder::rows;
  if (n > 1 || panels) {
    // Batches, and w1/w3 in panels (each GEMV one stream per thread already): w1·x and w3·x
    // apart, then the SiLU product.
    thread_local std::vector<float> up;
    h.resize(n * ffn);
    up.resize(n * ffn);
    gemm(e.w1, x, n, h, opts);
    gemm(e.w3, x, n, up, opts);
    for (std::size_t i = 0; i < n * ffn; ++i) h[i] = detail::silu(h[i]) * up[i];
    gemm(e.w2, std::span<const float>(h.data(), n * ffn), n, out, opts, {scale, true});
    return;
  }
  thread_local detail::PlanStorage storage1, storage3;
  const detail::GemvPlan p1 = detail::make_plan(e.w1, x.data(), opts, storage1);
  const bool same = e.w1.precision == e.w3.precision && e.w1.scheme == e.w3.scheme;
  const detail::GemvPlan p3 = same ? p1 : detail::make_plan(e.w3, x.data(), opts, storage3);
  if (h.size() < ffn) h.resize(ffn);
  float* hp = h.data();
  const std::size_t stride = e.w1.row_stride(), stride3 = e.w3.row_stride();
  // As gemv's int8 path (detail::gemv_rows), streamed as p1.streaming says: row r of w1 and w3
  // together are two streams; four streams take them from each half of the range. Each stream
  // is prefetched into L2 a whole row >= 12 KiB ahead when the streaming prefetches.
  const std::size_t ahead =
      p1.streaming.prefetch ? detail::prefetch_rows(std::max(stride, stride3)) : 0;
  auto up_gate = [&](std::size_t r0, std::size_t r1) {
    float* scratch = detail::plan_scratch(hidden);
    if (!same) {  // w1 and w3 in different formats: one row at a time
      for (std::size_t r = r0; r < r1; ++r)
        hp[r] = detail::silu(p1.dot(e.w1.row(r), scratch)) * p3.dot(e.w3.row(r), scratch);
      return;
    }
    // Row i of w1 and w3 from each of `Parts` equal parts of [from, from + Parts·part), side by
    // side.
    auto pairs = [&]<std::size_t Parts>(std::size_t from, std::size_t part) {
      for (std::size_t i = 0; i < part; ++i) {
        const std::byte* rows[2 * Parts];
        const std::byte* next[2 * Parts];
        for (std::size_t k = 0; k < Parts; ++k) {
          const std::size_t r = from + k * part + i,
                            n = from + k * part + std::min(i + ahead, part - 1);
          rows[2 * k] = e.w1.row(r), rows[2 * k + 1] = e.w3.row(r);
          next[2 * k] = e.w1.row(n), next[2 * k + 1] = e.w3.row(n);
        }
        float g[2 * Parts];
        p1.dots<2 * Parts>(rows, scratch, g, ahead ? next : nullptr);
        for (std::size_t k = 0; k < Parts; ++k)
          hp[from + k * part + i] = detail::silu(g[2 * k]) * g[2 * k + 1];
      }
    };
    std::size_t r = r0;
    if (p1.streaming.streams >= 4) {
      const std::size_t half = (r1 - r0) / 2;
      pairs.template operator()<2>(r0, half);
      r = r0 + 2 * half;
    }
    pairs.template operator()<1>(r, r1 - r);  // all rows, or the last row of an odd range
  };
  if (opts.pool)
    opts.pool->parallel_for(0, ffn, detail::row_grain(ffn, opts.pool), up_gate);
  else
    up_gate(0, ffn);
  gemv(e.w2, std::span<const float>(hp, ffn), out, opts, {scale, true});
}

}  // namespace moekit
