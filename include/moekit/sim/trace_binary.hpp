#pragma once
/// \file Compact binary file format for RoutingTrace (".mktrace"), reader and writer.
///
/// All integers and floats little-endian, no padding. Version 1:
///
/// | offset | size | field                                                              |
/// |--------|------|--------------------------------------------------------------------|
/// | 0      | 8    | magic "MOEKTRC\0"                                                  |
/// | 8      | 4    | version (u32) = 1                                                  |
/// | 12     | 4    | flags (u32): bit0 logits stored, bit1 hidden stored, bit2 synthetic; other
/// bits 0 | | 16     | 4    | n_layers (u32)                                                     |
/// | 20     | 4    | n_experts (u32)                                                    |
/// | 24     | 4    | top_k (u32)                                                        |
/// | 28     | 4    | hidden (u32; 0 unless bit1)                                        |
/// | 32     | 8    | n_sequences (u64)                                                  |
/// | 40     | 8    | n_tokens (u64), over all sequences                                 |
/// | 48     | 4    | name length in bytes (u32)                                         |
/// | 52     | 4    | reserved, 0                                                        |
/// | 56     | …    | name (UTF-8, no terminator)                                        |
/// | then, per sequence: u64 token count, u32 name length, name bytes                          |
/// | then: phases u8[n_tokens] (0 prefill, 1 decode; prefill before decode in each sequence)  |
/// | then: experts u32[n_tokens·n_layers·top_k] (0xFFFFFFFF in every slot = missing record)   |
/// | then: weights f32[same count] (0 in a missing record)                                    |
/// | then, if bit0: logits f32[n_tokens·n_layers·n_experts]                                   |
/// | then, if bit1: hidden f32[n_tokens·n_layers·hidden]                                      |
///
/// The file ends exactly there. Records are ordered token-major then layer. The reader checks
/// everything (sizes, ranges, distinct ids, finite descending normalised weights) and throws
/// `moekit::Error(invalid_format)` naming the source and the field.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/sim/trace.hpp"

namespace moekit::sim {

inline constexpr char trace_magic[8] = {'M', 'O', 'E', 'K', 'T', 'R', 'C', '\0'};
inline constexpr std::uint32_t trace_format_version = 1;
inline constexpr std::uint32_t trace_flag_logits = 1u << 0;
inline constexpr std::uint32_t trace_flag_hidden = 1u << 1;
inline constexpr std::uint32_t trace_flag_synthetic = 1u << 2;

namespace detail {

inline void require_little_endian(std::string_view what) {
  if constexpr (std::endian::native != std::endian::little)
    ::moekit::detail::fail(ErrorKind::unsupported,
                           std::string(what) + ": big-endian hosts are not supported");
}

class ByteWriter {
 public:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put_bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const std::byte*>(data);
    out_.insert(out_.end(), p, p + n);
  }
  std::vector<std::byte> take() { return std::move(out_); }
  void reserve(std::size_t n) { out_.reserve(n); }

 private:
  std::vector<std::byte> out_;
};

class ByteReader {
 public:
  ByteReader(std::span<const std::byte> bytes, std::string_view source)
      : bytes_(bytes), source_(source) {}

