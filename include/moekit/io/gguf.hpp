#pragma once
/// \file GGUF (ggml's model file, versions 2 and 3): a validating zero-copy reader.
///
/// Layout (little-endian): magic "GGUF"; u32 version; u64 tensor_count; u64 kv_count; kv_count
/// metadata pairs (string key, u32 value type, value; strings are u64 length + bytes, arrays are
/// u32 element type + u64 count + elements); tensor_count tensor infos (string name, u32 n_dims,
/// u64 ne[n_dims] innermost first, u32 ggml type, u64 offset relative to the data section); then
/// padding to `general.alignment` (default 32) and the data section. Version 1 (u32 counts) and
/// big-endian files are reported as unsupported.
///
/// The reader checks every length against the bytes that remain, the alignment of each tensor
/// offset, that every tensor lies inside the file, that no two tensors overlap, and that the
/// shape is a whole number of blocks of its type. Tensors of ggml types other than F32, F16, BF16,
/// Q8_0, Q4_0 and the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K are listed (their sizes are known)
/// but reading them reports `ErrorKind::unsupported` with the tensor's name.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/io/detail/bytes.hpp"
#include "moekit/io/detail/posix_file.hpp"
#include "moekit/io/tensor.hpp"

namespace moekit::io {

/// Metadata value types, numbered as in the GGUF specification.
enum class GgufValueType : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

/// ggml tensor types used in GGUF files (a subset of ggml_type, same numbers).
namespace ggml_type {
inline constexpr std::uint32_t f32 = 0, f16 = 1, q4_0 = 2, q8_0 = 8, q2_k = 10, q3_k = 11,
                               q4_k = 12, q5_k = 13, q6_k = 14, bf16 = 30;
}

/// One metadata value. Integers are widened (unsigned to u64, signed to i64), floats to double;
/// `type` keeps the stored type and `element_type` the element type of an array.
struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  GgufValueType element_type = GgufValueType::u8;
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string, std::vector<GgufValue>>
      value;

  [[nodiscard]] bool is_integer() const noexcept {
    return std::holds_alternative<std::uint64_t>(value) ||
           std::holds_alternative<std::int64_t>(value);
  }
  /// The value as a non-negative integer; throws `Error(invalid_format)` otherwise.
  [[nodiscard]] std::uint64_t as_uint(std::string_view key) const {
    if (auto* u = std::get_if<std::uint64_t>(&value)) return *u;
    if (auto* i = std::get_if<std::int64_t>(&value); i && *i >= 0)
      return static_cast<std::uint64_t>(*i);
    throw Error(ErrorKind::invalid_format,
                "GGUF metadata '" + std::string(key) + "' is not a non-negative integer");
  }
  [[nodiscard]] double as_double(std::string_view key) const {
    if (auto* d = std::get_if<double>(&value)) return *d;
    if (auto* u = std::get_if<std::uint64_t>(&value)) return static_cast<double>(*u);
    if (auto* i = std::get_if<std::int64_t>(&value)) return static_cast<double>(*i);
    throw Error(ErrorKind::invalid_format,
                "GGUF metadata '" + std::string(key) + "' is not a number");
  }
  [[nodiscard]] const std::string& as_string(std::string_view key) const {
    if (auto* s = std::get_if<std::string>(&value)) return *s;
    throw Error(ErrorKind::invalid_format,
                "GGUF metadata '" + std::string(key) + "' is not a string");
  }
  [[nodiscard]] const std::vector<GgufValue>& as_array(std::string_view key) const {
    if (auto* a = std::get_if<std::vector<GgufValue>>(&value)) return *a;
    throw Error(ErrorKind::invalid_format,
                "GGUF metadata '" + std::string(key) + "' is not an array");
  }
};

/// One tensor info of a GGUF file.
struct GgufTensorInfo {
  std::string name;
  std::uint32_t ggml_type = 0;
  std::optional<DType> dtype;                         ///< set for the types moekit reads
  std::array<std::uint64_t, max_tensor_rank> dims{};  ///< row-major (ne[] reversed)
  std::size_t rank = 0;
  std::uint64_t offset = 0;  ///< relative to the data section
  std::uint64_t bytes = 0;
};

/// A parsed and validated GGUF header.
struct GgufHeader {
  std::uint32_t version = 0;
  std::uint64_t alignment = 32;
  std::uint64_t data_offset = 0;  ///< absolute offset of the data section
  std::map<std::string, GgufValue, std::less<>> metadata;
  std::vector<GgufTensorInfo> tensors;  ///< in file order
};

