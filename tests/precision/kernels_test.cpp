// CPU kernels against the scalar float64 reference: every format × scheme × ISA this CPU runs,
// GEMM vs repeated GEMV, epilogues, threads, and the fused expert FFN vs its composition.
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "moekit/precision/expert_ffn.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/reference.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "test_support.hpp"

using namespace moekit;

namespace {
const QuantScheme kernel_schemes[] = {{32, false}, {64, true}, {128, false}, {0, false}, {0, true}};
const RowStreaming all_streamings[] = {{1, false}, {1, true},  {2, false},
                                       {2, true},  {4, false}, {4, true}};

std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::generic, Isa::avx2, Isa::avx512})
    if (isa_supported(i)) v.push_back(i);
  return v;
}

// Tolerance per format, relative to Σ of the magnitudes the float kernel adds (dot_magnitude):
// float32 accumulation of a few thousand terms in blocks stays far below 2^-16 of that sum.
// A wrong code, scale or order changes the result by about one term: ~1/cols ≫ 2^-16.
constexpr double rel_tol = 1.0 / 65536;

struct Case {
  std::vector<std::byte> bytes;
  MatrixView view;
};
Case make(std::size_t rows, std::size_t cols, Precision p, QuantScheme s, std::uint64_t salt) {
  Case c;
  const auto w = test::random_normal(rows * cols, salt, 0.05f);
  c.bytes = encode_matrix<float>(w, rows, cols, p, s);
  c.view = make_matrix_view(c.bytes, rows, cols, p, s);
  return c;
}

// Bound of an int8-activation result of row r: each activation moves by at most half its
// chunk's int8 step (max|x|/254), plus the float accumulation's rel_tol.
double int8_bound(const MatrixView& w, std::size_t r, const std::vector<float>& x) {
  const RowLayout l = w.layout();
  double bound = 0;
  for (std::size_t col = 0; col < w.cols / 32 * 32; ++col) {
    float amax = 0;
    for (std::size_t i = col / 32 * 32; i < col / 32 * 32 + 32; ++i)
      amax = std::max(amax, std::fabs(x[i]));
    bound += std::fabs(weight_at(w.row(r), l, w.precision, col)) * amax / 254.0;
  }
  return bound * 1.01 + rel_tol * test::dot_magnitude(w, r, x.data()) + 1e-6;
}

void check_close(const MatrixView& w, const float* x, const float* got, const double* want,
                 const std::string& what) {
  for (std::size_t r = 0; r < w.rows; ++r) {
    const double tol = rel_tol * test::dot_magnitude(w, r, x) + 1e-6;
    if (std::fabs(got[r] - want[r]) > tol)
      FAIL(what << " row " << r << ": got " << got[r] << " want " << want[r] << " tol " << tol);
  }
}
}  // namespace

TEST_CASE("GEMV matches the float64 reference for every format, scheme and ISA",
          "[precision][kernels]") {
  INFO("seed " << test::test_seed());
  for (std::size_t cols : {512u, 4096u + 40u, 77u})
    for (Precision p : all_precisions)
      for (QuantScheme s : kernel_schemes) {
        if (!is_quantized(p) && s != QuantScheme{32, false}) continue;
        const std::size_t rows = 37;
        const Case c = make(rows, cols, p, s, cols + 7);
        const auto x = test::random_normal(cols, cols + 8);
        std::vector<double> want(rows);
        for (std::size_t r = 0; r < rows; ++r) want[r] = reference::dot_row(c.view, r, x.data());
        for (Isa isa : isas()) {
          std::vector<float> y(rows, 99.f);
          gemv(c.view, x, y, {isa, nullptr});
          check_close(c.view, x.data(), y.data(), want.data(),
                      std::string(name(p)) + " g" + std::to_string(s.group_size) + " z" +
                          std::to_string(s.zero_point) + " " + std::string(name(isa)) + " cols " +
                          std::to_string(cols));
        }
      }
}