  template <class T>
  T get(std::string_view field) {
    T v;
    need(sizeof(T), field);
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  void get_bytes(void* dst, std::size_t n, std::string_view field) {
    need(n, field);
    if (n) std::memcpy(dst, bytes_.data() + pos_, n);
    pos_ += n;
  }
  /// A string of `n` bytes; checks the size before allocating.
  std::string get_string(std::size_t n, std::string_view field) {
    need(n, field);
    std::string out(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return out;
  }
  [[nodiscard]] std::size_t remaining() const noexcept { return bytes_.size() - pos_; }
  [[noreturn]] void bad(std::string_view field, std::string_view why) const {
    ::moekit::detail::fail(ErrorKind::invalid_format, "trace '" + std::string(source_) +
                                                          "': field '" + std::string(field) +
                                                          "': " + std::string(why));
  }

 private:
  void need(std::size_t n, std::string_view field) const {
    if (n > remaining())
      bad(field, "truncated (needs " + std::to_string(n) + " bytes at offset " +
                     std::to_string(pos_) + ", " + std::to_string(remaining()) + " left)");
  }
  std::span<const std::byte> bytes_;
  std::string_view source_;
  std::size_t pos_ = 0;
};

}  // namespace detail

/// Serialises `trace` in the binary format above.
[[nodiscard]] inline std::vector<std::byte> serialize_trace_binary(const RoutingTrace& trace) {
  detail::require_little_endian("serialize_trace_binary");
  const TraceDims& d = trace.dims();
  MOEKIT_EXPECTS(d.n_layers > 0, "serialize_trace_binary: trace has no dims");
  detail::ByteWriter w;
  w.reserve(64 + trace.all_experts().size_bytes() + trace.all_weights().size_bytes() +
            trace.all_logits().size_bytes() + trace.all_hidden().size_bytes() +
            trace.token_count());
  w.put_bytes(trace_magic, sizeof trace_magic);
  w.put(trace_format_version);
  std::uint32_t flags = 0;
  if (d.has_logits) flags |= trace_flag_logits;
  if (d.hidden) flags |= trace_flag_hidden;
  if (trace.synthetic()) flags |= trace_flag_synthetic;
  w.put(flags);
  w.put(d.n_layers);
  w.put(d.n_experts);
  w.put(d.top_k);
  w.put(d.hidden);
  w.put(std::uint64_t{trace.sequence_count()});
  w.put(std::uint64_t{trace.token_count()});
  MOEKIT_EXPECTS(trace.name().size() <= UINT32_MAX, "serialize_trace_binary: name too long");
  w.put(static_cast<std::uint32_t>(trace.name().size()));
  w.put(std::uint32_t{0});
  w.put_bytes(trace.name().data(), trace.name().size());
  for (std::size_t s = 0; s < trace.sequence_count(); ++s) {
    const std::string& n = trace.sequence_name(s);
    MOEKIT_EXPECTS(n.size() <= UINT32_MAX, "serialize_trace_binary: sequence name too long");
    w.put(std::uint64_t{trace.sequence_length(s)});
    w.put(static_cast<std::uint32_t>(n.size()));
    w.put_bytes(n.data(), n.size());
  }
  for (Phase p : trace.all_phases()) w.put(static_cast<std::uint8_t>(p == Phase::decode));
  w.put_bytes(trace.all_experts().data(), trace.all_experts().size_bytes());
  w.put_bytes(trace.all_weights().data(), trace.all_weights().size_bytes());
  w.put_bytes(trace.all_logits().data(), trace.all_logits().size_bytes());
  w.put_bytes(trace.all_hidden().data(), trace.all_hidden().size_bytes());
  return w.take();
}

namespace detail {

/// The fixed-size header and the name of a binary trace.
struct BinaryTraceHeader {
  std::uint32_t flags = 0;
  TraceDims dims;
  std::uint64_t n_sequences = 0, n_tokens = 0;
  std::string name;
};

inline BinaryTraceHeader read_trace_header(ByteReader& r) {
  char magic[8];
  r.get_bytes(magic, 8, "magic");
  if (std::memcmp(magic, trace_magic, 8) != 0) r.bad("magic", "not a moekit trace (bad magic)");
  const auto version = r.get<std::uint32_t>("version");
  if (version != trace_format_version)
    r.bad("version", "unsupported version " + std::to_string(version) +
                         " (this reader: " + std::to_string(trace_format_version) + ")");
  BinaryTraceHeader h;
  h.flags = r.get<std::uint32_t>("flags");
  if (h.flags & ~(trace_flag_logits | trace_flag_hidden | trace_flag_synthetic))
    r.bad("flags", "unknown flag bits set");
  TraceDims& d = h.dims;
  d.n_layers = r.get<std::uint32_t>("n_layers");
  d.n_experts = r.get<std::uint32_t>("n_experts");
  d.top_k = r.get<std::uint32_t>("top_k");
  d.hidden = r.get<std::uint32_t>("hidden");
  d.has_logits = (h.flags & trace_flag_logits) != 0;
  if (d.n_layers == 0) r.bad("n_layers", "must be > 0");
  if (d.n_experts == 0 || d.n_experts == missing_expert) r.bad("n_experts", "out of range");
  if (d.top_k == 0 || d.top_k > d.n_experts) r.bad("top_k", "must be in [1, n_experts]");
  if (((h.flags & trace_flag_hidden) != 0) != (d.hidden != 0))
    r.bad("hidden", "must be > 0 exactly when the hidden flag is set");
  h.n_sequences = r.get<std::uint64_t>("n_sequences");
  h.n_tokens = r.get<std::uint64_t>("n_tokens");
  const auto name_len = r.get<std::uint32_t>("name_length");
  if (r.get<std::uint32_t>("reserved") != 0) r.bad("reserved", "must be 0");

  // Every sequence needs at least 12 header bytes, every token at least one phase byte: reject
  // absurd counts before allocating anything.
  if (h.n_sequences > r.remaining() / 12) r.bad("n_sequences", "inconsistent with the file size");
  if (h.n_tokens > r.remaining()) r.bad("n_tokens", "inconsistent with the file size");
  h.name = r.get_string(name_len, "name");
  return h;
}

/// Each sequence's token count and name (`lengths` and `names` are sized to the sequences); the
/// counts must add up to `n_tokens`.
inline void read_sequence_table(ByteReader& r, std::uint64_t n_tok,
                                std::vector<std::uint64_t>& lengths,
                                std::vector<std::string>& names) {
  std::uint64_t total = 0;
  for (std::uint64_t s = 0; s < lengths.size(); ++s) {
    lengths[s] = r.get<std::uint64_t>("sequence.n_tokens");
    const auto len = r.get<std::uint32_t>("sequence.name_length");
    names[s] = r.get_string(len, "sequence.name");
    if (lengths[s] > n_tok - total) r.bad("sequence.n_tokens", "sequence lengths exceed n_tokens");
    total += lengths[s];
  }
  if (total != n_tok) r.bad("sequence.n_tokens", "sequence lengths do not add up to n_tokens");
}

/// Element counts of the arrays after the sequence table.
struct TraceArrayCounts {
  std::uint64_t slots = 0, logits = 0, hidden = 0;
};

/// The counts `d` and `n_tok` imply; they must fill exactly the bytes that follow.
inline TraceArrayCounts trace_array_counts(const ByteReader& r, const TraceDims& d,
                                           std::uint64_t n_tok) {
  TraceArrayCounts c;
  std::uint64_t recs = 0, need = 0;
  bool overflow = mul_overflows(n_tok, d.n_layers, recs) || mul_overflows(recs, d.top_k, c.slots) ||
                  mul_overflows(recs, d.has_logits ? d.n_experts : 0, c.logits) ||
                  mul_overflows(recs, d.hidden, c.hidden);
  if (!overflow) {
    const std::uint64_t parts[] = {n_tok, c.slots * 4, c.slots * 4, c.logits * 4, c.hidden * 4};
    for (std::uint64_t p : parts) overflow |= __builtin_add_overflow(need, p, &need);
    overflow |= c.slots > UINT64_MAX / 4 || c.logits > UINT64_MAX / 4 || c.hidden > UINT64_MAX / 4;
  }
  if (overflow || need != r.remaining())
    r.bad("n_tokens", "counts imply " +
                          (overflow ? std::string("an overflowing size")
                                    : std::to_string(need) + " bytes of arrays") +
                          " but " + std::to_string(r.remaining()) + " bytes follow");
  return c;
}

/// The arrays after the sequence table, as stored.
struct TraceArrays {
  std::vector<std::uint8_t> phases;
  std::vector<std::uint32_t> ids;
  std::vector<float> weights, logits, hidden;
};

inline TraceArrays read_trace_arrays(ByteReader& r, std::uint64_t n_tok,
                                     const TraceArrayCounts& c) {
  TraceArrays a;
  a.phases.resize(n_tok);
  r.get_bytes(a.phases.data(), n_tok, "phases");
  a.ids.resize(c.slots);
  a.weights.resize(c.slots);
  a.logits.resize(c.logits);
  a.hidden.resize(c.hidden);
  r.get_bytes(a.ids.data(), c.slots * 4, "experts");
  r.get_bytes(a.weights.data(), c.slots * 4, "weights");
  r.get_bytes(a.logits.data(), c.logits * 4, "logits");
  r.get_bytes(a.hidden.data(), c.hidden * 4, "hidden");
  return a;
}

/// Checks the record of token `tok` at layer `l` and stores it in `trace` (a missing record stays
/// missing).
inline void add_trace_record(const ByteReader& r, const TraceDims& d, const TraceArrays& a,
                             std::uint64_t tok, std::uint32_t l, RoutingTrace& trace) {
  const std::uint64_t rec = tok * d.n_layers + l;
  std::span<const std::uint32_t> rid(a.ids.data() + rec * d.top_k, d.top_k);
  std::span<const float> rw(a.weights.data() + rec * d.top_k, d.top_k);
  const std::string where = "token " + std::to_string(tok) + " layer " + std::to_string(l);
  if (rid[0] == missing_expert) {
    for (std::uint32_t i = 0; i < d.top_k; ++i)
      if (rid[i] != missing_expert || rw[i] != 0.0f)
        r.bad("experts", where + ": partially missing record");
    return;
  }
  const std::string why = check_route(d, rid, rw);
  if (!why.empty())
    r.bad(why.find("weight") != std::string::npos ? "weights" : "experts", where + ": " + why);
  std::span<const float> rl, rh;
  if (d.has_logits) rl = {a.logits.data() + rec * d.n_experts, d.n_experts};
  if (d.hidden) rh = {a.hidden.data() + rec * d.hidden, d.hidden};
  for (float v : rl)
    if (!std::isfinite(v)) r.bad("logits", where + ": not finite");
  for (float v : rh)
    if (!std::isfinite(v)) r.bad("hidden", where + ": not finite");
  trace.set_route(tok, l, rid, rw, rl, rh);
}

/// Appends every sequence's tokens (prefill before decode in each) with their records.
inline void add_trace_tokens(const ByteReader& r, const TraceDims& d, const TraceArrays& a,
                             const std::vector<std::uint64_t>& lengths,
                             std::vector<std::string>& names, RoutingTrace& trace) {
  std::uint64_t tok = 0;
  for (std::uint64_t s = 0; s < lengths.size(); ++s) {
    trace.begin_sequence(std::move(names[s]));
    bool seen_decode = false;
    for (std::uint64_t t = 0; t < lengths[s]; ++t, ++tok) {
      if (a.phases[tok] > 1) r.bad("phases", "token " + std::to_string(tok) + ": phase not 0 or 1");
      const Phase p = a.phases[tok] ? Phase::decode : Phase::prefill;
      if (p == Phase::prefill && seen_decode)
        r.bad("phases", "sequence " + std::to_string(s) + ": prefill token after decode");
      seen_decode |= p == Phase::decode;
      trace.append_token(p);
      for (std::uint32_t l = 0; l < d.n_layers; ++l) add_trace_record(r, d, a, tok, l, trace);
    }
  }
}

}  // namespace detail

/// Parses a binary trace from memory; `source` names it in error messages (a path, or
/// "<memory>"). Throws `moekit::Error(invalid_format)` on any inconsistency.
[[nodiscard]] inline RoutingTrace parse_trace_binary(std::span<const std::byte> bytes,
                                                     std::string_view source = "<memory>") {
  detail::require_little_endian("parse_trace_binary");
  detail::ByteReader r(bytes, source);
  detail::BinaryTraceHeader h = detail::read_trace_header(r);
  RoutingTrace trace(h.dims, std::move(h.name), (h.flags & trace_flag_synthetic) != 0);
  std::vector<std::uint64_t> lengths(h.n_sequences);
  std::vector<std::string> names(h.n_sequences);
  detail::read_sequence_table(r, h.n_tokens, lengths, names);
  const detail::TraceArrayCounts counts = detail::trace_array_counts(r, h.dims, h.n_tokens);
  trace.reserve_tokens(h.n_tokens);
  const detail::TraceArrays arrays = detail::read_trace_arrays(r, h.n_tokens, counts);
  detail::add_trace_tokens(r, h.dims, arrays, lengths, names, trace);
  return trace;
}

/// Reads a binary trace file.
[[nodiscard]] inline RoutingTrace read_trace_binary(const std::string& path) {
  const auto bytes = detail::read_file_bytes(path);
  return parse_trace_binary(bytes, path);
}

/// Writes `trace` to `path`; throws if the file exists unless `overwrite`.
inline void write_trace_binary(const RoutingTrace& trace, const std::string& path,
                               bool overwrite = false) {
  const auto bytes = serialize_trace_binary(trace);
  detail::write_file_bytes(path, bytes, overwrite);
}

}  // namespace moekit::sim
