// RoutingTrace: layout, binary and JSONL round trips, every reader validation error, importers
// for the shared Mixtral traces (hand-written snippets here; the real files when present).

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "moekit/sim/trace.hpp"
#include "moekit/sim/trace_binary.hpp"
#include "moekit/sim/trace_jsonl.hpp"
#include "moekit/sim/trace_stats.hpp"
#include "support/random_trace.hpp"

using namespace moekit;
using namespace moekit::sim;

namespace {

using moekit::test::random_trace;

std::string temp_path(const std::string& leaf) {
  auto dir =
      std::filesystem::temp_directory_path() / ("moekit-sim-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto p = dir / leaf;
  std::filesystem::remove(p);
  return p.string();
}

template <class F>
void require_format_error(F&& f, const std::string& field) {
  try {
    f();
    FAIL("expected moekit::Error mentioning '" << field << "'");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.kind() == ErrorKind::invalid_format);
    CHECK(e.message().find(field) != std::string::npos);
  }
}

template <class T>
void poke(std::vector<std::byte>& b, std::size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

constexpr std::size_t header_bytes = 56;

}  // namespace

TEST_CASE("RoutingTrace stores records flat and marks missing ones", "[sim][trace]") {
  RoutingTrace t(TraceDims{.n_layers = 2, .n_experts = 4, .top_k = 2}, "t");
  t.begin_sequence("a");
  const auto g0 = t.append_token(Phase::prefill);
  const auto g1 = t.append_token(Phase::decode);
  const std::uint32_t ids[] = {3, 1};
  const float w[] = {0.75f, 0.25f};
  t.set_route(g1, 1, ids, w);
  CHECK(t.token_count() == 2);
  CHECK(t.record_count() == 4);
  CHECK(t.missing_count() == 3);
  CHECK_FALSE(t.valid(g0, 0));
  CHECK(t.valid(g1, 1));
  CHECK(t.experts(g1, 1)[0] == 3);
  CHECK(t.weights(g1, 1)[1] == 0.25f);
  CHECK(t.experts(g0, 1)[0] == missing_expert);
  CHECK(t.prefill_length(0) == 1);
  CHECK(t.route(g1, 1).experts.size() == 2);
  CHECK(t.logits(g1, 1).empty());
  // Invalid records are refused.
  const std::uint32_t dup[] = {1, 1}, big[] = {4, 1};
  const float asc[] = {0.25f, 0.75f}, nan[] = {NAN, 0.5f};
  CHECK_THROWS_AS(t.set_route(g0, 0, dup, w), Error);
  CHECK_THROWS_AS(t.set_route(g0, 0, big, w), Error);
  CHECK_THROWS_AS(t.set_route(g0, 0, ids, asc), Error);
  CHECK_THROWS_AS(t.set_route(g0, 0, ids, nan), Error);
  CHECK_THROWS_AS(t.append_token(Phase::prefill), Error);  // prefill after decode
}

TEST_CASE("normalize_route sorts descending and normalises", "[sim][trace]") {
  std::vector<std::uint32_t> ids{3, 5, 1};
  std::vector<float> w{0.5f, 1.0f, 0.5f};
  normalize_route(ids, w);
  CHECK(ids == std::vector<std::uint32_t>{5, 1, 3});  // tie 0.5: ascending id
  CHECK(w[0] == Approx(0.5));
  CHECK(w[1] == Approx(0.25));
}

TEST_CASE("binary format round-trips every field", "[sim][trace][binary]") {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    const bool logits = seed != 1;
    const std::uint32_t hidden = seed == 3 ? 5 : 0;
    const RoutingTrace t = random_trace(seed, logits, hidden);
    const auto bytes = serialize_trace_binary(t);
    const RoutingTrace back = parse_trace_binary(bytes, "mem");
    CHECK(back == t);
    CHECK(back.synthetic() == t.synthetic());
    CHECK(back.missing_count() == t.missing_count());
    CHECK(t.missing_count() > 0);
  }
}

TEST_CASE("binary writer refuses to overwrite unless asked", "[sim][trace][binary]") {
  const RoutingTrace t = random_trace(4, true, 0);
  const std::string path = temp_path("t.mktrace");
  write_trace_binary(t, path);
  CHECK(read_trace_binary(path) == t);
  try {
    write_trace_binary(t, path);
    FAIL("overwrote an existing file");
  } catch (const Error& e) {
    CHECK(e.message().find("refusing to overwrite") != std::string::npos);
    CHECK(e.message().find(path) != std::string::npos);
  }
  write_trace_binary(t, path, /*overwrite=*/true);
  CHECK(read_trace_binary(path) == t);
  std::filesystem::remove(path);
  CHECK_THROWS_AS(read_trace_binary(path), Error);  // io error naming the path
}

