#pragma once
/// \file CPU dequant-GEMV (n = 1) and small-batch GEMM for every stored format, with the AVX-512 /
/// AVX2 / generic path chosen at run time and rows split over a `ThreadPool`.
///
/// GEMV streams each row once and never materialises dequantized weights: per group it
/// accumulates Σ q·x in floats and applies the scale once (s·Σq·x − s·z·Σx). GEMM dequantizes a
/// row once into a per-thread buffer and dots it with up to 32 activations (four per pass).

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/precision/detail/avx2_int8_rows.hpp"
#include "moekit/precision/detail/avx2_kquant_rows.hpp"
#include "moekit/precision/detail/avx2_rows.hpp"
#include "moekit/precision/detail/avx512_bf16_rows.hpp"
#include "moekit/precision/detail/avx512_int8_rows.hpp"
#include "moekit/precision/detail/avx512_kquant_rows.hpp"
#include "moekit/precision/detail/avx512_rows.hpp"
#include "moekit/precision/detail/prepared_activation.hpp"
#include "moekit/precision/format.hpp"
#include "moekit/precision/int8_gemm.hpp"
#include "moekit/precision/isa.hpp"
#include "moekit/precision/kquant_activation.hpp"
#include "moekit/precision/kquant_int8_gemm.hpp"
#include "moekit/precision/kquant_int8_rows.hpp"
#include "moekit/precision/panels.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit/precision/row_streaming.hpp"
#include "moekit/precision/thread_pool.hpp"

