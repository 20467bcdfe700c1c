// The int8-activation GEMM (int8_gemm.hpp) against the float64 reference within the activation
// rounding bound, on every tile path this CPU runs plus the scalar one; a token's result
// independent of the batch around it (bit for bit); panels equal to rows.
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "moekit/precision/gemv.hpp"
#include "moekit/precision/int8_gemm.hpp"
#include "moekit/precision/panels.hpp"
#include "moekit/precision/reference.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "test_support.hpp"

using namespace moekit;

namespace {
// Float accumulation, relative to Σ|w·x| (as kernels_test.cpp).
constexpr double gemm8_rel_tol = 1.0 / 65536;

struct Gemm8Case {
  std::vector<std::byte> bytes;
  MatrixView view;
};
Gemm8Case gemm8_make(std::size_t rows, std::size_t cols, Precision p, QuantScheme s,
                     std::uint64_t salt) {
  Gemm8Case c;
  const auto w = test::random_normal(rows * cols, salt, 0.05f);
  c.bytes = encode_matrix<float>(w, rows, cols, p, s);
  c.view = make_matrix_view(c.bytes, rows, cols, p, s);
  return c;
}

// Each activation moves by at most half its chunk's int8 step (max|x|/254); the columns after
// the last chunk stay float. Plus the float accumulation.
double gemm8_bound(const MatrixView& w, std::size_t r, const float* x) {
  const RowLayout l = w.layout();
  double bound = 0;
  for (std::size_t c0 = 0; c0 + 32 <= w.cols; c0 += 32) {
    float amax = 0;
    for (std::size_t i = c0; i < c0 + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    for (std::size_t i = c0; i < c0 + 32; ++i)
      bound += std::fabs(weight_at(w.row(r), l, w.precision, i)) * amax / 254.0;
  }
  return bound * 1.01 + gemm8_rel_tol * test::dot_magnitude(w, r, x) + 1e-6;
}
}  // namespace

TEST_CASE("int8 GEMM stays within the activation rounding bound on every path",
          "[precision][gemm]") {
  INFO("seed " << test::test_seed());
  ThreadPool pool(2);
  // Whole 16-chunk steps, a partial step, chunks after the last block, columns after the last
  // chunk; 13 rows (not a multiple of any tile or of the 16-row group); n not a multiple of T.
  for (std::size_t cols : {4096u + 32u, 1000u, 256u, 77u})
    for (Precision p : {Precision::q8, Precision::q4, Precision::q2})
      for (QuantScheme s :
           {QuantScheme{32, false}, QuantScheme{64, true}, QuantScheme{128, false}}) {
        const std::size_t rows = 13, n = 7;
        const Gemm8Case c = gemm8_make(rows, cols, p, s, cols * 3 + bits(p));
        auto x = test::random_normal(n * cols, cols + 41);
        x[3] = 9.f;  // q8 codes near 255 meet large activations (vpmaddubsw's int16 pairs)
        for (const test::Int8Path& path : test::int8_paths(&pool)) {
          std::vector<float> y(n * rows), yf(n * rows);
          gemm(c.view, x, n, y, path.opts);
          KernelOptions fo = path.opts;
          fo.int8_activations = false;
          gemm(c.view, x, n, yf, fo);
          CHECK(y != yf);  // the int8 path really ran
          for (std::size_t t = 0; t < n; ++t)
            for (std::size_t r = 0; r < rows; ++r) {
              const float* xt = x.data() + t * cols;
              const double want = reference::dot_row(c.view, r, xt);
              const float got = y[t * rows + r];
              INFO(path.name << " " << name(p) << " g" << s.group_size << " z" << s.zero_point
                             << " cols " << cols << " token " << t << " row " << r << ": " << got
                             << " want " << want);
              REQUIRE(std::fabs(got - want) <= gemm8_bound(c.view, r, xt));
              // The SIMD paths round x as their GEMV does: equal to it up to float accumulation.
              if (path.opts.isa != Isa::generic) {
                std::vector<float> one(rows);
                gemv(c.view, std::span<const float>(xt, cols), one, path.opts);
                REQUIRE(std::fabs(got - one[r]) <=
                        gemm8_rel_tol * test::dot_magnitude(c.view, r, xt) + 1e-6);
              }
            }
        }
      }
}

TEST_CASE("int8 GEMM: a token's result does not depend on the batch, panels equal rows",
          "[precision][gemm]") {
  INFO("seed " << test::test_seed());
  ThreadPool pool(2);
  for (std::size_t cols : {4096u + 32u, 1056u})
    for (Precision p : {Precision::q8, Precision::q4, Precision::q2}) {
      const std::size_t rows = 4 * 16 * 2 + 4 + 3;  // two blocked groups, a panel, 3 rows after
      const Gemm8Case c = gemm8_make(rows, cols, p, {32, false}, cols + bits(p));
      std::vector<std::byte> packed(c.view.bytes());
      const MatrixView panels = pack_panels(c.view, packed, MatrixOrder::blocked_panels4);
      const std::size_t n = 37;
      const auto batch = test::random_normal(n * cols, cols + 5);
      for (const test::Int8Path& path : test::int8_paths(&pool))
        for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
          KernelOptions o = path.opts;
          o.pool = tp;
          const std::vector<float> base = test::random_normal(n * rows, 77);
          std::vector<float> all = base, all_panels = base;
          gemm(c.view, batch, n, all, o, {0.75f, true});
          gemm(panels, batch, n, all_panels, o, {0.75f, true});
          INFO(path.name << " " << name(p) << " cols " << cols << " threads " << (tp ? 2 : 1));
          REQUIRE(all_panels == all);
          // The token at positions 0, 17 and 36, alone (as the engine runs one: twice, ops.hpp
          // for_rows) and in a batch of 5 where it sits elsewhere.
          for (std::size_t at : {0u, 17u, 36u}) {
            const float* xt = batch.data() + at * cols;
            std::vector<float> two(2 * cols), y2(2 * rows);
            std::copy(xt, xt + cols, two.begin());
            std::copy(xt, xt + cols, two.begin() + static_cast<std::ptrdiff_t>(cols));
            std::copy(base.begin() + static_cast<std::ptrdiff_t>(at * rows),
                      base.begin() + static_cast<std::ptrdiff_t>((at + 1) * rows), y2.begin());
            gemm(c.view, two, 2, y2, o, {0.75f, true});
            std::vector<float> five(5 * cols), y5(5 * rows);
            for (std::size_t j = 0; j < 5; ++j) {  // the token at position 3, others around it
              const std::size_t src = j == 3 ? at : (at + 7 * j + 1) % n;
              std::copy(batch.begin() + static_cast<std::ptrdiff_t>(src * cols),
                        batch.begin() + static_cast<std::ptrdiff_t>((src + 1) * cols),
                        five.begin() + static_cast<std::ptrdiff_t>(j * cols));
            }
            std::copy(base.begin() + static_cast<std::ptrdiff_t>(at * rows),
                      base.begin() + static_cast<std::ptrdiff_t>((at + 1) * rows),
                      y5.begin() + static_cast<std::ptrdiff_t>(3 * rows));
            gemm(panels, five, 5, y5, o, {0.75f, true});
            for (std::size_t r = 0; r < rows; ++r) {
              INFO("position " << at << " row " << r);
              REQUIRE(y2[r] == all[at * rows + r]);
              REQUIRE(y5[3 * rows + r] == all[at * rows + r]);
            }
          }
        }
    }
}

