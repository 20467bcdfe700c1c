#pragma once
/// \file A tiny validated reader for NumPy .npy arrays (format versions 1.0, 2.0, 3.0).
///
/// Supported: little-endian (or byte-order-free) float32/float64 and int8–int64 / uint8–uint64
/// arrays in C order; values are converted to double. Anything else (big-endian, Fortran order,
/// object or structured dtypes, a payload whose size disagrees with the shape) throws
/// `moekit::Error(invalid_format)` naming the source and the field.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/sim/trace.hpp"

namespace moekit::sim {

/// An n-dimensional array read from a .npy file, values as double, C order.
struct NpyArray {
  std::vector<std::size_t> shape;
  std::vector<double> data;
  std::string dtype;  ///< the file's descr, e.g. "<f4"

  [[nodiscard]] std::size_t size() const noexcept { return data.size(); }
  /// Element at a multi-index (row-major). Throws on a wrong rank or index.
  [[nodiscard]] double at(std::initializer_list<std::size_t> idx) const {
    MOEKIT_EXPECTS(idx.size() == shape.size(), "NpyArray::at: wrong number of indices");
    std::size_t off = 0, d = 0;
    for (std::size_t i : idx) {
      MOEKIT_EXPECTS(i < shape[d], "NpyArray::at: index out of range");
      off = off * shape[d++] + i;
    }
    return data[off];
  }
};

namespace detail {

struct NpyHeader {
  std::string descr;
  bool fortran = true;
  std::vector<std::size_t> shape;
};

// Parses the header dict, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (24, 60, 60), }
inline NpyHeader parse_npy_header(std::string_view h, std::string_view source) {
  auto bad = [&](const char* field, const std::string& why) {
    ::moekit::detail::fail(ErrorKind::invalid_format,
                           "npy '" + std::string(source) + "': field '" + field + "': " + why);
  };
  auto value_of = [&](const char* key) -> std::string_view {
    const std::string k = std::string("'") + key + "'";
    const auto p = h.find(k);
    if (p == std::string_view::npos) bad(key, "missing from the header");
    auto v = h.substr(p + k.size());
    const auto colon = v.find_first_not_of(" ");
    if (colon == std::string_view::npos || v[colon] != ':') bad(key, "malformed header");
    v = v.substr(colon + 1);
    const auto start = v.find_first_not_of(" ");
    if (start == std::string_view::npos) bad(key, "malformed header");
    return v.substr(start);
  };
  NpyHeader out;
  auto d = value_of("descr");
  if (d.empty() || d[0] != '\'') bad("descr", "must be a quoted dtype string");
  const auto dend = d.find('\'', 1);
  if (dend == std::string_view::npos) bad("descr", "unterminated string");
  out.descr = std::string(d.substr(1, dend - 1));
  auto f = value_of("fortran_order");
  if (f.starts_with("False"))
    out.fortran = false;
  else if (f.starts_with("True"))
    out.fortran = true;
  else
    bad("fortran_order", "must be True or False");
  auto s = value_of("shape");
  if (s.empty() || s[0] != '(') bad("shape", "must be a tuple");
  const auto send = s.find(')');
  if (send == std::string_view::npos) bad("shape", "unterminated tuple");
  std::string_view body = s.substr(1, send - 1);
  std::size_t pos = 0;
  while (pos < body.size()) {
    while (pos < body.size() && (body[pos] == ' ' || body[pos] == ',')) ++pos;
    if (pos >= body.size()) break;
    std::uint64_t v = 0;
    std::size_t digits = 0;
    while (pos < body.size() && body[pos] >= '0' && body[pos] <= '9') {
      if (v > (UINT64_MAX - 9) / 10) bad("shape", "dimension too large");
      v = v * 10 + std::uint64_t(body[pos++] - '0');
      ++digits;
    }
    if (digits == 0) bad("shape", "dimensions must be non-negative integers");
    out.shape.push_back(static_cast<std::size_t>(v));
  }
  return out;
}

[[noreturn]] inline void npy_field_error(std::string_view source, const char* field,
                                         const std::string& why) {
  ::moekit::detail::fail(ErrorKind::invalid_format,
                         "npy '" + std::string(source) + "': field '" + field + "': " + why);
}

/// Where the header dict lies in the file: after the magic and its version's length field.
struct NpyHeaderSpan {
  std::size_t at = 0, length = 0;
};

inline NpyHeaderSpan locate_npy_header(std::span<const std::byte> bytes, std::string_view source) {
  static constexpr unsigned char magic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 10 || std::memcmp(bytes.data(), magic, 6) != 0)
    npy_field_error(source, "magic", "not a .npy file");
  const auto major = static_cast<unsigned>(bytes[6]);
  NpyHeaderSpan h;
  if (major == 1) {
    h.length = std::size_t(bytes[8]) | (std::size_t(bytes[9]) << 8);
    h.at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) npy_field_error(source, "header_len", "truncated");
    h.length = std::size_t(bytes[8]) | (std::size_t(bytes[9]) << 8) |
               (std::size_t(bytes[10]) << 16) | (std::size_t(bytes[11]) << 24);
    h.at = 12;
  } else {
    npy_field_error(source, "version", "unsupported major version " + std::to_string(major));
  }
  if (h.length > bytes.size() - h.at) npy_field_error(source, "header_len", "truncated header");
  return h;
}

