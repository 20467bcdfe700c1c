// GGUF K-quant formats (q2_k .. q6_k) as moekit formats: decoding bit for bit against gguf-py,
// the int8-activation GEMV on every ISA against the float64 reference with a derived bound, the
// float-activation path and the batched GEMM, and the fused expert FFN on K-quant experts.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kquant_test_support.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/precision/expert_ffn.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/reference.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "test_support.hpp"

using namespace moekit;
using moekit::test::kquant_int8_bound;
using moekit::test::kquant_magnitude;
using moekit::test::random_kquant;

// Names unique in the area: its tests are built as one unity unit.
namespace {

const Precision kquants[] = {Precision::q4_k, Precision::q5_k, Precision::q6_k, Precision::q2_k,
                             Precision::q3_k};

std::vector<Isa> kquant_isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::generic, Isa::avx2, Isa::avx512})
    if (isa_supported(i)) v.push_back(i);
  return v;
}

}  // namespace

TEST_CASE("gguf K-quants: q2_k .. q6_k blocks decode to gguf-py's values bit for bit",
          "[precision][kquant]") {
  // tests/io/data/gguf_kquants.gguf (scripts/make_gguf_transcode_fixture.py): special f16 fields
  // (zeros, subnormals, the largest finite) with extreme code bytes, then random blocks;
  // "<type>.expected" is gguf-py's `dequantize` of them.
  io::GgufFile f(MOEKIT_SOURCE_DIR "/tests/io/data/gguf_kquants.gguf");
  for (const auto& [tensor, p] : {std::pair{"q2_k", Precision::q2_k},
                                  {"q3_k", Precision::q3_k},
                                  {"q4_k", Precision::q4_k},
                                  {"q5_k", Precision::q5_k},
                                  {"q6_k", Precision::q6_k}}) {
    INFO(tensor);
    const auto q = f.tensor(tensor);
    const auto e = f.tensor(std::string(tensor) + ".expected");
    REQUIRE(e.bytes.size() == 4 * q.elements());
    const std::size_t cols = q.cols(), rows = q.elements() / cols;
    REQUIRE(q.bytes.size() == matrix_bytes(rows, cols, p));
    const MatrixView w = make_matrix_view(q.bytes, rows, cols, p);
    const std::vector<float> got = decode_matrix(w);
    std::vector<float> want(got.size());
    std::memcpy(want.data(), e.bytes.data(), e.bytes.size());
    std::size_t bad = 0, bad_weight = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      // Bits, not values: the same NaN/zero sign and every rounding.
      if (std::memcmp(&got[i], &want[i], 4) != 0) ++bad;
      const float one = weight_at(w.row(i / cols), w.layout(), p, i % cols);
      if (std::memcmp(&one, &want[i], 4) != 0) ++bad_weight;
    }
    CHECK(bad == 0);
    CHECK(bad_weight == 0);
  }
}

TEST_CASE("gguf K-quants: int8-activation GEMV on every ISA within the derived bound",
          "[precision][kquant]") {
  ThreadPool pool(2);
  for (Precision p : kquants)
    for (const auto& [rows, cols] :
         {std::pair<std::size_t, std::size_t>{37, 256}, {64, 1024}, {9, 3584}}) {
      const auto bytes = random_kquant(rows, cols, p, rows + cols);
      const MatrixView w = make_matrix_view(bytes, rows, cols, p);
      const auto x = test::random_normal(cols, 7 + cols);
      std::vector<float> want(rows);
      reference::gemv(w, x.data(), want.data());
      for (Isa isa : kquant_isas())
        for (bool vnni : {true, false})
          for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
            INFO(name(p) << " " << rows << "x" << cols << " " << name(isa) << " vnni " << vnni
                         << " threads " << (tp ? 2 : 1));
            KernelOptions o;
            o.isa = isa;
            o.int8_activations = true;
            o.avx_vnni = vnni;
            o.pool = tp;
            std::vector<float> y(rows);
            gemv(w, x, y, o);
            for (std::size_t r = 0; r < rows; ++r) {
              INFO("row " << r << " got " << y[r] << " want " << want[r]);
              CHECK(std::fabs(y[r] - want[r]) <= kquant_int8_bound(w, r, x.data()));
            }
          }
    }
}

TEST_CASE("gguf K-quants: the vectorised activation preparations give the scalar one's bytes",
          "[precision][kquant]") {
#if defined(MOEKIT_HAS_X86_KERNELS)
  for (Precision p : kquants) {
    const std::size_t cols = 1536;
    auto x = test::random_normal(cols, 5);
    for (std::size_t i = 0; i < 32; ++i) x[64 + i] = 0.f;  // an all-zero chunk
    x[300] = 2.5f * 127;                                   // a value on a rounding tie
    KQuantStorage s0, s1, s2;
    const KQuantActivation want = prepare_kquant(x.data(), cols, p, s0);
    std::vector<KQuantActivation> got;
    if (isa_supported(Isa::avx2)) got.push_back(prepare_kquant(x.data(), cols, p, s1, Isa::avx2));
    if (isa_supported(Isa::avx512) && has_avx512_vnni())
      got.push_back(prepare_kquant(x.data(), cols, p, s2, Isa::avx512));
    for (const auto& g : got) {
      INFO(name(p));
      CHECK(std::memcmp(g.xq, want.xq, cols) == 0);
      const std::size_t scales = kquant_block_scaled(p) ? cols / 256 : cols / 16;
      CHECK(std::memcmp(g.dx, want.dx, 4 * scales) == 0);
      if (kquant_block_scaled(p))
        CHECK(std::memcmp(g.sums, want.sums, 2 * (cols / kquant_sub_block(p))) == 0);
      else
        CHECK(std::memcmp(g.dx_sum, want.dx_sum, 4 * (cols / 16)) == 0);
    }
  }
#endif
}

