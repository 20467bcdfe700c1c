#pragma once
/// \file The expert store: one file with every routed expert at each requested precision as a
/// contiguous, 4 KiB-aligned blob (so O_DIRECT reads land in place), and a JSON manifest.
///
/// Format version 1 (normative description: docs/expert-store.md):
///   [0, 4096)        header page: "MOEKSTOR", u32 version, u32 alignment, u64 manifest offset,
///                    u64 manifest bytes, u64 XXH64(manifest), u64 file bytes, u64 XXH64(header
///                    bytes 0..47); zero padding
///   [4096, M)        blobs, each at a multiple of 4096, zero-padded to the next multiple;
///                    precision-major, then layer, then expert
///   [M, end)         manifest (UTF-8 JSON): model shape, quant scheme, precisions, tensor order,
///                    and per blob {layer, expert, precision, offset, bytes, xxh64}
/// A blob is an expert blob (io/expert_blob.hpp): the expert's three matrices back to back, gate
/// (w1, ffn×hidden), up (w3, ffn×hidden), down (w2, hidden×ffn), each in the precision's format of
/// `precision/`; its size is `ModelShape::expert_bytes(p)` exactly. The manifest's optional
/// "matrix_order" says where the rows of the quantized blobs' matrices are: "rows" (the default,
/// and what a store without the field holds), "panels4" (MatrixOrder::panels4,
/// precision/panels.hpp: what the CPU's int8 GEMV reads fastest) or "blocked_panels4"
/// (MatrixOrder::blocked_panels4: panels in column blocks for rows wider than 4096); f32/bf16/f16
/// blobs are always in rows.
///
/// The writer takes already-encoded bytes from a callback, writes `<path>.partial` and renames it
/// at the end; it refuses to replace an existing file unless asked; it resumes an interrupted run
/// (blobs listed in `<path>.partial.journal` whose bytes still match their checksum are kept);
/// and it verifies every checksum at the end.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/core/expert_key.hpp"
#include "moekit/core/model_shape.hpp"
#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/checksum.hpp"
#include "moekit/io/detail/bytes.hpp"
#include "moekit/io/detail/posix_file.hpp"
#include "moekit/io/expert_blob.hpp"
#include "moekit/io/file_lock.hpp"
#include "moekit/io/output_file.hpp"
#include "moekit/precision/panels.hpp"

namespace moekit::io {

/// Store format constants.
inline constexpr char store_magic[8] = {'M', 'O', 'E', 'K', 'S', 'T', 'O', 'R'};
inline constexpr std::uint32_t store_version = 1;
inline constexpr std::uint64_t store_alignment = 4096;

/// Where one expert at one precision lives in the store.
struct StoreBlob {
  ExpertKey key{};
  Precision precision = Precision::f16;
  std::uint64_t offset = 0;    ///< absolute, a multiple of the store's alignment
  std::uint64_t bytes = 0;     ///< payload bytes (== ModelShape::expert_bytes(precision))
  std::uint64_t checksum = 0;  ///< XXH64 (seed 0) of the payload
  /// Bytes an O_DIRECT read should fetch: payload rounded up to the alignment (zero padding).
  [[nodiscard]] constexpr std::uint64_t padded_bytes() const noexcept {
    return detail::align_up(bytes, store_alignment);
  }
};

/// The fixed-size header page.
struct StoreHeader {
  std::uint32_t version = store_version;
  std::uint32_t alignment = store_alignment;
  std::uint64_t manifest_offset = 0;
  std::uint64_t manifest_bytes = 0;
  std::uint64_t manifest_checksum = 0;
  std::uint64_t file_bytes = 0;
};

/// A validated manifest. Blobs are dense: `blobs[(pi * n_layers + layer) * n_experts + expert]`
/// where `pi` is the precision's index in `precisions`.
struct StoreManifest {
  ModelShape shape{};
  std::vector<Precision> precisions;
  std::vector<StoreBlob> blobs;
  nlohmann::json meta = nlohmann::json::object();  ///< free-form (source checkpoint, tool, ...)
  MatrixOrder order = MatrixOrder::rows;           ///< of the quantized blobs' matrices

  /// The order of the matrices of the blobs at `p` (f32/bf16/f16: always rows).
  [[nodiscard]] MatrixOrder order_of(Precision p) const noexcept {
    return is_quantized(p) ? order : MatrixOrder::rows;
  }

