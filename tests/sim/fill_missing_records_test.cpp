// fill_missing_records: the rule moe-sim and moe-run --routing-trace share for missing records,
// checked against a per-record search of the original trace (the nearest earlier record of the
// sequence at that layer, else the nearest later one) on random traces with every optional array.

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moekit/sim/fill_missing_records.hpp"
#include "moekit/sim/trace.hpp"
#include "support/random_trace.hpp"

using namespace moekit;
using namespace moekit::sim;

namespace {

// The record (token, layer) of `original` a fill must copy: searched record by record.
std::optional<std::size_t> expected_source(const RoutingTrace& original, std::size_t s,
                                           std::size_t t, std::uint32_t l) {
  const std::size_t first = original.global_token(s, 0);
  for (std::size_t back = t + 1; back-- > first;)
    if (original.valid(back, l)) return back;
  for (std::size_t fwd = t; fwd < first + original.sequence_length(s); ++fwd)
    if (original.valid(fwd, l)) return fwd;
  return std::nullopt;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](float x, float y) {
    return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
  });
}

// Record (ta, l) of `a` is record (tb, l) of `b`, every array bit for bit.
bool same_record(const RoutingTrace& a, std::size_t ta, const RoutingTrace& b, std::size_t tb,
                 std::uint32_t l) {
  const auto ea = a.experts(ta, l), eb = b.experts(tb, l);
  return std::equal(ea.begin(), ea.end(), eb.begin(), eb.end()) &&
         same_bits(a.weights(ta, l), b.weights(tb, l)) &&
         same_bits(a.logits(ta, l), b.logits(tb, l)) && same_bits(a.hidden(ta, l), b.hidden(tb, l));
}

}  // namespace

TEST_CASE("fill_missing_records copies the nearest earlier record of the sequence at that layer",
          "[sim][trace][missing]") {
  for (std::uint64_t seed = 1; seed <= 24; ++seed) {
    const unsigned gap = 1 + static_cast<unsigned>(seed % 4);  // 1: nothing to fill from
    const test::RandomTraceShape shape{
        .n_layers = 4, .n_experts = 8, .sequences = 3, .tokens = 9, .prefill = 3, .gap = gap};
    const RoutingTrace original =
        test::random_trace(seed, seed % 2 == 0, seed % 3 == 0 ? 5 : 0, shape);
    RoutingTrace filled = original;
    const std::size_t n = fill_missing_records(filled);
    INFO("seed " << seed << ", one record in " << gap << " missing");
    CHECK(n == original.missing_count() - filled.missing_count());
    for (std::size_t s = 0; s < original.sequence_count(); ++s)
      for (std::size_t i = 0; i < original.sequence_length(s); ++i)
        for (std::uint32_t l = 0; l < original.dims().n_layers; ++l) {
          const std::size_t t = original.global_token(s, i);
          const auto src = expected_source(original, s, t, l);
          INFO("sequence " << s << ", token " << i << ", layer " << l);
          if (!src) {
            CHECK_FALSE(filled.valid(t, l));  // no record at this layer in the whole sequence
            continue;
          }
          REQUIRE(filled.valid(t, l));
          CHECK(same_record(filled, t, original, *src, l));  // its own when it had one
        }
    CHECK(fill_missing_records(filled) == 0);  // a second fill finds nothing to do
  }
}

TEST_CASE("fill_missing_records: leading gaps take the first record; other sequences are apart",
          "[sim][trace][missing]") {
  const TraceDims d{.n_layers = 2, .n_experts = 4, .top_k = 2};
  RoutingTrace t(d, "hand-made");
  const std::vector<float> w{0.75f, 0.25f};
  t.begin_sequence("a");
  for (int i = 0; i < 4; ++i) t.append_token(Phase::decode);
  t.set_route(1, 0, std::vector<std::uint32_t>{1, 2}, w);
  t.set_route(3, 0, std::vector<std::uint32_t>{3, 0}, w);
  t.begin_sequence("b");  // layer 0 never recorded: sequence a's records must not leak into it
  t.append_token(Phase::decode);
  t.set_route(4, 1, std::vector<std::uint32_t>{2, 3}, w);

  CHECK(fill_missing_records(t) == 2);  // a: tokens 0 and 2 at layer 0
  CHECK(t.experts(0, 0)[0] == 1);       // before the first record: the first record
  CHECK(t.experts(2, 0)[0] == 1);       // after it: the previous token's
  CHECK(t.experts(3, 0)[0] == 3);       // its own
  for (std::size_t tok = 0; tok < 4; ++tok) CHECK_FALSE(t.valid(tok, 1));
  CHECK_FALSE(t.valid(4, 0));
  CHECK(t.missing_count() == 5);
}
