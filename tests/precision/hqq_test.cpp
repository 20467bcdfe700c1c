// HQQ zero-point refinement (QuantizeOptions::hqq): it must not worsen the error it minimises
// (mean |W − Ŵ|) and its effect on MSE is reported.
#include <cmath>
#include <cstdio>
#include <vector>

#include <catch2/catch.hpp>

#include "moekit/precision/quantize.hpp"
#include "test_support.hpp"

using namespace moekit;

TEST_CASE("HQQ refinement lowers the mean absolute error of affine q4/q2", "[precision][hqq]") {
  INFO("seed " << test::test_seed());
  const std::size_t rows = 64, cols = 1024;
  // Heavy-tailed weights (a Gaussian plus sparse outliers), the case HQQ's l_0.7 loss targets.
  auto w = test::random_normal(rows * cols, 4242, 0.02f);
  const auto spikes = test::random_normal(rows * cols, 4343, 1.f);
  for (std::size_t i = 0; i < w.size(); i += 97) w[i] += 0.1f * spikes[i];
  for (Precision p : {Precision::q4, Precision::q2}) {
    const QuantScheme s{64, true};
    double mae[2] = {0, 0}, mse[2] = {0, 0};
    for (int hqq = 0; hqq < 2; ++hqq) {
      QuantizeOptions o;
      o.hqq = hqq == 1;
      const auto bytes = encode_matrix<float>(w, rows, cols, p, s, o);
      const auto back = decode_matrix(make_matrix_view(bytes, rows, cols, p, s));
      for (std::size_t i = 0; i < w.size(); ++i) {
        const double e = static_cast<double>(back[i]) - w[i];
        mae[hqq] += std::fabs(e);
        mse[hqq] += e * e;
      }
    }
    std::printf("HQQ %s g64: mean|err| %.4g -> %.4g (%.1f%%), MSE %.4g -> %.4g (%.1f%%)\n",
                std::string(name(p)).c_str(), mae[0] / w.size(), mae[1] / w.size(),
                100 * (mae[1] / mae[0] - 1), mse[0] / w.size(), mse[1] / w.size(),
                100 * (mse[1] / mse[0] - 1));
    CHECK(mae[1] < mae[0]);
  }
}