TEST_CASE("binary reader rejects malformed input naming the field", "[sim][trace][binary]") {
  const RoutingTrace t = random_trace(2, true, 0);
  const auto good = serialize_trace_binary(t);
  const std::size_t name_len = t.name().size();
  // Offsets of the arrays: header, name, sequence table (12 bytes + name per sequence).
  std::size_t seq_table = 0;
  for (std::size_t s = 0; s < t.sequence_count(); ++s) seq_table += 12 + t.sequence_name(s).size();
  const std::size_t phases_at = header_bytes + name_len + seq_table;
  const std::size_t experts_at = phases_at + t.token_count();
  const std::size_t weights_at = experts_at + t.all_experts().size_bytes();
  // First valid record's slot.
  std::size_t rec = 0;
  while (t.all_experts()[rec * 2] == missing_expert) ++rec;

  SECTION("empty and truncated") {
    require_format_error([&] { (void)parse_trace_binary({}, "f.bin"); }, "magic");
    for (std::size_t cut : {std::size_t{10}, std::size_t{40}, phases_at + 2, good.size() - 1}) {
      auto b = good;
      b.resize(cut);
      INFO("cut at " << cut);
      CHECK_THROWS_AS(parse_trace_binary(b, "f.bin"), Error);
    }
    auto b = good;
    b.resize(good.size() - 4);
    require_format_error([&] { (void)parse_trace_binary(b, "f.bin"); }, "n_tokens");
  }
  SECTION("names the source") {
    auto b = good;
    b[0] = std::byte{'X'};
    try {
      (void)parse_trace_binary(b, "some/file.mktrace");
      FAIL();
    } catch (const Error& e) {
      CHECK(e.message().find("some/file.mktrace") != std::string::npos);
      CHECK(e.message().find("magic") != std::string::npos);
    }
  }
  SECTION("header fields") {
    auto b = good;
    poke<std::uint32_t>(b, 8, 2);
    require_format_error([&] { (void)parse_trace_binary(b); }, "version");
    b = good;
    poke<std::uint32_t>(b, 12, 1u << 7);
    require_format_error([&] { (void)parse_trace_binary(b); }, "flags");
    b = good;
    poke<std::uint32_t>(b, 16, 0);
    require_format_error([&] { (void)parse_trace_binary(b); }, "n_layers");
    b = good;
    poke<std::uint32_t>(b, 24, 7);  // top_k > n_experts
    require_format_error([&] { (void)parse_trace_binary(b); }, "top_k");
    b = good;
    poke<std::uint32_t>(b, 28, 3);  // hidden without its flag
    require_format_error([&] { (void)parse_trace_binary(b); }, "hidden");
    b = good;
    poke<std::uint64_t>(b, 32, std::uint64_t{1} << 60);
    require_format_error([&] { (void)parse_trace_binary(b); }, "n_sequences");
    b = good;
    poke<std::uint64_t>(b, 40, t.token_count() + 1);
    require_format_error([&] { (void)parse_trace_binary(b); }, "n_tokens");
    b = good;
    poke<std::uint32_t>(b, 52, 1);
    require_format_error([&] { (void)parse_trace_binary(b); }, "reserved");
    b = good;
    poke<std::uint32_t>(b, 20, 2);  // n_experts 2: the counts no longer match the size
    CHECK_THROWS_AS(parse_trace_binary(b), Error);
  }
  SECTION("counts inconsistent with size") {
    auto b = good;
    b.push_back(std::byte{0});
    require_format_error([&] { (void)parse_trace_binary(b); }, "n_tokens");
    b = good;
    poke<std::uint64_t>(b, header_bytes + name_len, 1);  // first sequence length
    require_format_error([&] { (void)parse_trace_binary(b); }, "sequence.n_tokens");
  }
  SECTION("records") {
    auto b = good;
    b[phases_at] = std::byte{7};
    require_format_error([&] { (void)parse_trace_binary(b); }, "phases");
    b = good;
    b[phases_at + 3] = std::byte{0};  // prefill after decode in sequence 0
    require_format_error([&] { (void)parse_trace_binary(b); }, "phases");
    b = good;
    poke<std::uint32_t>(b, experts_at + rec * 8, 6);  // id out of range
    require_format_error([&] { (void)parse_trace_binary(b); }, "experts");
    b = good;
    poke<std::uint32_t>(b, experts_at + rec * 8, t.all_experts()[rec * 2 + 1]);  // duplicate
    require_format_error([&] { (void)parse_trace_binary(b); }, "experts");
    b = good;
    poke<std::uint32_t>(b, experts_at + rec * 8 + 4, missing_expert);  // half missing
    require_format_error([&] { (void)parse_trace_binary(b); }, "experts");
    b = good;
    poke<float>(b, weights_at + rec * 8, NAN);
    require_format_error([&] { (void)parse_trace_binary(b); }, "weights");
    b = good;
    poke<float>(b, weights_at + rec * 8 + 4, 0.99f);  // ascending / sum != 1
    require_format_error([&] { (void)parse_trace_binary(b); }, "weights");
    b = good;
    const std::size_t logits_at = weights_at + t.all_weights().size_bytes();
    poke<float>(b, logits_at + rec * 6 * 4, INFINITY);
    require_format_error([&] { (void)parse_trace_binary(b); }, "logits");
  }
}