TEST_CASE("GEMM equals repeated GEMV and honours the epilogue", "[precision][kernels]") {
  INFO("seed " << test::test_seed());
  ThreadPool pool(2);
  const std::size_t rows = 45, cols = 640 + 33;
  for (Precision p : all_precisions)
    for (QuantScheme s : {QuantScheme{32, false}, QuantScheme{64, true}}) {
      const Case c = make(rows, cols, p, s, 100);
      for (std::size_t n : {2u, 33u}) {  // a partial tile of four, and more than one slice of 32
        const auto x = test::random_normal(n * cols, 200 + n);
        for (Isa isa : isas()) {
          std::vector<float> y(n * rows, 1.f);
          gemm(c.view, x, n, y, {isa, &pool}, {0.5f, true});
          for (std::size_t b = 0; b < n; ++b) {
            std::vector<double> want(rows);
            std::vector<float> got(rows);
            std::vector<float> single(rows);
            gemv(c.view, std::span<const float>(x.data() + b * cols, cols), single, {isa, nullptr});
            for (std::size_t r = 0; r < rows; ++r) {
              want[r] = 1.0 + 0.5 * reference::dot_row(c.view, r, x.data() + b * cols);
              got[r] = y[b * rows + r];
              // GEMM and GEMV of one activation agree to float rounding.
              const double g1 = 1.0 + 0.5 * single[r];
              if (std::fabs(got[r] - g1) > 1e-4 * std::fabs(g1) + 1e-4)
                FAIL("gemm vs gemv " << name(p) << " " << name(isa) << " b " << b << " row " << r
                                     << ": " << got[r] << " vs " << g1);
            }
            check_close(c.view, x.data() + b * cols, got.data(), want.data(),
                        std::string("gemm ") + std::string(name(p)) + " " + std::string(name(isa)) +
                            " n " + std::to_string(n));
          }
        }
      }
    }
}

TEST_CASE("threaded GEMV gives the single-thread result", "[precision][kernels]") {
  INFO("seed " << test::test_seed());
  ThreadPool pool(3);
  const Case c = make(1000, 256, Precision::q4, {32, false}, 300);
  const auto x = test::random_normal(256, 301);
  std::vector<float> one(1000), many(1000);
  gemv(c.view, x, one);
  gemv(c.view, x, many, {std::nullopt, &pool});
  CHECK(one == many);  // rows are independent: bitwise equal
}

TEST_CASE("kernels reject mismatched shapes and unsupported requests", "[precision][kernels]") {
  const Case c = make(8, 64, Precision::q8, {}, 400);
  std::vector<float> x(63), y(8);
  CHECK_THROWS_WITH(gemv(c.view, x, y), Catch::Contains("gemv"));
  std::vector<float> x2(64), y2(8);
  MatrixView skip = c.view;
  skip.precision = Precision::skip;
  CHECK_THROWS_AS(gemv(skip, x2, y2), Error);
  std::vector<float> xb(3 * 64), yb(2 * 8);
  CHECK_THROWS_WITH(gemm(c.view, xb, 3, yb), Catch::Contains("gemm"));
  if (has_avx512_vnni()) {  // the streaming is read by the int8 path only
    KernelOptions o;
    o.int8_activations = true;
    o.streaming = RowStreaming{3, true};
    CHECK_THROWS_WITH(gemv(c.view, x2, y2, o),
                      Catch::Contains("streaming.streams must be 1, 2 or 4"));
  }
}

TEST_CASE("row streaming: the per-core table", "[precision][kernels]") {
  // Zen 4 measured best with four prefetched streams; Zen 5 with two, prefetched only for rows
  // wider than 8192 columns (w2's 14336), bench/RESULTS.md; other cores get two prefetched streams.
  STATIC_REQUIRE(default_row_streaming(CpuCore::zen4, 4096) == RowStreaming{4, true});
  STATIC_REQUIRE(default_row_streaming(CpuCore::zen5, 4096) == RowStreaming{2, false});
  STATIC_REQUIRE(default_row_streaming(CpuCore::zen5, 14336) == RowStreaming{2, true});
  STATIC_REQUIRE(default_row_streaming(CpuCore::other, 4096) == RowStreaming{2, true});
  STATIC_REQUIRE(default_row_streaming(CpuCore::xeon_amx, 4096) == RowStreaming{4, true});
  STATIC_REQUIRE(default_row_streaming(CpuCore::xeon_amx, 14336) == RowStreaming{4, true});
  // K-quants: four prefetched streams on Xeons with AMX, two elsewhere (measured on Zen 5).
  STATIC_REQUIRE(default_kquant_row_streaming(CpuCore::xeon_amx) == RowStreaming{4, true});
  STATIC_REQUIRE(default_kquant_row_streaming(CpuCore::zen5) == RowStreaming{2, true});
  STATIC_REQUIRE(default_kquant_row_streaming(CpuCore::other) == RowStreaming{2, true});
  // Both Zen cores the table names have AVX-512 (Zen 3 shares Zen 4's family without it).
  const CpuCore core = detect_core();
  INFO("this CPU: " << name(core));
  CHECK((core == CpuCore::other || detect_isa() == Isa::avx512));
}