  [[nodiscard]] std::optional<std::size_t> precision_index(Precision p) const noexcept {
    for (std::size_t i = 0; i < precisions.size(); ++i)
      if (precisions[i] == p) return i;
    return std::nullopt;
  }
  [[nodiscard]] const StoreBlob* find(ExpertKey k, Precision p) const noexcept {
    auto pi = precision_index(p);
    if (!pi || !shape.contains(k)) return nullptr;
    return &blobs[*pi * shape.expert_count() + shape.index(k)];
  }
};

namespace detail {

inline nlohmann::json shape_to_json(const ModelShape& s) {
  return {{"n_layers", s.n_layers},
          {"n_experts", s.n_experts},
          {"top_k", s.top_k},
          {"hidden", s.hidden},
          {"ffn", s.ffn},
          {"n_shared_experts", s.n_shared_experts},
          {"shared_ffn", s.shared_ffn}};
}

inline std::uint64_t parse_hex64(const std::string& s, bool& ok) noexcept {
  ok = s.size() == 16;
  std::uint64_t v = 0;
  for (char c : s) {
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= static_cast<std::uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= static_cast<std::uint64_t>(c - 'a' + 10);
    else
      ok = false;
  }
  return v;
}

inline std::vector<std::byte> header_page(const StoreHeader& h) {
  std::vector<std::byte> page(store_alignment);
  std::memcpy(page.data(), store_magic, 8);
  store_le<std::uint32_t>(page.data() + 8, h.version);
  store_le<std::uint32_t>(page.data() + 12, h.alignment);
  store_le<std::uint64_t>(page.data() + 16, h.manifest_offset);
  store_le<std::uint64_t>(page.data() + 24, h.manifest_bytes);
  store_le<std::uint64_t>(page.data() + 32, h.manifest_checksum);
  store_le<std::uint64_t>(page.data() + 40, h.file_bytes);
  store_le<std::uint64_t>(page.data() + 48, xxh64(std::span(page.data(), 48)));
  return page;
}

}  // namespace detail

/// The blob table a store of shape `s` at precisions `ps` has: precision-major, then layer and
/// expert, each blob 4 KiB-aligned after the header page (checksums left 0). Deterministic.
inline std::vector<StoreBlob> store_blob_layout(const ModelShape& s,
                                                std::span<const Precision> ps) {
  std::vector<StoreBlob> out;
  std::uint64_t off = store_alignment;
  for (Precision p : ps)
    for (std::uint32_t l = 0; l < s.n_layers; ++l)
      for (std::uint32_t e = 0; e < s.n_experts; ++e) {
        StoreBlob b{{l, e}, p, off, s.expert_bytes(p), 0};
        off += b.padded_bytes();
        out.push_back(b);
      }
  return out;
}

/// The manifest as the store file records it (JSON; `parse_store_manifest` reads it back).
inline nlohmann::json manifest_to_json(const StoreManifest& m) {
  nlohmann::json j;
  j["format"] = "moekit-expert-store";
  j["version"] = store_version;
  j["alignment"] = store_alignment;
  j["checksum"] = "xxh64";
  j["shape"] = detail::shape_to_json(m.shape);
  j["quant"] = {{"group_size", m.shape.quant.group_size}, {"zero_point", m.shape.quant.zero_point}};
  nlohmann::json ps = nlohmann::json::array();
  for (Precision p : m.precisions) ps.push_back(std::string(name(p)));
  j["precisions"] = ps;
  j["tensor_order"] = {"gate", "up", "down"};
  j["matrix_order"] = std::string(name(m.order));
  j["meta"] = m.meta;
  nlohmann::json blobs = nlohmann::json::array();
  for (const auto& b : m.blobs)
    blobs.push_back({{"layer", b.key.layer},
                     {"expert", b.key.expert},
                     {"precision", std::string(name(b.precision))},
                     {"offset", b.offset},
                     {"bytes", b.bytes},
                     {"xxh64", detail::hex64(b.checksum)}});
  j["blobs"] = blobs;
  return j;
}

/// Parses and validates the header page (`page` = the file's first bytes, at least 56 of them)
/// of a store whose size is `file_size`. Throws `Error(invalid_format)` / `Error(unsupported)`
/// naming the file and field.
inline StoreHeader parse_store_header(std::span<const std::byte> page, std::uint64_t file_size,
                                      const std::string& file) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorKind::invalid_format, "expert store '" + file + "': " + what);
  };
  if (page.size() < 56 || file_size < store_alignment)
    throw bad("file is " + std::to_string(file_size) +
              " bytes, shorter than the 4096-byte header (truncated?)");
  if (std::memcmp(page.data(), store_magic, 8) != 0)
    throw bad("bad magic at offset 0 (not an expert store)");
  StoreHeader h;
  h.version = detail::load_le<std::uint32_t>(page.data() + 8);
  if (h.version != store_version)
    throw Error(ErrorKind::unsupported,
                "expert store '" + file + "': format version " + std::to_string(h.version) +
                    " at offset 8; this build reads version " + std::to_string(store_version));
  if (detail::load_le<std::uint64_t>(page.data() + 48) != xxh64(page.first(48)))
    throw Error(ErrorKind::checksum,
                "expert store '" + file + "': header checksum mismatch (offset 48)");
  h.alignment = detail::load_le<std::uint32_t>(page.data() + 12);
  h.manifest_offset = detail::load_le<std::uint64_t>(page.data() + 16);
  h.manifest_bytes = detail::load_le<std::uint64_t>(page.data() + 24);
  h.manifest_checksum = detail::load_le<std::uint64_t>(page.data() + 32);
  h.file_bytes = detail::load_le<std::uint64_t>(page.data() + 40);
  if (h.alignment != store_alignment)
    throw bad("alignment " + std::to_string(h.alignment) +
              " at offset 12; version 1 requires 4096");
  if (h.file_bytes != file_size)
    throw bad("header records " + std::to_string(h.file_bytes) + " bytes but the file has " +
              std::to_string(file_size) + " (truncated or appended to?)");
  auto end = detail::checked_add(h.manifest_offset, h.manifest_bytes);
  if (h.manifest_offset < store_alignment || h.manifest_offset % store_alignment != 0 || !end ||
      *end != file_size)
    throw bad(
        "manifest [" + std::to_string(h.manifest_offset) + ", +" +
        std::to_string(h.manifest_bytes) +
        ") must start on a 4096-byte boundary after the header and end at the end of the file");
  return h;
}

