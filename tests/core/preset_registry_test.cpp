// The preset registry: every preset is one spec, found once by name and visited as its type; its
// knobs default to its components' own Configs; what it needs and reads is declared; Fiddler's
// placement preloads the most popular experts until the cache is full.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "moekit/presets.hpp"
#include "support/manual_loader.hpp"

using namespace moekit;
using test::ManualLoader;

namespace {
constexpr ModelShape reg_shape{.n_layers = 3, .n_experts = 4, .top_k = 2, .hidden = 4, .ffn = 32};
}  // namespace

TEST_CASE("presets registry: names are unique, found once, and visit the named spec",
          "[preset][registry]") {
  std::set<std::string> seen;
  for (const presets::PresetEntry& e : presets::entries) {
    INFO(e.name);
    CHECK(seen.insert(std::string(e.name)).second);
    CHECK_FALSE(e.summary.empty());
    REQUIRE(presets::find(e.name) == &e);
    const std::string visited =
        presets::visit(e, []<class S>(std::type_identity<S>) { return std::string(S::name); });
    CHECK(visited == e.name);
  }
  CHECK(presets::entries.size() == 11);
  CHECK(presets::find("hobbbit") == nullptr);
  CHECK(presets::names() ==
        "baseline, hobbit, fate, edgemoe, mobile, fiddler, nextuse, nextuse-fit, hobbit-oracle, "
        "fate-oracle, mobile-oracle");
  STATIC_REQUIRE(presets::index_of<presets::NextUseSpec> == 6);
  STATIC_REQUIRE(presets::is<presets::FateSpec>(presets::entry_of<presets::FateSpec>));
  STATIC_REQUIRE(
      std::is_same_v<presets::Hobbit<ManualLoader>, presets::HobbitSpec::Pipeline<ManualLoader>>);
  std::size_t n = 0;
  presets::for_each([&]<class S>(std::type_identity<S>) { CHECK(presets::index_of<S> == n++); });
  CHECK(n == presets::entries.size());
}

TEST_CASE("presets registry: knobs default to the components' Configs", "[preset][registry]") {
  const presets::PresetParams q;
  const auto h = presets::HobbitSpec::configure(reg_shape, Precision::f16, q);
  CHECK(h.rule.t1 == HobbitRule{}.t1);
  CHECK(h.rule.t2 == HobbitRule{}.t2);
  CHECK(h.rule.low == HobbitRule{}.low);
  CHECK(h.lookahead == StackedGatePredictor::Config{}.lookahead);
  const auto f = presets::FateSpec::configure(reg_shape, Precision::q4, q);
  CHECK(f.scorer.int2_fraction == PopularityScorer::Config{}.int2_fraction);
  CHECK(f.percentile == CrossLayerGatePredictor::Config{}.percentile);
  CHECK(f.cache.shallow_layers == ShallowFavoring<ArcPolicy>::Config{}.shallow_layers);
  CHECK(presets::FateSpec::Config{}.scorer.decode_precision == Precision::q4);  // the paper's
  const auto m = presets::MobileSpec::configure(reg_shape, Precision::f16, q);
  CHECK(m.tokens.gamma == BigLittlePolicy::Config{}.gamma);
  CHECK(m.tokens.k_little == BigLittlePolicy::Config{}.k_little);
}