namespace moekit {

/// Run-time knobs of the CPU kernels.
struct KernelOptions {
  std::optional<Isa> isa;      ///< force a path (must be supported); default: the best one
  ThreadPool* pool = nullptr;  ///< threads to split rows over; nullptr: the calling thread only
  /// GEMV of quantized rows with the activation rounded to int8 per 32 values (ggml's q8_0
  /// activations), error ≤ max|x|/254 per element of each 32-block: the AVX-512 VNNI kernels
  /// (fewer instructions per weight than the float path), else the AVX2 ones (AVX-VNNI when the
  /// CPU has it). Ignored for f32/bf16/f16 rows, and by the GEMV on the generic path (float
  /// activations); gemm with n >= 2 runs the int8 GEMM (int8_gemm.hpp), scalar there.
  bool int8_activations = false;
  /// GEMV of bf16 rows with the activation rounded to bf16 (round to nearest even: error
  /// ≤ 2⁻⁸·|x| per element), dotted with `vdpbf16ps` where the CPU has AVX512_BF16
  /// (avx512_bf16_rows.hpp). Elsewhere, for other formats and in gemm with n >= 2 it is ignored:
  /// the float path runs, with the activation exact.
  bool bf16_activations = false;
  /// The AVX2 int8 kernels use AVX-VNNI when the CPU has it; false forces vpmaddubsw (tests).
  bool avx_vnni = true;
  /// How the int8-activation kernels and the float-row kernels (f32/bf16/f16) stream rows
  /// (streams 1, 2 or 4); default: the table for this CPU's core (`default_row_streaming`,
  /// `default_float_row_streaming`).
  std::optional<RowStreaming> streaming = std::nullopt;
};

/// What a kernel does with its result: y = scale·result, or y += scale·result.
struct Epilogue {
  float scale = 1.f;
  bool accumulate = false;
};

/// True for q2_k and q3_k, whose int8 kernels are picked apart from the other K-quants': their
/// AVX2 kernel has no AVX-VNNI variant (codes ≤ 7, `vpmaddubsw` alone) and their AVX-512 one needs
/// GFNI and VBMI too (`has_avx512_kq2`; without them, the AVX2 kernel; docs/formats.md).
constexpr bool kquant_low2(Precision p) noexcept {
  return p == Precision::q2_k || p == Precision::q3_k;
}

namespace detail {
/// `prepare_kquant` for `isa`, which the caller has checked.
inline KQuantActivation prepare_kquant_for(Isa isa, const float* x, std::size_t cols, Precision p,
                                           KQuantStorage& st) {
#if defined(MOEKIT_HAS_X86_KERNELS)
  if (isa == Isa::avx512 && has_avx512_vnni()) return avx512_kquant::prepare(x, cols, p, st);
  if (isa != Isa::generic) return avx2_kquant::prepare(x, cols, p, st);
#endif
  (void)isa;
  return prepare_kquant(x, cols, p, st);
}
}  // namespace detail

/// The activation of a GEMV over K-quant rows of format `p` as the int8 kernels of `isa` prepare
/// it: vectorised on AVX-512 with VNNI and on AVX2, `prepare_kquant` (kquant_activation.hpp) on
/// the generic path, the same bytes on every one. `isa` must be supported.
inline KQuantActivation prepare_kquant(const float* x, std::size_t cols, Precision p,
                                       KQuantStorage& st, Isa isa) {
  MOEKIT_EXPECTS(isa_supported(isa), "prepare_kquant: the ISA is not supported by this CPU");
  return detail::prepare_kquant_for(isa, x, cols, p, st);
}

namespace detail {

using RowDotFn = float (*)(const std::byte*, const RowLayout&, const PreparedActivation&);
using RowDecodeFn = const float* (*)(const std::byte*, const RowLayout&, float*);

/// The streaming `o` asks for, else the table's for this core: the int8 kernels' column, or
/// (`float_rows`) the float-row kernels'.
inline RowStreaming resolve_streaming(const KernelOptions& o, std::size_t cols,
                                      bool float_rows = false) {
  const RowStreaming s =
      o.streaming.value_or(float_rows ? default_float_row_streaming(detect_core(), cols)
                                      : default_row_streaming(detect_core(), cols));
  if (!valid_streams(s.streams))
    fail(ErrorKind::invalid_argument,
         "kernel: KernelOptions::streaming.streams must be 1, 2 or 4 (got " +
             std::to_string(s.streams) + ")");
  return s;
}

inline Isa resolve_isa(const KernelOptions& o) {
  const Isa isa = o.isa.value_or(detect_isa());
  if (!isa_supported(isa))
    fail(ErrorKind::unsupported,
         "kernel: ISA '" + std::string(name(isa)) + "' is not supported by this CPU");
  return isa;
}

template <Precision P>
float generic_row_dot(const std::byte* row, const RowLayout& l,
                      const PreparedActivation& a) noexcept {
  float acc = 0;
  for (std::size_t c = 0; c < l.cols; ++c) acc += weight_at(row, l, P, c) * a.x[c];
  return acc;
}
template <Precision P>
const float* generic_row_decode(const std::byte* row, const RowLayout& l, float* buf) noexcept {
  for (std::size_t c = 0; c < l.cols; ++c) buf[c] = weight_at(row, l, P, c);
  return buf;
}

#if defined(MOEKIT_HAS_X86_KERNELS)
template <Precision P>
MOEKIT_TARGET_AVX512 float avx512_row_dot(const std::byte* row, const RowLayout& l,
                                          const PreparedActivation& a) noexcept {
  if constexpr (is_quantized(P))
    return avx512::quant_row_dot<bits(P)>(row, l, a);
  else
    return avx512::float_row_dot<P>(row, l.cols, a.x);
}
template <Precision P>
MOEKIT_TARGET_AVX512 const float* avx512_row_decode(const std::byte* row, const RowLayout& l,
                                                    float* buf) noexcept {
  if constexpr (P == Precision::f32)
    return reinterpret_cast<const float*>(row);
  else if constexpr (is_quantized(P))
    avx512::dequant_row<bits(P)>(row, l, buf);
  else
    avx512::convert_row<P>(row, l.cols, buf);
  return buf;
}
template <Precision P>
MOEKIT_TARGET_AVX2 float avx2_row_dot(const std::byte* row, const RowLayout& l,
                                      const PreparedActivation& a) noexcept {
  if constexpr (is_quantized(P))
    return avx2::quant_row_dot<bits(P)>(row, l, a);
  else
    return avx2::float_row_dot<P>(row, l.cols, a.x);
}
template <Precision P>
MOEKIT_TARGET_AVX2 const float* avx2_row_decode(const std::byte* row, const RowLayout& l,
                                                float* buf) noexcept {
  if constexpr (P == Precision::f32)
    return reinterpret_cast<const float*>(row);
  else if constexpr (is_quantized(P))
    avx2::dequant_row<bits(P)>(row, l, buf);
  else
    avx2::convert_row<P>(row, l.cols, buf);
  return buf;
}
#endif

template <Precision P>
RowDotFn row_dot_for(Isa isa) noexcept {
#if defined(MOEKIT_HAS_X86_KERNELS)
  if (isa == Isa::avx512) return &avx512_row_dot<P>;
  if (isa == Isa::avx2) return &avx2_row_dot<P>;
#endif
  (void)isa;
  return &generic_row_dot<P>;
}
template <Precision P>
RowDecodeFn row_decode_for(Isa isa) noexcept {
#if defined(MOEKIT_HAS_X86_KERNELS)
  if (isa == Isa::avx512) return &avx512_row_decode<P>;
  if (isa == Isa::avx2) return &avx2_row_decode<P>;
#endif
  (void)isa;
  return &generic_row_decode<P>;
}

/// The row functions for (precision, ISA).
struct RowKernels {
  RowDotFn dot;
  RowDecodeFn decode;
  bool permuted;  ///< the kernels expect activations in chunk decode order
};

/// A K-quant row decoded block by block (the float-activation path and the batched GEMM).
template <Precision P>
const float* kquant_row_decode(const std::byte* row, const RowLayout& l, float* buf) noexcept {
  for (std::size_t b = 0; b < l.groups; ++b) {
    const std::byte* block = row + b * kquant_block_bytes(P);
    if constexpr (P == Precision::q4_k)
      q4_k::decode_block(block, buf + b * kquant_block_weights);
    else if constexpr (P == Precision::q5_k)
      q5_k::decode_block(block, buf + b * kquant_block_weights);
    else if constexpr (P == Precision::q2_k)
      q2_k::decode_block(block, buf + b * kquant_block_weights);
    else if constexpr (P == Precision::q3_k)
      q3_k::decode_block(block, buf + b * kquant_block_weights);
    else
      q6_k::decode_block(block, buf + b * kquant_block_weights);
  }
  return buf;
}
/// A K-quant row · x with float activations: decoded into a per-thread buffer, then dotted as an
/// f32 row on `I`'s float kernel (eight sums in flight; one scalar sum was latency-bound).
template <Precision P, Isa I>
float kquant_row_dot(const std::byte* row, const RowLayout& l,
                     const PreparedActivation& a) noexcept {
  thread_local std::vector<float> buf;
  if (buf.size() < l.cols) buf.resize(l.cols);
  const float* w = kquant_row_decode<P>(row, l, buf.data());
  const auto* wb = reinterpret_cast<const std::byte*>(w);
#if defined(MOEKIT_HAS_X86_KERNELS)
  if constexpr (I == Isa::avx512) return avx512::float_row_dot<Precision::f32>(wb, l.cols, a.x);
  if constexpr (I == Isa::avx2) return avx2::float_row_dot<Precision::f32>(wb, l.cols, a.x);
#endif
  (void)wb;
  float acc[8] = {};
  for (std::size_t c = 0; c < l.cols; ++c) acc[c % 8] += w[c] * a.x[c];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
template <Precision P>
RowKernels kquant_row_kernels(Isa isa) noexcept {
#if defined(MOEKIT_HAS_X86_KERNELS)
  if (isa == Isa::avx512) return {&kquant_row_dot<P, Isa::avx512>, &kquant_row_decode<P>, false};
  if (isa == Isa::avx2) return {&kquant_row_dot<P, Isa::avx2>, &kquant_row_decode<P>, false};
#endif
  (void)isa;
  return {&kquant_row_dot<P, Isa::generic>, &kquant_row_decode<P>, false};
}

inline RowKernels row_kernels(Precision p, Isa isa) {
  const bool perm = isa != Isa::generic && (p == Precision::q4 || p == Precision::q2);
  switch (p) {
    case Precision::f32:
      return {row_dot_for<Precision::f32>(isa), row_decode_for<Precision::f32>(isa), perm};
    case Precision::bf16:
      return {row_dot_for<Precision::bf16>(isa), row_decode_for<Precision::bf16>(isa), perm};
    case Precision::f16:
      return {row_dot_for<Precision::f16>(isa), row_decode_for<Precision::f16>(isa), perm};
    case Precision::q8:
      return {row_dot_for<Precision::q8>(isa), row_decode_for<Precision::q8>(isa), perm};
    case Precision::q4:
      return {row_dot_for<Precision::q4>(isa), row_decode_for<Precision::q4>(isa), perm};
    case Precision::q2:
      return {row_dot_for<Precision::q2>(isa), row_decode_for<Precision::q2>(isa), perm};
    case Precision::q4_k:
      return kquant_row_kernels<Precision::q4_k>(isa);
    case Precision::q5_k:
      return kquant_row_kernels<Precision::q5_k>(isa);
    case Precision::q6_k:
      return kquant_row_kernels<Precision::q6_k>(isa);
    case Precision::q2_k:
      return kquant_row_kernels<Precision::q2_k>(isa);
    case Precision::q3_k:
      return kquant_row_kernels<Precision::q3_k>(isa);
    case Precision::skip:
      break;
  }
  fail(ErrorKind::invalid_argument, "kernel: precision 'skip' cannot be run");
}

/// Rows per parallel_for chunk: one range on one thread, four chunks per thread otherwise
/// (dynamic scheduling balances them). Long chunks keep gemv_rows' streams long: with 16 chunks
/// per thread the prefetcher restarted every 1/32 of the matrix and fell well short of the
/// streaming read (bench/RESULTS.md, "Dequant-GEMV kernels against ggml and the memory bound").
/// `least`: the fewest units in a chunk (8 rows or panels; groups of 16 panels are big enough).
inline std::size_t row_grain(std::size_t rows, const ThreadPool* pool,
                             std::size_t least = 8) noexcept {
  const std::size_t threads = pool ? pool->team_size() : 1;
  if (threads == 1) return rows;
  return std::max<std::size_t>(least, rows / (threads * 4));
}

inline void check_view(const MatrixView& w, const char* what) {
  validate_scheme(w.precision, w.scheme, what);
  MOEKIT_EXPECTS(w.data != nullptr && w.rows > 0 && w.cols > 0,
                 std::string(what) + ": empty weight matrix");
  validate_cols(w.precision, w.cols, what);
  if (in_panels(w.order) && !panels_supported(w.precision, w.scheme))
    fail(ErrorKind::invalid_argument, std::string(what) + ": a " + std::string(name(w.precision)) +
                                          " matrix with group_size " +
                                          std::to_string(w.scheme.group_size) +
                                          " cannot be in panels (q8/q4/q2, groups of 32/64/128)");
}

/// Per-thread buffer of one row's bytes (stored_row of a matrix in panels).
inline std::byte* row_buffer(std::size_t bytes) {
  thread_local std::vector<std::byte> buf;
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.data();
}

/// Activation prepared for rows of `w` (permuted when the row kernels want it).
inline PreparedActivation prepare_for(const MatrixView& w, const RowKernels& k, const float* x,
                                      std::vector<float>& storage) {
  // Float formats need neither permutation nor group sums; q8 needs sums only.
  return prepare_activation(x, w.layout(), k.permuted ? w.precision : Precision::q8, storage);
}

/// Scratch the storage of one prepared activation lives in (reused across calls).
struct PlanStorage {
  std::vector<float> f;
  std::vector<std::int8_t> q;
  std::vector<std::uint16_t> b;  ///< the activation in bf16 (bf16_activations)
  KQuantStorage k;               ///< the activation of K-quant rows (int8_activations)
};

/// Which kernel runs a GEMV with int8 activations (none: float activations).
enum class Int8Kernel : std::uint8_t {
  none,
  avx512_vnni,  ///< avx512_int8_rows.hpp: rows side by side, panels read as they lie
  avx2,         ///< avx2_int8_rows.hpp, vpmaddubsw
  avx_vnni,     ///< avx2_int8_rows.hpp, AVX-VNNI's 256-bit vpdpbusd
};

/// Which kernel runs a GEMV of K-quant rows with int8 activations (none: float activations).
enum class KQuantKernel : std::uint8_t { none, scalar, avx512_vnni, avx2, avx_vnni };

/// Everything a GEMV over rows of `w` needs for one activation: the row kernel and the prepared
/// activation (float, or int8 for the int8 kernels).
struct GemvPlan {
  RowLayout layout{};
  RowKernels kernels{};
  PreparedActivation act{};
  Int8Kernel int8 = Int8Kernel::none;
  /// Float rows (f32/bf16/f16) on the AVX-512 / AVX2 path: dots<N> runs their multi-row kernel.
  Isa float_rows = Isa::generic;
  Precision precision = Precision::f32;
  /// How gemv_rows reads rows (the int8 and float-row paths: per KernelOptions)
  RowStreaming streaming{2, false};
  const std::uint16_t* xb = nullptr;  ///< the activation in bf16 (the vdpbf16ps kernel), or null
  KQuantKernel kquant = KQuantKernel::none;
  KQuantActivation actk{};  ///< the activation of the K-quant int8 kernels
#if defined(MOEKIT_HAS_X86_KERNELS)
  Int8Activation act8{};
#endif

  /// Row · x. `scratch` holds at least cols/32 floats (int8 path only).
  float dot(const std::byte* row, float* scratch) const noexcept {
    float out;
    dots<1>(&row, scratch, &out);
    return out;
  }

  /// N rows of this layout · x into out[0..N); the int8, float-row and bf16 paths load the
  /// activation once for all of them (faster than N dot calls on rows in cache) and prefetch
  /// `next` (rows further down each row's stream, optional) into L2 as they go; the generic
  /// path takes them one by one.
  template <std::size_t N>
  void dots(const std::byte* const* rows, float* scratch, float* out,
            const std::byte* const* next = nullptr) const noexcept {
    if (kquant != KQuantKernel::none) return kquant_dots<N>(rows, out, next);
#if defined(MOEKIT_HAS_X86_KERNELS)
    if (xb) return avx512_bf16::row_dots<N>(rows, layout.cols, xb, out, next);
    if (float_rows != Isa::generic) return float_dots<N>(rows, out, next);
    if (int8 == Int8Kernel::avx512_vnni)
      return with_int8_kernel([&]<unsigned Bits>() {
        avx512_int8::row_dots<Bits, N>(rows, layout, act8, scratch, out, next);
      });
    if (int8 != Int8Kernel::none)
      return with_int8_kernel([&]<unsigned Bits, bool Vnni>() {
        for (std::size_t n = 0; n < N; ++n)
          out[n] = avx2_int8::row_dot<Bits, Vnni>(rows[n], layout, act8, scratch);
      });
#endif
    (void)scratch;
    (void)next;
    for (std::size_t n = 0; n < N; ++n) out[n] = kernels.dot(rows[n], layout, act);
  }

  /// The `count` panels of the group at `group` (laid out as `pl` says) · x into
  /// out[0..4·count): the int8 paths read them as they lie, the float ones gather each row first.
  void panels_dots(const std::byte* group, std::size_t count, const PanelLayout& pl, float* scratch,
                   float* out) const noexcept {
#if defined(MOEKIT_HAS_X86_KERNELS)
    if (int8 == Int8Kernel::avx512_vnni)
      return with_int8_kernel([&]<unsigned Bits>() {
        avx512_int8::panels_dots<Bits>(group, count, pl, act8, scratch, out);
      });
    if (int8 != Int8Kernel::none)
      return with_int8_kernel([&]<unsigned Bits, bool Vnni>() {
        avx2_int8::panels_dots<Bits, Vnni>(group, count, pl, act8, scratch, out);
      });
#endif
    std::byte* row = row_buffer(layout.bytes);
    for (std::size_t k = 0; k < count; ++k)
      for (std::size_t n = 0; n < PanelLayout::height; ++n) {
        pl.gather_row(group, k, n, count, row);
        out[PanelLayout::height * k + n] = dot(row, scratch);
      }
  }

 private:
  /// dots<N> of K-quant rows with int8 activations.
  template <std::size_t N>
  void kquant_dots(const std::byte* const* rows, float* out,
                   const std::byte* const* next) const noexcept {
    const std::size_t blocks = layout.groups;
    auto with = [&]<Precision P>() {
#if defined(MOEKIT_HAS_X86_KERNELS)
      constexpr bool q6 = P == Precision::q6_k, q5 = P == Precision::q5_k;
      constexpr bool q2 = P == Precision::q2_k, q3 = P == Precision::q3_k;
      if (kquant == KQuantKernel::avx512_vnni) {
        if constexpr (q6)
          return avx512_kquant::q6_k_row_dots<N>(rows, blocks, actk, out, next);
        else if constexpr (q2)
          return avx512_kquant::q2_k_row_dots<N>(rows, blocks, actk, out, next);
        else if constexpr (q3)
          return avx512_kquant::q3_k_row_dots<N>(rows, blocks, actk, out, next);
        else
          return avx512_kquant::q4_k_row_dots<N, q5>(rows, blocks, actk, out, next);
      }
      if (kquant == KQuantKernel::avx2 || kquant == KQuantKernel::avx_vnni) {
        auto each = [&]<bool Vnni>() {
          for (std::size_t n = 0; n < N; ++n) {
            const std::byte* ahead = next ? next[n] : nullptr;
            if constexpr (q6)
              out[n] = avx2_kquant::q6_k_row_dot<Vnni>(rows[n], blocks, actk, ahead);
            else if constexpr (q2)
              out[n] = avx2_kquant::q2_k_row_dot(rows[n], blocks, actk, ahead);
            else if constexpr (q3)
              out[n] = avx2_kquant::q3_k_row_dot(rows[n], blocks, actk, ahead);
            else
              out[n] = avx2_kquant::q4_k_row_dot<Vnni, q5>(rows[n], blocks, actk, ahead);
          }
        };
        if (kquant == KQuantKernel::avx_vnni) return each.template operator()<true>();
        return each.template operator()<false>();
      }
#endif
      for (std::size_t n = 0; n < N; ++n) out[n] = scalar_kquant::row_dot(P, rows[n], blocks, actk);
    };
    (void)next;
    if (precision == Precision::q2_k) return with.template operator()<Precision::q2_k>();
    if (precision == Precision::q3_k) return with.template operator()<Precision::q3_k>();
    if (precision == Precision::q6_k) return with.template operator()<Precision::q6_k>();
    if (precision == Precision::q5_k) return with.template operator()<Precision::q5_k>();
    with.template operator()<Precision::q4_k>();
  }

#if defined(MOEKIT_HAS_X86_KERNELS)
  /// dots<N> of float rows: the AVX-512 or AVX2 multi-row kernel for this plan's precision.
  template <std::size_t N>
  void float_dots(const std::byte* const* rows, float* out,
                  const std::byte* const* next) const noexcept {
    auto with = [&]<Precision P>() {
      if (float_rows == Isa::avx512)
        avx512::float_row_dots<P, N>(rows, layout.cols, act.x, out, next);
      else
        avx2::float_row_dots<P, N>(rows, layout.cols, act.x, out, next);
    };
    if (precision == Precision::bf16) return with.template operator()<Precision::bf16>();
    if (precision == Precision::f16) return with.template operator()<Precision::f16>();
    with.template operator()<Precision::f32>();
  }
#endif

  /// Calls f.template operator()<Bits>() (the AVX-512 kernel) or, for the AVX2 kernels,
  /// f.template operator()<Bits, Vnni>(), for this plan's code width and int8 kernel.
  template <class F>
  void with_int8_kernel(F&& f) const noexcept {
    auto with = [&]<unsigned Bits>() {
      if constexpr (requires { f.template operator()<Bits>(); })
        f.template operator()<Bits>();
      else if (int8 == Int8Kernel::avx_vnni)
        f.template operator()<Bits, true>();
      else
        f.template operator()<Bits, false>();
    };
    switch (layout.bits) {
      case 8:
        return with.template operator()<8>();
      case 4:
        return with.template operator()<4>();
      default:
        return with.template operator()<2>();
    }
  }
};

inline GemvPlan make_plan(const MatrixView& w, const float* x, const KernelOptions& o,
                          PlanStorage& st) {
  GemvPlan p;
  const Isa isa = resolve_isa(o);
  p.layout = w.layout();
  p.kernels = row_kernels(w.precision, isa);
  p.precision = w.precision;
  if (o.int8_activations && is_gguf_kquant(w.precision)) {
    // K-quants run their own int8 kernels on every ISA (the scalar one on the generic path).
    p.kquant = KQuantKernel::scalar;
#if defined(MOEKIT_HAS_X86_KERNELS)
    const bool low2 = kquant_low2(w.precision);
    if (isa == Isa::avx512 && has_avx512_vnni() && (!low2 || has_avx512_kq2()))
      p.kquant = KQuantKernel::avx512_vnni;
    else if (isa != Isa::generic)
      p.kquant =
          o.avx_vnni && has_avx_vnni() && !low2 ? KQuantKernel::avx_vnni : KQuantKernel::avx2;
#endif
    if (p.kquant != KQuantKernel::scalar)
      p.streaming =
          o.streaming ? resolve_streaming(o, w.cols) : default_kquant_row_streaming(detect_core());
    p.actk = prepare_kquant_for(isa, x, w.cols, w.precision, st.k);
    return p;
  }
#if defined(MOEKIT_HAS_X86_KERNELS)
  if (o.int8_activations && isa == Isa::avx512 && has_avx512_vnni() && is_quantized(w.precision)) {
    p.int8 = Int8Kernel::avx512_vnni;
    p.streaming = resolve_streaming(o, w.cols);
    p.act8 = avx512_int8::prepare(x, w.cols, p.layout.bits, st.q, st.f);
    return p;
  }
  if (o.int8_activations && isa != Isa::generic && is_quantized(w.precision)) {
    p.int8 = o.avx_vnni && has_avx_vnni() ? Int8Kernel::avx_vnni : Int8Kernel::avx2;
    p.act8 = avx2_int8::prepare(x, w.cols, p.layout.bits, st.q, st.f);
    return p;
  }
  if (!is_quantized(w.precision) && !is_gguf_kquant(w.precision) && isa != Isa::generic) {
    // Float rows stream as the table for this core says (their own column).
    p.float_rows = isa;
    p.precision = w.precision;
    p.streaming = resolve_streaming(o, w.cols, true);
    if (o.bf16_activations && w.precision == Precision::bf16 && isa == Isa::avx512 &&
        has_avx512_bf16())
      p.xb = avx512_bf16::prepare(x, w.cols, st.b);
  }
#endif
  p.act = prepare_for(w, p.kernels, x, st.f);
  return p;
}

/// The int8 GEMM's tile kernel for these options: as make_plan picks the GEMV's, and the
/// scalar tiles on the generic path (where the GEMV keeps float activations).
inline Int8GemmPath int8_gemm_path(const KernelOptions& o) {
  const Isa isa = resolve_isa(o);
  if (isa == Isa::generic) return Int8GemmPath::scalar;
  if (isa == Isa::avx512 && has_avx512_vnni()) return Int8GemmPath::avx512_vnni;
  return o.avx_vnni && has_avx_vnni() ? Int8GemmPath::avx_vnni : Int8GemmPath::avx2;
}

/// The K-quant int8 GEMM's row kernels for these options and format: as make_plan picks the
/// GEMV's (q2_k / q3_k: AVX-512 with GFNI and VBMI, no AVX-VNNI variant).
inline KQuantGemmPath kquant_gemm_path(const KernelOptions& o, Precision p) {
  const Isa isa = resolve_isa(o);
  if (isa == Isa::generic) return KQuantGemmPath::scalar;
  const bool low2 = kquant_low2(p);
  if (isa == Isa::avx512 && has_avx512_vnni() && (!low2 || has_avx512_kq2()))
    return KQuantGemmPath::avx512_vnni;
  return o.avx_vnni && has_avx_vnni() && !low2 ? KQuantGemmPath::avx_vnni : KQuantGemmPath::avx2;
}

/// Rows of `stride` bytes that make the int8 kernels' prefetch distance: the first whole row at
/// least 12 KiB ahead (four streams of it are a twentieth of a 1 MiB L2). On Zen 4,
/// bench/kernels/ggml_peer.sh: 2, 4 and 32 KiB ran as 12 KiB (bench/RESULTS.md, "Zen 4").
inline std::size_t prefetch_rows(std::size_t stride) noexcept {
  constexpr std::size_t distance = 12 * 1024;
  return (distance + stride - 1) / stride;
}

/// Per-thread scratch for GemvPlan::dot.
inline float* plan_scratch(std::size_t cols) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < cols / 32 + 1) scratch.resize(cols / 32 + 1);
  return scratch.data();
}

/// y[r] = ep(w_r · x) for r in [r0, r1).
inline void gemv_rows(const MatrixView& w, const GemvPlan& plan, float* y, Epilogue ep,
                      std::size_t r0, std::size_t r1) noexcept {
  float* scratch = plan_scratch(w.cols);
  const std::size_t stride = plan.layout.bytes;
  auto store = [&](std::size_t r, float dot) {
    const float v = ep.scale * dot;
    y[r] = ep.accumulate ? y[r] + v : v;
  };
  // The range is cut into N equal parts read side by side, row i of every part in one dots<N>
  // call, so each part is still read front to back as one stream (pairing neighbours made every
  // pair start a new stream, measurably slower on cold Mixtral shapes). The int8 path
  // streams as `plan.streaming` says (row_streaming.hpp: the choice differs between CPU
  // cores), each stream prefetched into L2 `ahead` rows (>= 12 KiB) in front of its loads when
  // it prefetches.
  auto side_by_side = [&]<std::size_t N>(std::size_t ahead) {
    const std::size_t part = (r1 - r0) / N;
    for (std::size_t i = 0; i < part; ++i) {
      const std::byte* rows[N];
      const std::byte* next[N];
      for (std::size_t n = 0; n < N; ++n) {
        const std::size_t first = r0 + n * part;
        rows[n] = w.data + (first + i) * stride;
        next[n] = w.data + (first + std::min(i + ahead, part - 1)) * stride;
      }
      float d[N];
      plan.dots<N>(rows, scratch, d, ahead ? next : nullptr);
      for (std::size_t n = 0; n < N; ++n) store(r0 + n * part + i, d[n]);
    }
    for (std::size_t r = r0 + N * part; r < r1; ++r)
      store(r, plan.dot(w.data + r * stride, scratch));
  };
  const std::size_t ahead = plan.streaming.prefetch ? prefetch_rows(stride) : 0;
  switch (plan.streaming.streams) {
    case 1:
      return side_by_side.template operator()<1>(ahead);
    case 4:
      return side_by_side.template operator()<4>(ahead);
    default:
      return side_by_side.template operator()<2>(ahead);
  }
}

/// y = ep(W·x) for the rows of the panel groups [g0, g1) of `w` (in panels).
inline void gemv_panels(const MatrixView& w, const GemvPlan& plan, float* y, Epilogue ep,
                        std::size_t g0, std::size_t g1) noexcept {
  float* scratch = plan_scratch(w.cols);
  const PanelLayout pl = PanelLayout::of(w.cols, w.precision, w.scheme, w.order);
  constexpr std::size_t h = PanelLayout::height;
  const std::size_t panels = w.rows / h;
  for (std::size_t g = g0; g < g1; ++g) {
    const std::size_t count = pl.group_count(g, panels), first = g * pl.group;
    float d[PanelLayout::blocked_group * h];
    plan.panels_dots(w.data + first * pl.panel_bytes, count, pl, scratch, d);
    for (std::size_t i = 0; i < count * h; ++i) {
      float& dst = y[first * h + i];
      dst = ep.accumulate ? dst + ep.scale * d[i] : ep.scale * d[i];
    }
  }
}

}  // namespace detail