TEST_CASE("JSONL round-trips bit-identically", "[sim][trace][jsonl]") {
  for (std::uint64_t seed : {5u, 6u, 7u}) {
    const RoutingTrace t = random_trace(seed, seed != 5, seed == 7 ? 3 : 0);
    const std::string text = serialize_trace_jsonl(t);
    CHECK(parse_trace_jsonl(text, "mem") == t);
  }
  const RoutingTrace t = random_trace(8, false, 0);
  const std::string path = temp_path("t.jsonl");
  write_trace_jsonl(t, path);
  CHECK(read_trace_jsonl(path) == t);
  CHECK_THROWS_AS(write_trace_jsonl(t, path), Error);
  std::filesystem::remove(path);
}

TEST_CASE("JSONL reader rejects malformed input naming line and field", "[sim][trace][jsonl]") {
  const std::string header =
      R"({"format":"moekit-trace","version":1,"name":"x","synthetic":false,"n_layers":2,)"
      R"("n_experts":4,"top_k":2,"hidden":0,"has_logits":false})"
      "\n";
  const std::string seq = "{\"sequence\":\"s\"}\n";
  auto tok = [](const std::string& l0) {
    return R"({"phase":"decode","layers":[)" + l0 + R"(,null]})" + "\n";
  };
  const std::string ok = R"({"experts":[1,2],"weights":[0.75,0.25]})";
  REQUIRE(parse_trace_jsonl(header + seq + tok(ok)).token_count() == 1);
  require_format_error([&] { (void)parse_trace_jsonl(""); }, "format");
  require_format_error([&] { (void)parse_trace_jsonl("{nope\n"); }, "invalid JSON");
  require_format_error([&] { (void)parse_trace_jsonl(R"({"format":"other","version":1})"); },
                       "format");
  require_format_error([&] { (void)parse_trace_jsonl(header + tok(ok)); }, "sequence");
  require_format_error(
      [&] {
        (void)parse_trace_jsonl(header + seq + tok(R"({"experts":[1,9],"weights":[0.75,0.25]})"));
      },
      "experts");
  require_format_error(
      [&] {
        (void)parse_trace_jsonl(header + seq + tok(R"({"experts":[1,1],"weights":[0.75,0.25]})"));
      },
      "experts");
  require_format_error(
      [&] {
        (void)parse_trace_jsonl(header + seq + tok(R"({"experts":[1,2],"weights":[0.25,0.75]})"));
      },
      "weights");
  require_format_error(
      [&] {
        (void)parse_trace_jsonl(header + seq + tok(R"({"experts":[1,2],"weights":[0.75,0.5]})"));
      },
      "weights");
  require_format_error(
      [&] {
        (void)parse_trace_jsonl(
            header + seq + tok(R"({"experts":[1,2],"weights":[0.75,0.25],"logits":[1,2,3,4]})"));
      },
      "logits");
  require_format_error(
      [&] {
        (void)parse_trace_jsonl(header + seq + R"({"phase":"decode","layers":[null]})" + "\n");
      },
      "layers");
  require_format_error(
      [&] {
        (void)parse_trace_jsonl(header + seq + R"({"phase":"middle","layers":[null,null]})" + "\n");
      },
      "phase");
  // Dimensions that would make one token line allocate gigabytes are refused up front.
  require_format_error(
      [&] {
        (void)parse_trace_jsonl(
            R"({"format":"moekit-trace","version":1,"name":"x","synthetic":false,"n_layers":4000,)"
            R"("n_experts":4000000,"top_k":2,"hidden":0,"has_logits":true})");
      },
      "n_layers");
  try {
    (void)parse_trace_jsonl(header + seq + tok(ok) + tok("7"), "f.jsonl");
    FAIL();
  } catch (const Error& e) {
    CHECK(e.message().find("f.jsonl' line 4") != std::string::npos);
  }
}

