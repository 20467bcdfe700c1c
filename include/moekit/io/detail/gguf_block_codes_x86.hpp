#pragma once
/// \file GGUF Q4_0 / Q8_0 blocks into moekit's q4 / q8 codes and scales, several blocks per
/// instruction (AVX-512 BW: 4 Q4_0 or 2 Q8_0 blocks; AVX2: 2 or 1), for the in-place reader of
/// GGUF checkpoints, which converts every missed expert on the loader thread while the kernels
/// compute on the other cores.
///
/// Why not the one-block SSE2 loop of gguf_transcode.hpp alone: decoding the full Mixtral file at
/// 50%, the conversion of missed experts took about as many CPU samples as the kernels beside it
/// and slowed them. Whole vectors and non-temporal stores (the codes of an expert do not stay in
/// any cache, and a streaming store skips the read-for-ownership of each line) convert more than
/// twice as fast (bench/RESULTS.md, "A second Xeon with AMX", the conversion of missed experts).
///
/// Same bytes as the one-block loop (tests/io/gguf_transcode_test.cpp compares them on every
/// path), and the same order of reads before writes: the blocks of one step are all loaded before
/// any of their codes is stored, and a step's codes (16 or 32 bytes per block) end before the next
/// step's source (18 or 34 bytes per block) begins, so the conversion stays safe in place.
/// Non-temporal stores are used only when the caller asks for them (a destination apart from
/// the source) and the codes are 64-byte aligned; the caller then issues `stream_fence` before
/// the bytes are handed to another thread.

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MOEKIT_GGUF_BLOCKS_X86 1
#endif

namespace moekit::io::detail {

#if defined(MOEKIT_GGUF_BLOCKS_X86)

/// One Q4_0 block per 128-bit lane: its 16-bit lanes hold byte pairs a | b << 8, the pair's two
/// output bytes (low nibbles, high nibbles) are computed in two lanes and packed together within
/// each 128-bit lane, as q4_0_codes does for one block.
__attribute__((target("avx512f,avx512bw"))) inline __m512i q4_0_nibbles(__m512i v) noexcept {
  const __m512i low = _mm512_set1_epi16(0x000F), high = _mm512_set1_epi16(0x00F0);
  const __m512i v4 = _mm512_srli_epi16(v, 4), v8 = _mm512_srli_epi16(v, 8);
  return _mm512_packus_epi16(
      _mm512_or_si512(_mm512_and_si512(v, low), _mm512_and_si512(v4, high)),
      _mm512_or_si512(_mm512_and_si512(v4, low), _mm512_and_si512(v8, high)));
}
__attribute__((target("avx2"))) inline __m256i q4_0_nibbles(__m256i v) noexcept {
  const __m256i low = _mm256_set1_epi16(0x000F), high = _mm256_set1_epi16(0x00F0);
  const __m256i v4 = _mm256_srli_epi16(v, 4), v8 = _mm256_srli_epi16(v, 8);
  return _mm256_packus_epi16(
      _mm256_or_si256(_mm256_and_si256(v, low), _mm256_and_si256(v4, high)),
      _mm256_or_si256(_mm256_and_si256(v4, low), _mm256_and_si256(v8, high)));
}

/// Four 16-byte pieces, at `src` + each offset, as one vector (whole 32-byte inserts trip a false
/// -Wmaybe-uninitialized in GCC 12's headers).
__attribute__((target("avx512f,avx512bw"))) inline __m512i load_4x16(const std::byte* src, int a,
                                                                     int b, int c, int d) noexcept {
  const auto at = [src](int o) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + o));
  };
  __m512i v = _mm512_zextsi128_si512(at(a));
  v = _mm512_inserti32x4(v, at(b), 1);
  v = _mm512_inserti32x4(v, at(c), 2);
  return _mm512_inserti32x4(v, at(d), 3);
}

/// The codes of one vector of blocks, streamed (non-temporal) or stored.
__attribute__((target("avx512f,avx512bw"))) inline void store_codes(std::byte* codes, __m512i v,
                                                                    bool stream) noexcept {
  if (stream)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(codes), v);
  else
    _mm512_storeu_si512(codes, v);
}
__attribute__((target("avx2"))) inline void store_codes(std::byte* codes, __m256i v,
                                                        bool stream) noexcept {
  if (stream)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(codes), v);
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), v);
}

