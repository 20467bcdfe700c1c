#pragma once
/// \file How the int8-activation GEMV and the fused expert FFN read their rows from memory: how
/// many streams each thread reads side by side, and whether it prefetches them in software.
///
/// The kernels are memory-bound on cold weights, and what keeps the memory busy while the core
/// computes differs between CPU cores running the same code, so the choice is a table per core,
/// filled from measurements (`moekit_bench_row_streaming` prints every choice against the
/// streaming read; bench/RESULTS.md has the runs), overridable through `KernelOptions::streaming`.
/// The table (`default_row_streaming`), from cold Mixtral expert shapes at one thread:
/// - Zen 4 (EPYC 9004): four streams, each prefetched into L2 a whole row ahead (the hardware
///   prefetcher alone fell behind the loop).
/// - Zen 5 (EPYC 9005): two streams; prefetched in software only on rows of 14336 columns (on
///   rows of 4096 the prefetch instructions cost more than they saved).
/// - Intel Xeon with AMX (Sapphire Rapids and later server cores): four streams, each prefetched
///   (the fastest, or within 5 points of it, in every cell at one and two threads, on Emerald
///   Rapids, family 6 model 0xCF, and on a KVM guest reporting model 0xA7 with AMX).
/// - Other cores (Ice Lake server included: its figures in bench/RESULTS.md ran the default) are
///   not measured: two prefetched streams, the middle of both.
/// The float-row kernels (f32/bf16/f16 rows, float or bf16 activations) have their own column
/// (`default_float_row_streaming`): they do less work per byte, and on Zen 5 four streams on the
/// hardware prefetcher alone beat every other way on both shapes, on Xeons with AMX four
/// prefetched streams ("bf16/f16 experts" and "Emerald Rapids" in bench/RESULTS.md,
/// `moekit_bench_float_gemv`).
/// A matrix in panels (MatrixOrder::panels4, panels.hpp) is one stream per thread whatever the
/// core, and reads closer to the streaming bound than any row streaming on w2. The measurements:
/// bench/RESULTS.md, "Zen 5, rows", "Zen 4" and "Panels".
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

namespace moekit {

/// How one thread reads its rows: `streams` rows side by side (1, 2 or 4; each from its own
/// part of the thread's range, so every stream is read front to back), each prefetched into L2
/// a whole row at least 12 KiB ahead of its loads when `prefetch` is set.
struct RowStreaming {
  unsigned streams = 2;
  bool prefetch = true;

