// moe-run's command line: byte sizes with units, and errors that name the flag.

#include <catch2/catch.hpp>

#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/engine/cli.hpp"

using namespace moekit::engine;

namespace {
struct Parsed {
  int rc = 0;
  std::string out, err;
  Options options;
};
Parsed parse(std::vector<const char*> args) {
  args.insert(args.begin(), "moe-run");
  Cli cli;
  std::ostringstream out, err;
  Parsed p;
  p.rc = cli.parse(static_cast<int>(args.size()), args.data(), out, err);
  p.out = out.str();
  p.err = err.str();
  p.options = cli.options();
  return p;
}

// Each of `bad` given to `flag` is refused with an error naming the flag and the words it takes.
void check_refused(const char* flag, std::initializer_list<const char*> bad,
                   const std::string& words) {
  for (const char* value : bad) {
    const auto p = parse({flag, value});
    INFO(flag << " " << value << ": " << p.err);
    CHECK(p.rc != 0);
    CHECK(p.err.find(flag) != std::string::npos);
    CHECK(p.err.find(words) != std::string::npos);
  }
}
}  // namespace

TEST_CASE("expert budgets parse with binary and decimal units", "[engine][cli]") {
  CHECK(parse_budget("all").kind == BudgetSpec::Kind::all);
  CHECK(parse_budget("2GiB").resolve(0) == 2ull << 30);
  CHECK(parse_budget("2G").resolve(0) == 2ull << 30);
  CHECK(parse_budget("1.5gib").resolve(0) == 3ull << 29);
  CHECK(parse_budget("300MB").resolve(0) == 300'000'000ull);
  CHECK(parse_budget("512KiB").resolve(0) == 512ull << 10);
  CHECK(parse_budget("123456").resolve(0) == 123456ull);
  CHECK(parse_budget("50%").resolve(1000) == 500ull);
  for (const char* bad : {"", "GiB", "2XB", "-1G", "0", "1.2.3G", "150%", "0%"}) {
    INFO(bad);
    try {
      (void)parse_budget(bad);
      FAIL("accepted");
    } catch (const moekit::Error& e) {
      CHECK(std::string(e.message()).find("--expert-budget") != std::string::npos);
    }
  }
}

TEST_CASE("flags set the options", "[engine][cli]") {
  const auto p = parse({"-m",
                        "dir",
                        "-p",
                        "hi",
                        "-n",
                        "5",
                        "-t",
                        "2",
                        "--temp",
                        "0",
                        "--top-p",
                        "0.5",
                        "--seed",
                        "9",
                        "--preset",
                        "baseline",
                        "--expert-budget",
                        "1MiB",
                        "--precision",
                        "q4",
                        "--json"});
  REQUIRE(p.rc == 0);
  CHECK(p.options.model == "dir");
  CHECK(p.options.prompt == "hi");
  CHECK(p.options.n_predict == 5);
  CHECK(p.options.threads == 2);
  CHECK(p.options.temperature == 0.f);
  CHECK(p.options.top_p == 0.5f);
  CHECK(p.options.seed == 9);
  CHECK(p.options.budget.resolve(0) == 1u << 20);
  CHECK(p.options.precision == moekit::Precision::q4);
  CHECK(p.options.json);
}

TEST_CASE("bad flags are refused naming the flag", "[engine][cli]") {
  auto refused = [](std::vector<const char*> args, const std::string& flag) {
    const auto p = parse(args);
    INFO(p.err);
    CHECK(p.rc != 0);
    CHECK(p.err.find(flag) != std::string::npos);
  };
  refused({"--bogus"}, "--bogus");
  refused({"--precision", "q3"}, "--precision");
  refused({"--precision", "skip"}, "--precision");
  refused({"--preset", "hobbit-ish"}, "--preset");
  refused({"--expert-budget", "lots"}, "--expert-budget");
  refused({"-n", "many"}, "-n");
  refused({"--temp", "-1"}, "--temp");
  refused({"--top-p", "0"}, "--top-p");
}

TEST_CASE("an impossible expert budget is refused with the minimum that works", "[engine][cli]") {
  const moekit::ModelShape s{.n_layers = 2, .n_experts = 4, .top_k = 2, .hidden = 32, .ffn = 32};
  const std::size_t one = s.expert_bytes(moekit::Precision::f16);
  CHECK(minimum_expert_budget(s, moekit::Precision::f16) == 2 * one);
  CHECK_NOTHROW(check_budget(s, {2 * one, moekit::Precision::f16}));
  CHECK_NOTHROW(check_budget(s, {0, moekit::Precision::f16}));  // 0 = all resident
  try {
    check_budget(s, {2 * one - 1, moekit::Precision::f16});
    FAIL("accepted");
  } catch (const moekit::Error& e) {
    INFO(e.message());
    CHECK(e.message().find("--expert-budget") != std::string::npos);
    CHECK(e.message().find("minimum at f16 is " + std::to_string(2 * one)) != std::string::npos);
  }
}