namespace detail {

/// Typed access to the manifest's fields; errors name the store.
class ManifestFields {
 public:
  explicit ManifestFields(const std::string& file) : file_(file) {}

  [[nodiscard]] Error bad(const std::string& what) const {
    return Error(ErrorKind::invalid_format, "expert store '" + file_ + "' manifest: " + what);
  }
  [[nodiscard]] const nlohmann::json& field(const nlohmann::json& o, const char* k) const {
    auto it = o.find(k);
    if (it == o.end()) throw bad(std::string("missing field '") + k + "'");
    return *it;
  }
  [[nodiscard]] std::uint64_t uint_field(const nlohmann::json& o, const char* k,
                                         std::uint64_t max) const {
    const auto& v = field(o, k);
    if (!v.is_number_unsigned() || v.get<std::uint64_t>() > max)
      throw bad(std::string("field '") + k + "' must be an integer in [0, " + std::to_string(max) +
                "]");
    return v.get<std::uint64_t>();
  }
  [[nodiscard]] const std::string& file() const noexcept { return file_; }

 private:
  const std::string& file_;
};

inline void check_manifest_format(const ManifestFields& f, const nlohmann::json& j) {
  if (f.field(j, "format") != "moekit-expert-store")
    throw f.bad("'format' is not \"moekit-expert-store\"");
  if (f.uint_field(j, "version", ~0u) != store_version)
    throw Error(ErrorKind::unsupported,
                "expert store '" + f.file() + "' manifest: unsupported version");
  if (f.uint_field(j, "alignment", ~0u) != store_alignment) throw f.bad("'alignment' must be 4096");
  if (f.field(j, "checksum") != "xxh64") throw f.bad("'checksum' must be \"xxh64\"");
}

inline ModelShape read_manifest_shape(const ManifestFields& f, const nlohmann::json& j) {
  ModelShape shape{};
  const auto& sh = f.field(j, "shape");
  if (!sh.is_object()) throw f.bad("'shape' is not an object");
  constexpr std::uint64_t u32max = 0xFFFFFFFFu;
  auto u32 = [&](const nlohmann::json& o, const char* k) {
    return static_cast<std::uint32_t>(f.uint_field(o, k, u32max));
  };
  shape.n_layers = u32(sh, "n_layers");
  shape.n_experts = u32(sh, "n_experts");
  shape.top_k = u32(sh, "top_k");
  shape.hidden = u32(sh, "hidden");
  shape.ffn = u32(sh, "ffn");
  shape.n_shared_experts = u32(sh, "n_shared_experts");
  shape.shared_ffn = u32(sh, "shared_ffn");
  const auto& q = f.field(j, "quant");
  if (!q.is_object()) throw f.bad("'quant' is not an object");
  shape.quant.group_size = u32(q, "group_size");
  if (!f.field(q, "zero_point").is_boolean()) throw f.bad("'quant.zero_point' is not a boolean");
  shape.quant.zero_point = q["zero_point"].get<bool>();
  try {
    shape.validate();
  } catch (const Error& e) {
    throw f.bad("shape: " + e.message());
  }
  return shape;
}

inline void read_manifest_precisions(const ManifestFields& f, const nlohmann::json& j,
                                     StoreManifest& m) {
  const auto& ps = f.field(j, "precisions");
  if (!ps.is_array() || ps.empty() || ps.size() > precision_count)
    throw f.bad("'precisions' must be a non-empty array");
  for (const auto& p : ps) {
    auto pp = p.is_string() ? parse_precision(p.get<std::string>()) : std::nullopt;
    if (!pp || *pp == Precision::skip)
      throw f.bad("'precisions' has an entry that is not a stored precision");
    if (m.precision_index(*pp))
      throw f.bad("'precisions' lists " + std::string(name(*pp)) + " twice");
    m.precisions.push_back(*pp);
  }
}

inline void read_matrix_order(const ManifestFields& f, const nlohmann::json& j, StoreManifest& m) {
  auto it = j.find("matrix_order");
  if (it == j.end()) return;  // absent: rows (stores written before it)
  if (*it == "panels4")
    m.order = MatrixOrder::panels4;
  else if (*it == "blocked_panels4")
    m.order = MatrixOrder::blocked_panels4;
  else if (*it != "rows")
    throw f.bad("'matrix_order' must be \"rows\", \"panels4\" or \"blocked_panels4\"");
  if (in_panels(m.order) && !panels_supported(m.shape.quant))
    throw f.bad("'matrix_order' is \"" + std::string(name(m.order)) + "\" but quant.group_size " +
                std::to_string(m.shape.quant.group_size) + " cannot be in panels (32, 64 or 128)");
}

/// "blob #i (layer l, expert e, precision)", for messages.
inline std::string blob_label(std::size_t i, const StoreBlob& s) {
  return "blob #" + std::to_string(i) + " (layer " + std::to_string(s.key.layer) + ", expert " +
         std::to_string(s.key.expert) + ", " + std::string(name(s.precision)) + ")";
}

/// Blob `i`, checked against the shape, the precisions and the blob region ending at `data_end`.
inline StoreBlob read_manifest_blob(const ManifestFields& f, const nlohmann::json& b, std::size_t i,
                                    const StoreManifest& m, std::uint64_t data_end) {
  constexpr std::uint64_t u32max = 0xFFFFFFFFu;
  const std::string at = "blob #" + std::to_string(i);
  if (!b.is_object()) throw f.bad(at + " is not an object");
  StoreBlob s;
  s.key.layer = static_cast<std::uint32_t>(f.uint_field(b, "layer", u32max));
  s.key.expert = static_cast<std::uint32_t>(f.uint_field(b, "expert", u32max));
  const auto& pn = f.field(b, "precision");
  auto p = pn.is_string() ? parse_precision(pn.get<std::string>()) : std::nullopt;
  if (!p || !m.precision_index(*p)) throw f.bad(at + " has a precision not listed in 'precisions'");
  s.precision = *p;
  if (!m.shape.contains(s.key))
    throw f.bad(at + " (layer " + std::to_string(s.key.layer) + ", expert " +
                std::to_string(s.key.expert) + ") is outside the model shape");
  s.offset = f.uint_field(b, "offset", ~std::uint64_t{0});
  s.bytes = f.uint_field(b, "bytes", ~std::uint64_t{0});
  const auto& cs = f.field(b, "xxh64");
  bool ok = cs.is_string();
  if (ok) s.checksum = parse_hex64(cs.get<std::string>(), ok);
  if (!ok) throw f.bad(at + " 'xxh64' must be 16 lowercase hex digits");
  const std::string who = blob_label(i, s);
  if (s.bytes != m.shape.expert_bytes(s.precision))
    throw f.bad(who + " has " + std::to_string(s.bytes) + " bytes; the shape gives " +
                std::to_string(m.shape.expert_bytes(s.precision)));
  if (s.offset % store_alignment != 0 || s.offset < store_alignment)
    throw f.bad(who + " offset " + std::to_string(s.offset) +
                " is not a multiple of 4096 after the header");
  auto end = checked_add(s.offset, s.bytes);
  if (!end || *end > data_end)
    throw f.bad(who + " [" + std::to_string(s.offset) + ", +" + std::to_string(s.bytes) +
                ") runs past the blob region ending at " + std::to_string(data_end));
  return s;
}

/// Every blob, one per (precision, layer, expert), into its slot of `m.blobs`.
inline void read_manifest_blobs(const ManifestFields& f, const nlohmann::json& j,
                                std::uint64_t data_end, StoreManifest& m) {
  const auto& bl = f.field(j, "blobs");
  const std::uint64_t total = m.shape.expert_count() * m.precisions.size();
  if (!bl.is_array() || bl.size() != total)
    throw f.bad("'blobs' must list " + std::to_string(total) +
                " blobs (one per precision, layer and expert)");
  m.blobs.assign(total, StoreBlob{});
  std::vector<bool> seen(total, false);
  for (std::size_t i = 0; i < bl.size(); ++i) {
    const StoreBlob s = read_manifest_blob(f, bl[i], i, m, data_end);
    const std::size_t slot =
        *m.precision_index(s.precision) * m.shape.expert_count() + m.shape.index(s.key);
    if (seen[slot]) throw f.bad(blob_label(i, s) + " is listed twice");
    seen[slot] = true;
    m.blobs[slot] = s;
  }
}

inline void check_blobs_disjoint(const ManifestFields& f, const StoreManifest& m) {
  std::vector<const StoreBlob*> order;
  for (const auto& b : m.blobs) order.push_back(&b);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  auto label = [](const StoreBlob& b) {
    return "(layer " + std::to_string(b.key.layer) + ", expert " + std::to_string(b.key.expert) +
           ", " + std::string(name(b.precision)) + ")";
  };
  for (std::size_t i = 1; i < order.size(); ++i)
    if (order[i]->offset < order[i - 1]->offset + order[i - 1]->bytes)
      throw f.bad("blobs " + label(*order[i - 1]) + " and " + label(*order[i]) +
                  " overlap at offset " + std::to_string(order[i]->offset));
}

}  // namespace detail

