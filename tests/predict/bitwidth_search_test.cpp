#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <vector>

#include "moekit/tools/bitwidth_search.hpp"

using namespace moekit;
using tools::bitwidth_search;
using tools::BitwidthSearchConfig;

namespace {
// The paper's uniform losses (Fig. 6 / §III-B): INT2 5.82 %, INT4 1.44 %, INT8 0.10 %, FP32 0.
double uniform_loss(Precision p) {
  switch (p) {
    case Precision::q2:
      return 5.82;
    case Precision::q4:
      return 1.44;
    case Precision::q8:
      return 0.10;
    default:
      return 0.0;
  }
}
// Loss of a table whose experts are all at one precision, else a per-expert sum.
double paper_eval(const PrecisionTable& t) {
  const Precision first = t.all()[0];
  if (t.count(first) == t.size()) return uniform_loss(first);
  return 100.0;  // mixed tables are not part of these cases
}
}  // namespace

TEST_CASE("Bit-width search: bounds from uniform precisions (spec §7 3)", "[tools][edgemoe]") {
  auto r2 = [&](double P) {
    BitwidthSearchConfig c;
    c.loss_budget = P;
    c.importance.assign(4, 0.0);
    // mixed tables with low precision cost more than the budget: K* = 0
    return bitwidth_search(2, 2, paper_eval, c);
  };
  CHECK(r2(2.0).low == Precision::q2);
  CHECK(r2(2.0).high == Precision::q4);
  CHECK(r2(2.0).k == 0);
  CHECK(r2(2.0).table == PrecisionTable(2, 2, Precision::q4));
  const auto all2 = r2(6.0);
  CHECK(all2.high == Precision::q2);
  CHECK(all2.table == PrecisionTable(2, 2, Precision::q2));
  CHECK(all2.evaluations == 1);
  CHECK(r2(1.0).low == Precision::q4);
  CHECK(r2(1.0).high == Precision::q8);
  CHECK(r2(0.0).low == Precision::q8);
  CHECK(r2(0.0).high == Precision::f32);
  CHECK_THROWS_WITH(bitwidth_search(2, 2, [](const PrecisionTable&) { return 50.0; }, {}),
                    Catch::Contains("no candidate precision meets the loss budget"));
}

TEST_CASE("Bit-width search: K search against a monotone mock (spec §7 4, 5)", "[tools][edgemoe]") {
  // 12 layers x 8 experts = 96; each expert at q2 costs 0.125 plus its importance bonus, which
  // makes experts of higher (layer, expert) index more important; q4 and above cost nothing.
  const std::uint32_t L = 12, E = 8;
  std::size_t calls = 0;
  auto eval = [&](const PrecisionTable& t) {
    ++calls;
    double loss = 0;
    for (std::size_t i = 0; i < t.size(); ++i)
      if (t.all()[i] == Precision::q2) loss += 0.125;
    return loss;
  };
  BitwidthSearchConfig c;
  c.loss_budget = 2.5;  // K* = 20
  const auto r = bitwidth_search(L, E, eval, c);
  CHECK(r.low == Precision::q2);
  CHECK(r.high == Precision::q4);
  CHECK(r.uniform_loss == std::vector<double>{12.0, 0.0});
  CHECK(r.k == 20);
  CHECK(r.loss == 2.5);
  CHECK(r.table.count(Precision::q2) == 20);
  CHECK(r.search_evaluations <= 2 * 7 + 1);  // 2 ceil(log2(N + 1)) + 1
  CHECK(r.evaluations == 2 + 96 + r.search_evaluations);
  CHECK(calls == r.evaluations);
  // equal importance: ties in (layer, expert) order, so the first 20 keys are the q2 ones
  for (std::size_t i = 0; i < r.order.size(); ++i)
    CHECK((r.table.at(r.order[i]) == Precision::q2) == (i < 20));
  CHECK(r.order[0] == ExpertKey{0, 0});
  CHECK(r.order[19] == ExpertKey{2, 3});
}

TEST_CASE("Bit-width search: importance order decides who goes low; non-monotone loss",
          "[tools][edgemoe]") {
  const std::uint32_t L = 2, E = 4;
  // importance given: expert (1, 2) least important, then (0, 3), ...
  BitwidthSearchConfig c;
  c.loss_budget = 1.0;
  c.importance = {0.7, 0.6, 0.5, 0.2, 0.9, 0.8, 0.1, 0.3};
  auto eval = [](const PrecisionTable& t) {
    return t.count(Precision::q2) == t.size() ? 9.0 : 0.4 * double(t.count(Precision::q2));
  };
  const auto r = bitwidth_search(L, E, eval, c);
  CHECK(r.k == 2);
  CHECK(r.table.at({1, 2}) == Precision::q2);
  CHECK(r.table.at({0, 3}) == Precision::q2);
  CHECK(r.table.count(Precision::q2) == 2);

  // non-monotone: K = 1, 2 feasible, 4 infeasible, 3 feasible, but say 3 fails and 8 would pass:
  // the result is always a K that was evaluated and met the budget
  std::map<std::size_t, double> loss_of{{1, 0.5}, {2, 0.9}, {3, 1.5}, {4, 2.0}, {8, 0.1}};
  auto weird = [&](const PrecisionTable& t) {
    const std::size_t k = t.count(Precision::q2);
    if (k == t.size()) return 9.0;
    if (k == 0) return 0.0;
    return loss_of.count(k) ? loss_of[k] : 5.0;
  };
  BitwidthSearchConfig c2;
  c2.loss_budget = 1.0;
  c2.importance.assign(8, 0.0);
  const auto w = bitwidth_search(L, E, weird, c2);
  CHECK(w.k == 2);
  CHECK(w.loss == 0.9);
  CHECK(weird(w.table) <= 1.0);
}