TEST_CASE("fused expert FFN equals its composition and the reference", "[precision][kernels]") {
  INFO("seed " << test::test_seed());
  ThreadPool pool(2);
  const std::size_t hidden = 256, ffn = 448 + 32;
  for (Precision p : {Precision::f32, Precision::bf16, Precision::q8, Precision::q4, Precision::q2})
    for (QuantScheme s : {QuantScheme{32, false}, QuantScheme{64, true}}) {
      const Case w1 = make(ffn, hidden, p, s, 500), w3 = make(ffn, hidden, p, s, 501);
      // w2 in another format: mixed experts must work.
      const Case w2 = make(hidden, ffn, p == Precision::q2 ? Precision::q4 : p, s, 502);
      const ExpertWeights e{w1.view, w3.view, w2.view};
      for (std::size_t n : {1u, 3u}) {
        const auto x = test::random_normal(n * hidden, 503 + n);
        std::vector<float> base = test::random_normal(n * hidden, 510);
        std::vector<float> ref = base;
        reference::expert_ffn(w1.view, w3.view, w2.view, x.data(), n, ref.data(), 0.7f);
        for (Isa isa : isas()) {
          std::vector<float> out = base;
          expert_ffn(e, x, n, out, 0.7f, {isa, &pool});
          // Composition: three GEMVs and the elementwise step, done by hand.
          std::vector<float> comp = base;
          for (std::size_t b = 0; b < n; ++b)
            test::composed_ffn(
                w1.view, w3.view, w2.view, std::span<const float>(x.data() + b * hidden, hidden),
                std::span<float>(comp.data() + b * hidden, hidden), 0.7f, {isa, nullptr});
          for (std::size_t i = 0; i < n * hidden; ++i) {
            INFO(name(p) << " g" << s.group_size << " " << name(isa) << " n " << n << " i " << i);
            REQUIRE(out[i] == Approx(comp[i]).epsilon(1e-4).margin(1e-5));
            REQUIRE(out[i] == Approx(ref[i]).epsilon(2e-3).margin(2e-4));
          }
        }
      }
    }
}

TEST_CASE("int8-activation GEMV (AVX-512 VNNI) stays within the activation rounding bound",
          "[precision][kernels]") {
  if (!has_avx512_vnni()) {
    WARN("skipped: this CPU has no AVX-512 VNNI; int8_activations falls back to the float path");
    return;
  }
  INFO("seed " << test::test_seed());
  ThreadPool pool(2);
  // Rows go 1, 2 or 4 at a time (every RowStreaming is checked below) from equal parts of each
  // thread's range, the rows after the last whole part one by one (21 rows: two ranges of 8 and
  // one of 5; 3 rows with 4 streams: one by one), each prefetching rows further down its part when
  // the streaming prefetches (16384 columns: one row ahead, 96: to its end).
  for (std::size_t rows : {21u, 3u})
    for (std::size_t cols : {4096u, 4096u + 32u, 1000u, 256u, 96u, 16384u})
      for (Precision p : {Precision::q8, Precision::q4, Precision::q2})
        for (QuantScheme s : kernel_schemes) {
          const Case c = make(rows, cols, p, s, cols * 3 + bits(p));
          auto x = test::random_normal(cols, cols + 9);
          x[5] = 9.f;  // an outlier: its block gets a coarse int8 step
          std::vector<float> y(rows);
          KernelOptions o{std::nullopt, &pool};
          o.int8_activations = true;
          gemv(c.view, x, y, o);
          for (std::size_t r = 0; r < rows; ++r) {
            const double bound = int8_bound(c.view, r, x);
            const double want = reference::dot_row(c.view, r, x.data());
            if (std::fabs(y[r] - want) > bound)
              FAIL(name(p) << " g" << s.group_size << " z" << s.zero_point << " cols " << cols
                           << " row " << r << " of " << rows << ": " << y[r] << " want " << want
                           << " bound " << bound);
          }
          // Every way of streaming the rows computes each row alike: bit-identical results.
          for (const RowStreaming& rs : all_streamings) {
            std::vector<float> ys(rows);
            KernelOptions os = o;
            os.streaming = rs;
            gemv(c.view, x, ys, os);
            INFO("streams " << rs.streams << " prefetch " << rs.prefetch << " cols " << cols);
            REQUIRE(ys == y);
          }
          // The float path is used when the option is off: results differ (the rounding is real).
          std::vector<float> yf(rows);
          gemv(c.view, x, yf, {std::nullopt, &pool});
          CHECK(yf != y);
        }
  // The fused FFN takes the same option: it equals its composition from int8-activation GEMVs
  // (hidden 256: the chunk-by-block path; 1056: 16-chunk steps plus a remainder). Rows of w1 and
  // w3 go as pairs, from the two halves of each range with four streams: 64 rows on one thread,
  // 21 on two (ranges of 8, 8 and 5: an odd range ends with one pair); every RowStreaming below.
  for (std::size_t hidden : {256u, 1056u})
    for (std::size_t ffn : {64u, 21u}) {
      const Case w1 = make(ffn, hidden, Precision::q4, {32, false}, 900 + ffn),
                 w3 = make(ffn, hidden, Precision::q4, {32, false}, 901 + ffn),
                 w2 = make(hidden, ffn, Precision::q8, {32, false}, 902 + ffn);
      const auto x = test::random_normal(hidden, 903 + ffn);  // seeds per ffn: no stale h matches
      KernelOptions o{std::nullopt, ffn == 21 ? &pool : nullptr};
      o.int8_activations = true;
      std::vector<float> comp(hidden, 0.f);
      test::composed_ffn(w1.view, w3.view, w2.view, x, comp, 1.f, o);
      for (const RowStreaming& rs : all_streamings) {
        std::vector<float> fused(hidden, 0.f);
        KernelOptions os = o;
        os.streaming = rs;
        expert_ffn({w1.view, w3.view, w2.view}, x, 1, fused, 1.f, os);
        INFO("hidden " << hidden << " ffn " << ffn << " streams " << rs.streams << " prefetch "
                       << rs.prefetch);
        for (std::size_t i = 0; i < hidden; ++i)
          REQUIRE(fused[i] == Approx(comp[i]).epsilon(1e-4).margin(1e-6));
      }
    }
}

