#pragma once
/// \file Hugging Face safetensors: a validating zero-copy reader (single file or sharded with
/// `model.safetensors.index.json`) and a small writer for f32/f16/bf16.
///
/// Format: an 8-byte little-endian header length N, N bytes of JSON
/// `{"__metadata__": {str: str}, "<tensor>": {"dtype": "F16", "shape": [..],
/// "data_offsets": [begin, end]}, ...}`, then the data section; offsets are relative to its start
/// (byte 8 + N). The reader checks the header length against the file size, that every tensor lies
/// inside the data section, that no two tensors overlap, and that shape × dtype size equals the
/// byte span. Tensors of other dtypes (I8, F64, ...) are listed but reading them reports
/// `ErrorKind::unsupported` with the tensor's name.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/io/detail/bytes.hpp"
#include "moekit/io/detail/posix_file.hpp"
#include "moekit/io/tensor.hpp"
#include "moekit/precision/half.hpp"

namespace moekit::io {

/// One tensor entry of a safetensors header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;      ///< as written in the file ("F16", "I64", ...)
  std::optional<DType> dtype;  ///< set for F32, F16, BF16
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  ///< relative to the data section
  std::uint64_t end = 0;
};

/// A parsed and validated safetensors header.
struct SafetensorsHeader {
  std::uint64_t data_offset = 0;  ///< absolute offset of the data section (8 + header length)
  std::vector<SafetensorsEntry> tensors;        ///< sorted by name
  std::map<std::string, std::string> metadata;  ///< "__metadata__"
};

namespace detail {

/// Element size of every dtype safetensors defines, 0 for names it does not know.
inline std::uint64_t safetensors_element_bytes(std::string_view d) noexcept {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

inline std::optional<DType> safetensors_dtype(std::string_view d) noexcept {
  if (d == "F32") return DType::f32;
  if (d == "F16") return DType::f16;
  if (d == "BF16") return DType::bf16;
  return std::nullopt;
}

inline std::string_view safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f16:
      return "F16";
    case DType::bf16:
      return "BF16";
    default:
      break;
  }
  throw Error(ErrorKind::unsupported,
              "safetensors cannot store " + std::string(name(t)) + " tensors");
}

}  // namespace detail

/// Largest header the reader accepts (the reference implementation's limit is 100 MB).
inline constexpr std::uint64_t safetensors_max_header = 100'000'000;

namespace detail {

template <class Bad>
void read_safetensors_metadata(const nlohmann::json& v, SafetensorsHeader& h, const Bad& bad) {
  if (!v.is_object()) throw bad("__metadata__ is not an object");
  for (auto m = v.begin(); m != v.end(); ++m) {
    if (!m.value().is_string()) throw bad("__metadata__['" + m.key() + "'] is not a string");
    h.metadata.emplace(m.key(), m.value().get<std::string>());
  }
}

/// The header's entry for tensor `key`, checked against its dtype, its shape and the data
/// section of `data_size` bytes at `data_offset`.
template <class Bad>
SafetensorsEntry read_safetensors_entry(const std::string& key, const nlohmann::json& v,
                                        const std::string& file_name, std::uint64_t data_offset,
                                        std::uint64_t data_size, const Bad& bad) {
  auto tbad = [&](const std::string& what) { return bad("tensor '" + key + "': " + what); };
  if (!v.is_object()) throw tbad("entry is not an object");
  SafetensorsEntry e;
  e.name = key;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) throw tbad("missing string field 'dtype'");
  e.dtype_name = dt->get<std::string>();
  const std::uint64_t esize = safetensors_element_bytes(e.dtype_name);
  if (esize == 0)
    throw Error(ErrorKind::unsupported, "safetensors '" + file_name + "': tensor '" + key +
                                            "' has unknown dtype '" + e.dtype_name + "'");
  e.dtype = safetensors_dtype(e.dtype_name);
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) throw tbad("missing array field 'shape'");
  std::uint64_t elements = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned())
      throw tbad("shape has an entry that is not a non-negative integer");
    const auto dim = d.get<std::uint64_t>();
    auto prod = checked_mul(elements, dim);
    if (!prod) throw tbad("shape's element count overflows");
    elements = *prod;
    e.shape.push_back(dim);
  }
  if (e.shape.size() > 8) throw tbad("rank " + std::to_string(e.shape.size()) + " is too large");
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    throw tbad("'data_offsets' must be an array of two non-negative integers");
  e.begin = (*off)[0].get<std::uint64_t>();
  e.end = (*off)[1].get<std::uint64_t>();
  if (e.begin > e.end)
    throw tbad("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
               ") are reversed");
  if (e.end > data_size)
    throw tbad("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
               ") (absolute offset " + std::to_string(data_offset + e.begin) + ") run past the " +
               std::to_string(data_size) + "-byte data section (truncated file?)");
  auto bytes = checked_mul(elements, esize);
  if (!bytes || *bytes != e.end - e.begin)
    throw tbad("shape × " + e.dtype_name + " size is " +
               (bytes ? std::to_string(*bytes) : std::string("too large")) +
               " bytes but data_offsets span " + std::to_string(e.end - e.begin) +
               " bytes at absolute offset " + std::to_string(data_offset + e.begin));
  return e;
}

