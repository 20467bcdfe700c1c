// Seeded mutation tests: the parsers meet thousands of damaged variants of valid files in the
// ordinary test suite (the libFuzzer targets in tests/fuzz go further but need clang). Every
// variant must parse or raise moekit::Error; any other exception, crash or broken invariant fails.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "io/gguf_builder.hpp"
#include "io/io_test_util.hpp"
#include "io/store_test_util.hpp"
#include "moekit/io/dequantize.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/io/safetensors.hpp"

using namespace moekit;
using namespace moekit::io;

namespace {

std::vector<std::byte> mutate(const std::vector<std::byte>& in, std::mt19937_64& rng) {
  std::vector<std::byte> b = in;
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < edits && !b.empty(); ++k) {
    const std::size_t at = rng() % b.size();
    switch (rng() % 5) {
      case 0:
        b[at] = static_cast<std::byte>(rng());
        break;  // random byte
      case 1:
        b[at] ^= static_cast<std::byte>(1u << (rng() % 8));
        break;  // bit flip
      case 2:
        b.resize(at);
        break;  // truncate
      case 3:
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::byte>(rng()));
        break;
      case 4: {  // overwrite 8 bytes with an extreme integer (lengths, counts, offsets)
        const std::uint64_t v = rng() % 2 ? ~std::uint64_t{0} >> (rng() % 64) : rng() % 100000;
        if (at + 8 <= b.size()) std::memcpy(b.data() + at, &v, 8);
        break;
      }
    }
  }
  return b;
}

template <class F>
void run_mutations(const std::vector<std::byte>& seed_file, std::uint64_t seed, int n, F&& parse) {
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  int parsed = 0, rejected = 0;
  for (int i = 0; i < n; ++i) {
    const auto b = mutate(seed_file, rng);
    try {
      parse(b);
      ++parsed;
    } catch (const Error&) {
      ++rejected;
    }
  }
  CHECK(parsed + rejected == n);
  CHECK(rejected > 0);  // the mutations do reach the checks
}

}  // namespace

TEST_CASE("mutations: safetensors header parser", "[io][mutation]") {
  const std::vector<float> v(64, 1.5f);
  SafetensorsWriter w;
  w.add("a", DType::f32, {8, 8}, v)
      .add("b", DType::f16, {64}, v)
      .add("c", DType::bf16, {4, 16}, v)
      .metadata("k", "v");
  run_mutations(w.bytes(), 7, 3000, [](const std::vector<std::byte>& b) {
    const auto h = parse_safetensors(b, "m.safetensors");
    for (const auto& t : h.tensors) REQUIRE(h.data_offset + t.end <= b.size());
  });
}

TEST_CASE("mutations: GGUF parser and dequantization of what it accepts", "[io][mutation]") {
  test::GgufBuilder g;
  g.kv_string("general.architecture", "llama")
      .kv_u32("llama.expert_count", 8)
      .kv_string_array("t", {"a", "bb"});
  g.tensor("f", {32, 2}, ggml_type::f32, std::vector<std::byte>(256));
  g.tensor("q", {256}, ggml_type::q4_k, std::vector<std::byte>(144));
  g.tensor("r", {256}, ggml_type::q2_k, std::vector<std::byte>(84));
  g.tensor("s", {64}, ggml_type::q8_0, std::vector<std::byte>(68));
  run_mutations(g.bytes(), 11, 3000, [](const std::vector<std::byte>& b) {
    const auto h = parse_gguf(b, "m.gguf");
    for (const auto& t : h.tensors) {
      REQUIRE(h.data_offset + t.offset + t.bytes <= b.size());
      if (!t.dtype) continue;
      TensorView v;
      v.dtype = *t.dtype;
      v.dims = t.dims;
      v.rank = t.rank;
      v.bytes = std::span(b).subspan(h.data_offset + t.offset, t.bytes);
      if (v.elements() <= (1u << 16)) (void)dequantize(v);
    }
  });
}

TEST_CASE("mutations: expert store header and manifest", "[io][mutation]") {
  test::TempDir dir;
  const auto path = dir.file("m.moestore");
  const std::vector<Precision> ps{Precision::q8};
  write_expert_store(path, test::tiny_shape, ps, [](ExpertKey k, Precision p) {
    return test::fake_expert(test::tiny_shape, k, p);
  });
  const auto file = test::read_file(path);
  auto store = ExpertStore::open(path);
  const std::uint64_t data_end = store.header().manifest_offset;
  const std::vector<std::byte> manifest(file.begin() + static_cast<std::ptrdiff_t>(data_end),
                                        file.end());
  run_mutations(manifest, 13, 2000, [&](const std::vector<std::byte>& b) {
    const std::string_view text(reinterpret_cast<const char*>(b.data()), b.size());
    const auto m = parse_store_manifest(text, data_end, "m.moestore");
    for (const auto& blob : m.blobs) REQUIRE(blob.offset + blob.bytes <= data_end);
  });
  const std::vector<std::byte> page(file.begin(), file.begin() + 4096);
  run_mutations(page, 17, 2000, [&](const std::vector<std::byte>& b) {
    (void)parse_store_header(b, file.size(), "m");
  });
}