TEST_CASE(
    "int8-activation GEMV on AVX2 (vpmaddubsw, and AVX-VNNI where the CPU has it) stays "
    "within the activation rounding bound",
    "[precision][kernels]") {
  if (!isa_supported(Isa::avx2)) {
    WARN("skipped: this CPU has no AVX2");
    return;
  }
  INFO("seed " << test::test_seed());
  ThreadPool pool(2);
  std::vector<bool> vnni{false};
  if (has_avx_vnni())
    vnni.push_back(true);
  else
    WARN("this CPU has no AVX-VNNI: only the vpmaddubsw kernels are checked");
  // Whole blocks, chunks after the last block, columns after the last chunk; q8 codes reach 255
  // (the int16 pairs that vpmaddubsw would saturate without the sign trick).
  for (std::size_t cols : {4096u, 4096u + 32u, 1000u, 256u, 96u, 77u})
    for (Precision p : {Precision::q8, Precision::q4, Precision::q2})
      for (QuantScheme s : kernel_schemes) {
        const std::size_t rows = 13;
        const Case c = make(rows, cols, p, s, cols * 5 + bits(p));
        auto x = test::random_normal(cols, cols + 19);
        x[5] = 9.f;
        std::vector<float> y512(rows);
        if (has_avx512_vnni()) {
          KernelOptions o{Isa::avx512, &pool};
          o.int8_activations = true;
          gemv(c.view, x, y512, o);
        }
        for (bool v : vnni) {
          std::vector<float> y(rows), yf(rows);
          KernelOptions o{Isa::avx2, &pool};
          o.int8_activations = true;
          o.avx_vnni = v;
          gemv(c.view, x, y, o);
          gemv(c.view, x, yf, {Isa::avx2, &pool});
          CHECK(yf != y);  // the int8 path really ran
          for (std::size_t r = 0; r < rows; ++r) {
            const double want = reference::dot_row(c.view, r, x.data());
            INFO(name(p) << " g" << s.group_size << " z" << s.zero_point << " cols " << cols
                         << " row " << r << " vnni " << v << ": " << y[r] << " want " << want);
            REQUIRE(std::fabs(y[r] - want) <= int8_bound(c.view, r, x));
            // The same int8 activation as the AVX-512 kernels: equal up to float accumulation.
            if (has_avx512_vnni())
              REQUIRE(std::fabs(y[r] - y512[r]) <=
                      rel_tol * test::dot_magnitude(c.view, r, x.data()) + 1e-6);
          }
        }
      }
}

