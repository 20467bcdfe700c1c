// MatrixOrder::panels4 and blocked_panels4: packing is a lossless permutation of the row-major
// bytes, and every kernel that takes a matrix in panels computes what it computes on the same
// matrix in rows.
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "moekit/precision/expert_ffn.hpp"
#include "moekit/precision/gemv.hpp"
#include "moekit/precision/panels.hpp"
#include "moekit/precision/reference.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "test_support.hpp"

using namespace moekit;

namespace {
const QuantScheme panel_schemes[] = {{32, false}, {64, true}, {128, false}, {128, true}};

struct Packed {
  std::vector<std::byte> rows_bytes, panel_bytes;
  MatrixView rows, panels;
};
const MatrixOrder panel_orders[] = {MatrixOrder::panels4, MatrixOrder::blocked_panels4};

Packed make_packed(std::size_t rows, std::size_t cols, Precision p, QuantScheme s,
                   std::uint64_t salt, MatrixOrder order = MatrixOrder::panels4) {
  Packed m;
  const auto w = test::random_normal(rows * cols, salt, 0.05f);
  m.rows_bytes = encode_matrix<float>(w, rows, cols, p, s);
  m.rows = make_matrix_view(m.rows_bytes, rows, cols, p, s);
  m.panel_bytes.resize(m.rows_bytes.size());
  m.panels = pack_panels(m.rows, m.panel_bytes, order);
  return m;
}
std::string label(Precision p, QuantScheme s, std::size_t rows, std::size_t cols,
                  MatrixOrder order = MatrixOrder::panels4) {
  return std::string(name(order)) + " " + std::string(name(p)) + " g" +
         std::to_string(s.group_size) + " z" + std::to_string(s.zero_point) + " " +
         std::to_string(rows) + "x" + std::to_string(cols);
}
}  // namespace

TEST_CASE("panels: packing is a lossless permutation of the rows", "[precision][panels]") {
  INFO("seed " << test::test_seed());
  // 512-column steps with and without a tail (1000, 1056), a tail only (96), Mixtral's w2 width
  // (14336 = 28 steps: blocked, 4 blocks of 7), 4704 (blocked: blocks of 5 and 4 steps and a
  // tail); row counts with and without rows after the last panel, and (79) a whole group of 16
  // panels, a group of 3 and 3 rows after them.
  for (MatrixOrder order : panel_orders)
    for (std::size_t cols : {512u, 1000u, 1056u, 96u, 14336u, 4704u})
      for (std::size_t rows : {8u, 7u, 2u, 79u})
        for (Precision p : {Precision::q8, Precision::q4, Precision::q2})
          for (QuantScheme s : panel_schemes) {
            if ((cols == 14336 || cols == 4704) != (rows == 79 || rows == 7)) continue;
            INFO(label(p, s, rows, cols, order));
            const Packed m = make_packed(rows, cols, p, s, cols + rows + bits(p), order);
            CHECK(m.panels.order == order);
            CHECK(m.panels.bytes() == m.rows.bytes());
            if (rows >= 4 && cols >= 512) CHECK(m.panel_bytes != m.rows_bytes);  // really moved
            std::vector<std::byte> buf(m.rows.row_stride());
            for (std::size_t r = 0; r < rows; ++r) {
              const std::byte* got = stored_row(m.panels, r, buf.data());
              REQUIRE(std::equal(got, got + m.rows.row_stride(), m.rows.row(r)));
            }
            std::vector<std::byte> back(m.rows_bytes.size());
            const MatrixView u = unpack_panels(m.panels, back);
            CHECK(u.order == MatrixOrder::rows);
            CHECK(back == m.rows_bytes);
            CHECK(decode_matrix(m.panels) == decode_matrix(m.rows));
          }
}

