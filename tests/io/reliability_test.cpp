#include <catch2/catch.hpp>

// Issue 24: atomic output files, the store writer's lock, the resume journal's source
// fingerprint, non-finite weights refused as they are read, and blobs verified on load by default.

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "io/io_test_util.hpp"
#include "io/store_test_util.hpp"
#include "moekit/io/async_loader.hpp"
#include "moekit/io/byte_source.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/file_lock.hpp"
#include "moekit/io/finite_check.hpp"
#include "moekit/io/output_file.hpp"

using namespace moekit;
using namespace moekit::io;
using moekit::test::fake_expert;
using moekit::test::require_error;
using moekit::test::TempDir;
using moekit::test::tiny_shape;

namespace {

std::string text_of(const std::string& path) {
  const auto b = moekit::test::read_file(path);
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

std::size_t entries(const TempDir& d) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(d.file(""))) ++n;
  return n;
}

}  // namespace

TEST_CASE("write_text_atomically writes, refuses to overwrite, and replaces only with overwrite") {
  TempDir d;
  const std::string f = d.file("out.csv");
  write_text_atomically(f, "one", false, "--out");
  CHECK(text_of(f) == "one");
  require_error([&] { write_text_atomically(f, "two", false, "--out"); },
                ErrorKind::invalid_argument,
                {"--out: '", "out.csv' exists; refusing to overwrite it (pass --force)"});
  CHECK(text_of(f) == "one");
  write_text_atomically(f, "three", true, "--out");
  CHECK(text_of(f) == "three");
  CHECK(entries(d) == 1);  // no temporary file left behind
}

TEST_CASE("check_output_path refuses directories, devices and missing directories up front") {
  TempDir d;
  require_error([&] { check_output_path(d.file(""), true, "-o"); }, ErrorKind::invalid_argument,
                {"-o: '", "names a directory"});
  std::filesystem::create_directory(d.file("sub"));
  require_error([&] { check_output_path(d.file("sub"), true, "-o"); }, ErrorKind::invalid_argument,
                {"is a directory"});
  require_error([&] { check_output_path(d.file("missing/x.bin"), true, "-o"); },
                ErrorKind::invalid_argument, {"the directory", "missing' does not exist"});
  require_error([&] { check_output_path("", true, "--trace-out"); }, ErrorKind::invalid_argument,
                {"--trace-out: empty file name"});
  const std::string fifo = d.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // --force never replaces what is not a regular file.
  require_error([&] { write_text_atomically(fifo, "x", true, "-o"); }, ErrorKind::invalid_argument,
                {"is not a regular file", "even with --force"});
  CHECK(std::filesystem::is_fifo(fifo));
}

TEST_CASE("OutputLock refuses a second writer of the same file and is released on destruction") {
  TempDir d;
  const std::string f = d.file("s.moestore");
  {
    const OutputLock first(f, "-o");
    CHECK(std::filesystem::exists(f + ".lock"));
    require_error([&] { OutputLock second(f, "-o"); }, ErrorKind::io,
                  {"-o: another process is writing '", "s.moestore.lock"});
  }
  CHECK_FALSE(std::filesystem::exists(f + ".lock"));
  const OutputLock again(f);  // free once the first is gone
}

TEST_CASE("write_expert_store: a second concurrent writer of the same store is refused at once") {
  TempDir d;
  const std::string f = d.file("s.moestore");
  const OutputLock held(f);  // as a first moe-convert would
  const std::vector<Precision> ps{Precision::q4};
  std::size_t encoded = 0;
  require_error(
      [&] {
        write_expert_store(f, tiny_shape, ps, [&](ExpertKey k, Precision p) {
          ++encoded;
          return fake_expert(tiny_shape, k, p);
        });
      },
      ErrorKind::io, {"another process is writing"});
  CHECK(encoded == 0);
}

TEST_CASE("the resume journal is tied to the source: another checkpoint never resumes it") {
  TempDir d;
  const std::string f = d.file("s.moestore");
  const std::vector<Precision> ps{Precision::f16, Precision::q4};
  auto interrupted = [&](const std::string& source) {
    ExpertStoreWriteOptions o;
    o.meta["checkpoint_fingerprint"] = source;
    std::size_t n = 0;
    try {
      write_expert_store(
          f, tiny_shape, ps,
          [&](ExpertKey k, Precision p) {
            if (++n > 4) throw Error(ErrorKind::io, "interrupted");
            return fake_expert(tiny_shape, k, p);
          },
          o);
    } catch (const Error&) {
    }
  };
  auto finish = [&](const std::string& source) {
    ExpertStoreWriteOptions o;
    o.meta["checkpoint_fingerprint"] = source;
    return write_expert_store(
        f, tiny_shape, ps, [](ExpertKey k, Precision p) { return fake_expert(tiny_shape, k, p); },
        o);
  };
  interrupted("checkpoint A");
  REQUIRE(std::filesystem::exists(f + ".partial"));
  CHECK(finish("checkpoint B").blobs_resumed == 0);  // a mixed-model store before issue 24
  std::filesystem::remove(f);
  interrupted("checkpoint A");
  CHECK(finish("checkpoint A").blobs_resumed == 4);  // the same source still resumes
}