/// Parses and validates manifest JSON for a store whose blob region ends at `data_end` (the
/// manifest offset). Checks: format and version, shape (ModelShape::validate), precisions,
/// one blob per (precision, layer, expert), each inside [4096, data_end), aligned, sized
/// `expert_bytes(p)`, not overlapping another; when `expect` is given, that the shape equals it.
/// The entry point of the manifest fuzz target.
inline StoreManifest parse_store_manifest(std::string_view text, std::uint64_t data_end,
                                          const std::string& file,
                                          const std::optional<ModelShape>& expect = std::nullopt) {
  const detail::ManifestFields f(file);
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw f.bad("not a JSON object");
  detail::check_manifest_format(f, j);
  StoreManifest m;
  m.shape = detail::read_manifest_shape(f, j);
  if (expect && !(*expect == m.shape))
    throw Error(ErrorKind::invalid_argument,
                "expert store '" + file + "' holds a model of shape " +
                    detail::shape_to_json(m.shape).dump() + " (group_size " +
                    std::to_string(m.shape.quant.group_size) + "), expected " +
                    detail::shape_to_json(*expect).dump() + " (group_size " +
                    std::to_string(expect->quant.group_size) + ")");
  detail::read_manifest_precisions(f, j, m);
  if (auto it = j.find("meta"); it != j.end()) m.meta = *it;
  detail::read_matrix_order(f, j, m);
  detail::read_manifest_blobs(f, j, data_end, m);
  detail::check_blobs_disjoint(f, m);
  return m;
}

