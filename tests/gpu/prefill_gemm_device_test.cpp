// cuda::PrefillGemm (dequantize to f16, then cuBLASLt with fp32 compute) at n = 1, 7, 64, 512
// against a float64 GEMM on the host over the same f16 weights (dequantize_f16 is bit-exact with
// them: gemv_device_test.cpp), plus activations and outputs that are not 256-byte aligned (a
// sub-batch of a chunked prefill), which cuBLASLt's heuristic must be told about.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <vector>

#include "gpu/device_support.hpp"
#include "precision/test_support.hpp"

using namespace moekit;
using namespace moekit::gpu_test;

namespace {

/// Host GEMM: y[b][r] = Σ_c f16(W[r][c])·x[b][c] in float64, and the magnitude sums.
struct GemmReference {
  std::vector<double> y, magnitude;
};
GemmReference host_gemm(const MatrixView& w, const std::vector<float>& x, std::size_t n) {
  std::vector<float> w16(w.rows * w.cols);
  const RowLayout l = w.layout();
  parallel_for(w.rows, [&](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r)
      for (std::size_t c = 0; c < w.cols; ++c)
        w16[r * w.cols + c] =
            half_bits_to_float(float_to_half_bits(weight_at(w.row(r), l, w.precision, c)));
  });
  GemmReference ref{std::vector<double>(n * w.rows), std::vector<double>(n * w.rows)};
  parallel_for(n * w.rows, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      const std::size_t t = i / w.rows, r = i % w.rows;
      double acc = 0, mag = 0;
      for (std::size_t c = 0; c < w.cols; ++c) {
        const double p = static_cast<double>(w16[r * w.cols + c]) * x[t * w.cols + c];
        acc += p;
        mag += std::fabs(p);
      }
      ref.y[i] = acc;
      ref.magnitude[i] = mag;
    }
  });
  return ref;
}

/// Runs the GEMM with x at byte `x_offset` and y at byte `y_offset` of their allocations.
std::string check_prefill(cuda::PrefillGemm& gemm, const DeviceMatrix& m,
                          const std::vector<float>& x, std::size_t n, const GemmReference& ref,
                          std::size_t x_offset, std::size_t y_offset) {
  const auto xb = activation_bytes(x, cuda::ActivationType::f16);
  DeviceBytes dx(xb.size() + x_offset), dy(n * m.view.rows * 4 + y_offset),
      dw(m.view.rows * m.view.cols * 2);
  DeviceBytes workspace(32u << 20);  // cuBLASLt's recommended workspace on Hopper
  dx.upload(xb, x_offset);
  gemm.run(m.view, reinterpret_cast<const std::uint16_t*>(dx.data(x_offset)), n,
           reinterpret_cast<float*>(dy.data(y_offset)), reinterpret_cast<std::uint16_t*>(dw.data()),
           workspace.data(), workspace.size(), nullptr);
  check_cuda(cudaDeviceSynchronize(), "PrefillGemm::run");
  const auto y = dy.download<float>(n * m.view.rows, y_offset);
  std::ostringstream bad;
  std::size_t n_bad = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    // rel_tol as for the GEMV: fp32 accumulation, blocked on the tensor cores (whose truncating
    // adds cost at most ~2^-23·sqrt(k)/8 of Σ|terms| at these k), stays far below 2^-16.
    const double tol = rel_tol * ref.magnitude[i] + 1e-6;
    if (!(std::fabs(y[i] - ref.y[i]) <= tol) && n_bad++ < 3)
      bad << " token " << i / m.view.rows << " row " << i % m.view.rows << ": " << y[i] << " want "
          << ref.y[i] << " tol " << tol << ";";
  }
  if (n_bad) bad << " (" << n_bad << " outside)";
  return bad.str();
}

}  // namespace

TEST_CASE("cuda::PrefillGemm matches the host GEMM on the f16 weights at n = 1, 7, 64, 512",
          "[gpu][prefill]") {
  INFO("seed " << test::test_seed());
  struct Case {
    std::size_t rows, cols;
    Precision p;
    QuantScheme s;
  };
  // One Mixtral w1 slice (1024 of its 14336 rows, all 4096 columns) and an odd shape.
  for (const Case& c :
       {Case{1024, 4096, Precision::q4, {64, true}}, Case{1024, 4096, Precision::q8, {32, false}},
        Case{1024, 4096, Precision::q2, {0, true}}, Case{75, 203, Precision::q4, {32, false}}}) {
    const auto bytes = encode_parallel(test::random_normal(c.rows * c.cols, c.cols + 11, 0.05f),
                                       c.rows, c.cols, c.p, c.s);
    const MatrixView host = make_matrix_view(bytes, c.rows, c.cols, c.p, c.s);
    const DeviceMatrix m(bytes, host, 0);
    cuda::PrefillGemm gemm;
    const auto x = exact_activations(test::random_normal(512 * c.cols, c.cols + 13));
    const GemmReference ref = host_gemm(host, x, 512);
    for (std::size_t n : {1u, 7u, 64u, 512u}) {
      INFO(c.rows << "x" << c.cols << " " << format_name(c.p, c.s) << " n = " << n);
      const std::vector<float> xn(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n * c.cols));
      // The first n tokens of the reference are the reference of the first n tokens.
      const GemmReference refn{
          std::vector<double>(ref.y.begin(),
                              ref.y.begin() + static_cast<std::ptrdiff_t>(n * c.rows)),
          std::vector<double>(ref.magnitude.begin(),
                              ref.magnitude.begin() + static_cast<std::ptrdiff_t>(n * c.rows))};
      CHECK(check_prefill(gemm, m, xn, n, refn, 0, 0) == "");
      if (n == 7) {
        INFO("x 16 bytes and y 4 bytes past 256-byte alignment");
        CHECK(check_prefill(gemm, m, xn, n, refn, 16, 4) == "");
      }
    }
  }
}