namespace detail {

struct GgmlTypeInfo {
  std::uint64_t block_elements, block_bytes;
  std::string_view name;
};

/// Block geometry of every ggml type whose size is fixed (ggml's type traits); nullopt otherwise.
inline std::optional<GgmlTypeInfo> ggml_type_info(std::uint32_t t) noexcept {
  switch (t) {
    case 0:
      return GgmlTypeInfo{1, 4, "F32"};
    case 1:
      return GgmlTypeInfo{1, 2, "F16"};
    case 2:
      return GgmlTypeInfo{32, 18, "Q4_0"};
    case 3:
      return GgmlTypeInfo{32, 20, "Q4_1"};
    case 6:
      return GgmlTypeInfo{32, 22, "Q5_0"};
    case 7:
      return GgmlTypeInfo{32, 24, "Q5_1"};
    case 8:
      return GgmlTypeInfo{32, 34, "Q8_0"};
    case 9:
      return GgmlTypeInfo{32, 40, "Q8_1"};
    case 10:
      return GgmlTypeInfo{256, 84, "Q2_K"};
    case 11:
      return GgmlTypeInfo{256, 110, "Q3_K"};
    case 12:
      return GgmlTypeInfo{256, 144, "Q4_K"};
    case 13:
      return GgmlTypeInfo{256, 176, "Q5_K"};
    case 14:
      return GgmlTypeInfo{256, 210, "Q6_K"};
    case 15:
      return GgmlTypeInfo{256, 292, "Q8_K"};
    case 16:
      return GgmlTypeInfo{256, 66, "IQ2_XXS"};
    case 17:
      return GgmlTypeInfo{256, 74, "IQ2_XS"};
    case 18:
      return GgmlTypeInfo{256, 98, "IQ3_XXS"};
    case 19:
      return GgmlTypeInfo{256, 50, "IQ1_S"};
    case 20:
      return GgmlTypeInfo{32, 18, "IQ4_NL"};
    case 21:
      return GgmlTypeInfo{256, 110, "IQ3_S"};
    case 22:
      return GgmlTypeInfo{256, 82, "IQ2_S"};
    case 23:
      return GgmlTypeInfo{256, 136, "IQ4_XS"};
    case 24:
      return GgmlTypeInfo{1, 1, "I8"};
    case 25:
      return GgmlTypeInfo{1, 2, "I16"};
    case 26:
      return GgmlTypeInfo{1, 4, "I32"};
    case 27:
      return GgmlTypeInfo{1, 8, "I64"};
    case 28:
      return GgmlTypeInfo{1, 8, "F64"};
    case 29:
      return GgmlTypeInfo{256, 56, "IQ1_M"};
    case 30:
      return GgmlTypeInfo{1, 2, "BF16"};
    case 34:
      return GgmlTypeInfo{256, 54, "TQ1_0"};
    case 35:
      return GgmlTypeInfo{256, 66, "TQ2_0"};
    default:
      return std::nullopt;
  }
}

inline std::optional<DType> gguf_dtype(std::uint32_t t) noexcept {
  switch (t) {
    case ggml_type::f32:
      return DType::f32;
    case ggml_type::f16:
      return DType::f16;
    case ggml_type::bf16:
      return DType::bf16;
    case ggml_type::q8_0:
      return DType::q8_0;
    case ggml_type::q4_0:
      return DType::q4_0;
    case ggml_type::q4_k:
      return DType::q4_k;
    case ggml_type::q2_k:
      return DType::q2_k;
    case ggml_type::q3_k:
      return DType::q3_k;
    case ggml_type::q5_k:
      return DType::q5_k;
    case ggml_type::q6_k:
      return DType::q6_k;
    default:
      return std::nullopt;
  }
}

/// Bounds-checked sequential reader over the file bytes; every failure names file and offset.
class GgufCursor {
 public:
  GgufCursor(std::span<const std::byte> b, const std::string& file) : b_(b), file_(file) {}

  [[nodiscard]] std::uint64_t pos() const noexcept { return pos_; }
  [[nodiscard]] std::uint64_t remaining() const noexcept { return b_.size() - pos_; }

  [[noreturn]] void fail(const std::string& what) const { fail_at(what, pos_); }
  [[noreturn]] void fail_at(const std::string& what, std::uint64_t at) const {
    throw Error(ErrorKind::invalid_format,
                "GGUF '" + file_ + "': " + what + " at offset " + std::to_string(at));
  }

