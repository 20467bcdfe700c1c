#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "io/gguf_builder.hpp"
#include "io/io_test_util.hpp"
#include "moekit/io/dequantize.hpp"
#include "moekit/io/gguf.hpp"
#include "moekit/precision/half.hpp"

using namespace moekit;
using namespace moekit::io;
using moekit::test::GgufBuilder;
using moekit::test::require_error;
using moekit::test::TempDir;

namespace {

void put_half(std::vector<std::byte>& b, std::size_t at, float v) {
  const std::uint16_t h = float_to_half_bits(v);
  std::memcpy(b.data() + at, &h, 2);
}
std::byte u8(unsigned v) { return static_cast<std::byte>(v & 0xFF); }

std::vector<std::byte> f32_bytes(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TensorView view_of(const std::vector<std::byte>& bytes, DType t, std::uint64_t rows,
                   std::uint64_t cols) {
  TensorView v;
  v.name = "hand";
  v.file = "memory";
  v.dtype = t;
  v.rank = 2;
  v.dims = {rows, cols, 0, 0};
  v.bytes = bytes;
  return v;
}

}  // namespace

TEST_CASE("gguf: header, metadata of all kinds, tensor infos and data offsets", "[io][gguf]") {
  TempDir dir;
  std::vector<float> w(4 * 8);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  std::vector<std::byte> h16(8 * 2);
  for (int i = 0; i < 8; ++i)
    put_half(h16, 2 * static_cast<std::size_t>(i), static_cast<float>(i) - 3.0f);
  GgufBuilder b;
  b.alignment = 64;
  b.write_alignment_key = true;
  b.kv_string("general.architecture", "llama")
      .kv_u32("llama.expert_count", 8)
      .kv_f32("llama.rope.freq_base", 1e6f)
      .kv_bool("general.flag", true)
      .kv_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>"})
      .kv_i32_array("some.ints", {-1, 2, -3})
      .tensor("blk.0.w", {8, 4}, ggml_type::f32, f32_bytes(w))
      .tensor("blk.0.h", {8}, ggml_type::f16, h16);
  moekit::test::write_file(dir.file("m.gguf"), b.bytes());

  GgufFile f(dir.file("m.gguf"));
  CHECK(f.header().version == 3);
  CHECK(f.header().alignment == 64);
  CHECK(f.header().data_offset % 64 == 0);
  CHECK(f.architecture() == "llama");
  CHECK(f.metadata("llama.expert_count")->as_uint("k") == 8);
  CHECK(f.metadata("llama.rope.freq_base")->as_double("k") == Approx(1e6));
  CHECK(std::get<bool>(f.metadata("general.flag")->value));
  const auto& toks = f.metadata("tokenizer.ggml.tokens")->as_array("k");
  REQUIRE(toks.size() == 3);
  CHECK(toks[1].as_string("k") == "<s>");
  const auto& ints = f.metadata("some.ints")->as_array("k");
  CHECK(std::get<std::int64_t>(ints[2].value) == -3);
  require_error([&] { (void)f.metadata("general.architecture")->as_uint("general.architecture"); },
                ErrorKind::invalid_format, {"general.architecture"});

  auto t = f.tensor("blk.0.w");
  CHECK(t.rank == 2);
  CHECK(t.rows() == 4);  // ne = {8, 4}: 4 rows of 8
  CHECK(t.cols() == 8);
  CHECK(t.file_offset % 64 == 0);
  CHECK(t.bytes.data() == f.mapped_bytes().data() + t.file_offset);
  CHECK(dequantize(t) == w);
  auto h = dequantize(f.tensor("blk.0.h"));
  CHECK(h == std::vector<float>{-3, -2, -1, 0, 1, 2, 3, 4});
  CHECK_FALSE(f.find("nope"));
}

TEST_CASE("gguf: version 2 files read like version 3", "[io][gguf]") {
  GgufBuilder b;
  b.version = 2;
  b.tensor("x", {32}, ggml_type::f32, std::vector<std::byte>(128));
  auto bytes = b.bytes();
  auto h = parse_gguf(bytes, "v2.gguf");
  CHECK(h.version == 2);
  CHECK(h.tensors.size() == 1);
}

TEST_CASE("gguf: Q8_0 and Q4_0 blocks dequantize as hand-computed", "[io][gguf][dequantize]") {
  std::vector<std::byte> q8(34);
  put_half(q8, 0, 0.5f);
  for (int i = 0; i < 32; ++i)
    q8[2 + static_cast<std::size_t>(i)] =
        u8(static_cast<unsigned>(static_cast<std::int8_t>(i - 16)));
  auto y = dequantize(view_of(q8, DType::q8_0, 1, 32));
  for (int i = 0; i < 32; ++i)
    CHECK(y[static_cast<std::size_t>(i)] == 0.5f * static_cast<float>(i - 16));

  std::vector<std::byte> q4(18);
  put_half(q4, 0, 2.0f);
  for (unsigned j = 0; j < 16; ++j) q4[2 + j] = u8(j | ((15 - j) << 4));
  y = dequantize(view_of(q4, DType::q4_0, 1, 32));
  for (int j = 0; j < 16; ++j) {
    CHECK(y[static_cast<std::size_t>(j)] == 2.0f * static_cast<float>(j - 8));
    CHECK(y[static_cast<std::size_t>(j) + 16] == 2.0f * static_cast<float>(7 - j));
  }
}

TEST_CASE("gguf: a hand-built Q4_K block dequantizes to d·sc·q − dmin·m",
          "[io][gguf][dequantize]") {
  // Eight sub-blocks of 32 weights with 6-bit scales and mins, packed as ggml does: bytes 0..3
  // hold sc[0..3] (low 6 bits) and sc[4..7]>>4 (top 2 bits); bytes 4..7 the same for the mins;
  // bytes 8..11 hold sc[4..7]&15 (low nibble) and m[4..7]&15 (high nibble).
  const unsigned sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
  const unsigned m[8] = {0, 1, 2, 3, 20, 40, 60, 5};
  std::vector<std::byte> b(144);
  put_half(b, 0, 1.0f);  // d
  put_half(b, 2, 0.5f);  // dmin
  for (unsigned j = 0; j < 4; ++j) {
    b[4 + j] = u8(sc[j] | ((sc[j + 4] >> 4) << 6));
    b[4 + j + 4] = u8(m[j] | ((m[j + 4] >> 4) << 6));
    b[4 + j + 8] = u8((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
  for (unsigned k = 0; k < 128; ++k) b[16 + k] = u8(k * 7);
  auto y = dequantize(view_of(b, DType::q4_k, 1, 256));
  for (unsigned i = 0; i < 256; ++i) {
    const unsigned sub = i / 32, chunk = i / 64, l = i % 32;
    const unsigned byte = ((32 * chunk + l) * 7) & 0xFF;
    const unsigned q = (i % 64) < 32 ? (byte & 15) : (byte >> 4);
    const float expect = 1.0f * static_cast<float>(sc[sub] * q) - 0.5f * static_cast<float>(m[sub]);
    INFO("weight " << i);
    CHECK(y[i] == expect);
  }
}

TEST_CASE("gguf: a hand-built Q2_K block dequantizes to d·sc·q − dmin·m",
          "[io][gguf][dequantize]") {
  // Sixteen sub-blocks of 16 weights; scales[s] = sc | m << 4. Weight i lies in half h = i/128;
  // within it, run r = (i%128)/32 uses bits 2r..2r+1 of qs[32h + (i%32)].
  std::vector<std::byte> b(84);
  for (unsigned s = 0; s < 16; ++s) b[s] = u8((s % 16) | (((15 - s) % 16) << 4));
  for (unsigned k = 0; k < 64; ++k) b[16 + k] = u8(k * 37 + 11);
  put_half(b, 80, 0.25f);   // d
  put_half(b, 82, 0.125f);  // dmin
  auto y = dequantize(view_of(b, DType::q2_k, 1, 256));
  for (unsigned i = 0; i < 256; ++i) {
    const unsigned s = i / 16, h = i / 128, r = (i % 128) / 32;
    const unsigned byte = ((32 * h + i % 32) * 37 + 11) & 0xFF;
    const unsigned q = (byte >> (2 * r)) & 3;
    const float expect =
        0.25f * static_cast<float>((s % 16) * q) - 0.125f * static_cast<float>(15 - s);
    INFO("weight " << i);
    CHECK(y[i] == expect);
  }
}

TEST_CASE("gguf: dequantization matches gguf-py on random blocks (committed fixture)",
          "[io][gguf][dequantize]") {
  GgufFile f(MOEKIT_SOURCE_DIR "/tests/io/data/quant_blocks.gguf");
  for (const char* name : {"q8_0", "q4_0", "q4_k", "q2_k"}) {
    INFO(name);
    auto q = f.tensor(name);
    auto e = f.tensor(std::string(name) + ".expected");
    REQUIRE(q.rows() == e.rows());
    REQUIRE(q.cols() == e.cols());
    auto got = dequantize(q);
    auto want = dequantize(e);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - want[i]) <= 1e-6f * std::max(1.0f, std::fabs(want[i])))) ++bad;
    CHECK(bad == 0);
  }
}

TEST_CASE("gguf: K-quants dequantize to gguf-py's values bit for bit (committed fixture)",
          "[io][gguf][dequantize]") {
  // scripts/make_gguf_transcode_fixture.py: special f16 fields (zeros, subnormals, the largest
  // finite) with extreme code bytes, then random blocks; "<type>.expected" is gguf-py's output.
  GgufFile f(MOEKIT_SOURCE_DIR "/tests/io/data/gguf_kquants.gguf");
  const std::pair<const char*, DType> types[] = {{"q2_k", DType::q2_k},
                                                 {"q3_k", DType::q3_k},
                                                 {"q4_k", DType::q4_k},
                                                 {"q5_k", DType::q5_k},
                                                 {"q6_k", DType::q6_k}};
  for (const auto& [tensor_name, dtype] : types) {
    INFO(tensor_name);
    auto q = f.tensor(tensor_name);
    CHECK(q.dtype == dtype);
    CHECK(q.bytes.size() == q.elements() / 256 * block_bytes(dtype));
    auto e = f.tensor(std::string(tensor_name) + ".expected");
    REQUIRE(q.rows() == e.rows());
    REQUIRE(q.cols() == e.cols());
    auto got = dequantize(q);
    auto want = dequantize(e);
    std::size_t bad = 0, nonzero = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i])) {
        if (bad++ < 4) UNSCOPED_INFO("weight " << i << ": " << got[i] << " vs " << want[i]);
      }
      nonzero += want[i] != 0.0f;
    }
    CHECK(bad == 0);
    CHECK(nonzero > got.size() / 2);  // the fixture is not mostly zeros
  }
}