  friend bool operator==(const RowStreaming&, const RowStreaming&) = default;
};

/// True for the stream counts the kernels are instantiated for.
constexpr bool valid_streams(unsigned streams) noexcept {
  return streams == 1 || streams == 2 || streams == 4;
}

/// Parses "1", "2" or "4" (streams, hardware prefetcher only) with an optional "p" (each stream
/// prefetched in software): the column labels of moekit_bench_row_streaming.
constexpr std::optional<RowStreaming> parse_row_streaming(std::string_view s) noexcept {
  const bool prefetch = !s.empty() && s.back() == 'p';
  if (prefetch) s.remove_suffix(1);
  if (s.size() != 1 || s[0] < '0' || s[0] > '9' ||
      !valid_streams(static_cast<unsigned>(s[0] - '0')))
    return std::nullopt;
  return RowStreaming{static_cast<unsigned>(s[0] - '0'), prefetch};
}

/// The CPU cores the per-core tables distinguish (this one, and the expert layout's in
/// engine/expert_layout.hpp).
enum class CpuCore : std::uint8_t { other, zen4, zen5, icelake_server, xeon_amx };

constexpr std::string_view name(CpuCore c) noexcept {
  switch (c) {
    case CpuCore::zen4:
      return "zen4";
    case CpuCore::zen5:
      return "zen5";
    case CpuCore::icelake_server:
      return "icelake-server";
    case CpuCore::xeon_amx:
      return "xeon-amx";
    case CpuCore::other:
      return "other";
  }
  return "?";
}

/// This CPU's core (CPUID vendor, family and model, read once): AMD family 0x19 with AVX-512 is
/// Zen 4, 0x1A is Zen 5; Intel family 6 model 0x6A or 0x6C (Xeon 3rd gen., Ice Lake server) is
/// icelake_server; an Intel family 6 CPU with AMX tiles (CPUID 7.0:EDX bit 24: Sapphire, Emerald
/// and Granite Rapids) xeon_amx. That entry goes by the feature, not the model number, because a
/// hypervisor may report another model: one KVM guest with AMX reported 0xA7 (a desktop Rocket
/// Lake's number) and measured as Emerald Rapids (0xCF) did, bench/RESULTS.md. Zen 3 shares family
/// 0x19 without AVX-512: it runs the AVX2 int8 kernels and is `other` (the per-core tables have no
/// measured entry for it; bench/RESULTS.md, "Experts apart", has its expert-layout comparison on
/// OLMoE, where blocked panels, the `other` choice, won).
inline CpuCore detect_core() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const CpuCore core = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return CpuCore::other;
    const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;    // "AuthenticAMD"
    const bool intel = b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // "GenuineIntel"
    if ((!amd && !intel) || !__get_cpuid(1, &a, &b, &c, &d)) return CpuCore::other;
    const unsigned base = (a >> 8) & 0xfu;
    const unsigned family = base == 0xfu ? base + ((a >> 20) & 0xffu) : base;
    const unsigned model = (a >> 4 & 0xfu) | (base == 6 || base == 0xf ? (a >> 12 & 0xf0u) : 0u);
    __builtin_cpu_init();
    if (intel && family == 6 && (model == 0x6a || model == 0x6c)) return CpuCore::icelake_server;
    unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
    const bool amx = __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7) && (d7 >> 24 & 1u);
    if (intel && family == 6 && amx) return CpuCore::xeon_amx;
    if (intel) return CpuCore::other;
    if (family == 0x19 && __builtin_cpu_supports("avx512f")) return CpuCore::zen4;
    if (family == 0x1a) return CpuCore::zen5;
    return CpuCore::other;
  }();
  return core;
#else
  return CpuCore::other;
#endif
}

/// The measured best way for `core` to stream rows of `cols` columns.
constexpr RowStreaming default_row_streaming(CpuCore core, std::size_t cols) noexcept {
  switch (core) {
    case CpuCore::zen4:
      return {4, true};
    // What decides is the width, not the row's bytes: rows of 4096 columns (Mixtral's w1/w3, 1280
    // to 4352 bytes) stream on the hardware prefetcher, rows of 14336 (w2) need the prefetch at
    // any precision (even q2's 4480-byte rows). Why is open; what was ruled out is in
    // bench/RESULTS.md, "Zen 5, rows".
    case CpuCore::zen5:
      return {2, cols > 8192};
    case CpuCore::xeon_amx:
      return {4, true};
    case CpuCore::icelake_server:  // streaming not measured there: as other cores
    case CpuCore::other:
      break;
  }
  return {2, true};
}

/// The measured best way for `core` to stream rows of a float format (f32/bf16/f16). Measured on
/// Zen 5 (four streams, no software prefetch, whatever the width) and Xeons with AMX (four
/// prefetched streams); other cores get Zen 5's until a `moekit_bench_float_gemv` run on them
/// says otherwise.
constexpr RowStreaming default_float_row_streaming(CpuCore core, std::size_t cols) noexcept {
  (void)cols;
  return {4, core == CpuCore::xeon_amx};
}

/// The measured best way for `core` to stream rows of GGUF K-quants (q2_k ... q6_k, their own
/// int8 kernels): four prefetched streams on Xeons with AMX (ahead of two in every cell but one,
/// level there, in two runs at one and two threads: bench/RESULTS.md, "A second Xeon with AMX");
/// elsewhere two prefetched streams, measured on Zen 5 (at 14336 columns four streams fell far
/// behind there; "GGUF K-quants read in place").
constexpr RowStreaming default_kquant_row_streaming(CpuCore core) noexcept {
  return {core == CpuCore::xeon_amx ? 4u : 2u, true};
}

}  // namespace moekit