/// Sorted by start, each non-empty tensor must end before the next one starts.
template <class Bad>
void check_safetensors_disjoint(const SafetensorsHeader& h, const Bad& bad) {
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : h.tensors)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      throw bad("tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name +
                "' overlap at absolute offset " +
                std::to_string(h.data_offset + by_offset[i]->begin));
}

}  // namespace detail

/// Parses and validates the header of a safetensors file whose complete bytes are `file`.
/// `file_name` is used in error messages. Throws `Error(invalid_format)` naming the file, the
/// tensor and the offset on any inconsistency, `Error(unsupported)` for a dtype safetensors does
/// not define. The entry point of the fuzz target.
inline SafetensorsHeader parse_safetensors(std::span<const std::byte> file,
                                           const std::string& file_name) {
  auto bad = [&](const std::string& what) -> Error {
    return Error(ErrorKind::invalid_format, "safetensors '" + file_name + "': " + what);
  };
  if (file.size() < 8)
    throw bad("file is " + std::to_string(file.size()) +
              " bytes, too short for the 8-byte header length");
  const std::uint64_t n = detail::load_le<std::uint64_t>(file.data());
  if (n > safetensors_max_header)
    throw bad("header length " + std::to_string(n) + " at offset 0 exceeds the limit of " +
              std::to_string(safetensors_max_header) + " bytes");
  if (n > file.size() - 8)
    throw bad("header length " + std::to_string(n) + " at offset 0 runs past the end of the " +
              std::to_string(file.size()) + "-byte file (truncated?)");
  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const std::uint64_t data_size = file.size() - h.data_offset;
  const auto* text = reinterpret_cast<const char*>(file.data() + 8);
  nlohmann::json j = nlohmann::json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw bad("header (offset 8, " + std::to_string(n) + " bytes) is not valid JSON");
  if (!j.is_object()) throw bad("header JSON is not an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__")
      detail::read_safetensors_metadata(it.value(), h, bad);
    else
      h.tensors.push_back(detail::read_safetensors_entry(it.key(), it.value(), file_name,
                                                         h.data_offset, data_size, bad));
  }
  detail::check_safetensors_disjoint(h, bad);
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return h;
}

/// One mapped safetensors file. Move-only; views stay valid while it lives.
class SafetensorsFile {
 public:
  /// Maps and validates `path`.
  explicit SafetensorsFile(const std::string& path) : map_(path) {
    header_ = parse_safetensors(map_.bytes(), map_.path());
  }

  [[nodiscard]] const std::string& path() const noexcept { return map_.path(); }
  [[nodiscard]] const SafetensorsHeader& header() const noexcept { return header_; }
  /// The whole mapped file (views point into it).
  [[nodiscard]] std::span<const std::byte> mapped_bytes() const noexcept { return map_.bytes(); }
  [[nodiscard]] const std::vector<SafetensorsEntry>& entries() const noexcept {
    return header_.tensors;
  }

