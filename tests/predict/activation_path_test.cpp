#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moekit/predict/activation_path.hpp"
#include "predict/predict_test_support.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::OwnedList;
using test::ResidentSet;
using test::Route;

namespace {
using Sets = std::vector<std::vector<std::uint32_t>>;
void add(ActivationPathProfile& p, const Sets& s, int times = 1) {
  std::vector<std::span<const std::uint32_t>> v(s.begin(), s.end());
  for (int i = 0; i < times; ++i) p.add_path(v);
}
std::vector<std::uint32_t> one(std::uint32_t e) { return {e}; }
}  // namespace

TEST_CASE("ActivationPath: EdgeMoE's P(E3=5 | E1=3, E2=1) = 87.1% lookup", "[predict][edgemoe]") {
  // Switch-style top-1, 8 experts, 4 layers. Of 1000 tokens routed 3 -> 1, 871 go to 5 next.
  ActivationPathProfile p(4, 8, 1);
  add(p, {{3}, {1}, {5}, {0}}, 871);
  add(p, {{3}, {1}, {2}, {0}}, 100);
  add(p, {{3}, {1}, {7}, {0}}, 29);
  add(p, {{4}, {1}, {2}, {0}}, 500);  // another history for the same layer-1 expert
  CHECK(p.probability(2, one(3), one(1), 5) == Approx(0.871));
  CHECK(p.probability(2, one(3), one(1), 2) == Approx(0.100));
  CHECK(p.probability(2, one(4), one(1), 2) == Approx(1.0));
  // one-layer table: P(E3 = 5 | E2 = 1) over all 1500 tokens
  CHECK(p.probability(2, {}, one(1), 5) == Approx(871.0 / 1500.0));
  // marginal
  CHECK(p.probability(2, {}, {}, 2) == Approx(600.0 / 1500.0));
  CHECK(p.probability(2, one(6), one(1), 5) == 0.0);  // unseen key
}

TEST_CASE("ActivationPath: probabilities of a key sum to k (random property)",
          "[predict][edgemoe]") {
  const std::uint32_t L = 5, E = 8, k = 2, seed = 4242;
  INFO("seed " << seed);
  std::mt19937 g(seed);
  ActivationPathProfile a(L, E, k), b(L, E, k), all(L, E, k);
  for (int t = 0; t < 400; ++t) {
    Sets s(L);
    for (auto& set : s) {
      const std::uint32_t x = g() % E;
      std::uint32_t y = g() % (E - 1);
      if (y >= x) ++y;
      set = {x, y};
    }
    if (t % 7 == 3) s[2].clear();  // a missing record
    add(t % 2 ? a : b, s);
    add(all, s);
  }
  for (std::uint32_t n = 0; n < L; ++n) {
    const auto* m = all.find(n, {}, {});
    REQUIRE(m);
    std::uint64_t hits = 0;
    for (auto h : m->hits) hits += h;
    CHECK(hits == k * m->total);
  }
  // merging the halves equals building from the whole
  a.merge(b);
  CHECK(a == all);
  // text round trip
  CHECK(ActivationPathProfile::parse(all.to_text()) == all);
  const std::string path = std::string(MOEKIT_BINARY_DIR) + "/predict_profile_test.txt";
  all.save(path);
  CHECK(ActivationPathProfile::load(path) == all);
  std::remove(path.c_str());
}

TEST_CASE("ActivationPath: backoff path2 -> path1 -> marginal", "[predict][edgemoe]") {
  ActivationPathProfile p(4, 8, 1);
  add(p, {{3}, {1}, {5}, {0}}, 6);
  add(p, {{2}, {4}, {6}, {0}}, 3);
  add(p, {{2}, {1}, {7}, {0}}, 2);
  std::vector<std::pair<std::uint32_t, float>> out;
  ActivationPathProfile::Key key;
  using S = ActivationPathProfile::Source;
  CHECK(p.rank(2, one(3), one(1), 5, out, key) == S::path2);
  REQUIRE(out.size() == 1);
  CHECK(out[0] == std::pair<std::uint32_t, float>{5, 1.0f});
  // (2,1) has only 2 tokens < min_support 5: back off to path1 (layer-1 = 1: 8 tokens)
  CHECK(p.rank(2, one(2), one(1), 5, out, key) == S::path1);
  REQUIRE(out.size() == 2);
  CHECK(out[0].first == 5);
  CHECK(out[0].second == Approx(0.75));
  CHECK(out[1].first == 7);
  // unseen layer-1 expert: marginal (ordered by probability, ties -> smaller id)
  CHECK(p.rank(2, one(0), one(0), 5, out, key) == S::marginal);
  REQUIRE(out.size() == 3);
  CHECK(out[0].first == 5);
  CHECK(out[1].first == 6);
  CHECK(out[2].first == 7);
  // layer 0 always uses the marginal, layer 1 never a two-layer key
  CHECK(p.rank(0, {}, {}, 1, out, key) == S::marginal);
  CHECK(p.rank(1, one(3), one(3), 1, out, key) == S::path1);
}