TEST_CASE("int8 GEMM leaves float rows and other group sizes to the float path",
          "[precision][gemm]") {
  // bf16 rows: int8_activations changes nothing; one group per row on a SIMD ISA: the float GEMM.
  const std::size_t rows = 9, cols = 288, n = 3;
  const auto x = test::random_normal(n * cols, 3);
  for (auto [p, s] : {std::pair{Precision::bf16, QuantScheme{32, false}},
                      std::pair{Precision::q4, QuantScheme{0, false}}}) {
    if (is_quantized(p) && !isa_supported(Isa::avx2)) continue;
    const Gemm8Case c = gemm8_make(rows, cols, p, s, 5);
    KernelOptions o;
    o.int8_activations = true;
    std::vector<float> y8(n * rows), yf(n * rows);
    gemm(c.view, x, n, y8, o);
    gemm(c.view, x, n, yf);
    CHECK(y8 == yf);
  }
}

#if defined(MOEKIT_HAS_X86_KERNELS)
namespace {
// Runs the AVX-512 panel tile on rows 0..15 of w for 3 tokens; true when every (row, token) equals
// the AVX-512 GEMV up to float accumulation (the tight check above), else names the first miss.
template <unsigned Bits>
bool panel_matches_gemv(const MatrixView& w, const std::vector<float>& x, bool mutate,
                        std::string& miss) {
  using namespace detail;
  constexpr std::size_t n = 3;
  const RowLayout l = w.layout();
  const std::size_t blocked =
      l.cols / 32 / avx512_int8::block_chunks(Bits) * avx512_int8::block_chunks(Bits);
  Int8Tokens tk;
  prepare_tokens(x.data(), n, l, Int8GemmPath::avx512_vnni, nullptr, tk);
  Int8Panels pk;
  int8_pack_group<Bits>(w, 0, 16, pk);
  if (mutate)
    pk.code_base[64 * (8 * 2 + 3) + 4 * 5] ^= std::byte{0x40};  // chunk 2, k-step 3, row 5
  const Int8Activation* acts[n] = {&tk.acts[0], &tk.acts[1], &tk.acts[2]};
  float out[16 * n];
  avx512_int8::panel_dots<Bits, n>(pk.code_base, pk.s.data(), pk.sz.data(), acts, blocked, out);
  KernelOptions o{Isa::avx512, nullptr};
  o.int8_activations = true;
  for (std::size_t t = 0; t < n; ++t) {
    const float* xt = x.data() + t * l.cols;
    std::vector<float> one(w.rows);
    gemv(w, std::span<const float>(xt, l.cols), one, o);
    for (std::size_t r = 0; r < 16; ++r)
      if (std::fabs(out[16 * t + r] - one[r]) >
          gemm8_rel_tol * test::dot_magnitude(w, r, xt) + 1e-6) {
        miss = "token " + std::to_string(t) + " row " + std::to_string(r);
        return false;
      }
  }
  return true;
}
}  // namespace

TEST_CASE("int8 GEMM panel tile: every lane equals the GEMV; a wrong panel byte fails",
          "[precision][gemm]") {
  if (!has_avx512_vnni()) return;
  INFO("seed " << test::test_seed());
  const std::size_t rows = 16, cols = 1024;
  const auto x = test::random_normal(3 * cols, 11);
  auto check = [&]<unsigned Bits>(Precision p) {
    for (QuantScheme s : {QuantScheme{32, false}, QuantScheme{128, true}}) {
      const Gemm8Case c = gemm8_make(rows, cols, p, s, 900 + Bits);
      std::string miss;
      INFO(name(p) << " g" << s.group_size);
      CHECK(panel_matches_gemv<Bits>(c.view, x, false, miss));
      INFO(miss);
      CHECK_FALSE(panel_matches_gemv<Bits>(c.view, x, true, miss));  // the mutation is caught
      CHECK(miss.find("row 5") != std::string::npos);
    }
  };
  check.template operator()<8>(Precision::q8);
  check.template operator()<4>(Precision::q4);
  check.template operator()<2>(Precision::q2);
}
#endif
