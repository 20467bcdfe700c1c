// StaticPopularityPolicy (cache/static_popularity.hpp): Fiddler's static placement of the most
// popular experts. Exact worked examples through ExpertCache (helpers: cache_test_support.hpp).

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "cache/cache_test_support.hpp"
#include "moekit/cache/static_popularity.hpp"

using namespace moekit;
using namespace moekit::test;

// ---- Fiddler ------------------------------------------------------------------------------------

namespace {
// Mixtral-8x7B-Instruct per-(layer, expert) selection counts over 59,505 tokens [32 × 8], from
// abhibambhaniya/mixtral-offloading-residency-info (MIT licence), via shared/data/stats/.
const std::vector<double> mixtral_counts = {
    21522, 13650, 13027, 11423, 13254, 15835, 19435, 10864, 14974, 21495, 11836, 12877, 23444,
    12183, 9843,  12358, 13711, 12269, 10952, 12839, 10520, 27165, 21424, 10130, 13299, 10549,
    9234,  14359, 21414, 14889, 15379, 19887, 22665, 9599,  13769, 9122,  14095, 21958, 12962,
    14840, 13479, 16430, 12060, 11951, 12567, 20047, 23613, 8863,  9248,  22551, 11107, 9586,
    18311, 14286, 14373, 19548, 27896, 20999, 13560, 10104, 6230,  15372, 9654,  15195, 8490,
    19220, 12996, 12131, 21745, 19161, 16608, 8659,  21944, 8765,  6163,  22835, 13355, 14778,
    22121, 9049,  14100, 18817, 10079, 12417, 26248, 7990,  18273, 11086, 23459, 24705, 20460,
    1694,  13306, 12109, 13076, 10201, 19834, 14389, 10685, 12752, 19578, 15773, 22533, 3466,
    25555, 11645, 29065, 8131,  11641, 12365, 8646,  11962, 9746,  25090, 6861,  16137, 20013,
    12430, 8988,  19745, 21417, 17975, 12812, 16715, 11838, 9730,  8587,  19936, 24146, 9408,
    11049, 20898, 16464, 12513, 13580, 10952, 12343, 12440, 14165, 17111, 12352, 20228, 7977,
    22394, 10897, 13159, 23731, 10080, 13542, 23401, 11339, 12861, 15538, 23744, 12837, 22487,
    11997, 10145, 9982,  12280, 10305, 22503, 12084, 22136, 10964, 14561, 12920, 13537, 9942,
    15004, 14012, 15623, 13989, 18549, 20603, 11288, 14960, 10428, 7748,  12524, 23337, 11846,
    25724, 12443, 16610, 14045, 11166, 13128, 22531, 8762,  22781, 9987,  12019, 23210, 13061,
    10133, 14989, 21222, 12106, 12270, 10244, 11663, 17295, 12280, 21553, 11284, 21798, 12893,
    12930, 20359, 17877, 13844, 11598, 12297, 14431, 15674, 10771, 15477, 11218, 11534, 21178,
    11631, 10570, 26631, 23453, 11058, 14384, 12462, 21820, 12965, 9769,  13099, 15307, 14388,
    13485, 12426, 12188, 20257, 9171,  21788, 10611, 20176, 13056, 13538, 14210, 20941, 10489,
    15989, 11234, 23452, 12480, 17504, 12593, 17554, 9094,  15099};
}  // namespace

TEST_CASE("Fiddler placement on Mixtral's real popularity (fiddler.md §7.13)", "[cache][fiddler]") {
  REQUIRE(mixtral_counts.size() == 256);
  const std::size_t b = mixtral_8x7b.expert_bytes(Precision::f16);
  auto rate = [&](std::size_t n) {
    ExpertCache<StaticPopularityPolicy> c(mixtral_8x7b, n * b + b / 2, Precision::f16,
                                          StaticPopularityPolicy({.counts = mixtral_counts}));
    CHECK(c.policy().placement().size() == n);
    return c.policy().expected_hit_rate();
  };
  CHECK(rate(56) == Approx(0.3340).margin(1e-4));
  CHECK(rate(52) == Approx(0.3128).margin(1e-4));
  CHECK(rate(128) == Approx(0.6321).margin(1e-4));
  CHECK(rate(256) == Approx(1.0));
}

TEST_CASE("Fiddler placement never evicts and refuses non-placed experts", "[cache][fiddler]") {
  std::vector<double> counts(32, 0.0);
  counts[small.index({0, 3})] = 9;
  counts[small.index({2, 1})] = 7;
  counts[small.index({1, 0})] = 7;  // tie with (2,1): the smaller layer wins
  ExpertCache<StaticPopularityPolicy> c(small, 2 * f16b, Precision::f16,
                                        StaticPopularityPolicy({.counts = counts}));
  const auto placed = c.policy().placement();
  REQUIRE(placed.size() == 2);
  CHECK(placed[0] == ExpertKey{0, 3});
  CHECK(placed[1] == ExpertKey{1, 0});
  CHECK(c.insert({0, 3}, c.access(Precision::f16, 0)).ok());
  CHECK(c.insert({1, 0}, c.access(Precision::f16, 1)).ok());
  CHECK(c.insert({2, 1}, c.access(Precision::f16, 2)).status == InsertStatus::too_large);
  CHECK(c.resident({0, 3}));
  CHECK(c.resident({1, 0}));
  CHECK(c.stats().evictions == 0);
  CHECK_THROWS_WITH(ExpertCache<StaticPopularityPolicy>(small, f16b, Precision::f16),
                    Catch::Contains("counts"));
}
