// The CUDA kernel bodies (precision/simt/gemv_body.hpp) run under the host SIMT emulation against
// the scalar float64 reference: every quantized format × scheme × activation type.
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "moekit/precision/half.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit/precision/reference.hpp"
#include "moekit/precision/simt/emulator.hpp"
#include "test_support.hpp"

using namespace moekit;

namespace {
template <class Act>
std::vector<Act> to_act(const std::vector<float>& v) {
  std::vector<Act> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<Act, Float16>)
      out[i] = to_f16(v[i]);
    else if constexpr (std::is_same_v<Act, BFloat16>)
      out[i] = to_bf16(v[i]);
    else
      out[i] = v[i];
  }
  return out;
}

template <unsigned Bits, class Act>
void check_gemv(std::size_t rows, std::size_t cols, QuantScheme s, const char* act_name) {
  const Precision p = Bits == 8 ? Precision::q8 : Bits == 4 ? Precision::q4 : Precision::q2;
  const auto w = test::random_normal(rows * cols, Bits * 1000 + cols, 0.05f);
  const auto bytes = encode_matrix<float>(w, rows, cols, p, s);
  const MatrixView m = make_matrix_view(bytes, rows, cols, p, s);
  const auto act = to_act<Act>(test::random_normal(cols, cols + 1));
  std::vector<float> xf(cols);
  for (std::size_t c = 0; c < cols; ++c) xf[c] = to_float(act[c]);
  std::vector<float> y(rows, 2.f);
  simt::GemvArgs<Act> a{bytes.data(), rows,     m.row_stride(), m.layout(),
                        act.data(),   y.data(), 0.5f,           true};
  const bool aligned = m.row_stride() % 16 == 0;
  if (aligned)
    simt::emulate_gemv<Bits, Act, true>(a);
  else
    simt::emulate_gemv<Bits, Act, false>(a);
  for (std::size_t r = 0; r < rows; ++r) {
    const double want = 2.0 + 0.5 * reference::dot_row(m, r, xf.data());
    const double tol = 0.5 * test::dot_magnitude(m, r, xf.data()) / 65536 + 1e-6;
    if (std::fabs(y[r] - want) > tol)
      FAIL("q" << Bits << " " << act_name << " g" << s.group_size << " z" << s.zero_point
               << " cols " << cols << " row " << r << ": " << y[r] << " want " << want);
  }
  // The up/gate body: h = silu(w1·x) ⊙ w3·x with w1 = w3 = this matrix.
  std::vector<float> h(rows);
  simt::UpGateArgs<Act> u{bytes.data(), bytes.data(), rows,    m.row_stride(),
                          m.layout(),   act.data(),   h.data()};
  if (aligned)
    simt::emulate_up_gate<Bits, Act, true>(u);
  else
    simt::emulate_up_gate<Bits, Act, false>(u);
  for (std::size_t r = 0; r < rows; ++r) {
    const double d = reference::dot_row(m, r, xf.data());
    const double want = reference::silu(d) * d;
    const double tol = 4 * std::fabs(d) * test::dot_magnitude(m, r, xf.data()) / 65536 + 1e-5;
    if (std::fabs(h[r] - want) > tol)
      FAIL("up/gate q" << Bits << " " << act_name << " row " << r << ": " << h[r] << " want "
                       << want);
  }
}

template <unsigned Bits>
void check_all_acts(std::size_t rows, std::size_t cols, QuantScheme s) {
  check_gemv<Bits, Float16>(rows, cols, s, "f16");
  check_gemv<Bits, BFloat16>(rows, cols, s, "bf16");
  check_gemv<Bits, float>(rows, cols, s, "f32");
}
}  // namespace

TEST_CASE("SIMT emulation of the CUDA GEMV and up/gate bodies matches the reference",
          "[precision][simt]") {
  INFO("seed " << test::test_seed());
  // 4096 + 64: more chunks than lanes and a ragged last round; 200: a tail of columns after the
  // last whole chunk (unaligned rows: byte-wise loads); 0 = one group per row.
  for (std::size_t cols : {4096u + 64u, 200u, 1024u})
    for (QuantScheme s : {QuantScheme{32, false}, QuantScheme{64, true}, QuantScheme{128, false},
                          QuantScheme{0, true}}) {
      check_all_acts<8>(13, cols, s);
      check_all_acts<4>(13, cols, s);
      check_all_acts<2>(13, cols, s);
    }
}

TEST_CASE("host warp_sum is the xor butterfly: every lane gets the total", "[precision][simt]") {
  simt::LaneValues v;
  for (unsigned l = 0; l < simt::warp_size; ++l) v[l] = static_cast<float>(l + 1);
  simt::warp_sum(v);
  for (float x : v) CHECK(x == 528.f);
  CHECK(simt::warp_row(3, 2, 4) == 14u);
}

TEST_CASE("SIMT emulation of the dequantize-to-f16 body matches decode", "[precision][simt]") {
  INFO("seed " << test::test_seed());
  for (Precision p : {Precision::q8, Precision::q4, Precision::q2})
    for (std::size_t cols : {256u, 203u}) {
      const std::size_t rows = 9;
      const auto w = test::random_normal(rows * cols, 77 + cols);
      const QuantScheme s{64, true};
      const auto bytes = encode_matrix<float>(w, rows, cols, p, s);
      const MatrixView m = make_matrix_view(bytes, rows, cols, p, s);
      std::vector<std::uint16_t> out(rows * cols, 0xffff);
      simt::emulate_dequant({bytes.data(), rows, m.row_stride(), m.layout(), out.data()});
      const auto want = decode_matrix(m);
      for (std::size_t i = 0; i < want.size(); ++i)
        if (out[i] != float_to_half_bits(want[i]))
          FAIL(name(p) << " element " << i << ": " << half_bits_to_float(out[i]) << " want "
                       << want[i]);
    }
}