TEST_CASE("presets registry: needs and precisions are declared per preset", "[preset][registry]") {
  presets::PresetParams q;
  q.low = Precision::q2;
  const presets::PresetInputs none;
  auto reads = [&](const presets::PresetEntry& e, const presets::PresetInputs& in) {
    return e.precisions(reg_shape, Precision::q8, q, in);
  };
  using V = std::vector<Precision>;
  CHECK(reads(presets::entry_of<presets::BaselineSpec>, none) == V{Precision::q8});
  CHECK(reads(presets::entry_of<presets::HobbitSpec>, none) == V{Precision::q8, Precision::q2});
  CHECK(reads(presets::entry_of<presets::NextUseSpec>, none) == V{Precision::q8, Precision::q2});
  CHECK(reads(presets::entry_of<presets::FateSpec>, none) == V{Precision::q8, Precision::q2});
  q.fate_low_fraction = 0;
  CHECK(reads(presets::entry_of<presets::FateSpec>, none) == V{Precision::q8});
  presets::PresetInputs table;
  auto t = std::make_shared<PrecisionTable>(reg_shape.n_layers, reg_shape.n_experts, Precision::q4);
  t->set({1, 2}, Precision::f16);
  table.bitwidths = t;
  CHECK(reads(presets::entry_of<presets::EdgeMoeSpec>, none) == V{Precision::q8});
  CHECK(reads(presets::entry_of<presets::EdgeMoeSpec>, table) ==
        V{Precision::q8, Precision::q4, Precision::f16});

  CHECK(presets::HobbitSpec::needs.routers);
  CHECK(presets::FateSpec::needs.routers);
  CHECK(presets::EdgeMoeSpec::needs.paths);
  CHECK(presets::EdgeMoeSpec::needs.bitwidths);
  // EdgeMoE's codec is per output channel (group size 0); every other preset groups by 32.
  for (const presets::PresetEntry& e : presets::entries)
    CHECK(e.quant_group_size == (presets::is<presets::EdgeMoeSpec>(e) ? 0u : 32u));
  CHECK(presets::FiddlerSpec::needs.popularity);
  CHECK(presets::FiddlerSpec::needs.latencies);
  CHECK_FALSE(presets::NextUseSpec::needs.routers);
  CHECK_FALSE(presets::MobileSpec::needs.routers);
  CHECK(presets::HobbitOracleSpec::needs.lookahead);
  CHECK(presets::FateOracleSpec::needs.lookahead);
  CHECK_FALSE(presets::HobbitOracleSpec::needs.routers);
  CHECK_FALSE(presets::HobbitSpec::needs.lookahead);
  CHECK(presets::MobileOracleSpec::needs.lookahead);
  CHECK(presets::MobileOracleSpec::needs.replayed_logits);
  CHECK_FALSE(presets::MobileSpec::needs.replayed_logits);

  // mobile-oracle: the paper's fallback share and plan accuracy unless set, judged by share only.
  q = {};
  const auto mo = presets::MobileOracleSpec::configure(reg_shape, Precision::q8, q);
  CHECK(mo.tokens.fallback_ratio_without_logits == 0.1375);
  CHECK(mo.tokens.share_only);
  CHECK(mo.replay_accuracy == 0.8);
  q.replay_accuracy = 1.5;
  CHECK_THROWS_WITH(presets::check(presets::entry_of<presets::MobileOracleSpec>, Precision::q8, q),
                    Catch::Contains("--replay-accuracy"));
  q = {};
  q.fallback_ratio = -0.1;
  CHECK_THROWS_WITH(presets::check(presets::entry_of<presets::MobileOracleSpec>, Precision::q8, q),
                    Catch::Contains("--fallback-ratio"));

  // The oracle stand-ins: their recall defaults to the paper's, hobbit-oracle's per rank from
  // --hobbit-recall (moe-sim's flag), fate-oracle's from --oracle-recall, both checked; building
  // one without the routing ahead names the flag it needs.
  q = {};
  const auto hobbit = presets::HobbitOracleSpec::configure(reg_shape, Precision::q8, q).recall;
  CHECK(hobbit.top1 == std::vector<double>{0.96, 0.90, 0.90});
  CHECK(hobbit.lower == std::vector<double>{0.96, 0.90, 0.90});
  CHECK(presets::HobbitOracleSpec::Config{}.recall.top1 == hobbit.top1);
  CHECK(presets::FateOracleSpec::configure(reg_shape, Precision::q8, q).recall ==
        std::vector<double>{0.9715});
  CHECK(presets::FateOracleSpec::Config{}.recall == std::vector<double>{0.9715});
  q.hobbit_recall = "measured";
  CHECK(presets::HobbitOracleSpec::configure(reg_shape, Precision::q8, q).recall.lower ==
        std::vector<double>{0.764, 0.726, 0.665});
  q.hobbit_recall = "0.5,0.25/0.125";
  const auto given = presets::HobbitOracleSpec::configure(reg_shape, Precision::q8, q).recall;
  CHECK(given.top1 == std::vector<double>{0.5, 0.25});
  CHECK(given.lower == std::vector<double>{0.125});
  q.hobbit_recall = "1.5";
  CHECK_THROWS_WITH(presets::check(presets::entry_of<presets::BaselineSpec>, Precision::q8, q),
                    Catch::Contains("--hobbit-recall"));
  q = {};
  q.oracle_recall = {0.5, 0.25};
  CHECK(presets::FateOracleSpec::configure(reg_shape, Precision::q8, q).recall == q.oracle_recall);
  CHECK_THROWS_WITH(presets::check(presets::entry_of<presets::HobbitOracleSpec>, Precision::q8, q),
                    Catch::Contains("--hobbit-recall"));  // one figure per distance: not its model
  q.oracle_recall = {1.5};
  CHECK_THROWS_WITH(presets::check(presets::entry_of<presets::FateOracleSpec>, Precision::q8, q),
                    Catch::Contains("--oracle-recall"));
  q.oracle_recall = {0.9, 0.9, 0.9, 0.9};
  CHECK_THROWS_WITH(presets::check(presets::entry_of<presets::FateOracleSpec>, Precision::q8, q),
                    Catch::Contains("--oracle-recall"));
  q = {};
  CHECK_THROWS_WITH(
      presets::HobbitOracleSpec::predictor(
          reg_shape, presets::HobbitOracleSpec::configure(reg_shape, Precision::q8, q),
          presets::PresetInputs{}),
      Catch::Contains("--routing-trace"));

  q = {};
  q.low = Precision::f16;
  CHECK_THROWS_WITH(presets::check(presets::entry_of<presets::NextUseSpec>, Precision::q8, q),
                    Catch::Contains("--low-precision"));
  CHECK_NOTHROW(presets::check(presets::entry_of<presets::BaselineSpec>, Precision::q8, q));
}

TEST_CASE("presets registry: Fiddler places the most popular experts until the cache is full",
          "[preset][registry][fiddler]") {
  presets::PresetInputs in;
  in.popularity = {1, 9, 2, 8, 0, 1, 0, 0, 7, 3, 0, 0};
  in.cpu_seconds_per_token = 7;
  in.copy_seconds = 70;
  const std::size_t f16 = reg_shape.expert_bytes(Precision::f16);
  auto p = presets::make_pipeline<presets::FiddlerSpec>(reg_shape, {.expert_budget_bytes = 3 * f16},
                                                        {}, ManualLoader{}, in);
  CHECK(p->stats().bytes_preloaded == 3 * f16);
  std::vector<ExpertKey> loaded;
  for (const auto& r : p->loader().records()) loaded.push_back(r.request.key);
  CHECK(loaded == std::vector<ExpertKey>{{0, 1}, {0, 3}, {2, 0}});
  // Built without placement, nothing is preloaded; placing returns the count.
  auto q = presets::FiddlerSpec::build(reg_shape, {.expert_budget_bytes = 3 * f16}, ManualLoader{},
                                       {}, in);
  CHECK(q->stats().bytes_preloaded == 0);
  CHECK(presets::FiddlerSpec::place(*q, in) == 3);
}
