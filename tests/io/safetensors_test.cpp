#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "io/io_test_util.hpp"
#include "moekit/io/dequantize.hpp"
#include "moekit/io/safetensors.hpp"
#include "moekit/precision/half.hpp"

using namespace moekit;
using namespace moekit::io;
using moekit::test::require_error;
using moekit::test::TempDir;

namespace {

std::vector<float> iota_values(std::size_t n, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = scale * (static_cast<float>(i) - static_cast<float>(n) / 2);
  return v;
}

/// A file with a hand-written header (so tests can break it on purpose).
std::vector<std::byte> raw_file(const std::string& header, std::size_t data_bytes) {
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

}  // namespace

TEST_CASE("safetensors: f32/f16/bf16 round trip through the writer and the mmap reader",
          "[io][safetensors]") {
  TempDir dir;
  const auto a = iota_values(6 * 4, 0.25f);  // exactly representable in f16 and bf16
  const auto b = iota_values(3 * 8, 0.5f);
  const auto c = iota_values(16, 1.0f);
  SafetensorsWriter w;
  w.add("a", DType::f32, {6, 4}, a).add("b", DType::f16, {3, 8}, b).add("c", DType::bf16, {16}, c);
  w.metadata("format", "pt");
  w.write(dir.file("m.safetensors"));

  SafetensorsFile f(dir.file("m.safetensors"));
  REQUIRE(f.entries().size() == 3);
  CHECK(f.header().metadata.at("format") == "pt");
  CHECK(f.header().data_offset % 8 == 0);
  auto ta = f.tensor("a");
  CHECK(ta.dtype == DType::f32);
  CHECK(ta.rows() == 6);
  CHECK(ta.cols() == 4);
  CHECK(dequantize(ta) == a);
  auto tb = f.tensor("b");
  CHECK(tb.dtype == DType::f16);
  CHECK(tb.bytes.size() == 3 * 8 * 2);
  CHECK(dequantize(tb) == b);
  auto tc = f.tensor("c");
  CHECK(tc.dtype == DType::bf16);
  CHECK(tc.rank == 1);
  CHECK(dequantize(tc) == c);
  CHECK_FALSE(f.find("missing").has_value());
  require_error([&] { (void)f.tensor("missing"); }, ErrorKind::invalid_argument,
                {"missing", "m.safetensors"});
}

TEST_CASE(
    "safetensors: f16/bf16 go through precision/half.hpp bit for bit (every pattern, NaN, Inf, "
    "subnormals)",
    "[io][safetensors][half]") {
  // Decoding: all 65536 patterns of each type through dequantize().
  std::vector<std::byte> bytes(2 * 65536);
  for (std::uint32_t h = 0; h < 65536; ++h)
    std::memcpy(bytes.data() + 2 * h, &h, 2);  // little endian
  for (DType t : {DType::f16, DType::bf16}) {
    TensorView v;
    v.name = "all";
    v.file = "memory";
    v.dtype = t;
    v.rank = 1;
    v.dims = {65536, 0, 0, 0};
    v.bytes = bytes;
    const auto got = dequantize(v);
    for (std::uint32_t h = 0; h < 65536; ++h) {
      const auto b = static_cast<std::uint16_t>(h);
      const float want = t == DType::f16 ? half_bits_to_float(b) : bf16_bits_to_float(b);
      if (std::bit_cast<std::uint32_t>(got[h]) != std::bit_cast<std::uint32_t>(want))
        FAIL(name(t) << " pattern " << h << " decodes differently from precision/half.hpp");
    }
  }
  // Encoding: the writer's bits are float_to_half_bits / float_to_bf16_bits, NaN payloads included.
  const std::vector<float> edge{0.f,
                                -0.f,
                                1.f,
                                65504.f,
                                65519.f,
                                65520.f,
                                -1e30f,
                                std::ldexp(1.f, -24),
                                std::ldexp(1.f, -25),
                                std::ldexp(3.f, -26),
                                std::ldexp(1.f, -130),
                                std::numeric_limits<float>::infinity(),
                                std::bit_cast<float>(0x7fc00000u),
                                std::bit_cast<float>(0xffa5a000u),
                                std::bit_cast<float>(0x7f800001u),
                                1.f + std::ldexp(1.f, -11)};
  TempDir dir;
  SafetensorsWriter w;
  w.add("h", DType::f16, {edge.size()}, edge).add("b", DType::bf16, {edge.size()}, edge);
  w.write(dir.file("edge.safetensors"));
  SafetensorsFile f(dir.file("edge.safetensors"));
  const auto th = f.tensor("h"), tb = f.tensor("b");
  for (std::size_t i = 0; i < edge.size(); ++i) {
    std::uint16_t h, b;
    std::memcpy(&h, th.bytes.data() + 2 * i, 2);
    std::memcpy(&b, tb.bytes.data() + 2 * i, 2);
    INFO("value " << i);
    CHECK(h == float_to_half_bits(edge[i]));
    CHECK(b == float_to_bf16_bits(edge[i]));
  }
}

TEST_CASE("safetensors: the view is zero-copy into the mapping", "[io][safetensors]") {
  TempDir dir;
  const auto a = iota_values(8, 1.0f);
  SafetensorsWriter().add("x", DType::f32, {8}, a).write(dir.file("z.safetensors"));
  SafetensorsFile f(dir.file("z.safetensors"));
  auto t = f.tensor("x");
  CHECK(t.bytes.data() == f.mapped_bytes().data() + t.file_offset);
  CHECK(t.file_offset == f.header().data_offset);
}

TEST_CASE("safetensors: unsupported dtypes are listed and reported by name", "[io][safetensors]") {
  TempDir dir;
  SafetensorsWriter()
      .add_raw("ids", "I64", {2}, std::vector<std::byte>(16))
      .add("w", DType::f32, {2}, std::vector<float>{1.f, 2.f})
      .write(dir.file("u.safetensors"));
  SafetensorsFile f(dir.file("u.safetensors"));
  CHECK(f.entries().size() == 2);
  CHECK(f.tensor("w").elements() == 2);
  require_error([&] { (void)f.tensor("ids"); }, ErrorKind::unsupported, {"ids", "I64"});

  SafetensorsWriter()
      .add_raw("q", "Q9_Z", {2}, std::vector<std::byte>(2))
      .write(dir.file("v.safetensors"));
  require_error([&] { SafetensorsFile g(dir.file("v.safetensors")); }, ErrorKind::unsupported,
                {"q", "Q9_Z"});
}

TEST_CASE("safetensors: malformed files give typed errors naming file, tensor and offset",
          "[io][safetensors]") {
  const std::string file = "bad.safetensors";
  SECTION("shorter than the length field") {
    std::vector<std::byte> b(5);
    require_error([&] { (void)parse_safetensors(b, file); }, ErrorKind::invalid_format,
                  {file, "too short"});
  }
  SECTION("header length past the end (truncated)") {
    auto b = raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
    b.resize(20);
    require_error([&] { (void)parse_safetensors(b, file); }, ErrorKind::invalid_format,
                  {file, "header length", "truncated"});
  }
  SECTION("header is not JSON") {
    auto b = raw_file("{not json", 0);
    require_error([&] { (void)parse_safetensors(b, file); }, ErrorKind::invalid_format,
                  {file, "not valid JSON"});
  }
  SECTION("offsets outside the data section") {
    auto b = raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4);
    require_error([&] { (void)parse_safetensors(b, file); }, ErrorKind::invalid_format,
                  {file, "'a'", "run past", "offset"});
  }
  SECTION("overlapping tensors") {
    auto b = raw_file(
        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
        12);
    require_error([&] { (void)parse_safetensors(b, file); }, ErrorKind::invalid_format,
                  {file, "'a'", "'b'", "overlap"});
  }
  SECTION("shape × dtype does not match the span") {
    auto b = raw_file(R"({"a":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}})", 8);
    require_error([&] { (void)parse_safetensors(b, file); }, ErrorKind::invalid_format,
                  {file, "'a'", "6 bytes", "8 bytes"});
  }
  SECTION("reversed offsets") {
    auto b = raw_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", 8);
    require_error([&] { (void)parse_safetensors(b, file); }, ErrorKind::invalid_format,
                  {file, "reversed"});
  }
  SECTION("missing fields and wrong types") {
    auto b = raw_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4);
    require_error([&] { (void)parse_safetensors(b, file); }, ErrorKind::invalid_format,
                  {"'a'", "dtype"});
    b = raw_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
    require_error([&] { (void)parse_safetensors(b, file); }, ErrorKind::invalid_format,
                  {"'a'", "shape"});
    b = raw_file(R"([1,2])", 0);
    require_error([&] { (void)parse_safetensors(b, file); }, ErrorKind::invalid_format,
                  {"not an object"});
  }
  SECTION("huge shape overflows instead of wrapping") {
    auto b = raw_file(
        R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", 0);
    require_error([&] { (void)parse_safetensors(b, file); }, ErrorKind::invalid_format,
                  {"'a'", "overflow"});
  }
}

