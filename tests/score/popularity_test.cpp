#include <catch2/catch.hpp>

#include <vector>

#include "moekit/score/popularity.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::Route;

TEST_CASE("PopularityScorer: least popular 25% of a prefill layer at q2, decode q4",
          "[score][fate]") {
  PopularityScorer s;
  // 8 experts with token counts 8,1,7,2,6,3,5,3 -> floor(0.25*8) = 2 least popular: experts 1, 3
  std::vector<ExpertDemand> d;
  const std::uint32_t counts[] = {8, 1, 7, 2, 6, 3, 5, 3};
  for (std::uint32_t e = 0; e < 8; ++e) d.push_back(ExpertDemand{e, counts[e], 0, 0, 0});
  std::vector<Precision> out(8);
  const Route r(8, {{0, 1}});  // the scorer uses the demands, not the routes
  s.score(ctx(0, 1, 0, Phase::prefill, 20), r.view(), d, out);
  using P = Precision;
  CHECK(out == std::vector<P>{P::q4, P::q2, P::q4, P::q2, P::q4, P::q4, P::q4, P::q4});
  // ties: the larger id counts as less popular (experts 5 and 7 both have 3 tokens)
  d[3].n_tokens = 9;  // now 1 and 7 are the least popular
  s.score(ctx(0, 1, 0, Phase::prefill, 20), r.view(), d, out);
  CHECK(out == std::vector<P>{P::q4, P::q2, P::q4, P::q4, P::q4, P::q4, P::q4, P::q2});
  // 56 active experts -> exactly 14 at q2
  std::vector<ExpertDemand> big;
  for (std::uint32_t e = 0; e < 56; ++e) big.push_back(ExpertDemand{e, 100 - e, 0, 0, 0});
  std::vector<Precision> o56(56);
  s.score(ctx(0, 1, 0, Phase::prefill, 512), r.view(), big, o56);
  CHECK(std::count(o56.begin(), o56.end(), P::q2) == 14);
  for (std::size_t e = 42; e < 56; ++e) CHECK(o56[e] == P::q2);
  // decode: always q4
  s.score(ctx(0, 1), r.view(), std::span(d).first(2), std::span(out).first(2));
  CHECK(out[0] == P::q4);
  CHECK(out[1] == P::q4);
  CHECK_THROWS_AS(PopularityScorer({.int2_fraction = 1.5}), Error);
}
