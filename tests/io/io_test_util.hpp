#pragma once
// Helpers shared by the io tests: a temporary directory removed at scope exit, file writers,
// and a matcher for moekit::Error kind + message fragments.

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "moekit/error.hpp"

namespace moekit::test {

/// A fresh directory under the system temp dir, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "moekit-io-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, std::span<const std::byte> data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  REQUIRE(out.good());
}

inline std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

/// Runs `f`, requires it to throw moekit::Error of `kind` whose message contains every fragment.
template <class F>
void require_error(F&& f, ErrorKind kind, std::initializer_list<std::string> fragments) {
  try {
    f();
  } catch (const Error& e) {
    INFO("message: " << e.message());
    CHECK(static_cast<int>(e.kind()) == static_cast<int>(kind));
    for (const auto& frag : fragments) CHECK(e.message().find(frag) != std::string::npos);
    return;
  }
  FAIL("expected a moekit::Error");
}

}  // namespace moekit::test
