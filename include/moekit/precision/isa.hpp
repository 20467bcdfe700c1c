#pragma once
/// \file Which SIMD instruction set the CPU kernels use, detected at run time
/// (`__builtin_cpu_supports`), so one binary runs everywhere and uses AVX-512 where it exists.

#include <cstdint>
#include <optional>
#include <string_view>

namespace moekit {

/// Instruction set of a CPU kernel path. Ordered: a CPU that runs one runs the ones before it.
enum class Isa : std::uint8_t {
  generic,  ///< portable C++ (any CPU)
  avx2,     ///< AVX2 + FMA + F16C
  avx512,   ///< AVX-512 F/BW/VL/DQ (+ FMA, F16C)
};

constexpr std::string_view name(Isa isa) noexcept {
  switch (isa) {
    case Isa::generic:
      return "generic";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
  }
  return "?";
}

/// Parses "generic", "avx2" or "avx512".
constexpr std::optional<Isa> parse_isa(std::string_view s) noexcept {
  for (Isa i : {Isa::generic, Isa::avx2, Isa::avx512})
    if (name(i) == s) return i;
  return std::nullopt;
}

/// The best path this CPU supports (detected once).
inline Isa detect_isa() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const Isa best = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512dq");
    return avx512 ? Isa::avx512 : avx2 ? Isa::avx2 : Isa::generic;
  }();
  return best;
#else
  return Isa::generic;
#endif
}

/// True when the CPU has AVX-512 VNNI (`vpdpbusd`), used by the int8-activation kernels.
inline bool has_avx512_vnni() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool yes = detect_isa() == Isa::avx512 && __builtin_cpu_supports("avx512vnni");
  return yes;
#else
  return false;
#endif
}

/// True when the CPU has AVX-512 VNNI with GFNI and VBMI (Ice Lake and later, Zen 4 and later; not
/// Cascade Lake), which the q2_k/q3_k AVX-512 kernels use (`vgf2p8affineqb`, `vpermb`).
inline bool has_avx512_kq2() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool yes =
      has_avx512_vnni() && __builtin_cpu_supports("gfni") && __builtin_cpu_supports("avx512vbmi");
  return yes;
#else
  return false;
#endif
}

/// True when the CPU has AVX512_BF16 (`vdpbf16ps`: pairs of bf16 products summed into floats),
/// used by the GEMV of bf16 rows with bf16 activations (KernelOptions::bf16_activations).
inline bool has_avx512_bf16() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool yes = detect_isa() == Isa::avx512 && __builtin_cpu_supports("avx512bf16");
  return yes;
#else
  return false;
#endif
}

/// True when the CPU has AVX-VNNI (256-bit `vpdpbusd` without AVX-512), used by the AVX2 int8
/// kernels when present.
inline bool has_avx_vnni() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool yes = detect_isa() != Isa::generic && __builtin_cpu_supports("avxvnni");
  return yes;
#else
  return false;
#endif
}

/// True when this CPU can run `isa`.
inline bool isa_supported(Isa isa) noexcept {
  return static_cast<std::uint8_t>(isa) <= static_cast<std::uint8_t>(detect_isa());
}

}  // namespace moekit
