// The int8-activation GEMM of GGUF K-quant rows (kquant_int8_gemm.hpp) against the float64
// reference with the bound the K-quant GEMV tests derive (gguf_kquant_test.cpp), on every path
// this CPU runs (forced with KernelOptions::isa), with and without a thread pool; and a token's
// result independent of the batch bit for bit: n = 1 .. 40, each token equal to the same gemm on
// that token alone, wherever it sits.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "moekit/precision/gemv.hpp"
#include "moekit/precision/reference.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "test_support.hpp"

using namespace moekit;

// Names unique in the area: its tests are built as one unity unit.
namespace {

const Precision kqg_formats[] = {Precision::q4_k, Precision::q5_k, Precision::q6_k, Precision::q2_k,
                                 Precision::q3_k};

struct KqgPath {
  std::string name;
  KernelOptions opts;
};

// Every path this CPU runs: the generic ISA (scalar kernels), AVX2 with and without AVX-VNNI,
// AVX-512; each with `pool` (which may be null).
std::vector<KqgPath> kqg_paths(ThreadPool* pool) {
  std::vector<KqgPath> v;
  auto add = [&](const char* n, Isa isa, bool vnni) {
    KernelOptions o{isa, pool};
    o.int8_activations = true;
    o.avx_vnni = vnni;
    v.push_back({std::string(n) + (pool ? " pool" : ""), o});
  };
  add("scalar", Isa::generic, false);
  if (isa_supported(Isa::avx2)) add("avx2", Isa::avx2, false);
  if (isa_supported(Isa::avx2) && has_avx_vnni()) add("avx-vnni", Isa::avx2, true);
  if (isa_supported(Isa::avx512)) add("avx512", Isa::avx512, true);
  return v;
}

void kqg_put_half(std::byte* p, float v) {
  const std::uint16_t h = float_to_half_bits(v);
  std::memcpy(p, &h, 2);
}

// A rows × cols K-quant matrix of random code and scale bytes with finite, moderate f16
// super-scales (as gguf_kquant_test.cpp makes them: every byte pattern is a valid block).
std::vector<std::byte> kqg_random(std::size_t rows, std::size_t cols, Precision p,
                                  std::uint64_t salt) {
  std::mt19937_64 rng(test::test_seed() * 1000003u + salt);
  std::vector<std::byte> b(matrix_bytes(rows, cols, p));
  for (auto& x : b) x = static_cast<std::byte>(rng() & 0xff);
  std::uniform_real_distribution<float> scale(-0.004f, 0.004f);
  const std::size_t bb = kquant_block_bytes(p);
  for (std::size_t off = 0; off < b.size(); off += bb) {
    if (p == Precision::q6_k || p == Precision::q3_k) {
      kqg_put_half(b.data() + off + (p == Precision::q6_k ? q6_k::d_offset : q3_k::d_offset),
                   scale(rng));
    } else {
      const std::size_t at = p == Precision::q2_k ? q2_k::d_offset : 0;
      kqg_put_half(b.data() + off + at, std::fabs(scale(rng)));
      kqg_put_half(b.data() + off + at + 2, std::fabs(scale(rng)));
    }
  }
  return b;
}

// Σ |term|·|x| over the terms the int8 kernels add in floats (the code's product and the minimum
// or code offset), the unit of the float-accumulation part of the bound.
double kqg_magnitude(const MatrixView& w, std::size_t r, const float* x) {
  double m = 0;
  const RowLayout l = w.layout();
  for (std::size_t c = 0; c < w.cols; ++c) {
    const std::byte* block = w.row(r) + c / 256 * kquant_block_bytes(w.precision);
    const std::size_t i = c % 256;
    double term;
    if (w.precision == Precision::q2_k) {
      term = std::fabs(q2_k::d_of(block)) * q2_k::scale(block, i / 16) * q2_k::code(block, i) +
             std::fabs(q2_k::dmin_of(block)) * q2_k::min(block, i / 16);
    } else if (w.precision == Precision::q3_k) {
      term =
          std::fabs(q3_k::d_of(block) * q3_k::scale(block, i / 16)) * (q3_k::code(block, i) + 4.0);
    } else if (w.precision == Precision::q6_k) {
      term =
          std::fabs(q6_k::d_of(block) * q6_k::scale(block, i / 16)) * (q6_k::code(block, i) + 32.0);
    } else {  // q4_k, q5_k: |w| + 2·dmin·m bounds d·sc·q + dmin·m
      std::uint8_t sc[8], mn[8];
      q4_k::scales_mins(block, sc, mn);
      term = std::fabs(weight_at(w.row(r), l, w.precision, c)) +
             2 * std::fabs(q4_k::dmin_of(block)) * mn[i / 32];
    }
    m += term * std::fabs(x[c]);
  }
  return m;
}

// The bound of gguf_kquant_test.cpp's GEMV test (the GEMM rounds the activation as the GEMV
// does): each activation moves by at most half its int8 step, max|x|/254 over the values sharing
// its scale (32 for q6_k, the 256 of a super-block for the others; ×1.01 for the rounding of the
// step), plus float accumulation far below 2^-16 of the kernels' terms.
double kqg_bound(const MatrixView& w, std::size_t r, const float* x) {
  const RowLayout l = w.layout();
  const std::size_t span = kquant_block_scaled(w.precision) ? 256 : 32;
  double bound = 0;
  for (std::size_t col = 0; col < w.cols; ++col) {
    float amax = 0;
    for (std::size_t i = col / span * span; i < col / span * span + span; ++i)
      amax = std::max(amax, std::fabs(x[i]));
    bound += std::fabs(weight_at(w.row(r), l, w.precision, col)) * amax / 254.0;
  }
  return bound * 1.01 + kqg_magnitude(w, r, x) / 65536 + 1e-9;
}

}  // namespace