TEST_CASE("safetensors: sharded checkpoints through model.safetensors.index.json",
          "[io][safetensors]") {
  TempDir dir;
  const auto a = iota_values(4, 1.0f), b = iota_values(6, 2.0f);
  SafetensorsWriter()
      .add("layer.0", DType::f32, {2, 2}, a)
      .write(dir.file("model-00001-of-00002.safetensors"));
  SafetensorsWriter()
      .add("layer.1", DType::bf16, {3, 2}, b)
      .write(dir.file("model-00002-of-00002.safetensors"));
  {
    std::ofstream idx(dir.file("model.safetensors.index.json"));
    idx << R"({"metadata":{"total_size":28},"weight_map":{"layer.0":"model-00001-of-00002.safetensors",)"
        << R"("layer.1":"model-00002-of-00002.safetensors"}})";
  }
  auto m = SafetensorsModel::open(dir.path());
  CHECK(m.shard_count() == 2);
  CHECK(m.names() == std::vector<std::string>{"layer.0", "layer.1"});
  CHECK(dequantize(m.tensor("layer.0")) == a);
  CHECK(dequantize(m.tensor("layer.1")) == b);
  CHECK(m.tensor("layer.1").file.find("00002") != std::string_view::npos);
  CHECK_FALSE(m.find("layer.2"));

  // An index that points at the wrong shard is rejected when opened.
  {
    std::ofstream idx(dir.file("model.safetensors.index.json"));
    idx << R"({"weight_map":{"layer.0":"model-00002-of-00002.safetensors"}})";
  }
  require_error([&] { (void)SafetensorsModel::open(dir.path()); }, ErrorKind::invalid_format,
                {"layer.0", "does not contain"});
  // A shard that does not exist is an I/O error naming it.
  {
    std::ofstream idx(dir.file("model.safetensors.index.json"));
    idx << R"({"weight_map":{"layer.0":"model-00003-of-00002.safetensors"}})";
  }
  require_error([&] { (void)SafetensorsModel::open(dir.path()); }, ErrorKind::io,
                {"model-00003-of-00002"});
}

TEST_CASE("safetensors: a single file opens through SafetensorsModel too", "[io][safetensors]") {
  TempDir dir;
  const auto a = iota_values(4, 1.0f);
  SafetensorsWriter().add("w", DType::f16, {4}, a).write(dir.file("model.safetensors"));
  auto m = SafetensorsModel::open(dir.path());
  CHECK(m.shard_count() == 1);
  CHECK(dequantize(m.tensor("w")) == a);
  require_error([&] { (void)SafetensorsModel::open(dir.path() / "nope"); }, ErrorKind::io,
                {"nope"});
}
