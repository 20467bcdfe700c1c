#pragma once
/// \file Warp-level primitives shared by the CUDA kernels and their host emulation.
///
/// A warp sum is an xor butterfly (offsets 16, 8, 4, 2, 1) after which every lane holds the
/// total. `warp_sum(float)` is the device implementation (`__shfl_xor_sync`); `warp_sum(lanes)`
/// is the host implementation over the 32 emulated lanes' values, adding in the same order, so the
/// emulation reproduces the device's floating-point result exactly.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/config.hpp"

// `#pragma unroll` for nvcc; nothing for host compilers (GCC warns about unknown pragmas).
#if defined(__CUDACC__)
#define MOEKIT_PRAGMA_UNROLL _Pragma("unroll")
#else
#define MOEKIT_PRAGMA_UNROLL
#endif

namespace moekit::simt {

/// Threads per warp (all NVIDIA architectures moekit targets).
inline constexpr unsigned warp_size = 32;

/// The 32 lanes' values of one warp, as the host emulation holds them.
using LaneValues = std::array<float, warp_size>;

#if defined(__CUDACC__)
/// Device: sum over the warp; every lane receives the total.
MOEKIT_DEVICE inline float warp_sum(float v) noexcept {
  for (unsigned offset = warp_size / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
#endif

/// Host: the same butterfly over the emulated lanes; every lane receives the total.
inline void warp_sum(LaneValues& lanes) noexcept {
  for (unsigned offset = warp_size / 2; offset > 0; offset /= 2) {
    LaneValues next;
    for (unsigned l = 0; l < warp_size; ++l) next[l] = lanes[l] + lanes[l ^ offset];
    lanes = next;
  }
}

/// Row handled by warp `warp` of block `block` in a warp-per-row kernel.
MOEKIT_HOST_DEVICE constexpr std::size_t warp_row(std::size_t block, unsigned warp,
                                                  unsigned warps_per_block) noexcept {
  return block * warps_per_block + warp;
}

/// Sixteen bytes, the unit of a 128-bit load.
struct Vec128 {
  std::uint32_t w[4];
};

/// 128-bit load. `Aligned`: `p` is 16-byte aligned (one vector load on the device); otherwise a
/// byte-wise copy that works at any address.
template <bool Aligned>
MOEKIT_HOST_DEVICE inline Vec128 load128(const void* p) noexcept {
#if defined(__CUDA_ARCH__)
  if constexpr (Aligned) {
    const uint4 v = __ldg(static_cast<const uint4*>(p));
    return Vec128{{v.x, v.y, v.z, v.w}};
  }
#endif
  Vec128 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// Little-endian u16 at any address (scales and zero points of odd-sized rows are unaligned).
MOEKIT_HOST_DEVICE inline std::uint16_t load_u16(const std::byte* p) noexcept {
  return static_cast<std::uint16_t>(static_cast<unsigned>(p[0]) |
                                    (static_cast<unsigned>(p[1]) << 8));
}

}  // namespace moekit::simt