TEST_CASE("panels: GEMV, GEMM and the FFN compute what they compute on rows",
          "[precision][panels]") {
  INFO("seed " << test::test_seed());
  ThreadPool pool(2);
  std::vector<Isa> isas;
  for (Isa i : {Isa::generic, Isa::avx2, Isa::avx512})
    if (isa_supported(i)) isas.push_back(i);
  for (MatrixOrder order : panel_orders)
    for (std::size_t cols : {1056u, 96u, 4096u, 4704u})
      for (std::size_t rows : {42u, 5u, 143u})
        for (Precision p : {Precision::q8, Precision::q4, Precision::q2})
          for (QuantScheme s : panel_schemes) {
            if ((rows == 143) != (cols == 4704)) continue;
            INFO(label(p, s, rows, cols, order));
            const Packed m = make_packed(rows, cols, p, s, 7 * cols + rows + bits(p), order);
            auto x = test::random_normal(cols, cols + 11);
            x[3] = 7.f;  // an outlier block
            // The reference reads rows through stored_row: the same doubles.
            std::vector<float> ref_rows(rows), ref_panels(rows);
            reference::gemv(m.rows, x.data(), ref_rows.data());
            reference::gemv(m.panels, x.data(), ref_panels.data());
            REQUIRE(ref_panels == ref_rows);
            // Every kernel path (float activations on each ISA, int8 activations on AVX-512 VNNI
            // and AVX2), one thread and two, y = and y += : bit-identical to the matrix in rows
            // (the panel kernels do the row kernels' operations in the row kernels' order).
            // int8: 0 float activations, 1 int8 (on AVX2 with AVX-VNNI where the CPU has it),
            // 2 int8 on AVX2 with vpmaddubsw.
            for (Isa isa : isas)
              for (int int8 : {0, 1, 2})
                for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
                  if (int8 == 2 && isa != Isa::avx2) continue;
                  KernelOptions o{isa, tp};
                  o.int8_activations = int8 > 0;
                  o.avx_vnni = int8 != 2;
                  std::vector<float> yr(rows, 0.5f), yp(rows, 0.5f);
                  gemv(m.rows, x, yr, o, {0.75f, true});
                  gemv(m.panels, x, yp, o, {0.75f, true});
                  INFO("isa " << name(isa) << " int8 " << int8 << " threads " << (tp ? 2 : 1));
                  REQUIRE(yp == yr);
                }
            // A batch: every row gathered and dequantized as in rows.
            const std::size_t n = 3;
            const auto xb = test::random_normal(n * cols, cols + 12);
            std::vector<float> gr(n * rows), gp(n * rows);
            gemm(m.rows, xb, n, gr, {std::nullopt, &pool});
            gemm(m.panels, xb, n, gp, {std::nullopt, &pool});
            REQUIRE(gp == gr);
          }
  // The expert FFN with w1/w3/w2 in panels: w1·x and w3·x go as two GEMVs, so it equals the
  // composition of GEMVs on the rows (and the fused rows path within float rounding). The
  // blocked order with w2 wide enough to be blocked (4704 columns).
  for (MatrixOrder order : panel_orders)
    for (bool int8 : {false, true}) {
      const std::size_t hidden = 1056, ffn = order == MatrixOrder::panels4 ? 44 : 4704;
      const Packed w1 = make_packed(ffn, hidden, Precision::q4, {32, false}, 31, order),
                   w3 = make_packed(ffn, hidden, Precision::q4, {32, false}, 32, order),
                   w2 = make_packed(hidden, ffn, Precision::q8, {32, false}, 33, order);
      const auto x = test::random_normal(hidden, 34);
      KernelOptions o{std::nullopt, &pool};
      o.int8_activations = int8;
      std::vector<float> comp(hidden, 1.f);
      test::composed_ffn(w1.rows, w3.rows, w2.rows, x, comp, 0.5f, o);
      std::vector<float> panels(hidden, 1.f), fused(hidden, 1.f);
      expert_ffn({w1.panels, w3.panels, w2.panels}, x, 1, panels, 0.5f, o);
      expert_ffn({w1.rows, w3.rows, w2.rows}, x, 1, fused, 0.5f, o);
      INFO(name(order) << " int8 " << int8);
      for (std::size_t i = 0; i < hidden; ++i) {
        REQUIRE(panels[i] == Approx(comp[i]).epsilon(1e-6).margin(1e-7));
        REQUIRE(panels[i] == Approx(fused[i]).epsilon(1e-4).margin(1e-6));
      }
    }
}