TEST_CASE("K-quant int8 GEMM within the derived bound on every path, with and without a pool",
          "[precision][kquant][gemm]") {
  INFO("seed " << test::test_seed());
  ThreadPool pool(2);
  // 37 rows: two whole 16-row groups, a four and a single row after; 7 tokens.
  for (Precision p : kqg_formats)
    for (std::size_t cols : {256u, 1024u, 3584u}) {
      const std::size_t rows = 37, n = 7;
      const auto bytes = kqg_random(rows, cols, p, cols + 17);
      const MatrixView w = make_matrix_view(bytes, rows, cols, p);
      const auto x = test::random_normal(n * cols, 3 + cols);
      std::vector<float> want(n * rows);
      reference::gemm(w, x.data(), n, want.data());
      for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool})
        for (const KqgPath& path : kqg_paths(tp)) {
          std::vector<float> y(n * rows), yf(n * rows);
          gemm(w, x, n, y, path.opts);
          KernelOptions fo = path.opts;
          fo.int8_activations = false;
          gemm(w, x, n, yf, fo);
          INFO(name(p) << " cols " << cols << " " << path.name);
          CHECK(y != yf);  // the int8 path really ran
          for (std::size_t t = 0; t < n; ++t)
            for (std::size_t r = 0; r < rows; ++r) {
              const float* xt = x.data() + t * cols;
              INFO("token " << t << " row " << r << ": " << y[t * rows + r] << " want "
                            << want[t * rows + r]);
              REQUIRE(std::fabs(y[t * rows + r] - want[t * rows + r]) <= kqg_bound(w, r, xt));
            }
        }
    }
}

TEST_CASE("K-quant int8 GEMM: a token's result does not depend on the batch, bit for bit",
          "[precision][kquant][gemm]") {
  INFO("seed " << test::test_seed());
  ThreadPool pool(2);
  const std::size_t rows = 16 * 2 + 4 + 3, cols = 1024, most = 40;
  for (Precision p : kqg_formats) {
    const auto bytes = kqg_random(rows, cols, p, 5);
    const MatrixView w = make_matrix_view(bytes, rows, cols, p);
    const auto batch = test::random_normal(most * cols, 41);
    const auto base = test::random_normal(most * rows, 77);  // accumulated into
    for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool})
      for (const KqgPath& path : kqg_paths(tp)) {
        INFO(name(p) << " " << path.name);
        // Each token alone (n = 1: the GEMV) ...
        std::vector<float> alone = base;
        for (std::size_t t = 0; t < most; ++t)
          gemm(w, std::span<const float>(batch.data() + t * cols, cols), 1,
               std::span<float>(alone.data() + t * rows, rows), path.opts, {0.75f, true});
        // ... equals it in every batch of its first n tokens, and in the batch reversed.
        for (std::size_t n = 2; n <= most; ++n) {
          std::vector<float> y(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(n * rows));
          gemm(w, std::span<const float>(batch.data(), n * cols), n, y, path.opts, {0.75f, true});
          INFO("n " << n);
          for (std::size_t i = 0; i < n * rows; ++i) REQUIRE(y[i] == alone[i]);
        }
        std::vector<float> rev(most * cols), yr(most * rows);
        for (std::size_t t = 0; t < most; ++t) {
          const std::size_t to = most - 1 - t;
          std::memcpy(rev.data() + to * cols, batch.data() + t * cols, 4 * cols);
          std::memcpy(yr.data() + to * rows, base.data() + t * rows, 4 * rows);
        }
        gemm(w, rev, most, yr, path.opts, {0.75f, true});
        for (std::size_t t = 0; t < most; ++t)
          for (std::size_t r = 0; r < rows; ++r) {
            INFO("reversed: token " << t << " row " << r);
            REQUIRE(yr[(most - 1 - t) * rows + r] == alone[t * rows + r]);
          }
      }
  }
}
