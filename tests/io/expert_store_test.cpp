#include <catch2/catch.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <vector>

#include "io/io_test_util.hpp"
#include "io/store_test_util.hpp"
#include "moekit/io/expert_store.hpp"

using namespace moekit;
using namespace moekit::io;
using moekit::test::fake_expert;
using moekit::test::require_error;
using moekit::test::TempDir;
using moekit::test::tiny_shape;

namespace {
const std::vector<Precision> f16_q4{Precision::f16, Precision::q4};

ExpertStoreWriteReport write_tiny(const std::string& path, ExpertStoreWriteOptions opt = {}) {
  return write_expert_store(
      path, tiny_shape, f16_q4,
      [](ExpertKey k, Precision p) { return fake_expert(tiny_shape, k, p); }, opt);
}

void patch(const std::string& path, std::uint64_t offset, std::span<const std::byte> bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
}  // namespace

TEST_CASE("expert store: every blob is aligned, complete and matches the encoder", "[io][store]") {
  TempDir dir;
  const auto path = dir.file("tiny.moestore");
  std::size_t progress_calls = 0;
  ExpertStoreWriteOptions opt;
  opt.meta = {{"source", "unit test"}};
  opt.progress = [&](std::size_t done, std::size_t total) {
    ++progress_calls;
    CHECK(done <= total);
  };
  auto rep = write_tiny(path, opt);
  CHECK(rep.blobs_encoded == 12);
  CHECK(rep.blobs_resumed == 0);
  CHECK(progress_calls == 12);
  CHECK(std::filesystem::file_size(path) == rep.file_bytes);
  CHECK_FALSE(std::filesystem::exists(path + ".partial"));
  CHECK_FALSE(std::filesystem::exists(path + ".partial.journal"));

  auto store = ExpertStore::open(path, tiny_shape);
  CHECK(store.shape() == tiny_shape);
  CHECK(store.has(Precision::q4));
  CHECK_FALSE(store.has(Precision::q8));
  CHECK(store.manifest().meta["source"] == "unit test");
  const auto file = moekit::test::read_file(path);
  for (Precision p : f16_q4)
    for (std::uint32_t l = 0; l < 2; ++l)
      for (std::uint32_t e = 0; e < 3; ++e) {
        const auto& b = store.blob({l, e}, p);
        CHECK(b.offset % 4096 == 0);
        CHECK(b.bytes == tiny_shape.expert_bytes(p));
        const auto want = fake_expert(tiny_shape, {l, e}, p);
        CHECK(std::equal(want.begin(), want.end(),
                         file.begin() + static_cast<std::ptrdiff_t>(b.offset)));
        CHECK(b.checksum == xxh64(want));
        // zero padding up to the next 4 KiB boundary
        for (std::uint64_t i = b.offset + b.bytes; i < b.offset + b.padded_bytes(); ++i)
          REQUIRE(file[i] == std::byte{0});
      }
  CHECK(store.find({2, 0}, Precision::f16) == nullptr);
  require_error(
      [&] {
        (void)store.blob({0, 0}, Precision::q2);
      },
      ErrorKind::invalid_argument, {"q2", "layer 0"});
  REQUIRE_NOTHROW(store.verify());
}

TEST_CASE("expert store: refuses to overwrite unless told", "[io][store]") {
  TempDir dir;
  const auto path = dir.file("s.moestore");
  write_tiny(path);
  require_error([&] { write_tiny(path); }, ErrorKind::invalid_argument, {path, "overwrite"});
  ExpertStoreWriteOptions opt;
  opt.overwrite = true;
  CHECK(write_tiny(path, opt).blobs_encoded == 12);
}

TEST_CASE("expert store: an interrupted write resumes, re-encoding only missing or damaged blobs",
          "[io][store]") {
  TempDir dir;
  const auto path = dir.file("r.moestore");
  int calls = 0;
  auto failing = [&](ExpertKey k, Precision p) {
    if (++calls > 5) throw std::runtime_error("simulated crash");
    return fake_expert(tiny_shape, k, p);
  };
  CHECK_THROWS_WITH(write_expert_store(path, tiny_shape, f16_q4, failing), "simulated crash");
  CHECK_FALSE(std::filesystem::exists(path));
  REQUIRE(std::filesystem::exists(path + ".partial"));

  // Damage the second blob in the partial file: it must be re-encoded.
  const auto layout = io::store_blob_layout(tiny_shape, f16_q4);
  std::vector<std::byte> junk(16, std::byte{0xAB});
  patch(path + ".partial", layout[1].offset + 100, junk);

  std::vector<std::pair<ExpertKey, Precision>> encoded;
  auto counting = [&](ExpertKey k, Precision p) {
    encoded.emplace_back(k, p);
    return fake_expert(tiny_shape, k, p);
  };
  auto rep = write_expert_store(path, tiny_shape, f16_q4, counting);
  CHECK(rep.blobs_resumed == 4);
  CHECK(rep.blobs_encoded == 8);
  REQUIRE_FALSE(encoded.empty());
  CHECK(encoded.front().first == layout[1].key);
  REQUIRE_NOTHROW(ExpertStore::open(path).verify());

  // A partial file from another layout is never resumed.
  std::filesystem::remove(path);
  calls = 0;
  CHECK_THROWS(write_expert_store(path, tiny_shape, f16_q4, failing));
  const std::vector<Precision> only_q8{Precision::q8};
  auto rep2 = write_expert_store(path, tiny_shape, only_q8, [](ExpertKey k, Precision p) {
    return fake_expert(tiny_shape, k, p);
  });
  CHECK(rep2.blobs_resumed == 0);
  CHECK(rep2.blobs_encoded == 6);
}

TEST_CASE("expert store: writer rejects bad requests and encoders", "[io][store]") {
  TempDir dir;
  require_error(
      [&] {
        write_expert_store(dir.file("a"), tiny_shape, f16_q4,
                           [](ExpertKey, Precision) { return std::vector<std::byte>(7); });
      },
      ErrorKind::invalid_argument, {"7 bytes", "layer 0", "expert 0", "f16"});
  const std::vector<Precision> dup{Precision::q4, Precision::q4};
  require_error([&] { write_expert_store(dir.file("b"), tiny_shape, dup, {}); },
                ErrorKind::invalid_argument, {"twice"});
  const std::vector<Precision> skip{Precision::skip};
  require_error([&] { write_expert_store(dir.file("c"), tiny_shape, skip, {}); },
                ErrorKind::invalid_argument, {"skip"});
}

TEST_CASE("expert store: damaged files give typed errors", "[io][store]") {
  TempDir dir;
  const auto path = dir.file("d.moestore");
  write_tiny(path);
  const auto good = moekit::test::read_file(path);
  auto store = ExpertStore::open(path);
  const auto& b0 = store.blob({1, 2}, Precision::q4);

  SECTION("truncated") {
    std::filesystem::resize_file(path, good.size() - 10);
    require_error([&] { (void)ExpertStore::open(path); }, ErrorKind::invalid_format,
                  {path, "truncated"});
    std::filesystem::resize_file(path, 100);
    require_error([&] { (void)ExpertStore::open(path); }, ErrorKind::invalid_format,
                  {path, "truncated"});
  }
  SECTION("wrong magic") {
    patch(path, 0, std::vector<std::byte>(1, std::byte{'X'}));
    require_error([&] { (void)ExpertStore::open(path); }, ErrorKind::invalid_format,
                  {path, "magic"});
  }
  SECTION("wrong version") {
    patch(path, 8, std::vector<std::byte>(1, std::byte{9}));
    require_error([&] { (void)ExpertStore::open(path); }, ErrorKind::unsupported,
                  {path, "version 9"});
  }
  SECTION("damaged header") {
    patch(path, 20, std::vector<std::byte>(1, std::byte{1}));
    require_error([&] { (void)ExpertStore::open(path); }, ErrorKind::checksum,
                  {path, "header checksum"});
  }
  SECTION("damaged manifest") {
    patch(path, store.header().manifest_offset + 3, std::vector<std::byte>(1, std::byte{'#'}));
    require_error([&] { (void)ExpertStore::open(path); }, ErrorKind::checksum,
                  {path, "manifest checksum"});
  }
  SECTION("damaged blob: verify names the blob and offset") {
    patch(path, b0.offset + 17, std::vector<std::byte>(1, ~good[b0.offset + 17]));
    auto s = ExpertStore::open(path);  // opening does not read blobs
    require_error([&] { s.verify(); }, ErrorKind::checksum,
                  {path, "layer 1", "expert 2", "q4", std::to_string(b0.offset)});
  }
  SECTION("shape disagreement") {
    ModelShape other = tiny_shape;
    other.ffn = 64;
    require_error([&] { (void)ExpertStore::open(path, other); }, ErrorKind::invalid_argument,
                  {path, "expected"});
  }
}

TEST_CASE("expert store: manifest validation catches offsets, overlaps and sizes", "[io][store]") {
  TempDir dir;
  const auto path = dir.file("m.moestore");
  write_tiny(path);
  auto store = ExpertStore::open(path);
  const std::uint64_t data_end = store.header().manifest_offset;
  auto j = io::manifest_to_json(store.manifest());
  REQUIRE_NOTHROW(parse_store_manifest(j.dump(), data_end, "m"));

  auto edit = [&](auto&& change) {
    auto k = j;
    change(k);
    return k.dump();
  };
  require_error(
      [&] {
        (void)parse_store_manifest(edit([](auto& k) { k["blobs"][3]["offset"] = 1u << 30; }),
                                   data_end, "m");
      },
      ErrorKind::invalid_format, {"blob #3", "runs past"});
  require_error(
      [&] {
        (void)parse_store_manifest(edit([](auto& k) { k["blobs"][3]["offset"] = 4097; }), data_end,
                                   "m");
      },
      ErrorKind::invalid_format, {"blob #3", "4096"});
  require_error(
      [&] {
        (void)parse_store_manifest(
            edit([](auto& k) { k["blobs"][3]["offset"] = k["blobs"][2]["offset"]; }), data_end,
            "m");
      },
      ErrorKind::invalid_format, {"overlap"});
  require_error(
      [&] {
        (void)parse_store_manifest(edit([](auto& k) { k["blobs"][0]["bytes"] = 5; }), data_end,
                                   "m");
      },
      ErrorKind::invalid_format, {"blob #0", "5 bytes"});
  require_error(
      [&] {
        (void)parse_store_manifest(edit([](auto& k) { k["blobs"][1] = k["blobs"][0]; }), data_end,
                                   "m");
      },
      ErrorKind::invalid_format, {"twice"});
  require_error(
      [&] {
        (void)parse_store_manifest(edit([](auto& k) { k["blobs"].erase(0); }), data_end, "m");
      },
      ErrorKind::invalid_format, {"'blobs' must list 12"});
  require_error(
      [&] {
        (void)parse_store_manifest(edit([](auto& k) { k["shape"]["top_k"] = 9; }), data_end, "m");
      },
      ErrorKind::invalid_format, {"shape", "top_k"});
  require_error(
      [&] {
        (void)parse_store_manifest(edit([](auto& k) { k["blobs"][0]["xxh64"] = "zz"; }), data_end,
                                   "m");
      },
      ErrorKind::invalid_format, {"xxh64"});
  require_error(
      [&] { (void)parse_store_manifest(edit([](auto& k) { k["version"] = 2; }), data_end, "m"); },
      ErrorKind::unsupported, {"version"});
  require_error([&] { (void)parse_store_manifest("[]", data_end, "m"); }, ErrorKind::invalid_format,
                {"not a JSON object"});
}

namespace {
// Writes a store of `shape` with its quantized blobs in `order` and checks them: the f16 blobs as
// encoded, each matrix of the q4 blobs the encoder's bytes in panels (unpacked, they return).
void check_store_in_panels(const std::string& path, const ModelShape& shape, MatrixOrder order) {
  INFO(name(order));
  auto fake = [&](ExpertKey k, Precision p) { return fake_expert(shape, k, p); };
  ExpertStoreWriteOptions opt;
  opt.order = order;
  write_expert_store(path, shape, f16_q4, fake, opt);
  const auto store = ExpertStore::open(path, shape);
  CHECK(store.manifest().order == order);
  CHECK(store.manifest().order_of(Precision::q4) == order);
  CHECK(store.manifest().order_of(Precision::f16) == MatrixOrder::rows);
  CHECK(io::manifest_to_json(store.manifest())["matrix_order"] == std::string(name(order)));
  const auto file = moekit::test::read_file(path);
  const std::size_t m13 = matrix_bytes(shape.ffn, shape.hidden, Precision::q4, shape.quant);
  for (std::uint32_t l = 0; l < 2; ++l)
    for (std::uint32_t e = 0; e < 3; ++e) {
      const auto& f16 = store.blob({l, e}, Precision::f16);
      const auto want16 = fake({l, e}, Precision::f16);
      CHECK(std::equal(want16.begin(), want16.end(),
                       file.begin() + static_cast<std::ptrdiff_t>(f16.offset)));
      const auto& q4 = store.blob({l, e}, Precision::q4);
      const auto rows = fake({l, e}, Precision::q4);
      const std::span<const std::byte> got(file.data() + q4.offset, q4.bytes);
      CHECK_FALSE(std::equal(rows.begin(), rows.end(), got.begin()));
      std::vector<std::byte> back(q4.bytes);
      const struct {
        std::size_t at, r, c;
      } parts[] = {{0, shape.ffn, shape.hidden},
                   {m13, shape.ffn, shape.hidden},
                   {2 * m13, shape.hidden, shape.ffn}};
      for (const auto& m : parts) {
        const std::size_t n = matrix_bytes(m.r, m.c, Precision::q4, shape.quant);
        unpack_panels(MatrixView{got.data() + m.at, m.r, m.c, Precision::q4, shape.quant, order},
                      std::span(back).subspan(m.at, n));
      }
      CHECK(back == rows);
      CHECK(q4.checksum == xxh64(got));
    }
  REQUIRE_NOTHROW(store.verify());
}
}  // namespace

TEST_CASE("expert store: quantized blobs in panels, packed by the writer", "[io][store][panels]") {
  TempDir dir;
  // blocked_panels4: w2 (96 x 4608) in two column blocks, a group of 16 panels and one of 8.
  check_store_in_panels(dir.file("blocked.moestore"),
                        {.n_layers = 2, .n_experts = 3, .top_k = 1, .hidden = 96, .ffn = 4608},
                        MatrixOrder::blocked_panels4);
  const auto path = dir.file("panels.moestore");
  // Wide enough for whole 512-column steps (tiny_shape's rows are all tail).
  constexpr ModelShape shape{.n_layers = 2, .n_experts = 3, .top_k = 1, .hidden = 1024, .ffn = 544};
  check_store_in_panels(path, shape, MatrixOrder::panels4);
  const auto store = ExpertStore::open(path, shape);
  auto fake = [&](ExpertKey k, Precision p) { return fake_expert(shape, k, p); };
  ExpertStoreWriteOptions opt;
  opt.order = MatrixOrder::panels4;
  // The manifest names the order; a store without the field (written before it) is in rows.
  const std::uint64_t data_end = store.header().manifest_offset;
  auto j = io::manifest_to_json(store.manifest());
  CHECK(j["matrix_order"] == "panels4");
  auto k = j;
  k.erase("matrix_order");
  CHECK(parse_store_manifest(k.dump(), data_end, "p").order == MatrixOrder::rows);
  k["matrix_order"] = "columns";
  require_error([&] { (void)parse_store_manifest(k.dump(), data_end, "p"); },
                ErrorKind::invalid_format,
                {"'matrix_order'", "rows", "panels4", "blocked_panels4"});
  k = j;
  k["quant"]["group_size"] = 0;
  require_error([&] { (void)parse_store_manifest(k.dump(), data_end, "p"); },
                ErrorKind::invalid_format, {"'matrix_order'", "group_size 0"});
  // The writer refuses panels for a scheme they cannot take, before writing anything.
  ModelShape channel = shape;
  channel.quant.group_size = 0;
  require_error([&] { write_expert_store(dir.file("c.moestore"), channel, f16_q4, fake, opt); },
                ErrorKind::invalid_argument, {"panels", "group_size"});
  CHECK_FALSE(std::filesystem::exists(dir.file("c.moestore")));
}

TEST_CASE("expert store: encoding on several threads writes the same file", "[io][store]") {
  TempDir dir;
  const auto one = dir.file("one.moestore");
  write_tiny(one);
  const auto want = moekit::test::read_file(one);
  for (unsigned threads : {2u, 5u, 64u}) {  // 5 does not divide the 12 blobs; 64 exceeds them
    const auto path = dir.file("t" + std::to_string(threads) + ".moestore");
    ExpertStoreWriteOptions opt;
    opt.encode_threads = threads;
    std::size_t last_done = 0;
    opt.progress = [&](std::size_t done, std::size_t total) {
      CHECK(done > last_done);
      CHECK(done <= total);
      last_done = done;
    };
    const auto rep = write_tiny(path, opt);
    CHECK(rep.blobs_encoded == 12);
    CHECK(last_done == 12);
    CHECK(moekit::test::read_file(path) == want);
  }

  // A worker's failure reaches the caller and leaves a partial file that resumes.
  const auto path = dir.file("fail.moestore");
  std::atomic<int> calls{0};
  auto failing = [&](ExpertKey k, Precision p) {
    if (k.layer == 1 && k.expert == 2 && p == Precision::q4)
      throw std::runtime_error("simulated crash");
    ++calls;
    return fake_expert(tiny_shape, k, p);
  };
  ExpertStoreWriteOptions opt;
  opt.encode_threads = 4;
  CHECK_THROWS_WITH(write_expert_store(path, tiny_shape, f16_q4, failing, opt), "simulated crash");
  CHECK_FALSE(std::filesystem::exists(path));
  const auto rep = write_expert_store(
      path, tiny_shape, f16_q4,
      [](ExpertKey k, Precision p) { return fake_expert(tiny_shape, k, p); }, opt);
  CHECK(rep.blobs_resumed + rep.blobs_encoded == 12);
  CHECK(rep.blobs_resumed > 0);
  CHECK(moekit::test::read_file(path) == want);
}