TEST_CASE("importer for the shared *.decode.jsonl format (hand-written snippet)",
          "[sim][trace][import]") {
  const TraceDims dims{.n_layers = 2, .n_experts = 8, .top_k = 2};
  const RoutingTrace t =
      read_mixtral_decode_jsonl(MOEKIT_TEST_DATA_DIR "/mixtral_decode_snippet.jsonl", dims);
  REQUIRE(t.sequence_count() == 2);
  CHECK(t.sequence_name(0) == "toy/3");
  CHECK(t.sequence_name(1) == "toy/5");
  REQUIRE(t.sequence_length(0) == 3);  // longest layer
  CHECK(t.sequence_length(1) == 1);
  CHECK(t.prefill_length(0) == 0);
  CHECK_FALSE(t.synthetic());
  CHECK(t.experts(1, 0)[0] == 4);
  CHECK(t.weights(2, 0)[0] == 0.9375f);
  CHECK(t.experts(1, 1)[0] == 6);
  CHECK_FALSE(t.valid(2, 1));  // layer 1 is one record short: the tail is missing
  // Ascending weights were put in trace order.
  CHECK(t.experts(3, 0)[0] == 5);
  CHECK(t.weights(3, 0)[0] == 0.75f);
  CHECK(t.missing_count() == 1);

  SECTION("quirk checks") {
    const std::string rec =
        R"({"dataset":"d","problem_id":0,"layer":0,"experts":[1,2],"gating_probs":[0.75,0.25],"token_idx":1})";
    require_format_error([&] { (void)parse_mixtral_decode_jsonl(rec, "m", dims); }, "token_idx");
    const std::string bad_layer =
        R"({"dataset":"d","problem_id":0,"layer":2,"experts":[1,2],"gating_probs":[0.75,0.25],"token_idx":0})";
    require_format_error([&] { (void)parse_mixtral_decode_jsonl(bad_layer, "m", dims); }, "layer");
    const std::string bad_id =
        R"({"dataset":"d","problem_id":0,"layer":0,"experts":[1,8],"gating_probs":[0.75,0.25],"token_idx":0})";
    require_format_error([&] { (void)parse_mixtral_decode_jsonl(bad_id, "m", dims); }, "experts");
    const std::string no_probs =
        R"({"dataset":"d","problem_id":0,"layer":0,"experts":[1,3],"token_idx":0})";
    require_format_error([&] { (void)parse_mixtral_decode_jsonl(no_probs, "m", dims); },
                         "gating_probs");
  }
}

TEST_CASE("importer for the shared *.prefill-decode.raw.jsonl format (hand-written snippet)",
          "[sim][trace][import]") {
  const TraceDims dims{.n_layers = 2, .n_experts = 8, .top_k = 2};
  const RoutingTrace t =
      read_mixtral_raw_jsonl(MOEKIT_TEST_DATA_DIR "/mixtral_raw_snippet.jsonl", dims);
  REQUIRE(t.sequence_count() == 1);
  REQUIRE(t.token_count() == 5);
  CHECK(t.prefill_length(0) == 3);
  CHECK(t.phase(3) == Phase::decode);
  CHECK(t.experts(2, 0)[0] == 1);
  CHECK_FALSE(t.valid(1, 1));  // dropped prefill record stays missing, layers stay aligned
  CHECK(t.experts(2, 1)[0] == 6);
  CHECK(t.experts(3, 0)[0] == 5);
  CHECK(t.experts(3, 1)[0] == 7);
  CHECK_FALSE(t.valid(4, 0));
  CHECK(t.experts(4, 1)[0] == 0);
  CHECK(t.missing_count() == 2);
  const std::string decode_with_pos =
      R"({"dataset":"d","problem_id":0,"layer":1,"token_pos":0,"experts":[1,2],"gating_probs":[0.75,0.25]})"
      "\n"
      R"({"dataset":"d","problem_id":0,"layer":0,"token_pos":3,"experts":[1,2],"gating_probs":[0.75,0.25]})";
  require_format_error([&] { (void)parse_mixtral_raw_jsonl(decode_with_pos, "m", dims); },
                       "token_pos");
  const std::string huge_prompt =
      R"({"dataset":"d","problem_id":0,"layer":0,"token_pos":4000000000,"experts":[1,2],"gating_probs":[0.75,0.25]})";
  require_format_error([&] { (void)parse_mixtral_raw_jsonl(huge_prompt, "m", dims); }, "token_pos");
}