TEST_CASE("ActivationPath: malformed profiles name the file, line and field",
          "[predict][edgemoe]") {
  auto err = [](std::string_view t) {
    try {
      (void)ActivationPathProfile::parse(t, "prof.txt");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::invalid_format);
      return e.message();
    }
    return std::string("no error");
  };
  const std::string head = "moekit-activation-path 1\nlayers 3 experts 4 top_k 1\n";
  CHECK(err("") == "prof.txt:1: empty file: expected header 'moekit-activation-path 1'");
  CHECK(err("moekit-activation-path 9\n") ==
        "prof.txt:1: unsupported version '9' (this build reads version 1)");
  CHECK(err(head + "marginal 1 5 1 2 3\n") ==
        "prof.txt:3: field 'marginal': expected <layer> <total> and 4 counts");
  CHECK(err(head + "marginal 7 5 1 2 1 1\n") ==
        "prof.txt:3: field 'layer': expected a layer index below 3");
  CHECK(err(head + "path1 1 9 5 1:5\n") ==
        "prof.txt:3: field 'key': '9' is not a comma-separated set of expert ids < 4");
  CHECK(err(head + "path2 1 1/2 5 1:5\n") ==
        "prof.txt:3: field 'path2': layer 1 has no such history");
  CHECK(err(head + "path1 1 2 5 1:6\n") ==
        "prof.txt:3: field 'count': a count exceeds the key's total");
  CHECK(err(head + "path1 1 2 5 x\n") ==
        "prof.txt:3: field 'count': expected <expert>:<count> with expert < 4, got 'x'");
  CHECK(err(head + "bogus 1\n") ==
        "prof.txt:3: unknown record 'bogus' (expected marginal, path1 or path2)");
}

TEST_CASE("ActivationPathPredictor: preloads in probability order up to max_preload",
          "[predict][edgemoe]") {
  auto prof = std::make_shared<ActivationPathProfile>(4, 8, 2);
  add(*prof, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}, 10);
  add(*prof, {{0, 1}, {2, 3}, {4, 6}, {6, 7}}, 6);
  add(*prof, {{0, 1}, {2, 3}, {1, 6}, {6, 7}}, 4);
  ActivationPathPredictor p({.profile = prof, .max_preload = 3});
  ResidentSet none;
  // token 5: layer 0 -> {1, 0}, layer 1 -> {3, 2}; predict layer 2 at layer 1
  const Route l0(8, {{1, 0}}), l1(8, {{3, 2}});
  p.observe(ctx(0, 4, 5), l0.view());
  OwnedList a;
  p.predict(ctx(0, 4, 5), l0.view(), none.view(), a.list);
  p.observe(ctx(1, 4, 5), l1.view());
  OwnedList b;
  p.predict(ctx(1, 4, 5), l1.view(), none.view(), b.list);
  const auto it = b.items();
  REQUIRE(it.size() == 3);
  CHECK(it[0].key == ExpertKey{2, 4});  // 16/20
  CHECK(it[0].confidence == Approx(0.8));
  CHECK(it[1].key == ExpertKey{2, 5});  // 10/20: ties -> smaller id first
  CHECK(it[2].key == ExpertKey{2, 6});  // 10/20 (expert 1, 4/20, is beyond max_preload)
  CHECK(it[0].precision == Precision::q4);
  CHECK(p.stats().by_source[0] == 1);  // path2 answered layer 2
  CHECK(p.stats().by_source[1] == 1);  // path1 answered layer 1
  // prefill: no prediction
  OwnedList c;
  const Route pre(8, {{3, 2}, {1, 0}});
  p.observe(ctx(1, 4, 0, Phase::prefill, 2), pre.view());
  p.predict(ctx(1, 4, 0, Phase::prefill, 2), pre.view(), none.view(), c.list);
  CHECK(c.items().empty());
  CHECK_THROWS_AS(ActivationPathPredictor({}), Error);
  CHECK_THROWS_WITH(p.observe(ctx(0, 5, 9), l0.view()),
                    Catch::Contains("the profile describes 4 layers x 8 experts, the model 5 x 8"));
}