/// Reads `bytes` at `offset` of `fd` completely, retrying EINTR and short reads; a read that
/// returns 0 early is an `Error(io)` "unexpected end of file" naming the file and offset.
inline void pread_exact(int fd, std::span<std::byte> dest, std::uint64_t offset,
                        const std::string& file) {
  while (!dest.empty()) {
    const ssize_t n = ::pread(fd, dest.data(), dest.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      detail::fail_errno("read failed at offset " + std::to_string(offset) + " of", file, errno);
    }
    if (n == 0)
      throw Error(ErrorKind::io, "unexpected end of file '" + file + "' at offset " +
                                     std::to_string(offset) + " (" + std::to_string(dest.size()) +
                                     " bytes still expected)");
    dest = dest.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
}

namespace detail {
/// XXH64 of `bytes` bytes at `offset`, read in 4 MiB chunks.
inline std::uint64_t checksum_range(int fd, std::uint64_t offset, std::uint64_t bytes,
                                    const std::string& file) {
  std::vector<std::byte> buf(std::min<std::uint64_t>(bytes, 4u << 20));
  Xxh64 h;
  while (bytes > 0) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, buf.size()));
    pread_exact(fd, std::span(buf.data(), n), offset, file);
    h.update(std::span(buf.data(), n));
    offset += n;
    bytes -= n;
  }
  return h.digest();
}
}  // namespace detail

