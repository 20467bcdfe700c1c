// The int8-activation GEMM of GGUF K-quant rows (kquant_int8_gemm.hpp) against the float64
// reference with the bound the K-quant GEMV tests derive (kquant_test_support.hpp), on every path
// this CPU runs (forced with KernelOptions::isa), with and without a thread pool, and on the
// AVX-512 path both through the row kernels and through the panel tile; and a token's result
// independent of the batch bit for bit: n = 1 .. 40 and the batch reversed, each token equal to
// the same token alone through the same kernels (the GEMV for the row kernels, which are its
// own; the panel tile on that token alone for the panel path, whose summation order differs from
// the GEMV's).
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kquant_test_support.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/kquant_int8_gemm.hpp"
#include "moekit/precision/reference.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "test_support.hpp"

using namespace moekit;

// Names unique in the area: its tests are built as one unity unit.
namespace {

const Precision kqg_formats[] = {Precision::q4_k, Precision::q5_k, Precision::q6_k, Precision::q2_k,
                                 Precision::q3_k};

// The routes of kquant_int8_gemm (the forced ones fall back to the rows where no panel tile is).
const detail::KQuantRoute kqg_routes[] = {detail::KQuantRoute::by_batch, detail::KQuantRoute::rows,
                                          detail::KQuantRoute::panels};

}  // namespace

// The panel tile (avx512_kquant_panel_tiles.hpp) sums in another order than the row kernels but
// meets the same bound: its integer sums are exact, and per super-block it rounds the conversion
// of Σ sc·dot (|·| < 2^26), d·dx, one FMA and the same three for the minimums, each a relative
// 2^-24 of that block's part of kquant_magnitude, and the block sums add up in float over at most
// 14 blocks here: far below the magnitude/65536 the bound allows besides the activation rounding.
TEST_CASE("K-quant int8 GEMM within the derived bound on every path, with and without a pool",
          "[precision][kquant][gemm]") {
  INFO("seed " << test::test_seed());
  ThreadPool pool(2);
  // 37 rows: two whole 16-row groups, a four and a single row after; 7 tokens.
  for (Precision p : kqg_formats)
    for (std::size_t cols : {256u, 1024u, 3584u}) {
      const std::size_t rows = 37, n = 7;
      const auto bytes = test::random_kquant(rows, cols, p, cols + 17);
      const MatrixView w = make_matrix_view(bytes, rows, cols, p);
      const auto x = test::random_normal(n * cols, 3 + cols);
      std::vector<float> want(n * rows);
      reference::gemm(w, x.data(), n, want.data());
      std::vector<double> bound(n * rows);
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t r = 0; r < rows; ++r)
          bound[t * rows + r] = test::kquant_int8_bound(w, r, x.data() + t * cols);
      for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool})
        for (const test::Int8Path& path : test::int8_paths(tp))
          for (const detail::KQuantRoute route : kqg_routes) {
            const detail::KQuantGemmPath kp = detail::kquant_gemm_path(path.opts, p);
            std::vector<float> y(n * rows), yf(n * rows);
            detail::kquant_int8_gemm(w, x.data(), n, y.data(), kp, tp, 1.f, false, route);
            KernelOptions fo = path.opts;
            fo.int8_activations = false;
            gemm(w, x, n, yf, fo);
            INFO(name(p) << " cols " << cols << " " << path.name << (tp ? " pool" : "") << " route "
                         << static_cast<int>(route));
            CHECK(y != yf);  // the int8 path really ran
            for (std::size_t i = 0; i < n * rows; ++i) {
              INFO("token " << i / rows << " row " << i % rows << ": " << y[i] << " want "
                            << want[i]);
              REQUIRE(std::fabs(y[i] - want[i]) <= bound[i]);
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
    const auto bytes = test::random_kquant(rows, cols, p, 5);
    const MatrixView w = make_matrix_view(bytes, rows, cols, p);
    const auto batch = test::random_normal(most * cols, 41);
    const auto base = test::random_normal(most * rows, 77);  // accumulated into
    for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool})
      for (const test::Int8Path& path : test::int8_paths(tp))
        for (const detail::KQuantRoute route : kqg_routes) {
          const detail::KQuantGemmPath kp = detail::kquant_gemm_path(path.opts, p);
          INFO(name(p) << " " << path.name << (tp ? " pool" : "") << " route "
                       << static_cast<int>(route));
          auto run = [&](const float* x, std::size_t n, float* y, detail::KQuantRoute r) {
            detail::kquant_int8_gemm(w, x, n, y, kp, tp, 0.75f, true, r);
          };
          // Each token alone: the GEMV (the row kernels' own), and the panel tile on it alone ...
          std::vector<float> alone = base, alone_panel = base;
          for (std::size_t t = 0; t < most; ++t) {
            gemm(w, std::span<const float>(batch.data() + t * cols, cols), 1,
                 std::span<float>(alone.data() + t * rows, rows), path.opts, {0.75f, true});
            run(batch.data() + t * cols, 1, alone_panel.data() + t * rows,
                detail::KQuantRoute::panels);
          }
          auto want = [&](std::size_t n) {
            return detail::kquant_panel_takes(p, kp, n, route) ? alone_panel : alone;
          };
          // ... equals it in every batch of its first n tokens, and in the batch reversed.
          for (std::size_t n = 2; n <= most; ++n) {
            std::vector<float> y(base.begin(),
                                 base.begin() + static_cast<std::ptrdiff_t>(n * rows));
            run(batch.data(), n, y.data(), route);
            const std::vector<float> ref = want(n);
            INFO("n " << n);
            for (std::size_t i = 0; i < n * rows; ++i) REQUIRE(y[i] == ref[i]);
          }
          std::vector<float> rev(most * cols), yr(most * rows);
          for (std::size_t t = 0; t < most; ++t) {
            const std::size_t to = most - 1 - t;
            std::memcpy(rev.data() + to * cols, batch.data() + t * cols, 4 * cols);
            std::memcpy(yr.data() + to * rows, base.data() + t * rows, 4 * rows);
          }
          run(rev.data(), most, yr.data(), route);
          const std::vector<float> ref = want(most);
          for (std::size_t t = 0; t < most; ++t)
            for (std::size_t r = 0; r < rows; ++r) {
              INFO("reversed: token " << t << " row " << r);
              REQUIRE(yr[(most - 1 - t) * rows + r] == ref[t * rows + r]);
            }
        }
  }
}