  const std::byte* take(std::uint64_t n, const char* what) {
    if (n > remaining())
      fail(std::string("file truncated: ") + what + " needs " + std::to_string(n) + " bytes, " +
           std::to_string(remaining()) + " remain,");
    const std::byte* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }
  template <class T>
  T get(const char* what) {
    return load_le<T>(take(sizeof(T), what));
  }
  std::string string(const char* what) {
    const std::uint64_t n = get<std::uint64_t>(what);
    const std::byte* p = take(n, what);
    return std::string(reinterpret_cast<const char*>(p), n);
  }

 private:
  std::span<const std::byte> b_;
  const std::string& file_;
  std::uint64_t pos_ = 0;
};

/// Smallest encoding of one value of type `t` (for bounding array counts before allocating).
inline std::uint64_t gguf_min_value_bytes(GgufValueType t) noexcept {
  switch (t) {
    case GgufValueType::u8:
    case GgufValueType::i8:
    case GgufValueType::boolean:
      return 1;
    case GgufValueType::u16:
    case GgufValueType::i16:
      return 2;
    case GgufValueType::u32:
    case GgufValueType::i32:
    case GgufValueType::f32:
      return 4;
    case GgufValueType::u64:
    case GgufValueType::i64:
    case GgufValueType::f64:
    case GgufValueType::string:
      return 8;
    case GgufValueType::array:
      return 12;
  }
  return 1;
}

inline GgufValue read_gguf_value(GgufCursor& c, std::uint32_t raw_type, const std::string& key,
                                 int depth) {
  GgufValue v;
  if (raw_type > 12)
    c.fail("metadata '" + key + "' has unknown value type " + std::to_string(raw_type));
  v.type = static_cast<GgufValueType>(raw_type);
  switch (v.type) {
    case GgufValueType::u8:
      v.value = std::uint64_t{c.get<std::uint8_t>("u8")};
      break;
    case GgufValueType::i8:
      v.value = std::int64_t{c.get<std::int8_t>("i8")};
      break;
    case GgufValueType::u16:
      v.value = std::uint64_t{c.get<std::uint16_t>("u16")};
      break;
    case GgufValueType::i16:
      v.value = std::int64_t{c.get<std::int16_t>("i16")};
      break;
    case GgufValueType::u32:
      v.value = std::uint64_t{c.get<std::uint32_t>("u32")};
      break;
    case GgufValueType::i32:
      v.value = std::int64_t{c.get<std::int32_t>("i32")};
      break;
    case GgufValueType::u64:
      v.value = c.get<std::uint64_t>("u64");
      break;
    case GgufValueType::i64:
      v.value = c.get<std::int64_t>("i64");
      break;
    case GgufValueType::f32:
      v.value = double{c.get<float>("f32")};
      break;
    case GgufValueType::f64:
      v.value = c.get<double>("f64");
      break;
    case GgufValueType::boolean: {
      const auto b = c.get<std::uint8_t>("bool");
      if (b > 1)
        c.fail_at("metadata '" + key + "' has bool value " + std::to_string(b), c.pos() - 1);
      v.value = b == 1;
      break;
    }
    case GgufValueType::string:
      v.value = c.string("string value");
      break;
    case GgufValueType::array: {
      if (depth >= 4) c.fail("metadata '" + key + "' nests arrays more than 4 deep");
      const auto et = c.get<std::uint32_t>("array element type");
      if (et > 12) c.fail("metadata '" + key + "' has array of unknown type " + std::to_string(et));
      v.element_type = static_cast<GgufValueType>(et);
      const auto n = c.get<std::uint64_t>("array length");
      if (n > c.remaining() / gguf_min_value_bytes(v.element_type))
        c.fail("metadata '" + key + "' claims " + std::to_string(n) +
               " array elements, more than the file can hold,");
      std::vector<GgufValue> items;
      items.reserve(n);
      for (std::uint64_t i = 0; i < n; ++i) items.push_back(read_gguf_value(c, et, key, depth + 1));
      v.value = std::move(items);
      break;
    }
  }
  return v;
}

/// `n_kv` metadata entries into `h.metadata`, and the alignment they may set.
inline void read_gguf_metadata(GgufCursor& c, std::uint64_t n_kv, GgufHeader& h) {
  if (n_kv > c.remaining() / 12)
    c.fail_at("metadata count " + std::to_string(n_kv) + " exceeds the file", 16);
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::uint64_t at = c.pos();
    std::string key = c.string("metadata key");
    const auto type = c.get<std::uint32_t>("metadata value type");
    GgufValue v = read_gguf_value(c, type, key, 0);
    if (!h.metadata.emplace(key, std::move(v)).second)
      c.fail_at("duplicate metadata key '" + key + "'", at);
  }
  if (auto it = h.metadata.find("general.alignment"); it != h.metadata.end()) {
    if (!it->second.is_integer()) c.fail("general.alignment is not an integer");
    h.alignment = it->second.as_uint("general.alignment");
    if (h.alignment == 0 || (h.alignment & (h.alignment - 1)) != 0 || h.alignment > (1u << 20))
      c.fail("general.alignment " + std::to_string(h.alignment) +
             " is not a power of two <= 1 MiB");
  }
}