TEST_CASE("moe-run --activations parses auto, f32 and int8 and refuses the rest", "[engine][cli]") {
  CHECK(parse({}).options.activations == ActivationMode::automatic);
  CHECK(parse({"--activations", "f32"}).options.activations == ActivationMode::f32);
  CHECK(parse({"--activations", "int8"}).options.activations == ActivationMode::int8);
  CHECK(parse({"--activations", "auto"}).options.activations == ActivationMode::automatic);
  check_refused("--activations", {"q8", "INT8", "", "fp32"}, "auto, f32, int8");
}

TEST_CASE(
    "moe-run --dense-precision parses auto and the float and 8/4-bit formats, refuses the rest",
    "[engine][cli]") {
  CHECK_FALSE(parse({}).options.dense_precision.has_value());
  CHECK_FALSE(parse({"--dense-precision", "auto"}).options.dense_precision.has_value());
  CHECK(parse({"--dense-precision", "bf16"}).options.dense_precision == moekit::Precision::bf16);
  CHECK(parse({"--dense-precision", "q8"}).options.dense_precision == moekit::Precision::q8);
  check_refused("--dense-precision", {"q2", "skip", "", "fp16", "BF16"},
                "auto, f32, bf16, f16, q8, q4");
}

TEST_CASE("moe-run --row-streaming parses auto and 1/2/4 with an optional p, refuses the rest",
          "[engine][cli]") {
  CHECK_FALSE(parse({}).options.row_streaming.has_value());
  CHECK_FALSE(parse({"--row-streaming", "auto"}).options.row_streaming.has_value());
  CHECK(parse({"--row-streaming", "2"}).options.row_streaming == moekit::RowStreaming{2, false});
  CHECK(parse({"--row-streaming", "4p"}).options.row_streaming == moekit::RowStreaming{4, true});
  CHECK(parse({"--row-streaming", "1p"}).options.row_streaming == moekit::RowStreaming{1, true});
  check_refused("--row-streaming", {"3", "p", "2pp", "", "8p", "two"}, "auto, 1, 1p, 2, 2p, 4, 4p");
}

TEST_CASE(
    "moe-run --expert-layout parses auto, rows, panels and blocked-panels and refuses the rest",
    "[engine][cli]") {
  CHECK_FALSE(parse({}).options.expert_layout.has_value());
  CHECK_FALSE(parse({"--expert-layout", "auto"}).options.expert_layout.has_value());
  CHECK(parse({"--expert-layout", "rows"}).options.expert_layout == moekit::MatrixOrder::rows);
  CHECK(parse({"--expert-layout", "panels"}).options.expert_layout == moekit::MatrixOrder::panels4);
  CHECK(parse({"--expert-layout", "blocked-panels"}).options.expert_layout ==
        moekit::MatrixOrder::blocked_panels4);
  check_refused("--expert-layout", {"panels4", "blocked_panels4", "ROWS", "", "columns"},
                "auto, rows, panels, blocked-panels");
}

TEST_CASE("moe-run --expert-layout auto: the per-core table", "[engine][cli]") {
  using moekit::CpuCore;
  using moekit::MatrixOrder;
  // bench/RESULTS.md, "Expert layout per CPU core": rows on Ice Lake server and Xeons with AMX,
  // blocked panels on Zen 5 and (unmeasured) elsewhere; float activations always read rows.
  STATIC_REQUIRE(auto_expert_order(CpuCore::icelake_server, true) == MatrixOrder::rows);
  STATIC_REQUIRE(auto_expert_order(CpuCore::xeon_amx, true) == MatrixOrder::rows);
  STATIC_REQUIRE(auto_expert_order(CpuCore::zen5, true) == MatrixOrder::blocked_panels4);
  STATIC_REQUIRE(auto_expert_order(CpuCore::zen4, true) == MatrixOrder::blocked_panels4);
  STATIC_REQUIRE(auto_expert_order(CpuCore::other, true) == MatrixOrder::blocked_panels4);
  for (CpuCore c :
       {CpuCore::icelake_server, CpuCore::xeon_amx, CpuCore::zen4, CpuCore::zen5, CpuCore::other})
    CHECK(auto_expert_order(c, false) == MatrixOrder::rows);
  CHECK(moekit::name(CpuCore::icelake_server) == "icelake-server");
  CHECK(moekit::name(CpuCore::xeon_amx) == "xeon-amx");
}