/// y = W·x (or per `ep`): W is `w.rows × w.cols`, x has `w.cols` values, y `w.rows`.
/// Throws `Error(invalid_argument)` on mismatched sizes or an unusable view.
inline void gemv(const MatrixView& w, std::span<const float> x, std::span<float> y,
                 const KernelOptions& opts = {}, Epilogue ep = {}) {
  detail::check_view(w, "gemv");
  MOEKIT_EXPECTS(x.size() == w.cols && y.size() == w.rows,
                 "gemv: x must have " + std::to_string(w.cols) + " values and y " +
                     std::to_string(w.rows) + " (got " + std::to_string(x.size()) + ", " +
                     std::to_string(y.size()) + ")");
  thread_local detail::PlanStorage storage;
  const detail::GemvPlan plan = detail::make_plan(w, x.data(), opts, storage);
  // In panels, whole groups of panels go to the threads (each range one stream) and the rows
  // after the last panel, stored as rows, to detail::gemv_rows.
  const bool panels = in_panels(w.order);
  const std::size_t h = PanelLayout::height;
  const std::size_t group =
      panels ? PanelLayout::of(w.cols, w.precision, w.scheme, w.order).group : 1;
  const std::size_t units = panels ? (w.rows / h + group - 1) / group : w.rows;
  auto body = [&](std::size_t b, std::size_t e) {
    if (panels)
      detail::gemv_panels(w, plan, y.data(), ep, b, e);
    else
      detail::gemv_rows(w, plan, y.data(), ep, b, e);
  };
  if (units > 0 && opts.pool)
    opts.pool->parallel_for(0, units, detail::row_grain(units, opts.pool, group > 1 ? 1 : 8), body);
  else if (units > 0)
    body(0, units);
  if (panels && w.rows % h) detail::gemv_rows(w, plan, y.data(), ep, w.rows / h * h, w.rows);
}

