#pragma once
// Shared helpers of the precision tests: seeded random data (seed logged, overridable with
// MOEKIT_TEST_SEED) and the tolerance scale of a dot product.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "moekit/precision/format.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/quantize.hpp"

namespace moekit::test {

inline std::uint64_t test_seed() {
  static const std::uint64_t seed = [] {
    if (const char* s = std::getenv("MOEKIT_TEST_SEED"))
      return static_cast<std::uint64_t>(std::strtoull(s, nullptr, 10));
    return static_cast<std::uint64_t>(std::random_device{}());
  }();
  return seed;
}

/// `n` normal(0, sigma) values from a generator seeded with test_seed() + salt.
inline std::vector<float> random_normal(std::size_t n, std::uint64_t salt, float sigma = 1.f) {
  std::mt19937_64 rng(test_seed() * 1000003u + salt);
  std::normal_distribution<float> d(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Σ of the magnitudes a float kernel adds up for row r · x: Σ|w·x| plus, for quantized rows,
/// Σ_g |s·z|·Σ|x| (the zero-point term is accumulated separately). Tolerances scale with it.
inline double dot_magnitude(const MatrixView& w, std::size_t r, const float* x) {
  const RowLayout l = w.layout();
  const std::byte* row = w.row(r);
  double m = 0;
  for (std::size_t c = 0; c < w.cols; ++c) {
    double term = std::fabs(static_cast<double>(weight_at(row, l, w.precision, c)) * x[c]);
    if (is_quantized(w.precision)) {
      const std::size_t g = c / l.group_size;
      term = std::fabs(group_scale(row, l, g)) *
             (read_code(row, c, l.bits) + std::fabs(group_zero(row, l, g))) * std::fabs(x[c]);
    }
    m += term;
  }
  return m;
}

/// The expert FFN composed from GEMVs: out += scale · w2·(silu(w1·x) ⊙ w3·x), what expert_ffn
/// fuses.
inline void composed_ffn(const MatrixView& w1, const MatrixView& w3, const MatrixView& w2,
                         std::span<const float> x, std::span<float> out, float scale,
                         const KernelOptions& o) {
  std::vector<float> g(w1.rows), u(w1.rows);
  gemv(w1, x, g, o);
  gemv(w3, x, u, o);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
  gemv(w2, g, out, o, {scale, true});
}

struct Int8Path {
  const char* name;
  KernelOptions opts;
};

// Every int8-activation path this CPU runs (the int8 and K-quant GEMM tests): scalar (generic ISA),
// AVX2 with vpmaddubsw, AVX-VNNI, AVX-512 VNNI; each with `pool` (which may be null).
inline std::vector<Int8Path> int8_paths(ThreadPool* pool) {
  std::vector<Int8Path> v;
  auto add = [&](const char* n, Isa isa, bool vnni) {
    KernelOptions o{isa, pool};
    o.int8_activations = true;
    o.avx_vnni = vnni;
    v.push_back({n, o});
  };
  add("scalar", Isa::generic, false);
  if (isa_supported(Isa::avx2)) add("avx2", Isa::avx2, false);
  if (isa_supported(Isa::avx2) && has_avx_vnni()) add("avx-vnni", Isa::avx2, true);
  if (has_avx512_vnni()) add("avx512-vnni", Isa::avx512, true);
  return v;
}

}  // namespace moekit::test
