#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "moekit/score/static_bitwidth.hpp"
#include "support/routing.hpp"

using namespace moekit;
using test::ctx;
using test::Route;

namespace {
std::string error_of(std::string_view text) {
  try {
    (void)PrecisionTable::parse(text, "bits.txt");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_format);
    return e.message();
  }
  return "no error";
}
}  // namespace

TEST_CASE("PrecisionTable text round trip and file I/O", "[score][edgemoe]") {
  PrecisionTable t(3, 4, Precision::q4);
  t.set({0, 1}, Precision::q2);
  t.set({2, 3}, Precision::q8);
  t.set({1, 0}, Precision::f32);
  const std::string text = t.to_text();
  CHECK(text ==
        "moekit-precision-table 1\nlayers 3 experts 4\nq4 q2 q4 q4\nf32 q4 q4 q4\n"
        "q4 q4 q4 q8\n");
  CHECK(PrecisionTable::parse(text) == t);
  CHECK(PrecisionTable::parse("# comment\n  moekit-precision-table 1  \r\nlayers 1 experts 2 # x\n"
                              "\nq2 f16\n")
            .at({0, 1}) == Precision::f16);
  const std::string path = std::string(MOEKIT_BINARY_DIR) + "/score_bits_test.txt";
  t.save(path);
  CHECK(PrecisionTable::load(path) == t);
  CHECK(StaticBitwidthScorer::from_file(path).config().table == t);
  std::remove(path.c_str());
  CHECK(t.count(Precision::q4) == 9);
}

TEST_CASE("PrecisionTable: malformed files name the file, line and field", "[score][edgemoe]") {
  CHECK(error_of("") == "bits.txt:1: empty file: expected header 'moekit-precision-table 1'");
  CHECK(error_of("moekit-precision-table 2\n") ==
        "bits.txt:1: unsupported version '2' (this build reads version 1)");
  CHECK(error_of("moekit-precision-table 1\nlayers 2 experts x\n") ==
        "bits.txt:2: expected 'layers <n_layers> experts <n_experts>' with positive counts");
  CHECK(error_of("moekit-precision-table 1\nlayers 2 experts 2\nq4 q4\nq4 q3\n") ==
        "bits.txt:4: field 'layer 1 expert 1': 'q3' is not a stored precision (f32 bf16 f16 q8 "
        "q4 q2)");
  CHECK(error_of("moekit-precision-table 1\nlayers 2 experts 2\nq4 skip\n") ==
        "bits.txt:3: field 'layer 0 expert 1': 'skip' is not a stored precision (f32 bf16 f16 "
        "q8 q4 q2)");
  CHECK(error_of("moekit-precision-table 1\nlayers 2 experts 2\nq4 q4 q4\n") ==
        "bits.txt:3: field 'layer 0': 3 precisions, expected 2");
  CHECK(error_of("moekit-precision-table 1\nlayers 2 experts 2\nq4 q4\n") ==
        "bits.txt:4: field 'layer 1': missing (the header promises 2 layers)");
  CHECK(error_of("moekit-precision-table 1\nlayers 1 experts 1\nq4\nq4\n") ==
        "bits.txt:4: unexpected content after the last layer");
  // Was an out-of-memory crash of the fuzz target: a header promising more precisions than the
  // text holds was allocated first (10^10 bytes for 'layers 100000 experts 100000').
  CHECK(error_of("moekit-precision-table 1\nlayers 100000 experts 100000\n") ==
        "bits.txt:2: 'layers 100000 experts 100000' promises 10000000000 precisions, more than the "
        "54 bytes of the file can hold");
  CHECK(error_of("moekit-precision-table 1\nlayers 4000000 experts 4000000\n") ==
        "bits.txt:2: 'layers 4000000 experts 4000000' promises 16000000000000 precisions, more "
        "than the 56 bytes of the file can hold");
  try {
    (void)PrecisionTable::load("/nonexistent/bits.txt");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::io);
    CHECK(e.message().find("/nonexistent/bits.txt") != std::string::npos);
  }
}

TEST_CASE("StaticBitwidthScorer returns the table's precision and never skips",
          "[score][edgemoe]") {
  PrecisionTable t(2, 4, Precision::q4);
  t.set({1, 2}, Precision::q2);
  StaticBitwidthScorer s({t});
  const std::vector<ExpertDemand> d{{2, 1, 0.05f, 0.05f, 1}, {0, 1, 0.95f, 0.95f, 0}};
  std::vector<Precision> out(2);
  s.score(ctx(1, 2), Route(4, {{0, 2}}, {{0.95f, 0.05f}}).view(), d, out);
  CHECK(out == std::vector<Precision>{Precision::q2, Precision::q4});
  s.score(ctx(0, 2), Route(4, {{0, 2}}, {{0.95f, 0.05f}}).view(), d, out);
  CHECK(out == std::vector<Precision>{Precision::q4, Precision::q4});
  CHECK_THROWS_AS(s.score(ctx(2, 3), Route(4, {{0, 2}}).view(), d, out), Error);
  CHECK_THROWS_AS(StaticBitwidthScorer({}), Error);
}
