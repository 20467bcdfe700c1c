#pragma once
// Test-side GGUF writer: builds small v2/v3 files in memory, with knobs to break them.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "moekit/io/gguf.hpp"

namespace moekit::test {

class GgufBuilder {
 public:
  struct Tensor {
    std::string name;
    std::vector<std::uint64_t> ne;  // innermost first, as stored
    std::uint32_t type;
    std::vector<std::byte> data;
    std::int64_t offset_override = -1;
  };

  std::uint32_t version = 3;
  std::uint64_t alignment = 32;
  bool write_alignment_key = false;

  GgufBuilder& kv_u32(const std::string& k, std::uint32_t v) {
    key(k, 4);
    put(v);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& kv_string(const std::string& k, const std::string& v) {
    key(k, 8);
    str(v);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& kv_f32(const std::string& k, float v) {
    key(k, 6);
    put(v);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& kv_bool(const std::string& k, bool v) {
    key(k, 7);
    put(std::uint8_t{v});
    ++n_kv_;
    return *this;
  }
  GgufBuilder& kv_string_array(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9);
    put(std::uint32_t{8});
    put(std::uint64_t{v.size()});
    for (const auto& s : v) str(s);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& kv_i32_array(const std::string& k, const std::vector<std::int32_t>& v) {
    key(k, 9);
    put(std::uint32_t{5});
    put(std::uint64_t{v.size()});
    for (auto x : v) put(x);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& tensor(std::string name, std::vector<std::uint64_t> ne, std::uint32_t type,
                      std::vector<std::byte> data, std::int64_t offset_override = -1) {
    tensors_.push_back({std::move(name), std::move(ne), type, std::move(data), offset_override});
    return *this;
  }

  [[nodiscard]] std::vector<std::byte> bytes() const {
    std::vector<std::byte> out;
    auto append = [&](const void* p, std::size_t n) {
      const auto* b = static_cast<const std::byte*>(p);
      out.insert(out.end(), b, b + n);
    };
    append("GGUF", 4);
    append(&version, 4);
    const std::uint64_t nt = tensors_.size();
    std::uint64_t nkv = n_kv_ + (write_alignment_key ? 1 : 0);
    append(&nt, 8);
    append(&nkv, 8);
    out.insert(out.end(), kv_.begin(), kv_.end());
    if (write_alignment_key) {
      const std::string k = "general.alignment";
      const std::uint64_t n = k.size();
      append(&n, 8);
      append(k.data(), k.size());
      const std::uint32_t t = 4;
      append(&t, 4);
      const auto a = static_cast<std::uint32_t>(alignment);
      append(&a, 4);
    }
    std::uint64_t off = 0;
    std::vector<std::uint64_t> offsets;
    for (const auto& t : tensors_) {
      const std::uint64_t n = t.name.size();
      append(&n, 8);
      append(t.name.data(), t.name.size());
      const auto nd = static_cast<std::uint32_t>(t.ne.size());
      append(&nd, 4);
      for (auto d : t.ne) append(&d, 8);
      append(&t.type, 4);
      const std::uint64_t o =
          t.offset_override >= 0 ? static_cast<std::uint64_t>(t.offset_override) : off;
      append(&o, 8);
      offsets.push_back(o);
      off = (off + t.data.size() + alignment - 1) / alignment * alignment;
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment);
    const std::size_t data_start = out.size();
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      if (out.size() < data_start + offsets[i] + t.data.size())
        out.resize(data_start + offsets[i] + t.data.size());
      std::memcpy(out.data() + data_start + offsets[i], t.data.data(), t.data.size());
    }
    return out;
  }

 private:
  template <class T>
  void put(T v) {
    const auto* b = reinterpret_cast<const std::byte*>(&v);
    kv_.insert(kv_.end(), b, b + sizeof(T));
  }
  void str(const std::string& s) {
    put(std::uint64_t{s.size()});
    const auto* b = reinterpret_cast<const std::byte*>(s.data());
    kv_.insert(kv_.end(), b, b + s.size());
  }
  void key(const std::string& k, std::uint32_t type) {
    str(k);
    put(type);
  }
  std::vector<std::byte> kv_;
  std::uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace moekit::test