/// One tensor info, checked against its type's block size and the file's alignment.
inline GgufTensorInfo read_gguf_tensor_info(GgufCursor& c, std::uint64_t alignment,
                                            const std::string& file_name) {
  const std::uint64_t at = c.pos();
  GgufTensorInfo t;
  t.name = c.string("tensor name");
  const auto n_dims = c.get<std::uint32_t>("tensor rank");
  if (n_dims == 0 || n_dims > max_tensor_rank)
    c.fail_at("tensor '" + t.name + "' has rank " + std::to_string(n_dims) + " (1..4 allowed)", at);
  t.rank = n_dims;
  std::uint64_t elements = 1;
  for (std::uint32_t d = 0; d < n_dims; ++d) {
    const auto ne = c.get<std::uint64_t>("tensor dimension");
    t.dims[n_dims - 1 - d] = ne;
    auto p = checked_mul(elements, ne);
    if (!p || *p > (std::uint64_t{1} << 60))
      c.fail_at("tensor '" + t.name + "' has too many elements", at);
    elements = *p;
  }
  t.ggml_type = c.get<std::uint32_t>("tensor type");
  const auto info = ggml_type_info(t.ggml_type);
  if (!info)
    throw Error(ErrorKind::unsupported, "GGUF '" + file_name + "': tensor '" + t.name +
                                            "' has ggml type " + std::to_string(t.ggml_type) +
                                            " of unknown size (offset " + std::to_string(at) + ")");
  t.dtype = gguf_dtype(t.ggml_type);
  t.offset = c.get<std::uint64_t>("tensor offset");
  const std::uint64_t inner = t.dims[n_dims - 1];
  if (inner % info->block_elements != 0)
    c.fail_at("tensor '" + t.name + "' of type " + std::string(info->name) + " has a row of " +
                  std::to_string(inner) + " elements, not a multiple of its block size " +
                  std::to_string(info->block_elements),
              at);
  t.bytes = elements / info->block_elements * info->block_bytes;
  if (t.offset % alignment != 0)
    c.fail_at("tensor '" + t.name + "' offset " + std::to_string(t.offset) +
                  " is not a multiple of the alignment " + std::to_string(alignment),
              at);
  return t;
}

/// Every tensor's bytes lie inside the file's data section, and no two overlap.
inline void check_gguf_tensor_data(const GgufCursor& c, const GgufHeader& h,
                                   std::uint64_t file_size) {
  const std::uint64_t data_size = file_size > h.data_offset ? file_size - h.data_offset : 0;
  std::vector<const GgufTensorInfo*> order;
  for (const auto& t : h.tensors) {
    auto end = checked_add(t.offset, t.bytes);
    if (!end || *end > data_size)
      c.fail_at("tensor '" + t.name + "' (" + std::to_string(t.bytes) + " bytes at data offset " +
                    std::to_string(t.offset) + ") runs past the end of the " +
                    std::to_string(file_size) + "-byte file (truncated?)",
                h.data_offset + t.offset);
    if (t.bytes > 0) order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < order.size(); ++i)
    if (order[i]->offset < order[i - 1]->offset + order[i - 1]->bytes)
      c.fail_at("tensors '" + order[i - 1]->name + "' and '" + order[i]->name + "' overlap",
                h.data_offset + order[i]->offset);
}

}  // namespace detail