/// Y = X·Wᵀ (or per `ep`) for a batch: X is n × cols, Y is n × rows, both row-major. n = 1 is
/// gemv. Quantized rows with `int8_activations` (groups of 32/64/128; any group on the generic
/// path) go through the int8 GEMM (int8_gemm.hpp: tiles of rows × tokens, a token's result
/// independent of the batch), K-quant rows with it through kquant_int8_gemm.hpp; the rest decodes
/// each row to floats once and dots it with up to 32 activations (larger n in slices of 32).
inline void gemm(const MatrixView& w, std::span<const float> x, std::size_t n, std::span<float> y,
                 const KernelOptions& opts = {}, Epilogue ep = {}) {
  detail::check_view(w, "gemm");
  MOEKIT_EXPECTS(n > 0 && x.size() == n * w.cols && y.size() == n * w.rows,
                 "gemm: x must be n x " + std::to_string(w.cols) + " and y n x " +
                     std::to_string(w.rows) + " with n = " + std::to_string(n));
  if (n == 1) return gemv(w, x, y, opts, ep);
  if (opts.int8_activations && is_gguf_kquant(w.precision))
    return detail::kquant_int8_gemm(w, x.data(), n, y.data(),
                                    detail::kquant_gemm_path(opts, w.precision), opts.pool,
                                    ep.scale, ep.accumulate);
  if (opts.int8_activations && is_quantized(w.precision)) {
    const detail::Int8GemmPath path = detail::int8_gemm_path(opts);
    if (detail::int8_gemm_takes(path, w.layout()))
      return detail::int8_gemm(w, x.data(), n, y.data(), path, opts.pool, ep.scale, ep.accumulate);
  }
  const detail::RowKernels k = detail::row_kernels(w.precision, detail::resolve_isa(opts));
  const RowLayout l = w.layout();
  constexpr std::size_t tile = 32;
  thread_local std::vector<float> storage;
  for (std::size_t b0 = 0; b0 < n; b0 += tile) {
    const std::size_t nb = std::min(tile, n - b0);
    // Activations in the rows' decode order (the decoded row is in that order too).
    if (storage.size() < nb * w.cols) storage.resize(nb * w.cols);
    std::array<const float*, tile> xs{};
    for (std::size_t b = 0; b < nb; ++b) {
      const float* src = x.data() + (b0 + b) * w.cols;
      float* dst = storage.data() + b * w.cols;
      if (k.permuted) {
        const std::size_t full = w.cols / 32 * 32;
        for (std::size_t c = 0; c < full; c += 32)
          for (std::size_t i = 0; i < 32; ++i) dst[c + detail::chunk_slot(l.bits, i)] = src[c + i];
        std::copy(src + full, src + w.cols, dst + full);
        xs[b] = dst;
      } else {
        xs[b] = src;
      }
    }
    const Isa isa = detail::resolve_isa(opts);
    auto body = [&](std::size_t r0, std::size_t r1) {
      thread_local std::vector<float> row_buf;
      if (row_buf.size() < w.cols) row_buf.resize(w.cols);
      std::array<float, tile> out{};
      for (std::size_t r = r0; r < r1; ++r) {
        const float* wr =
            k.decode(stored_row(w, r, detail::row_buffer(l.bytes)), l, row_buf.data());
#if defined(MOEKIT_HAS_X86_KERNELS)
        if (isa == Isa::avx512)
          detail::avx512::multi_dot(wr, w.cols, xs.data(), nb, out.data());
        else if (isa == Isa::avx2)
          detail::avx2::multi_dot(wr, w.cols, xs.data(), nb, out.data());
        else
#endif
          for (std::size_t b = 0; b < nb; ++b) {
            float acc = 0;
            for (std::size_t c = 0; c < w.cols; ++c) acc += wr[c] * xs[b][c];
            out[b] = acc;
          }
        for (std::size_t b = 0; b < nb; ++b) {
          float& dst = y[(b0 + b) * w.rows + r];
          dst = ep.accumulate ? dst + ep.scale * out[b] : ep.scale * out[b];
        }
      }
    };
    if (opts.pool)
      opts.pool->parallel_for(0, w.rows, detail::row_grain(w.rows, opts.pool), body);
    else
      body(0, w.rows);
  }
}

}  // namespace moekit