TEST_CASE("moe-run --activations resolves against the experts' precisions, width and the CPU",
          "[engine][cli]") {
  using moekit::Precision;
  const std::vector<Precision> q4{Precision::q4}, f16{Precision::f16},
      mixed{Precision::f16, Precision::q4};
  const std::size_t wide = int8_min_row_width, narrow = int8_min_row_width - 1;
  // auto: int8 exactly when some expert is quantized, its rows are wide enough and the CPU runs
  // the int8 kernels (AVX2 at least).
  CHECK(resolve_int8_activations(ActivationMode::automatic, q4, wide, true));
  CHECK(resolve_int8_activations(ActivationMode::automatic, mixed, wide, true));
  CHECK_FALSE(resolve_int8_activations(ActivationMode::automatic, q4, narrow, true));
  CHECK_FALSE(resolve_int8_activations(ActivationMode::automatic, q4, wide, false));
  CHECK_FALSE(resolve_int8_activations(ActivationMode::automatic, f16, wide, true));
  // GGUF K-quants read in place have int8 kernels of their own.
  const std::vector<Precision> q4_k{Precision::q4_k}, q2_k{Precision::q2_k, Precision::q3_k};
  CHECK(resolve_int8_activations(ActivationMode::automatic, q4_k, wide, true));
  CHECK(resolve_int8_activations(ActivationMode::automatic, q2_k, wide, true));
  CHECK_FALSE(resolve_int8_activations(ActivationMode::f32, q4, wide, true));
  // An explicit int8 ignores the width (narrow rows run, just not faster).
  CHECK(resolve_int8_activations(ActivationMode::int8, mixed, narrow, true));
  // int8 applies to quantized experts only: nothing to apply it to at f16.
  CHECK_FALSE(resolve_int8_activations(ActivationMode::int8, f16, wide, true));
  try {
    (void)resolve_int8_activations(ActivationMode::int8, q4, wide, false);
    FAIL("int8 accepted without the int8 kernels");
  } catch (const moekit::Error& e) {
    INFO(e.message());
    CHECK(e.kind() == moekit::ErrorKind::unsupported);
    CHECK(e.message().find("--activations int8") != std::string::npos);
    CHECK(e.message().find("AVX2") != std::string::npos);
  }
  CHECK(activations_name(true) == "int8");
  CHECK(activations_name(false) == "f32");
}

TEST_CASE("moe-run --routing-trace takes a file and refuses --perplexity",
          "[engine][cli][replay]") {
  CHECK(parse({}).options.routing_trace.empty());
  const auto p = parse({"--routing-trace", "t.jsonl"});
  CHECK(p.rc == 0);
  CHECK(p.options.routing_trace == "t.jsonl");
  const auto q = parse({"--routing-trace", "t.jsonl", "--perplexity", "text.txt"});
  CHECK(q.rc != 0);
  CHECK(q.err.find("--routing-trace") != std::string::npos);
  CHECK(q.err.find("--perplexity") != std::string::npos);
}

TEST_CASE("moe-run --help states what each input file and calibration is (issue 22, claims)",
          "[engine][cli]") {
  const auto help = parse({"--help"});
  REQUIRE(help.rc == 0);
  // The help entry of `flag`: its line and, when CLI11 moved the description below a long
  // option column, the lines up to the next option.
  auto line_of = [&](const std::string& flag) {
    const auto at = help.out.find("  " + flag + " ");
    REQUIRE(at != std::string::npos);
    return help.out.substr(at, help.out.find("\n  -", at) - at);
  };
  // --bitwidth-table reads PrecisionTable's text format; only --popularity is JSON.
  const std::string table = line_of("--bitwidth-table");
  CHECK_THAT(table,
             Catch::Contains("text file (not JSON)") && Catch::Contains("moekit-precision-table"));
  CHECK_THAT(line_of("--popularity"), Catch::Contains("JSON"));
  // --lookahead says the predictor's range, and the parser holds to it.
  CHECK_THAT(line_of("--lookahead"), Catch::Contains("1..3"));
  CHECK(parse({"--preset", "hobbit", "--lookahead", "3"}).rc == 0);
  check_refused("--lookahead", {"0", "4", "64"}, "not in range 1 to 3");
  // Fiddler calibrates on --calib-text, not on the prompt (issue 22, calibration).
  const auto fiddler = help.out.find("fiddler: Fiddler:");
  REQUIRE(fiddler != std::string::npos);
  CHECK_THAT(help.out.substr(fiddler, help.out.find('\n', fiddler) - fiddler),
             Catch::Contains("calibration run on --calib-text"));
}
