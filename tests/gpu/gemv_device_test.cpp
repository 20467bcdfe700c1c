// cuda::gemv and cuda::dequantize_f16 on the device against the float64 reference on the same
// bytes: every format × activation type × shape (Mixtral's expert matrices, odd column counts that
// take the byte-wise fallback, a ragged last round of chunks), each matrix once 256-byte aligned
// (the 128-bit path wherever the row stride is a multiple of 16) and once 4 bytes off (fallback).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "gpu/device_support.hpp"
#include "precision/test_support.hpp"

using namespace moekit;
using namespace moekit::gpu_test;

namespace {

struct Shape {
  std::size_t rows, cols;
  const char* what;
};
// Mixtral-8x7B's w1/w3 (ffn × hidden) and w2 (hidden × ffn); 200/203 columns: strides that are
// not multiples of 16 (byte-wise loads) and a tail after the last whole chunk; 4160: more chunks
// than lanes with a ragged last round.
constexpr Shape gemv_shapes[] = {{14336, 4096, "Mixtral w1/w3"},
                                 {4096, 14336, "Mixtral w2"},
                                 {13, 200, "200 cols"},
                                 {37, 203, "203 cols"},
                                 {33, 4160, "4160 cols"}};

/// Runs y = 2 + 0.5·W·x on the device (accumulate into 2, scale 0.5: both epilogue flags) and
/// returns the rows outside the bound, described.
std::string check_gemv(const DeviceMatrix& m, const std::vector<float>& x, cuda::ActivationType act,
                       std::size_t x_offset, const RowReference& ref) {
  const auto xb = activation_bytes(x, act);
  DeviceBytes dx(xb.size() + x_offset), dy(m.view.rows * sizeof(float));
  dx.upload(xb, x_offset);
  dy.upload(std::vector<float>(m.view.rows, 2.f));
  cuda::gemv(m.view, dx.data(x_offset), act, reinterpret_cast<float*>(dy.data()), 0.5f, true,
             nullptr);
  check_cuda(cudaDeviceSynchronize(), "gemv");
  const auto y = dy.download<float>(m.view.rows);
  std::ostringstream bad;
  std::size_t n_bad = 0;
  for (std::size_t r = 0; r < y.size(); ++r) {
    const double want = 2.0 + 0.5 * ref.dot[r];
    // The kernel's accumulation, then the rounding of the fp32 epilogue (2^-24 of the result).
    const double tol = 0.5 * rel_tol * ref.magnitude[r] + 0x1p-23 * std::fabs(want) + 1e-6;
    if (!(std::fabs(y[r] - want) <= tol) && n_bad++ < 3)
      bad << " row " << r << ": " << y[r] << " want " << want << " tol " << tol << ";";
  }
  if (n_bad) bad << " (" << n_bad << " rows)";
  return bad.str();
}

}  // namespace

TEST_CASE("cuda::gemv matches the float64 reference on every format, activation type and shape",
          "[gpu][gemv]") {
  INFO("seed " << test::test_seed());
  for (const Shape& shape : gemv_shapes) {
    const auto w = test::random_normal(shape.rows * shape.cols, shape.cols, 0.05f);
    const auto x = exact_activations(test::random_normal(shape.cols, shape.cols + 1));
    for (auto [p, s] : all_formats()) {
      const auto bytes = encode_parallel(w, shape.rows, shape.cols, p, s);
      const MatrixView host = make_matrix_view(bytes, shape.rows, shape.cols, p, s);
      const RowReference ref = reference_rows(host, x.data());
      for (std::size_t offset : {0u, 4u}) {
        const DeviceMatrix m(bytes, host, offset);
        for (cuda::ActivationType act : all_activations) {
          INFO(shape.what << " " << shape.rows << "x" << shape.cols << " " << format_name(p, s)
                          << " " << name(act) << " at byte offset " << offset << " (row stride "
                          << host.row_stride()
                          << (host.row_stride() % 16 == 0 && offset == 0 ? ": 128-bit path)"
                                                                         : ": byte-wise)"));
          CHECK(check_gemv(m, x, act, offset, ref) == "");
        }
      }
    }
  }
}

TEST_CASE("cuda::dequantize_f16 is bit-exact with the host decode rounded to f16",
          "[gpu][dequantize]") {
  INFO("seed " << test::test_seed());
  for (const Shape& shape : {Shape{14336, 4096, "Mixtral w1/w3"}, Shape{37, 203, "203 cols"},
                             Shape{33, 4160, "4160 cols"}, Shape{5, 7, "7 cols"}}) {
    const auto w = test::random_normal(shape.rows * shape.cols, shape.cols + 7, 0.05f);
    for (auto [p, s] : all_formats()) {
      const auto bytes = encode_parallel(w, shape.rows, shape.cols, p, s);
      const MatrixView host = make_matrix_view(bytes, shape.rows, shape.cols, p, s);
      for (std::size_t offset : {0u, 4u}) {
        INFO(shape.what << " " << format_name(p, s) << " at byte offset " << offset);
        const DeviceMatrix m(bytes, host, offset);
        DeviceBytes out(shape.rows * shape.cols * 2);
        cuda::dequantize_f16(m.view, reinterpret_cast<std::uint16_t*>(out.data()), nullptr);
        check_cuda(cudaDeviceSynchronize(), "dequantize_f16");
        const auto got = out.download<std::uint16_t>(shape.rows * shape.cols);
        // Rows whose f16 bits differ anywhere from the host decode (rows compared on every core).
        std::vector<char> row_bad(shape.rows, 0);
        const RowLayout l = host.layout();
        parallel_for(shape.rows, [&](std::size_t b, std::size_t e) {
          for (std::size_t r = b; r < e; ++r)
            for (std::size_t c = 0; c < shape.cols; ++c)
              if (got[r * shape.cols + c] != float_to_half_bits(weight_at(host.row(r), l, p, c)))
                row_bad[r] = 1;
        });
        const auto first = std::find(row_bad.begin(), row_bad.end(), 1);
        INFO("first row with a mismatch: " << (first - row_bad.begin()) << " of " << shape.rows);
        CHECK(first == row_bad.end());
      }
    }
  }
}

TEST_CASE("cuda::gemv refuses what the kernels do not take, before any launch", "[gpu][gemv]") {
  const std::vector<std::byte> f32_bytes(4 * 64);
  const MatrixView f32 = make_matrix_view(f32_bytes, 2, 32, Precision::f32);
  DeviceBytes dx(128), dy(8);
  CHECK_THROWS_WITH(cuda::gemv(f32, dx.data(), cuda::ActivationType::f32,
                               reinterpret_cast<float*>(dy.data()), 1.f, false, nullptr),
                    Catch::Contains("q8/q4/q2"));
}