TEST_CASE("gguf: unsupported ggml types are listed and reported by tensor name", "[io][gguf]") {
  GgufBuilder b;
  b.tensor("iq4", {256}, 23, std::vector<std::byte>(136));  // IQ4_XS: size known, not read
  auto bytes = b.bytes();
  TempDir dir;
  moekit::test::write_file(dir.file("iq4.gguf"), bytes);
  GgufFile f(dir.file("iq4.gguf"));
  CHECK(f.tensors().size() == 1);
  require_error([&] { (void)f.tensor("iq4"); }, ErrorKind::unsupported, {"iq4", "IQ4_XS"});

  GgufBuilder c;
  c.tensor("weird", {32}, 99, std::vector<std::byte>(32));
  auto cb = c.bytes();
  require_error([&] { (void)parse_gguf(cb, "w.gguf"); }, ErrorKind::unsupported,
                {"weird", "99", "w.gguf"});
}

TEST_CASE("gguf: malformed files give typed errors naming file, tensor and offset", "[io][gguf]") {
  const std::string file = "bad.gguf";
  GgufBuilder good;
  good.kv_string("general.architecture", "llama");
  good.tensor("a", {32}, ggml_type::f32, std::vector<std::byte>(128));
  good.tensor("b", {32}, ggml_type::q8_0, std::vector<std::byte>(34));
  const auto ok = good.bytes();
  REQUIRE_NOTHROW(parse_gguf(ok, file));

  SECTION("wrong magic") {
    auto b = ok;
    b[0] = std::byte{'X'};
    require_error([&] { (void)parse_gguf(b, file); }, ErrorKind::invalid_format,
                  {file, "magic", "offset 0"});
  }
  SECTION("wrong or unsupported version") {
    auto b = ok;
    b[4] = std::byte{7};
    require_error([&] { (void)parse_gguf(b, file); }, ErrorKind::invalid_format,
                  {file, "version 7"});
    b[4] = std::byte{1};
    require_error([&] { (void)parse_gguf(b, file); }, ErrorKind::unsupported, {file, "version 1"});
    b[4] = std::byte{0};
    b[7] = std::byte{3};  // 0x03000000: a big-endian v3 file
    require_error([&] { (void)parse_gguf(b, file); }, ErrorKind::unsupported, {file, "big-endian"});
  }
  SECTION("truncated anywhere") {
    for (std::size_t cut : {std::size_t{3}, std::size_t{20}, std::size_t{40}, ok.size() - 1}) {
      INFO("cut at " << cut);
      std::vector<std::byte> b(ok.begin(), ok.begin() + static_cast<std::ptrdiff_t>(cut));
      require_error([&] { (void)parse_gguf(b, file); }, ErrorKind::invalid_format,
                    {file, "offset"});
    }
  }
  SECTION("tensor offset outside the file") {
    GgufBuilder g;
    g.tensor("far", {32}, ggml_type::f32, std::vector<std::byte>(128), 4096);
    auto b = g.bytes();
    b.resize(b.size() - (4096 + 128 - 128));  // keep the header, drop the far data
    require_error([&] { (void)parse_gguf(b, file); }, ErrorKind::invalid_format,
                  {file, "'far'", "runs past", "offset"});
  }
  SECTION("overlapping tensors") {
    GgufBuilder g;
    g.tensor("a", {64}, ggml_type::f32, std::vector<std::byte>(256), 0);
    g.tensor("b", {32}, ggml_type::f32, std::vector<std::byte>(128), 64);
    auto b = g.bytes();
    require_error([&] { (void)parse_gguf(b, file); }, ErrorKind::invalid_format,
                  {file, "'a'", "'b'", "overlap"});
  }
  SECTION("misaligned offset") {
    GgufBuilder g;
    g.tensor("a", {32}, ggml_type::f32, std::vector<std::byte>(128), 4);
    auto b = g.bytes();
    require_error([&] { (void)parse_gguf(b, file); }, ErrorKind::invalid_format,
                  {"'a'", "alignment"});
  }
  SECTION("row not a whole number of blocks (shape/dtype mismatch)") {
    GgufBuilder g;
    g.tensor("q", {48}, ggml_type::q4_k, std::vector<std::byte>(144));
    auto b = g.bytes();
    require_error([&] { (void)parse_gguf(b, file); }, ErrorKind::invalid_format,
                  {"'q'", "Q4_K", "block size 256"});
  }
  SECTION("absurd counts do not allocate") {
    auto b = ok;
    const std::uint64_t huge = ~std::uint64_t{0} / 2;
    std::memcpy(b.data() + 16, &huge, 8);  // metadata count
    require_error([&] { (void)parse_gguf(b, file); }, ErrorKind::invalid_format,
                  {"metadata count"});
    b = ok;
    std::memcpy(b.data() + 8, &huge, 8);  // tensor count
    require_error([&] { (void)parse_gguf(b, file); }, ErrorKind::invalid_format, {"tensor count"});
  }
  SECTION("bad alignment value") {
    GgufBuilder g;
    g.alignment = 48;
    g.write_alignment_key = true;
    auto b = g.bytes();
    require_error([&] { (void)parse_gguf(b, file); }, ErrorKind::invalid_format,
                  {"general.alignment", "48"});
  }
}