/// Blocks [0, return value) of `blocks` Q4_0 blocks, 4 at a time; the caller converts the rest.
__attribute__((target("avx512f,avx512bw"))) inline std::size_t q4_0_blocks_avx512(
    const std::byte* src, std::size_t blocks, std::byte* codes, std::byte* scales,
    bool stream) noexcept {
  stream = stream && reinterpret_cast<std::uintptr_t>(codes) % 64 == 0;
  std::size_t i = 0;
  for (; i + 4 <= blocks; i += 4, src += 72, codes += 64, scales += 8) {
    const __m512i v = load_4x16(src, 2, 20, 38, 56);  // the four blocks' 16 code bytes
    std::uint16_t d[4];
    for (int b = 0; b < 4; ++b) std::memcpy(&d[b], src + 18 * b, 2);
    store_codes(codes, q4_0_nibbles(v), stream);
    std::memcpy(scales, d, sizeof d);
  }
  return i;
}

/// As q4_0_blocks_avx512, 2 blocks at a time in AVX2.
__attribute__((target("avx2"))) inline std::size_t q4_0_blocks_avx2(const std::byte* src,
                                                                    std::size_t blocks,
                                                                    std::byte* codes,
                                                                    std::byte* scales,
                                                                    bool stream) noexcept {
  stream = stream && reinterpret_cast<std::uintptr_t>(codes) % 32 == 0;
  std::size_t i = 0;
  for (; i + 2 <= blocks; i += 2, src += 36, codes += 32, scales += 4) {
    const __m256i v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(src + 20),
                                          reinterpret_cast<const __m128i*>(src + 2));
    std::uint16_t d[2];
    std::memcpy(&d[0], src, 2);
    std::memcpy(&d[1], src + 18, 2);
    store_codes(codes, q4_0_nibbles(v), stream);
    std::memcpy(scales, d, sizeof d);
  }
  return i;
}

/// Blocks [0, return value) of `blocks` Q8_0 blocks, 2 at a time: the int8 codes with their sign
/// bit flipped (q + 128).
__attribute__((target("avx512f,avx512bw"))) inline std::size_t q8_0_blocks_avx512(
    const std::byte* src, std::size_t blocks, std::byte* codes, std::byte* scales,
    bool stream) noexcept {
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  stream = stream && reinterpret_cast<std::uintptr_t>(codes) % 64 == 0;
  std::size_t i = 0;
  for (; i + 2 <= blocks; i += 2, src += 68, codes += 64, scales += 4) {
    const __m512i v = load_4x16(src, 2, 18, 36, 52);  // the two blocks' 32 code bytes each
    std::uint16_t d[2];
    std::memcpy(&d[0], src, 2);
    std::memcpy(&d[1], src + 34, 2);
    store_codes(codes, _mm512_xor_si512(v, sign), stream);
    std::memcpy(scales, d, sizeof d);
  }
  return i;
}

/// As q8_0_blocks_avx512, one block at a time in AVX2.
__attribute__((target("avx2"))) inline std::size_t q8_0_blocks_avx2(const std::byte* src,
                                                                    std::size_t blocks,
                                                                    std::byte* codes,
                                                                    std::byte* scales,
                                                                    bool stream) noexcept {
  const __m256i sign = _mm256_set1_epi8(static_cast<char>(0x80));
  stream = stream && reinterpret_cast<std::uintptr_t>(codes) % 32 == 0;
  for (std::size_t i = 0; i < blocks; ++i, src += 34, codes += 32, scales += 2) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2));
    std::uint16_t d;
    std::memcpy(&d, src, 2);
    store_codes(codes, _mm256_xor_si256(v, sign), stream);
    std::memcpy(scales, &d, 2);
  }
  return blocks;
}

#endif  // MOEKIT_GGUF_BLOCKS_X86

/// Blocks [0, return value) of `blocks` GGUF blocks (Q4_0 when `q4`, else Q8_0) converted on the
/// widest path this CPU has (0 on CPUs without AVX2: the caller's loop does them all).
inline std::size_t gguf_blocks_simd(bool q4, const std::byte* src, std::size_t blocks,
                                    std::byte* codes, std::byte* scales, bool stream) noexcept {
#if defined(MOEKIT_GGUF_BLOCKS_X86)
  // The two features these paths need, not precision/isa.hpp's kernel levels: that header asks
  // for features clang 14's __builtin_cpu_supports does not name, and the fuzzers (clang) parse
  // GGUF files through this one.
  static const int level = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bw") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
  }();
  if (level == 2)
    return q4 ? q4_0_blocks_avx512(src, blocks, codes, scales, stream)
              : q8_0_blocks_avx512(src, blocks, codes, scales, stream);
  if (level == 1)
    return q4 ? q4_0_blocks_avx2(src, blocks, codes, scales, stream)
              : q8_0_blocks_avx2(src, blocks, codes, scales, stream);
#endif
  (void)q4, (void)src, (void)blocks, (void)codes, (void)scales, (void)stream;
  return 0;
}

/// Orders the non-temporal stores before what follows (the bytes' hand-over to another thread).
inline void stream_fence() noexcept {
#if defined(MOEKIT_GGUF_BLOCKS_X86)
  _mm_sfence();
#endif
}

}  // namespace moekit::io::detail