// gemm itself takes the panel tile from kquant_panel_min_tokens tokens on AVX-512 VNNI (the
// route the engine runs): its batches equal the forced panel route's bit for bit.
TEST_CASE("K-quant int8 GEMM: gemm runs the panel tile where it is taken",
          "[precision][kquant][gemm]") {
  INFO("seed " << test::test_seed());
  if (!has_avx512_vnni()) return;
  const std::size_t rows = 37, cols = 512, n = detail::kquant_panel_min_tokens + 3;
  for (Precision p : kqg_formats) {
    KernelOptions o{Isa::avx512, nullptr};
    o.int8_activations = true;
    const detail::KQuantGemmPath kp = detail::kquant_gemm_path(o, p);
    if (!detail::kquant_panel_takes(p, kp, n, detail::KQuantRoute::by_batch))
      continue;  // q2_k without GFNI and VBMI runs AVX2
    const auto bytes = test::random_kquant(rows, cols, p, 9);
    const MatrixView w = make_matrix_view(bytes, rows, cols, p);
    const auto x = test::random_normal(n * cols, 13);
    std::vector<float> y(n * rows), yp(n * rows);
    gemm(w, x, n, y, o);
    detail::kquant_int8_gemm(w, x.data(), n, yp.data(), detail::KQuantGemmPath::avx512_vnni,
                             nullptr, 1.f, false, detail::KQuantRoute::panels);
    INFO(name(p));
    CHECK(y == yp);
  }
}