TEST_CASE("float rows: every streaming and thread count gives the one-row result bit for bit",
          "[precision][kernels]") {
  INFO("seed " << test::test_seed());
  ThreadPool pool(2);
  for (Precision p : {Precision::f32, Precision::bf16, Precision::f16})
    for (std::size_t cols : {4096u + 40u, 77u}) {
      const std::size_t rows = 37;  // ranges that do not split evenly into 2 or 4 streams
      const Case c = make(rows, cols, p, {}, 600 + cols);
      const auto x = test::random_normal(cols, 601 + cols);
      for (Isa isa : isas()) {
        std::vector<float> one(rows);
        for (std::size_t r = 0; r < rows; ++r) {  // rows one by one
          KernelOptions o{isa, nullptr};
          o.streaming = RowStreaming{1, false};
          const MatrixView v{c.view.row(r), 1, cols, p, {}};
          gemv(v, x, std::span<float>(&one[r], 1), o);
        }
        for (RowStreaming s : all_streamings)
          for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
            KernelOptions o{isa, tp};
            o.streaming = s;
            std::vector<float> y(rows, 99.f);
            gemv(c.view, x, y, o);
            INFO(name(p) << " " << name(isa) << " cols " << cols << " S" << s.streams
                         << (s.prefetch ? "p" : "") << (tp ? " pool" : ""));
            CHECK(y == one);
          }
      }
    }
  STATIC_REQUIRE(default_float_row_streaming(CpuCore::zen5, 4096) == RowStreaming{4, false});
  STATIC_REQUIRE(default_float_row_streaming(CpuCore::zen5, 14336) == RowStreaming{4, false});
  STATIC_REQUIRE(default_float_row_streaming(CpuCore::xeon_amx, 4096) == RowStreaming{4, true});
}

// Bound of a bf16-activation result of row r against the exact product with x: each activation
// moves by at most 2⁻⁸·|x| (rounding to nearest even to 8 significant bits), so the product moves
// by at most 2⁻⁸·Σ|w·x|; the float accumulation of Σ w·x̃ adds rel_tol of its magnitude, at most
// (1 + 2⁻⁸)·Σ|w·x|.
static double bf16_activation_bound(const MatrixView& w, std::size_t r, const float* x) {
  constexpr double u = 1.0 / 256;
  return (u + rel_tol * (1 + u)) * test::dot_magnitude(w, r, x) + 1e-6;
}

TEST_CASE("bf16-activation GEMV (vdpbf16ps) stays within the activation rounding bound",
          "[precision][kernels]") {
  INFO("seed " << test::test_seed());
  ThreadPool pool(2);
  for (std::size_t cols : {4096u + 40u, 512u, 77u}) {
    const std::size_t rows = 37;
    const Case c = make(rows, cols, Precision::bf16, {}, 700 + cols);
    const auto x = test::random_normal(cols, 701 + cols);
    std::vector<float> xr(cols);  // x rounded to bf16, as the kernel rounds it
    for (std::size_t i = 0; i < cols; ++i) xr[i] = bf16_bits_to_float(float_to_bf16_bits(x[i]));
    for (Isa isa : isas())
      for (RowStreaming s : {RowStreaming{1, false}, RowStreaming{4, true}}) {
        KernelOptions o{isa, &pool};
        o.bf16_activations = true;
        o.streaming = s;
        std::vector<float> y(rows, 99.f), plain(rows);
        gemv(c.view, x, y, o);
        o.bf16_activations = false;
        gemv(c.view, x, plain, o);
        INFO(name(isa) << " cols " << cols << " S" << s.streams);
        if (isa != Isa::avx512 || !has_avx512_bf16()) {
          CHECK(y == plain);  // no vdpbf16ps here: the float path, x exact
          continue;
        }
        for (std::size_t r = 0; r < rows; ++r) {
          // The same sum as the float path of x̃ up to accumulation order (tight: a wrong pair
          // moves it by about one term), and within the derived bound of the exact product.
          const double with_rounded = reference::dot_row(c.view, r, xr.data());
          const double exact = reference::dot_row(c.view, r, x.data());
          INFO("row " << r << " got " << y[r] << " x̃ " << with_rounded << " exact " << exact);
          CHECK(std::fabs(y[r] - with_rounded) <=
                rel_tol * test::dot_magnitude(c.view, r, xr.data()) + 1e-6);
          CHECK(std::fabs(y[r] - exact) <= bf16_activation_bound(c.view, r, x.data()));
        }
      }
  }
  // Other float formats ignore the option (f16 weights are not bf16 pairs).
  const Case h = make(9, 300, Precision::f16, {}, 720);
  const auto x = test::random_normal(300, 721);
  KernelOptions o;
  std::vector<float> a(9), b(9);
  gemv(h.view, x, a, o);
  o.bf16_activations = true;
  gemv(h.view, x, b, o);
  CHECK(a == b);
}