// ---- the real shared traces: read from ../shared/data beside the repository when present -------

namespace {
const std::string shared_traces = MOEKIT_SOURCE_DIR "/../shared/data/traces/mixtral-8x7b/";
bool have(const std::string& leaf) {
  if (std::filesystem::exists(shared_traces + leaf)) return true;
  WARN("SKIPPED: " << shared_traces + leaf
                   << " not found (the shared data lives beside the repository in CI)");
  return false;
}
}  // namespace

TEST_CASE("real GSM8K decode trace reproduces the facts in data/README.md", "[sim][trace][real]") {
  if (!have("gsm8k-p0-p1.decode.jsonl")) return;
  const RoutingTrace t = read_mixtral_decode_jsonl(shared_traces + "gsm8k-p0-p1.decode.jsonl");
  CHECK(t.sequence_count() == 2);
  CHECK(t.record_count() - t.missing_count() == 7889);  // one record per input line
  // HOBBIT T1 = 0.6, T2 = 0.9: ≈ 65 / 32 / 3 % (paper Fig. 5b: 67 / 30 / 3).
  const PrecisionSplit split = hobbit_split(t, 0.6, 0.9);
  CHECK(split.selections == 2 * 7889);
  CHECK(split.high == Approx(0.65).margin(0.01));
  CHECK(split.low == Approx(0.32).margin(0.01));
  CHECK(split.skip == Approx(0.03).margin(0.005));
  // Top-1 reuse ≈ 37 % (uniform 25 %), at least one reused ≈ 59 % (uniform 46 %).
  const ReuseStats r = reuse_stats(t);
  CHECK(r.top1_reused == Approx(0.375).margin(0.01));
  CHECK(r.any_reused == Approx(0.589).margin(0.01));
  // Round trip of a real trace through both formats.
  CHECK(parse_trace_binary(serialize_trace_binary(t)) == t);
  CHECK(parse_trace_jsonl(serialize_trace_jsonl(t)) == t);
}

TEST_CASE("real HumanEval raw trace: 135-token prompt, 83 decode steps", "[sim][trace][real]") {
  if (!have("humaneval-p0.prefill-decode.raw.jsonl")) return;
  const RoutingTrace t =
      read_mixtral_raw_jsonl(shared_traces + "humaneval-p0.prefill-decode.raw.jsonl");
  REQUIRE(t.sequence_count() == 1);
  CHECK(t.prefill_length(0) == 135);
  CHECK(t.sequence_length(0) == 135 + 83);
  CHECK(t.record_count() - t.missing_count() == 6777);
  // Missing entries per the canonical .npz: 122 prefill and 77 decode records.
  std::size_t miss_prefill = 0, miss_decode = 0;
  for (std::size_t g = 0; g < t.token_count(); ++g)
    for (std::uint32_t l = 0; l < 32; ++l)
      if (!t.valid(g, l)) ++(t.phase(g) == Phase::prefill ? miss_prefill : miss_decode);
  CHECK(miss_prefill == 122);
  CHECK(miss_decode == 77);
  // The decode part matches the per-layer decode file at layer 0 (the other layers of that file
  // drift after dropped records, so only ~90 % of their records line up).
  if (!have("humaneval-p0.decode.jsonl")) return;
  const RoutingTrace d = read_mixtral_decode_jsonl(shared_traces + "humaneval-p0.decode.jsonl");
  CHECK(d.sequence_length(0) == 83);
  std::size_t agree = 0, n = 0;
  for (std::size_t i = 0; i < 83; ++i)
    if (t.valid(135 + i, 0) && d.valid(i, 0)) {
      ++n;
      agree += t.experts(135 + i, 0)[0] == d.experts(i, 0)[0];
    }
  CHECK(n > 70);
  CHECK(agree == n);
}
