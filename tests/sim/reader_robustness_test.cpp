// Property: every reader, fed mutated or truncated input, either parses it or throws
// moekit::Error — never another exception, never a crash. (The libFuzzer targets run the same
// entry points for longer; this is the fast, seeded version.)

#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "moekit/sim/hardware.hpp"
#include "moekit/sim/npy.hpp"
#include "moekit/sim/synthetic_trace.hpp"
#include "moekit/sim/trace_binary.hpp"
#include "moekit/sim/trace_jsonl.hpp"

using namespace moekit;
using namespace moekit::sim;

namespace {

template <class Parse>
void mutate_and_parse(std::vector<std::byte> good, Parse&& parse, std::uint64_t seed, int rounds) {
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  int parsed = 0, rejected = 0;
  for (int i = 0; i < rounds; ++i) {
    std::vector<std::byte> b = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !b.empty(); ++e) {
      const std::size_t at = rng() % b.size();
      switch (rng() % 4) {
        case 0:
          b[at] = std::byte(rng() & 0xff);
          break;  // overwrite
        case 1:
          b.resize(at);
          break;  // truncate
        case 2:
          b.insert(b.begin() + std::ptrdiff_t(at), std::byte(rng() & 0xff));
          break;
        default:
          b[at] = std::byte(std::to_integer<unsigned>(b[at]) ^ (1u << (rng() % 8)));
      }
    }
    try {
      parse(b);
      ++parsed;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& ex) {
      FAIL("round " << i << ": a non-moekit exception escaped: " << ex.what());
    }
  }
  CHECK(parsed + rejected == rounds);
  CHECK(rejected > 0);
}

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}
std::string text_of(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}
std::vector<std::byte> file_bytes(const char* path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f);
  return bytes_of(std::string(std::istreambuf_iterator<char>(f), {}));
}

RoutingTrace small_trace() {
  RoutingTrace t = generate_synthetic_trace(
      TransitionStats::parametric(3, 6, 1.0, 0.2, 1),
      {.top_k = 2, .sequences = 2, .prefill_tokens = 2, .decode_tokens = 3, .seed = 4});
  t.clear_route(3, 1);  // one missing record
  return t;
}

}  // namespace

TEST_CASE("binary trace reader survives mutated input", "[sim][robustness]") {
  mutate_and_parse(
      serialize_trace_binary(small_trace()),
      [](const auto& b) { (void)parse_trace_binary(b, "fuzz"); }, 1, 3000);
}

TEST_CASE("JSONL trace readers survive mutated input", "[sim][robustness]") {
  mutate_and_parse(
      bytes_of(serialize_trace_jsonl(small_trace())),
      [](const auto& b) { (void)parse_trace_jsonl(text_of(b), "fuzz"); }, 2, 1500);
  const std::string mixtral =
      R"({"dataset": "toy", "problem_id": 0, "layer": 0, "token_pos": 0, "experts": [3, 0], "gating_probs": [0.75, 0.25]})"
      "\n"
      R"({"dataset": "toy", "problem_id": 0, "layer": 1, "token_pos": 0, "experts": [2, 5], "gating_probs": [0.625, 0.375]})"
      "\n"
      R"({"dataset": "toy", "problem_id": 0, "layer": 0, "token_pos": 0, "experts": [1, 7], "gating_probs": [0.875, 0.125]})"
      "\n";
  const TraceDims dims{.n_layers = 2, .n_experts = 8, .top_k = 2};
  mutate_and_parse(
      bytes_of(mixtral),
      [&](const auto& b) { (void)parse_mixtral_raw_jsonl(text_of(b), "fuzz", dims); }, 3, 1500);
  std::string decode = mixtral;
  for (std::size_t p; (p = decode.find("token_pos")) != std::string::npos;)
    decode.replace(p, 9, "token_idx");
  mutate_and_parse(
      bytes_of(decode),
      [&](const auto& b) { (void)parse_mixtral_decode_jsonl(text_of(b), "fuzz", dims); }, 4, 1500);
}

TEST_CASE("npy and hardware JSON readers survive mutated input", "[sim][robustness]") {
  const auto npy = file_bytes(MOEKIT_SOURCE_DIR "/data/stats/mixtral-top1-transition.npy");
  mutate_and_parse(
      npy, [](const auto& b) { (void)parse_npy(b, "fuzz"); }, 5, 2000);
  mutate_and_parse(
      bytes_of(serialize_hardware_json(rtx4090_pcie4())),
      [](const auto& b) { (void)parse_hardware_json(text_of(b), "fuzz"); }, 6, 2000);
}