TEST_CASE("first_non_finite and require_finite_stored find NaN/Inf weights and name the tensor") {
  std::vector<float> v(3000, 0.5f);
  CHECK_FALSE(first_non_finite(v).has_value());
  v[2047] = std::numeric_limits<float>::infinity();
  v[2500] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE(first_non_finite(v).has_value());
  CHECK(*first_non_finite(v) == 2047);

  std::vector<std::byte> bytes(4 * 12);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + 4 * 7, &nan, 4);
  TensorView t;
  t.name = "model.layers.0.self_attn.q_proj.weight";
  t.file = "m/model.safetensors";
  t.dtype = DType::f32;
  t.rank = 2;
  t.dims[0] = 3;
  t.dims[1] = 4;
  t.bytes = bytes;
  require_error(
      [&] { require_finite_stored(t); }, ErrorKind::invalid_format,
      {"q_proj.weight' in 'm/model.safetensors'", "index 7 (row 1, column 3)", "not finite"});

  // bf16: exponent all ones is Inf/NaN; Q8_0: only the f16 block scale can be.
  std::vector<std::byte> bf(2 * 12, std::byte{0});
  bf[2 * 5 + 1] = std::byte{0x7F};
  bf[2 * 5] = std::byte{0x80};  // 0x7F80 = +Inf
  t.dtype = DType::bf16;
  t.bytes = bf;
  require_error([&] { require_finite_stored(t, "layer 2, expert 1"); }, ErrorKind::invalid_format,
                {"(layer 2, expert 1)", "index 5"});
  std::vector<std::byte> q8(2 * block_bytes(DType::q8_0), std::byte{0});
  q8[block_bytes(DType::q8_0) + 1] = std::byte{0x7C};  // the second block's scale: +Inf
  t.dtype = DType::q8_0;
  t.rank = 1;
  t.dims[0] = 64;
  t.bytes = q8;
  require_error([&] { require_finite_stored(t); }, ErrorKind::invalid_format,
                {"a block scale at index 32"});
}

TEST_CASE("AsyncLoader verifies every blob by default and names store, layer, expert, precision") {
  CHECK(AsyncLoader<MemorySource>::Config{}.verify_checksums);
  TempDir d;
  const std::string f = d.file("s.moestore");
  const std::vector<Precision> ps{Precision::f16, Precision::q4};
  write_expert_store(f, tiny_shape, ps,
                     [](ExpertKey k, Precision p) { return fake_expert(tiny_shape, k, p); });
  const ExpertStore store = ExpertStore::open(f);
  auto bytes = moekit::test::read_file(f);
  const StoreBlob& b = store.blob({1, 2}, Precision::q4);
  bytes[b.offset + 100] ^= std::byte{0x01};
  AsyncLoader<MemorySource> loader(store, MemorySource(bytes, f), {});
  std::vector<std::byte> dest(b.bytes);
  const LoadTicket ok = loader.submit({{0, 0}, Precision::q4, LoadPriority::on_demand, dest});
  loader.wait(ok);
  const LoadTicket t = loader.submit({{1, 2}, Precision::q4, LoadPriority::on_demand, dest});
  require_error([&] { loader.wait(t); }, ErrorKind::checksum,
                {"s.moestore", "layer 1, expert 2, q4", "XXH64"});
}

TEST_CASE("AsyncLoader verifies a large blob read in pieces: any flipped byte is found") {
  // 37 MiB + 123 bytes: pieces of 18.5, 9.25, ... MiB down to the last, below 1 MiB.
  const std::size_t n = (37u << 20) + 123;
  std::vector<std::byte> file(4096 + n);
  std::uint32_t x = 12345;
  for (auto& b : file) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  const StoreBlob blob{{0, 0}, Precision::f32, 4096, n, xxh64(std::span(file).subspan(4096, n))};
  std::vector<std::byte> dest(n);
  for (const std::size_t flip : {std::size_t{0}, n / 2, n - (1u << 19), n - 1}) {
    DYNAMIC_SECTION("flipped byte at " << flip) {
      std::vector<std::byte> bad = file;
      {
        AsyncLoader<MemorySource> good(MemorySource(file, "good"),
                                       [&](ExpertKey, Precision) { return blob; }, {});
        good.wait(good.submit({{0, 0}, Precision::f32, LoadPriority::on_demand, dest}));
        CHECK(std::memcmp(dest.data(), file.data() + 4096, n) == 0);
      }
      bad[4096 + flip] ^= std::byte{0x10};
      AsyncLoader<MemorySource> loader(MemorySource(bad, "bad.moestore"),
                                       [&](ExpertKey, Precision) { return blob; }, {});
      const LoadTicket t = loader.submit({{0, 0}, Precision::f32, LoadPriority::on_demand, dest});
      require_error([&] { loader.wait(t); }, ErrorKind::checksum,
                    {"bad.moestore", "layer 0, expert 0, f32"});
    }
  }
}