TEST_CASE("panels: what cannot be packed is refused, naming what is wrong", "[precision][panels]") {
  const auto w = test::random_normal(8 * 512, 40, 0.05f);
  auto make = [&](Precision p, QuantScheme s) { return encode_matrix<float>(w, 8, 512, p, s); };
  const auto f16 = make(Precision::f16, {});
  const auto channel = make(Precision::q4, {0, false});
  const auto q4 = make(Precision::q4, {32, false});
  std::vector<std::byte> dst(q4.size());
  std::vector<std::byte> f16_dst(f16.size());
  CHECK_THROWS_WITH(pack_panels(make_matrix_view(f16, 8, 512, Precision::f16), f16_dst),
                    Catch::Contains("pack_panels") && Catch::Contains("f16"));
  CHECK_THROWS_WITH(pack_panels(make_matrix_view(channel, 8, 512, Precision::q4, {0, false}), dst),
                    Catch::Contains("group_size 0"));
  const MatrixView v = make_matrix_view(q4, 8, 512, Precision::q4);
  std::vector<std::byte> small(q4.size() - 1);
  CHECK_THROWS_WITH(pack_panels(v, small), Catch::Contains("destination has"));
  std::vector<std::byte> in_place = q4;
  CHECK_THROWS_WITH(pack_panels(make_matrix_view(in_place, 8, 512, Precision::q4), in_place),
                    Catch::Contains("overlap"));
  const MatrixView packed = pack_panels(v, dst);
  std::vector<std::byte> again(q4.size());
  CHECK_THROWS_WITH(pack_panels(packed, again), Catch::Contains("is in panels4, not rows"));
  CHECK_THROWS_WITH(unpack_panels(v, again), Catch::Contains("the source matrix is in rows"));
  CHECK_THROWS_WITH(pack_panels(v, again, MatrixOrder::rows), Catch::Contains("not a packing"));
  // A view that claims panels for a format they do not take: the kernels refuse it.
  MatrixView bad = make_matrix_view(f16, 8, 512, Precision::f16);
  bad.order = MatrixOrder::panels4;
  std::vector<float> x(512), y(8);
  CHECK_THROWS_WITH(gemv(bad, x, y), Catch::Contains("cannot be in panels"));
}

TEST_CASE("panels: blocked_panels4 lies as docs/formats.md says", "[precision][panels]") {
  // 4704 q4 g32 columns: 9 steps of 1152 bytes (4 rows x (256 code + 32 scale bytes)), in column
  // blocks of 5 and 4 steps; groups of 16 panels.
  const PanelLayout l =
      PanelLayout::of(4704, Precision::q4, {32, false}, MatrixOrder::blocked_panels4);
  CHECK(l.step_bytes == 1152);
  CHECK(l.group == 16);
  CHECK(l.block_steps == 5);
  CHECK(l.blocks() == 2);
  CHECK(l.step(0, 4, 16) == 4 * 1152);                   // panel 0's block 0: steps 0..4
  CHECK(l.step(1, 0, 16) == 5 * 1152);                   // then panel 1's
  CHECK(l.step(0, 5, 16) == 16 * 5 * 1152);              // block 1 after every panel's block 0
  CHECK(l.step(2, 6, 3) == (3 * 5 + 2 * 4 + 1) * 1152);  // a group of 3 panels
  CHECK(l.tail_row(1, 2, 3) == 3 * 9 * 1152 + (4 + 2) * l.tail.bytes);  // tails after all steps
  // Up to 4096 columns blocked_panels4 is panels4.
  const PanelLayout narrow =
      PanelLayout::of(4096, Precision::q8, {64, true}, MatrixOrder::blocked_panels4);
  CHECK(narrow.group == 1);
  CHECK(narrow.block_steps == narrow.steps);
  // 14336 columns (Mixtral's w2): four blocks of 3584 columns.
  CHECK(
      PanelLayout::of(14336, Precision::q2, {64, true}, MatrixOrder::blocked_panels4).block_steps ==
      7);
}