TEST_CASE("gguf K-quants: float-activation GEMV and batched GEMM match the reference",
          "[precision][kquant]") {
  for (Precision p : kquants) {
    const std::size_t rows = 19, cols = 768, n = 5;
    const auto bytes = random_kquant(rows, cols, p, 99);
    const MatrixView w = make_matrix_view(bytes, rows, cols, p);
    const auto x = test::random_normal(n * cols, 3);
    std::vector<float> want(n * rows);
    reference::gemm(w, x.data(), n, want.data());
    for (Isa isa : kquant_isas()) {
      // Float activations (the int8 batch is kquant_gemm_test.cpp's).
      INFO(name(p) << " " << name(isa));
      KernelOptions o;
      o.isa = isa;
      std::vector<float> y(n * rows), y1(rows);
      gemm(w, x, n, y, o);
      gemv(w, std::span<const float>(x.data(), cols), y1, o);
      for (std::size_t b = 0; b < n; ++b)
        for (std::size_t r = 0; r < rows; ++r) {
          const double tol = kquant_magnitude(w, r, x.data() + b * cols) / 65536 + 1e-9;
          CHECK(std::fabs(y[b * rows + r] - want[b * rows + r]) <= tol);
          if (b == 0) CHECK(std::fabs(y1[r] - want[r]) <= tol);
        }
    }
  }
}

TEST_CASE("gguf K-quants: the fused expert FFN on K-quant gate/up and down experts",
          "[precision][kquant]") {
  // Q4_K_M's mix: w1/w3 in q4_k, w2 in q6_k; Q5_K_M's: q5_k and q6_k; all q6_k; Q2_K's: q2_k
  // and q3_k; q3_k and q6_k.
  const std::size_t hidden = 512, ffn = 768;
  ThreadPool pool(2);
  for (const Precision gate_up : kquants) {
    const Precision down = gate_up == Precision::q2_k ? Precision::q3_k : Precision::q6_k;
    const auto b1 = random_kquant(ffn, hidden, gate_up, 1);
    const auto b3 = random_kquant(ffn, hidden, gate_up, 3);
    const auto b2 = random_kquant(hidden, ffn, down, 2);
    const ExpertWeights e{make_matrix_view(b1, ffn, hidden, gate_up),
                          make_matrix_view(b3, ffn, hidden, gate_up),
                          make_matrix_view(b2, hidden, ffn, down)};
    for (std::size_t n : {1u, 3u}) {
      const auto x = test::random_normal(n * hidden, 11 + n);
      std::vector<float> want(n * hidden, 0.5f);
      reference::expert_ffn(e.w1, e.w3, e.w2, x.data(), n, want.data(), 0.75f);
      double scale = 0;  // the output's typical magnitude, the bound's unit
      for (float v : want) scale = std::max(scale, std::fabs(static_cast<double>(v) - 0.5));
      for (Isa isa : kquant_isas())
        for (bool int8 : {false, true}) {
          INFO(name(gate_up) << " n " << n << " " << name(isa) << " int8 " << int8);
          KernelOptions o;
          o.isa = isa;
          o.int8_activations = int8;
          o.pool = &pool;
          std::vector<float> got(n * hidden, 0.5f), composed(n * hidden, 0.5f);
          expert_ffn(e, x, n, got, 0.75f, o);
          // The fused single-token path against the composition of the GEMVs tested above: the
          // same kernels on the same activations, so equal up to float summation order.
          if (n == 1) test::composed_ffn(e.w1, e.w3, e.w2, x, composed, 0.75f, o);
          for (std::size_t i = 0; i < n * hidden; ++i) {
            // int8 activations: x and h each move by ≤ 1/254 of their chunk's max (a few % of
            // the output at these sizes); float activations: float rounding only.
            CHECK(std::fabs(got[i] - want[i]) <= (int8 ? 0.05 : 1e-4) * scale + 1e-6);
            if (n == 1) CHECK(std::fabs(got[i] - composed[i]) <= 1e-5 * scale + 1e-6);
          }
        }
    }
  }
}

TEST_CASE("gguf K-quants: shapes that are not whole super-blocks and quantizing into them fail",
          "[precision][kquant]") {
  std::vector<std::byte> bytes(row_bytes(256, Precision::q4_k) * 2);
  CHECK_THROWS_WITH(make_matrix_view(bytes, 2, 300, Precision::q4_k, {}, "w1"),
                    Catch::Contains("w1") && Catch::Contains("multiple of 256"));
  CHECK_NOTHROW(make_matrix_view(bytes, 2, 256, Precision::q4_k));
  const std::vector<float> v(256, 0.5f);
  std::vector<std::byte> out(row_bytes(256, Precision::q6_k));
  CHECK_THROWS_WITH(encode_row<float>(v, Precision::q6_k, {}, out),
                    Catch::Contains("does not quantize"));
  CHECK(row_bytes(4096, Precision::q4_k) == 16 * 144);
  CHECK(row_bytes(14336, Precision::q6_k) == 56 * 210);
}
