// npy reader: hand-built arrays of each supported dtype, and each rejected input.

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "moekit/sim/npy.hpp"

using namespace moekit;
using namespace moekit::sim;

namespace {

// A .npy v1.0 (or v2.0) file with `header` (padded to 64 bytes) and `payload`.
std::vector<std::byte> npy(const std::string& dict, const std::vector<unsigned char>& payload,
                           int major = 1) {
  std::string h = dict;
  const std::size_t pre = major == 1 ? 10 : 12;
  while ((pre + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::vector<unsigned char> b = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<unsigned char>(major),
                                  0};
  const auto n = h.size();
  b.push_back(n & 0xff);
  b.push_back((n >> 8) & 0xff);
  if (major != 1) {
    b.push_back((n >> 16) & 0xff);
    b.push_back((n >> 24) & 0xff);
  }
  b.insert(b.end(), h.begin(), h.end());
  b.insert(b.end(), payload.begin(), payload.end());
  std::vector<std::byte> out(b.size());
  std::memcpy(out.data(), b.data(), b.size());
  return out;
}

template <class T>
std::vector<unsigned char> le(std::initializer_list<T> v) {
  std::vector<unsigned char> out(v.size() * sizeof(T));
  std::size_t at = 0;
  for (T x : v) {  // the test host is little-endian (checked below)
    std::memcpy(out.data() + at, &x, sizeof(T));
    at += sizeof(T);
  }
  return out;
}

void expect_bad(const std::vector<std::byte>& b, const std::string& field) {
  try {
    (void)parse_npy(b, "x.npy");
    FAIL("accepted input with a bad '" << field << "'");
  } catch (const Error& e) {
    INFO(e.message());
    CHECK(e.kind() == ErrorKind::invalid_format);
    CHECK(e.message().find("x.npy") != std::string::npos);
    CHECK(e.message().find("'" + field + "'") != std::string::npos);
  }
}

}  // namespace

TEST_CASE("npy reader parses the supported dtypes", "[sim][npy]") {
  REQUIRE(std::endian::native == std::endian::little);
  auto f4 = parse_npy(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                          le<float>({1, 2, 3, 4, 5, 6.5f})));
  CHECK(f4.shape == std::vector<std::size_t>{2, 3});
  CHECK(f4.at({1, 2}) == 6.5);
  auto f8 = parse_npy(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
                          le<double>({-1.25, 0, 1e300}), 2));
  CHECK(f8.data == std::vector<double>{-1.25, 0, 1e300});
  auto i2 = parse_npy(npy("{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }",
                          le<std::int16_t>({-300, 7})));
  CHECK(i2.data == std::vector<double>{-300, 7});
  auto u1 = parse_npy(npy("{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }", {255, 3}));
  CHECK(u1.data == std::vector<double>{255, 3});
  auto i8 = parse_npy(
      npy("{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }", le<std::int64_t>({-5})));
  CHECK(i8.data[0] == -5);
  auto scalar =
      parse_npy(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", le<float>({3})));
  CHECK(scalar.shape.empty());
  CHECK(scalar.data == std::vector<double>{3});
}

TEST_CASE("npy reader rejects what it does not support", "[sim][npy]") {
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const auto payload = le<float>({1, 2});
  auto good = npy(ok, payload);
  REQUIRE_NOTHROW(parse_npy(good));
  auto b = good;
  b[1] = std::byte{'X'};
  expect_bad(b, "magic");
  expect_bad({}, "magic");
  b = good;
  b[6] = std::byte{9};
  expect_bad(b, "version");
  b = good;
  b.resize(30);
  expect_bad(b, "header_len");
  b = good;
  b.pop_back();
  expect_bad(b, "shape");
  expect_bad(npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", payload), "descr");
  expect_bad(npy("{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }", payload), "descr");
  expect_bad(npy("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", payload), "descr");
  expect_bad(npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", payload),
             "fortran_order");
  expect_bad(npy("{'descr': '<f4', 'shape': (2,), }", payload), "fortran_order");
  expect_bad(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", payload), "shape");
  expect_bad(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", payload), "shape");
  expect_bad(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, "
                 "99999999999), }",
                 payload),
             "shape");
}

TEST_CASE("npy reader reads the shipped statistics", "[sim][npy]") {
  const auto q = read_npy(MOEKIT_SOURCE_DIR "/data/stats/qwen-top1-transition.npy");
  CHECK(q.dtype == "<f4");
  CHECK(q.shape == std::vector<std::size_t>{24, 60, 60});
  double layer0 = 0;
  for (std::size_t i = 0; i < 3600; ++i) layer0 += q.data[i];
  CHECK(layer0 == 10220);  // transitions counted per layer (data/README.md)
  const auto c = read_npy(MOEKIT_SOURCE_DIR "/data/stats/expert_activation_counts.npy");
  CHECK(c.dtype == "<f8");
  CHECK(c.shape == std::vector<std::size_t>{32, 8});
}