  /// The entry named `name`, or nullptr.
  [[nodiscard]] const SafetensorsEntry* entry(std::string_view name) const noexcept {
    auto it =
        std::lower_bound(header_.tensors.begin(), header_.tensors.end(), name,
                         [](const SafetensorsEntry& e, std::string_view n) { return e.name < n; });
    return it != header_.tensors.end() && it->name == name ? &*it : nullptr;
  }

  /// A view of tensor `name`, or nullopt when absent. Throws `Error(unsupported)` naming the
  /// tensor when its dtype is not F32, F16 or BF16, or its rank exceeds max_tensor_rank.
  [[nodiscard]] std::optional<TensorView> find(std::string_view name) const {
    const SafetensorsEntry* e = entry(name);
    if (e == nullptr) return std::nullopt;
    return view(*e);
  }

  /// Like find(), but throws `Error(invalid_argument)` naming the file when absent.
  [[nodiscard]] TensorView tensor(std::string_view name) const {
    auto t = find(name);
    if (!t)
      throw Error(ErrorKind::invalid_argument,
                  "safetensors '" + path() + "' has no tensor '" + std::string(name) + "'");
    return *t;
  }

  [[nodiscard]] TensorView view(const SafetensorsEntry& e) const {
    if (!e.dtype)
      throw Error(ErrorKind::unsupported, "safetensors '" + path() + "': tensor '" + e.name +
                                              "' has dtype " + e.dtype_name +
                                              "; only F32, F16 and BF16 are supported");
    if (e.shape.size() > max_tensor_rank)
      throw Error(ErrorKind::unsupported, "safetensors '" + path() + "': tensor '" + e.name +
                                              "' has rank " + std::to_string(e.shape.size()));
    TensorView t;
    t.name = e.name;
    t.file = path();
    t.dtype = *e.dtype;
    t.rank = e.shape.size();
    std::copy(e.shape.begin(), e.shape.end(), t.dims.begin());
    t.file_offset = header_.data_offset + e.begin;
    t.bytes = map_.bytes().subspan(t.file_offset, e.end - e.begin);
    return t;
  }

 private:
  detail::MappedFile map_;
  SafetensorsHeader header_;
};

/// A checkpoint of one or more safetensors files. `open` accepts a directory (uses
/// `model.safetensors.index.json` when present, else `model.safetensors`), an index JSON, or a
/// single `.safetensors` file.
class SafetensorsModel {
 public:
  static SafetensorsModel open(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    SafetensorsModel m;
    fs::path p = path;
    if (fs::is_directory(p)) {
      if (fs::exists(p / "model.safetensors.index.json"))
        p /= "model.safetensors.index.json";
      else if (fs::exists(p / "model.safetensors"))
        p /= "model.safetensors";
      else
        throw Error(ErrorKind::invalid_argument,
                    "directory '" + path.string() +
                        "' has neither model.safetensors.index.json nor model.safetensors");
    }
    if (p.extension() == ".json")
      m.open_index(p);
    else
      m.add_shard(p.string());
    return m;
  }

  /// A view of `name` from whichever shard holds it, or nullopt.
  [[nodiscard]] std::optional<TensorView> find(std::string_view name) const {
    if (!weight_map_.empty()) {
      auto it = weight_map_.find(std::string(name));
      if (it == weight_map_.end()) return std::nullopt;
      return shards_[it->second]->find(name);
    }
    for (const auto& s : shards_)
      if (auto t = s->find(name)) return t;
    return std::nullopt;
  }

  [[nodiscard]] TensorView tensor(std::string_view name) const {
    auto t = find(name);
    if (!t)
      throw Error(ErrorKind::invalid_argument,
                  "checkpoint '" + source_ + "' has no tensor '" + std::string(name) + "'");
    return *t;
  }

