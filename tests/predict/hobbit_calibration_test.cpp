#include <catch2/catch.hpp>

#include <array>
#include <vector>

#include "moekit/tools/hobbit_calibration.hpp"

using namespace moekit;

TEST_CASE("HOBBIT threshold calibration hits the target fractions", "[tools][hobbit]") {
  // 100 top-2 tokens; the top-1 weight w0 takes values 0.50, 0.51, ..., 0.99 twice each, so the
  // second expert's score is w0. N = 200 selections, 100 of them scored 0 (top-1).
  tools::HobbitScoreCollector c;
  for (int rep = 0; rep < 2; ++rep)
    for (int i = 0; i < 50; ++i) {
      const float w0 = 0.5f + 0.01f * float(i);
      const std::array<std::uint32_t, 2> ids{1, 2};
      const std::array<float, 2> w{w0, 1.0f - w0};
      c.add(ids, w);
    }
  CHECK(c.size() == 200);
  // f_skip = 0.03 -> at most 6 scores above T2: the 3 largest values twice -> T2 = 0.96
  // f_low = 0.30 -> at most 66 above T1: 33 largest values -> T1 = 0.66
  const HobbitRule r = c.thresholds(0.30, 0.03);
  CHECK(r.t2 == Approx(0.96f));
  CHECK(r.t1 == Approx(0.66f));
  // applying the calibrated rule gives the target split exactly
  std::array<int, 3> n{};
  for (int i = 0; i < 50; ++i) {
    const float w0 = 0.5f + 0.01f * float(i);
    const std::array<std::uint32_t, 2> ids{1, 2};
    const std::array<float, 2> w{w0, 1.0f - w0};
    std::array<HobbitDecision, 2> d{};
    r.decide(ids, w, d);
    for (auto x : d) n[static_cast<std::size_t>(x)] += 2;
  }
  CHECK(n[0] == 6);    // skip: 3 %
  CHECK(n[1] == 60);   // low: 30 %
  CHECK(n[2] == 134);  // high
  CHECK_THROWS_AS(tools::HobbitScoreCollector{}.thresholds(), Error);
}