/// Parses and validates a GGUF file whose complete bytes are `file`; `file_name` is used in error
/// messages. Throws `Error(invalid_format)` naming the file, the field or tensor and the offset;
/// `Error(unsupported)` for version 1, big-endian files or a ggml type of unknown size.
/// The entry point of the fuzz target.
inline GgufHeader parse_gguf(std::span<const std::byte> file, const std::string& file_name) {
  detail::GgufCursor c(file, file_name);
  GgufHeader h;
  const std::byte* magic = c.take(4, "magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) c.fail_at("bad magic (not a GGUF file)", 0);
  h.version = c.get<std::uint32_t>("version");
  if (h.version == 1 || (h.version & 0xFFFF) == 0)
    throw Error(ErrorKind::unsupported,
                "GGUF '" + file_name + "': version " + std::to_string(h.version) +
                    (h.version == 1 ? " (GGUF v1)" : " (a big-endian file?)") +
                    " is not supported; versions 2 and 3 are");
  if (h.version != 2 && h.version != 3)
    c.fail_at("unknown version " + std::to_string(h.version), 4);
  const auto n_tensors = c.get<std::uint64_t>("tensor count");
  const auto n_kv = c.get<std::uint64_t>("metadata count");
  detail::read_gguf_metadata(c, n_kv, h);
  if (n_tensors > c.remaining() / 24)
    c.fail_at("tensor count " + std::to_string(n_tensors) + " exceeds the file", 8);
  std::set<std::string, std::less<>> seen;
  h.tensors.reserve(n_tensors);
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    const std::uint64_t at = c.pos();
    GgufTensorInfo t = detail::read_gguf_tensor_info(c, h.alignment, file_name);
    if (!seen.insert(t.name).second) c.fail_at("duplicate tensor name '" + t.name + "'", at);
    h.tensors.push_back(std::move(t));
  }
  h.data_offset = detail::align_up(c.pos(), h.alignment);
  if (h.data_offset > file.size() && !h.tensors.empty())
    c.fail("file truncated: data section would start past the end of the file,");
  detail::check_gguf_tensor_data(c, h, file.size());
  return h;
}

/// One mapped GGUF file. Move-only; views stay valid while it lives.
class GgufFile {
 public:
  explicit GgufFile(const std::string& path) : map_(path) {
    header_ = parse_gguf(map_.bytes(), map_.path());
    for (std::size_t i = 0; i < header_.tensors.size(); ++i)
      index_.emplace(header_.tensors[i].name, i);
  }

  [[nodiscard]] const std::string& path() const noexcept { return map_.path(); }
  [[nodiscard]] const GgufHeader& header() const noexcept { return header_; }
  [[nodiscard]] const std::vector<GgufTensorInfo>& tensors() const noexcept {
    return header_.tensors;
  }
  [[nodiscard]] std::span<const std::byte> mapped_bytes() const noexcept { return map_.bytes(); }

  /// Metadata value `key`, or nullptr.
  [[nodiscard]] const GgufValue* metadata(std::string_view key) const noexcept {
    auto it = header_.metadata.find(key);
    return it == header_.metadata.end() ? nullptr : &it->second;
  }
  /// `general.architecture` ("llama" for Mixtral, "qwen2moe", "olmoe", ...), or "".
  [[nodiscard]] std::string architecture() const {
    const GgufValue* v = metadata("general.architecture");
    return v ? v->as_string("general.architecture") : std::string();
  }

  [[nodiscard]] const GgufTensorInfo* info(std::string_view name) const noexcept {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &header_.tensors[it->second];
  }

  /// A view of tensor `name`, or nullopt. Throws `Error(unsupported)` naming the tensor and its
  /// ggml type when moekit cannot read that type.
  [[nodiscard]] std::optional<TensorView> find(std::string_view name) const {
    const GgufTensorInfo* t = info(name);
    if (t == nullptr) return std::nullopt;
    if (!t->dtype)
      throw Error(ErrorKind::unsupported,
                  "GGUF '" + path() + "': tensor '" + t->name + "' has ggml type " +
                      std::string(detail::ggml_type_info(t->ggml_type)->name) +
                      "; supported: F32, F16, BF16, Q8_0, Q4_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K");
    TensorView v;
    v.name = t->name;
    v.file = path();
    v.dtype = *t->dtype;
    v.dims = t->dims;
    v.rank = t->rank;
    v.file_offset = header_.data_offset + t->offset;
    v.bytes = map_.bytes().subspan(v.file_offset, t->bytes);
    return v;
  }

  [[nodiscard]] TensorView tensor(std::string_view name) const {
    auto t = find(name);
    if (!t)
      throw Error(ErrorKind::invalid_argument,
                  "GGUF '" + path() + "' has no tensor '" + std::string(name) + "'");
    return *t;
  }

 private:
  detail::MappedFile map_;
  GgufHeader header_;
  std::map<std::string, std::size_t, std::less<>> index_;
};

}  // namespace moekit::io
