// inject_fault: damages a copy of a model or store the way the robustness suite's faults need,
// located through moekit's own readers (so the suite needs no offsets of its own):
//   inject_fault nan-tensor FILE.safetensors TENSOR INDEX [nan|inf]   one f32 weight -> NaN/Inf
//   inject_fault flip-blob STORE LAYER EXPERT PRECISION               one byte of a blob flipped
//   inject_fault gguf-set-uint FILE.gguf KEY VALUE                    an integer metadata value
// Exit code 0 when done, 1 with a message otherwise.

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/expert_store.hpp"
#include "moekit/io/safetensors.hpp"

namespace {

void patch(const std::string& path, std::uint64_t offset, const void* bytes, std::size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  if (fd < 0 || ::pwrite(fd, bytes, n, static_cast<off_t>(offset)) != static_cast<ssize_t>(n))
    throw moekit::Error(moekit::ErrorKind::io, "cannot patch '" + path + "'");
  ::close(fd);
}

int nan_tensor(const std::string& file, const std::string& name, std::uint64_t index,
               const std::string& kind) {
  const auto model = moekit::io::SafetensorsModel::open(file);
  const moekit::io::TensorView t = model.tensor(name);
  if (t.dtype != moekit::io::DType::f32 || index >= t.elements())
    throw moekit::Error(
        moekit::ErrorKind::invalid_argument,
        "nan-tensor: '" + name + "' is not f32 or has no index " + std::to_string(index));
  const float v = kind == "inf" ? std::numeric_limits<float>::infinity()
                                : std::numeric_limits<float>::quiet_NaN();
  patch(file, t.file_offset + 4 * index, &v, 4);
  return 0;
}

int flip_blob(const std::string& store_path, std::uint32_t layer, std::uint32_t expert,
              const std::string& precision) {
  const auto p = moekit::parse_precision(precision);
  if (!p) throw moekit::Error(moekit::ErrorKind::invalid_argument, "flip-blob: bad precision");
  const auto store = moekit::io::ExpertStore::open(store_path);
  const moekit::io::StoreBlob& b = store.blob({layer, expert}, *p);
  const std::uint64_t at = b.offset + b.bytes / 2;
  unsigned char c = 0;
  const int fd = ::open(store_path.c_str(), O_RDONLY);
  if (fd < 0 || ::pread(fd, &c, 1, static_cast<off_t>(at)) != 1)
    throw moekit::Error(moekit::ErrorKind::io, "cannot read '" + store_path + "'");
  ::close(fd);
  c ^= 0x01;
  patch(store_path, at, &c, 1);
  return 0;
}

// GGUF stores a metadata entry as u64 key length, key bytes, u32 value type, value: the entry is
// found by its key bytes, and its value overwritten in its own integer type (u32, i32, u64, i64).
int gguf_set_uint(const std::string& file, const std::string& key, std::uint64_t value) {
  std::vector<char> bytes;
  {
    const int fd = ::open(file.c_str(), O_RDONLY);
    if (fd < 0) throw moekit::Error(moekit::ErrorKind::io, "cannot open '" + file + "'");
    char buf[65536];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) bytes.insert(bytes.end(), buf, buf + n);
    ::close(fd);
  }
  std::string needle(8, '\0');
  const std::uint64_t len = key.size();
  std::memcpy(needle.data(), &len, 8);
  needle += key;
  const auto at = std::string_view(bytes.data(), bytes.size()).find(needle);
  if (at == std::string_view::npos || at + needle.size() + 4 > bytes.size())
    throw moekit::Error(moekit::ErrorKind::invalid_argument, "gguf-set-uint: no key '" + key + "'");
  std::uint32_t type = 0;
  std::memcpy(&type, bytes.data() + at + needle.size(), 4);
  const std::uint64_t value_at = at + needle.size() + 4;
  if (type == 4 || type == 5) {  // u32, i32
    const auto v = static_cast<std::uint32_t>(value);
    patch(file, value_at, &v, 4);
  } else if (type == 10 || type == 11) {  // u64, i64
    patch(file, value_at, &value, 8);
  } else {
    throw moekit::Error(moekit::ErrorKind::invalid_argument,
                        "gguf-set-uint: '" + key + "' has type " + std::to_string(type));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string what = argc > 1 ? argv[1] : "";
    if (what == "nan-tensor" && (argc == 5 || argc == 6))
      return nan_tensor(argv[2], argv[3], std::stoull(argv[4]), argc == 6 ? argv[5] : "nan");
    if (what == "flip-blob" && argc == 6)
      return flip_blob(argv[2], static_cast<std::uint32_t>(std::stoul(argv[3])),
                       static_cast<std::uint32_t>(std::stoul(argv[4])), argv[5]);
    if (what == "gguf-set-uint" && argc == 5)
      return gguf_set_uint(argv[2], argv[3], std::stoull(argv[4]));
    std::cerr << "usage: inject_fault nan-tensor FILE TENSOR INDEX [nan|inf] | "
                 "flip-blob STORE LAYER EXPERT PRECISION | gguf-set-uint FILE KEY VALUE\n";
  } catch (const std::exception& e) {
    std::cerr << "inject_fault: " << e.what() << "\n";
  }
  return 1;
}