  /// Every tensor name, sorted.
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& s : shards_)
      for (const auto& e : s->entries()) out.push_back(e.name);
    std::sort(out.begin(), out.end());
    return out;
  }

  [[nodiscard]] std::size_t shard_count() const noexcept { return shards_.size(); }
  [[nodiscard]] const SafetensorsFile& shard(std::size_t i) const { return *shards_.at(i); }

 private:
  std::size_t add_shard(const std::string& file) {
    shards_.push_back(std::make_unique<SafetensorsFile>(file));
    if (source_.empty()) source_ = file;
    return shards_.size() - 1;
  }

  void open_index(const std::filesystem::path& index) {
    source_ = index.string();
    std::ifstream in(index);
    if (!in) detail::fail_errno("cannot open", source_, errno);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    auto bad = [&](const std::string& what) {
      return Error(ErrorKind::invalid_format, "safetensors index '" + source_ + "': " + what);
    };
    if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) throw bad("missing object 'weight_map'");
    std::map<std::string, std::size_t> shard_of_file;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) throw bad("weight_map['" + it.key() + "'] is not a string");
      const std::string file = it.value().get<std::string>();
      if (file.find('/') != std::string::npos || file == "..")
        throw bad("weight_map['" + it.key() + "'] names '" + file +
                  "', not a file beside the index");
      auto [s, inserted] = shard_of_file.emplace(file, 0);
      if (inserted) s->second = add_shard((index.parent_path() / file).string());
      weight_map_.emplace(it.key(), s->second);
    }
    source_ = index.string();
    for (const auto& [name, shard] : weight_map_)
      if (shards_[shard]->entry(name) == nullptr)
        throw bad("tensor '" + name + "' is mapped to '" + shards_[shard]->path() +
                  "', which does not contain it");
  }

  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, std::size_t, std::less<>> weight_map_;
  std::string source_;
};

/// Builds a safetensors file in memory and writes it (tests and tools). Tensors keep insertion
/// order in the data section; the header is padded with spaces to a multiple of 8 bytes.
class SafetensorsWriter {
 public:
  /// Adds `values` (row-major, `shape`) converted to `dtype` (F32, F16 or BF16).
  SafetensorsWriter& add(std::string name, DType dtype, std::vector<std::uint64_t> shape,
                         std::span<const float> values) {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    MOEKIT_EXPECTS(n == values.size(),
                   "SafetensorsWriter::add: values do not match the shape of '" + name + "'");
    std::vector<std::byte> bytes;
    const auto dn = detail::safetensors_dtype_name(dtype);
    bytes.resize(values.size() * (dtype == DType::f32 ? 4 : 2));
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::f32)
        detail::store_le<float>(bytes.data() + 4 * i, values[i]);
      else
        detail::store_le<std::uint16_t>(bytes.data() + 2 * i, dtype == DType::f16
                                                                  ? float_to_half_bits(values[i])
                                                                  : float_to_bf16_bits(values[i]));
    }
    return add_raw(std::move(name), std::string(dn), std::move(shape), std::move(bytes));
  }

  /// Adds raw bytes with any dtype name (no checks: lets tests write broken files).
  SafetensorsWriter& add_raw(std::string name, std::string dtype, std::vector<std::uint64_t> shape,
                             std::vector<std::byte> bytes) {
    tensors_.push_back({std::move(name), std::move(dtype), std::move(shape), std::move(bytes)});
    return *this;
  }

  SafetensorsWriter& metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
    return *this;
  }

  /// The complete file.
  [[nodiscard]] std::vector<std::byte> bytes() const {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    if (!metadata_.empty()) h["__metadata__"] = metadata_;
    std::uint64_t off = 0;
    for (const auto& t : tensors_) {
      h[t.name] = {
          {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
      off += t.bytes.size();
    }
    std::string text = h.dump();
    text.resize(detail::align_up(text.size(), 8), ' ');
    std::vector<std::byte> out(8 + text.size());
    detail::store_le<std::uint64_t>(out.data(), text.size());
    std::memcpy(out.data() + 8, text.data(), text.size());
    for (const auto& t : tensors_) out.insert(out.end(), t.bytes.begin(), t.bytes.end());
    return out;
  }

  /// Writes the file to `path` (replacing it).
  void write(const std::string& path) const {
    auto data = bytes();
    auto fd = detail::FileDescriptor::open(path, O_WRONLY | O_CREAT | O_TRUNC);
    detail::write_all(fd.get(), data, path);
  }

 private:
  struct Pending {
    std::string name, dtype;
    std::vector<std::uint64_t> shape;
    std::vector<std::byte> bytes;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace moekit::io
