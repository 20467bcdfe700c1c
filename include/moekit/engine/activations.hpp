#pragma once
/// \file How the routed experts' activations enter the quantized kernels (`--activations`).
///
/// `f32`: the float path (activations stay f32; each quantized weight group is dotted in floats).
/// `int8`: the activation is rounded to int8 per 32 values (ggml's q8_0 activations) and dotted
/// with the int8 weights (`KernelOptions::int8_activations`: AVX-512 VNNI, else AVX2 with
/// AVX-VNNI or vpmaddubsw). It applies to
/// quantized experts (q8/q4/q2) in decode forwards (one token per expert: the fused GEMV path) and
/// in prefill (the int8 GEMM, precision/int8_gemm.hpp; bench/RESULTS.md, "Prefill GEMM with int8
/// activations"); f32/bf16/f16 experts keep float activations. The dense matrices
/// follow the same choice judged on their own precisions (Model::set_int8_dense_activations).
/// `auto` (the default): int8 when the CPU has the int8 kernels (AVX2 at least), some expert runs
/// quantized and the expert rows are at least `int8_min_row_width` wide; f32 otherwise. The int8
/// kernels beat the float path on AVX2 too (bench/RESULTS.md, "Int8 expert activations"); the
/// width threshold was measured with the AVX-512 ones.
///
/// Why the width: the int8 kernel saves work per 64-byte block but pays a fixed cost per row
/// (activation scales, two horizontal sums), so below a width the float path wins
/// (moekit_bench_int8_activations; bench/RESULTS.md, "Int8 expert activations").

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/precision/isa.hpp"

namespace moekit::engine {

/// What --activations asked for.
enum class ActivationMode { automatic, f32, int8 };

constexpr std::string_view name(ActivationMode m) noexcept {
  switch (m) {
    case ActivationMode::automatic:
      return "auto";
    case ActivationMode::f32:
      return "f32";
    case ActivationMode::int8:
      return "int8";
  }
  return "?";
}

/// Parses "auto", "f32" or "int8".
constexpr std::optional<ActivationMode> parse_activation_mode(std::string_view s) noexcept {
  for (ActivationMode m : {ActivationMode::automatic, ActivationMode::f32, ActivationMode::int8})
    if (name(m) == s) return m;
  return std::nullopt;
}

/// Narrowest expert rows (min(hidden, expert ffn)) for which `auto` picks int8.
inline constexpr std::size_t int8_min_row_width = 512;

/// True when experts run with int8 activations: `mode` resolved against the precisions the run's
/// experts use, their narrowest row (`row_width` = min(hidden, expert ffn); `auto` only) and
/// whether the CPU runs the int8 kernels (`cpu_has_int8`: AVX2 at least). An explicit int8
/// without them throws `Error(unsupported)` naming the flag; with no quantized expert (q8/q4/q2
/// or a GGUF K-quant, which has int8 kernels of its own) there is
/// nothing int8 could apply to, so the run is f32 whatever was asked.
inline bool resolve_int8_activations(ActivationMode mode,
                                     std::span<const moekit::Precision> expert_precisions,
                                     std::size_t row_width,
                                     bool cpu_has_int8 = moekit::isa_supported(moekit::Isa::avx2)) {
  if (mode == ActivationMode::f32) return false;
  if (mode == ActivationMode::int8 && !cpu_has_int8)
    moekit::detail::fail(moekit::ErrorKind::unsupported,
                         "--activations int8: this CPU has neither AVX-512 VNNI nor AVX2, which "
                         "the int8 kernels need (use f32 or auto)");
  const bool quantized = std::any_of(
      expert_precisions.begin(), expert_precisions.end(),
      [](moekit::Precision p) { return moekit::is_quantized(p) || moekit::is_gguf_kquant(p); });
  if (mode == ActivationMode::automatic && row_width < int8_min_row_width) return false;
  return quantized && cpu_has_int8;
}

/// The name of a resolved choice, as the statistics report it.
constexpr std::string_view activations_name(bool int8) noexcept { return int8 ? "int8" : "f32"; }

}  // namespace moekit::engine