/// The element type a descr names: its kind ('f', 'i', 'u') and size in bytes.
struct NpyItemType {
  char kind = 0;
  std::size_t size = 0;
};

inline NpyItemType npy_item_type(const std::string& descr, std::string_view source) {
  if (descr.size() < 3) npy_field_error(source, "descr", "unsupported dtype '" + descr + "'");
  const char order = descr[0], kind = descr[1];
  const std::string size_str = descr.substr(2);
  std::size_t item = 0;
  if (size_str == "1")
    item = 1;
  else if (size_str == "2")
    item = 2;
  else if (size_str == "4")
    item = 4;
  else if (size_str == "8")
    item = 8;
  else
    npy_field_error(source, "descr", "unsupported item size in '" + descr + "'");
  if (!(order == '<' || (order == '|' && item == 1) || (order == '=' && item == 1)))
    npy_field_error(source, "descr",
                    "only little-endian arrays are supported, got '" + descr + "'");
  if (!((kind == 'f' && (item == 4 || item == 8)) || kind == 'i' || kind == 'u'))
    npy_field_error(source, "descr",
                    "only float32/float64 and integer arrays are supported, got '" + descr + "'");
  return {kind, item};
}

/// One element at `p` as a double.
inline double decode_npy_item(const std::byte* p, NpyItemType t) {
  // Assemble little-endian bytes explicitly so the reader is correct on any host.
  std::uint64_t bits = 0;
  for (std::size_t b = 0; b < t.size; ++b)
    bits |= std::uint64_t(std::to_integer<unsigned>(p[b])) << (8 * b);
  double v = 0;
  if (t.kind == 'f' && t.size == 4) {
    float f;
    const auto u = static_cast<std::uint32_t>(bits);
    std::memcpy(&f, &u, 4);
    v = f;
  } else if (t.kind == 'f') {
    std::memcpy(&v, &bits, 8);
  } else if (t.kind == 'u') {
    v = static_cast<double>(bits);
  } else {
    const unsigned shift = unsigned(64 - 8 * t.size);
    v = static_cast<double>(static_cast<std::int64_t>(bits << shift) >> shift);
  }
  return v;
}

}  // namespace detail

/// Parses a .npy file from memory; `source` names it in errors.
[[nodiscard]] inline NpyArray parse_npy(std::span<const std::byte> bytes,
                                        std::string_view source = "<memory>") {
  const detail::NpyHeaderSpan hs = detail::locate_npy_header(bytes, source);
  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + hs.at), hs.length);
  const auto h = detail::parse_npy_header(header, source);
  if (h.fortran)
    detail::npy_field_error(source, "fortran_order", "Fortran-order arrays are not supported");
  const detail::NpyItemType type = detail::npy_item_type(h.descr, source);
  const std::size_t item = type.size;

  std::uint64_t count = 1;
  for (std::size_t d : h.shape)
    if (detail::mul_overflows(count, d, count))
      detail::npy_field_error(source, "shape", "element count overflows");
  const std::size_t payload_at = hs.at + hs.length;
  const std::size_t payload = bytes.size() - payload_at;
  std::uint64_t need = 0;
  if (detail::mul_overflows(count, item, need) || need != payload)
    detail::npy_field_error(source, "shape",
                            "shape implies " + std::to_string(count) + " items of " +
                                std::to_string(item) + " bytes but " + std::to_string(payload) +
                                " bytes follow the header");
  NpyArray a;
  a.shape = h.shape;
  a.dtype = h.descr;
  a.data.resize(count);
  const std::byte* p = bytes.data() + payload_at;
  for (std::size_t i = 0; i < count; ++i, p += item) a.data[i] = detail::decode_npy_item(p, type);
  return a;
}

/// Reads a .npy file.
[[nodiscard]] inline NpyArray read_npy(const std::string& path) {
  const auto bytes = detail::read_file_bytes(path);
  return parse_npy(bytes, path);
}

}  // namespace moekit::sim
