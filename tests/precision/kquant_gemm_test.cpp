// The int8-activation GEMM of GGUF K-quant rows (kquant_int8_gemm.hpp) against the float64
// reference with the bound the K-quant GEMV tests derive (kquant_test_support.hpp), on every path
// this CPU runs (forced with KernelOptions::isa), with and without a thread pool; and a token's
// result independent of the batch bit for bit: n = 1 .. 40, each token equal to the same gemm on
// that token alone, wherever it sits.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kquant_test_support.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/reference.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "test_support.hpp"

using namespace moekit;

// Names unique in the area: its tests are built as one unity unit.
namespace {

const Precision kqg_formats[] = {Precision::q4_k, Precision::q5_k, Precision::q6_k, Precision::q2_k,
                                 Precision::q3_k};

}  // namespace

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
      for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool})
        for (const test::Int8Path& path : test::int8_paths(tp)) {
          std::vector<float> y(n * rows), yf(n * rows);
          gemm(w, x, n, y, path.opts);
          KernelOptions fo = path.opts;
          fo.int8_activations = false;
          gemm(w, x, n, yf, fo);
          INFO(name(p) << " cols " << cols << " " << path.name << (tp ? " pool" : ""));
          CHECK(y != yf);  // the int8 path really ran
          for (std::size_t t = 0; t < n; ++t)
            for (std::size_t r = 0; r < rows; ++r) {
              const float* xt = x.data() + t * cols;
              INFO("token " << t << " row " << r << ": " << y[t * rows + r] << " want "
                            << want[t * rows + r]);
              REQUIRE(std::fabs(y[t * rows + r] - want[t * rows + r]) <=
                      test::kquant_int8_bound(w, r, xt));
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
      for (const test::Int8Path& path : test::int8_paths(tp)) {
        INFO(name(p) << " " << path.name << (tp ? " pool" : ""));
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