/// An opened and validated expert store. Reading blobs is the byte sources' job (sources.hpp);
/// this class says where they are.
class ExpertStore {
 public:
  /// Opens `path`, validates header and manifest, and (when `expect` is given) checks that the
  /// store holds a model of that shape.
  static ExpertStore open(const std::string& path,
                          const std::optional<ModelShape>& expect = std::nullopt) {
    ExpertStore s;
    s.path_ = path;
    auto fd = detail::FileDescriptor::open(path, O_RDONLY);
    const std::uint64_t size = detail::file_size(fd.get(), path);
    std::vector<std::byte> page(std::min<std::uint64_t>(size, store_alignment));
    pread_exact(fd.get(), page, 0, path);
    s.header_ = parse_store_header(page, size, path);
    std::string text(s.header_.manifest_bytes, '\0');
    pread_exact(fd.get(), std::as_writable_bytes(std::span(text)), s.header_.manifest_offset, path);
    if (xxh64(std::as_bytes(std::span(text))) != s.header_.manifest_checksum)
      throw Error(ErrorKind::checksum, "expert store '" + path +
                                           "': manifest checksum mismatch (offset " +
                                           std::to_string(s.header_.manifest_offset) + ")");
    s.manifest_ = parse_store_manifest(text, s.header_.manifest_offset, path, expect);
    return s;
  }

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] const StoreHeader& header() const noexcept { return header_; }
  [[nodiscard]] const StoreManifest& manifest() const noexcept { return manifest_; }
  [[nodiscard]] const ModelShape& shape() const noexcept { return manifest_.shape; }
  [[nodiscard]] std::span<const Precision> precisions() const noexcept {
    return manifest_.precisions;
  }
  [[nodiscard]] bool has(Precision p) const noexcept {
    return manifest_.precision_index(p).has_value();
  }

  /// Where `key` at `p` lives, or nullptr when the store does not hold it.
  [[nodiscard]] const StoreBlob* find(ExpertKey key, Precision p) const noexcept {
    return manifest_.find(key, p);
  }

  /// Where `key` at `p` lives; throws `Error(invalid_argument)` naming the store when absent.
  [[nodiscard]] const StoreBlob& blob(ExpertKey key, Precision p) const {
    const StoreBlob* b = find(key, p);
    if (b == nullptr)
      throw Error(ErrorKind::invalid_argument,
                  "expert store '" + path_ + "' has no blob for layer " +
                      std::to_string(key.layer) + ", expert " + std::to_string(key.expert) +
                      " at " + std::string(name(p)));
    return *b;
  }

  /// Re-reads every blob and checks its checksum; throws `Error(checksum)` naming the first bad
  /// blob. `progress(done, total)` is called after each blob when given.
  void verify(const std::function<void(std::size_t, std::size_t)>& progress = {}) const {
    auto fd = detail::FileDescriptor::open(path_, O_RDONLY);
    std::size_t done = 0;
    for (const auto& b : manifest_.blobs) {
      verify_blob(fd.get(), b);
      if (progress) progress(++done, manifest_.blobs.size());
    }
  }

  /// Checks one blob against its checksum through `fd`.
  void verify_blob(int fd, const StoreBlob& b) const {
    const std::uint64_t got = detail::checksum_range(fd, b.offset, b.bytes, path_);
    if (got != b.checksum)
      throw Error(ErrorKind::checksum,
                  "expert store '" + path_ + "': blob (layer " + std::to_string(b.key.layer) +
                      ", expert " + std::to_string(b.key.expert) + ", " +
                      std::string(name(b.precision)) + ") at offset " + std::to_string(b.offset) +
                      " has XXH64 " + detail::hex64(got) + ", manifest says " +
                      detail::hex64(b.checksum));
  }

 private:
  std::string path_;
  StoreHeader header_;
  StoreManifest manifest_;
};

/// Encodes one expert at one precision: returns exactly `shape.expert_bytes(precision)` bytes.
using ExpertEncoder = std::function<std::vector<std::byte>(ExpertKey, Precision)>;

/// Knobs of write_expert_store.
struct ExpertStoreWriteOptions {
  bool overwrite = false;  ///< replace an existing file at `path`
  bool resume = true;      ///< reuse blobs of an interrupted run of the same layout
  bool verify = true;      ///< re-read and check every blob after the rename
  /// Where the quantized blobs' rows go: the encoder always returns rows; in panels (panels4,
  /// blocked_panels4) the writer packs each of the blob's matrices (precision/panels.hpp) before
  /// writing it.
  MatrixOrder order = MatrixOrder::rows;
  nlohmann::json meta = nlohmann::json::object();  ///< stored as the manifest's "meta"
  std::function<void(std::size_t done, std::size_t total)> progress{};
  /// Blobs encoded at once, each on a thread of its own (the encoder must then be safe to call
  /// concurrently); blobs are written in order whatever this is, so the file does not change.
  unsigned encode_threads = 1;
};

/// What write_expert_store did.
struct ExpertStoreWriteReport {
  std::size_t blobs_encoded = 0;  ///< blobs produced by the encoder in this run
  std::size_t blobs_resumed = 0;  ///< blobs kept from an interrupted run
  std::uint64_t file_bytes = 0;
};

namespace detail {

inline void check_store_request(const std::string& path, const ModelShape& shape,
                                std::span<const Precision> precisions,
                                const ExpertStoreWriteOptions& options) {
  shape.validate();
  MOEKIT_EXPECTS(!precisions.empty(), "write_expert_store: no precisions requested");
  for (std::size_t i = 0; i < precisions.size(); ++i) {
    MOEKIT_EXPECTS(precisions[i] != Precision::skip,
                   "write_expert_store: 'skip' is not a stored precision");
    for (std::size_t k = 0; k < i; ++k)
      MOEKIT_EXPECTS(
          precisions[k] != precisions[i],
          "write_expert_store: precision " + std::string(name(precisions[i])) + " requested twice");
  }
  if (in_panels(options.order) && !panels_supported(shape.quant))
    throw Error(ErrorKind::invalid_argument,
                "write_expert_store: panels need quant.group_size 32, 64 or 128 (the shape has " +
                    std::to_string(shape.quant.group_size) + ")");
  // Refuses an existing store without overwrite, and anything but a regular file even with it
  // (a device node is never replaced by a store), before any blob is encoded.
  check_output_path(path, options.overwrite, "", "pass overwrite");
}

/// The journal's first line: it names the layout and the source (the manifest's meta: the
/// checkpoint's path and fingerprint), so a run for another shape or another checkpoint never
/// resumes it (a mixed-model store).
inline std::string journal_fingerprint(const StoreManifest& m) {
  nlohmann::json layout = {{"shape", shape_to_json(m.shape)},
                           {"group_size", m.shape.quant.group_size},
                           {"zero_point", m.shape.quant.zero_point},
                           {"precisions", nlohmann::json::array()}};
  if (m.order != MatrixOrder::rows)
    layout["matrix_order"] = std::string(name(m.order));  // rows: as before it
  for (Precision p : m.precisions) layout["precisions"].push_back(std::string(name(p)));
  if (!m.meta.empty()) layout["source"] = m.meta;
  return "moekit-store-journal v1 " + layout.dump();
}

/// The blobs (index -> checksum) an interrupted run of the same layout journaled; when there is
/// nothing to resume, removes any partial file and starts a fresh journal.
inline std::map<std::size_t, std::uint64_t> resume_journal(const std::string& tmp,
                                                           const std::string& journal,
                                                           const std::string& fingerprint,
                                                           bool resume, std::size_t n_blobs) {
  namespace fs = std::filesystem;
  std::map<std::size_t, std::uint64_t> journaled;
  bool fresh = true;
  if (resume && fs::exists(tmp) && fs::exists(journal)) {
    std::ifstream in(journal);
    std::string first;
    if (std::getline(in, first) && first == fingerprint) {
      fresh = false;
      std::size_t idx;
      std::string hex;
      while (in >> idx >> hex) {
        bool ok;
        const std::uint64_t c = parse_hex64(hex, ok);
        if (ok && idx < n_blobs) journaled[idx] = c;
      }
    }
  }
  if (fresh) {
    fs::remove(tmp);
    fs::remove(journal);
    std::ofstream out(journal, std::ios::trunc);
    out << fingerprint << '\n';
    if (!out) fail_errno("cannot write journal", journal, errno);
  }
  return journaled;
}

// Blob `b`'s bytes as stored: the encoder's rows (in panels when the store wants them), padded
// with zeros so a rewritten blob never leaves stale bytes behind it; sets b.checksum.
inline std::vector<std::byte> encode_store_blob(const StoreManifest& m, StoreBlob& b,
                                                const ExpertEncoder& encode) {
  std::vector<std::byte> bytes = encode(b.key, b.precision);
  if (bytes.size() != b.bytes)
    throw Error(ErrorKind::invalid_argument,
                "expert encoder returned " + std::to_string(bytes.size()) + " bytes for layer " +
                    std::to_string(b.key.layer) + ", expert " + std::to_string(b.key.expert) +
                    " at " + std::string(name(b.precision)) + "; the model shape gives " +
                    std::to_string(b.bytes));
  if (in_panels(m.order_of(b.precision)))
    bytes = expert_blob_in_panels(m.shape, b.precision, bytes, m.order);
  b.checksum = xxh64(bytes);
  bytes.resize(b.padded_bytes(), std::byte{0});
  return bytes;
}

/// Writes every blob of `m` to `fd` (the file `tmp`), or keeps it when its journaled checksum
/// still matches, and journals each one written.
/// `options.encode_threads` blobs are encoded at once (std::async) and written in order.
inline ExpertStoreWriteReport write_store_blobs(
    int fd, const std::string& tmp, const std::string& journal, StoreManifest& m,
    const ExpertEncoder& encode, const std::map<std::size_t, std::uint64_t>& journaled,
    const ExpertStoreWriteOptions& options) {
  std::ofstream jout(journal, std::ios::app);
  ExpertStoreWriteReport report;
  const std::size_t window = std::max(1u, options.encode_threads);
  std::vector<std::size_t> todo;  // blobs of this window the journal does not vouch for
  std::vector<std::future<std::vector<std::byte>>> encoded;
  for (std::size_t w = 0; w < m.blobs.size(); w += window) {
    const std::size_t end = std::min(m.blobs.size(), w + window);
    todo.clear();
    for (std::size_t i = w; i < end; ++i) {
      StoreBlob& b = m.blobs[i];
      if (auto it = journaled.find(i);
          it != journaled.end() && checksum_range(fd, b.offset, b.bytes, tmp) == it->second) {
        b.checksum = it->second;
        ++report.blobs_resumed;
      } else {
        todo.push_back(i);
      }
    }
    encoded.clear();
    for (std::size_t t = 1; t < todo.size(); ++t)  // the first is encoded on this thread
      encoded.push_back(std::async(std::launch::async, [&m, &encode, i = todo[t]] {
        return encode_store_blob(m, m.blobs[i], encode);
      }));
    for (std::size_t t = 0; t < todo.size(); ++t) {
      const std::size_t i = todo[t];
      const std::vector<std::byte> bytes =
          t == 0 ? encode_store_blob(m, m.blobs[i], encode) : encoded[t - 1].get();
      pwrite_all(fd, bytes, m.blobs[i].offset, tmp);
      jout << i << ' ' << hex64(m.blobs[i].checksum) << '\n' << std::flush;
      ++report.blobs_encoded;
    }
    if (options.progress) options.progress(end, m.blobs.size());
  }
  return report;
}

/// Writes the manifest at `data_end` and the header page, syncs and closes `fd`, renames `tmp`
/// to `path` and drops the journal. Returns the file's size.
inline std::uint64_t finish_store(FileDescriptor& fd, const std::string& tmp,
                                  const std::string& path, const std::string& journal,
                                  const StoreManifest& m, std::uint64_t data_end) {
  const std::string text = manifest_to_json(m).dump(1);
  StoreHeader h;
  h.manifest_offset = data_end;
  h.manifest_bytes = text.size();
  h.manifest_checksum = xxh64(std::as_bytes(std::span(text)));
  h.file_bytes = data_end + text.size();
  pwrite_all(fd.get(), std::as_bytes(std::span(text)), data_end, tmp);
  pwrite_all(fd.get(), header_page(h), 0, tmp);
  if (::fsync(fd.get()) != 0) fail_errno("cannot fsync", tmp, errno);
  fd.reset();
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    throw Error(ErrorKind::io, "cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  std::filesystem::remove(journal, ec);
  return h.file_bytes;
}

}  // namespace detail

/// Writes the store for `shape` × `precisions` to `path` with bytes from `encode`.
/// Throws `Error(invalid_argument)` when `path` exists and `options.overwrite` is false, or when
/// the encoder returns the wrong number of bytes (naming the expert and precision);
/// `Error(io)` on write failures; `Error(checksum)` when the final verification fails.
inline ExpertStoreWriteReport write_expert_store(const std::string& path, const ModelShape& shape,
                                                 std::span<const Precision> precisions,
                                                 const ExpertEncoder& encode,
                                                 const ExpertStoreWriteOptions& options = {}) {
  detail::check_store_request(path, shape, precisions, options);
  const OutputLock lock(path);  // a second writer of `path` is refused now, not after encoding
  StoreManifest m;
  m.shape = shape;
  m.precisions.assign(precisions.begin(), precisions.end());
  m.blobs = store_blob_layout(shape, precisions);
  m.meta = options.meta;
  m.order = options.order;
  const std::uint64_t data_end = m.blobs.back().offset + m.blobs.back().padded_bytes();

  const std::string tmp = path + ".partial", journal = path + ".partial.journal";
  const auto journaled = detail::resume_journal(tmp, journal, detail::journal_fingerprint(m),
                                                options.resume, m.blobs.size());
  auto fd = detail::FileDescriptor::open(tmp, O_RDWR | O_CREAT);
  if (::ftruncate(fd.get(), static_cast<off_t>(data_end)) != 0)
    detail::fail_errno("cannot size", tmp, errno);
  ExpertStoreWriteReport report =
      detail::write_store_blobs(fd.get(), tmp, journal, m, encode, journaled, options);
  report.file_bytes = detail::finish_store(fd, tmp, path, journal, m, data_end);
  if (options.verify) ExpertStore::open(path, shape).verify();
  return report;
}

}  // namespace moekit::io
