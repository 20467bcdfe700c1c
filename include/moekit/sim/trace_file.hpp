#pragma once
/// \file Reading a routing trace file whatever its format, told apart by content, not by name:
/// the binary .mktrace format (trace_binary.hpp: starts with the magic "MOEKTRC\0"), moekit's
/// JSONL schema (trace_jsonl.hpp: a header line with "format"), or one of the shared Mixtral
/// JSONL traces (trace_jsonl.hpp: records with "token_pos", forward-call order, or "token_idx",
/// per-layer decode order). The Mixtral files carry no dimensions: they are read with
/// `mixtral_trace_dims` (32 layers, 8 experts, top-2), the model they were recorded from.

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/sim/trace.hpp"
#include "moekit/sim/trace_binary.hpp"
#include "moekit/sim/trace_jsonl.hpp"

namespace moekit::sim {

/// The formats `read_trace_file` reads.
enum class TraceFileFormat {
  binary,          ///< .mktrace
  moekit_jsonl,    ///< moekit's JSONL schema
  mixtral_decode,  ///< shared `*.decode.jsonl` ("token_idx")
  mixtral_raw,     ///< shared `*.prefill-decode.raw.jsonl` ("token_pos")
};

/// The format of a trace held in `bytes`; `source` names it in the error thrown
/// (`Error(invalid_format)`) when it is none of them.
inline TraceFileFormat detect_trace_format(std::span<const std::byte> bytes,
                                           std::string_view source) {
  if (bytes.size() >= sizeof trace_magic && std::memcmp(bytes.data(), trace_magic, 8) == 0)
    return TraceFileFormat::binary;
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  nlohmann::json first;
  bool seen = false;
  detail::for_each_line(text, [&](std::size_t, std::string_view line) {
    if (seen) return;
    seen = true;
    first = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  });
  if (first.is_object()) {
    if (first.contains("format")) return TraceFileFormat::moekit_jsonl;
    if (first.contains("token_pos")) return TraceFileFormat::mixtral_raw;
    if (first.contains("token_idx")) return TraceFileFormat::mixtral_decode;
  }
  ::moekit::detail::fail(ErrorKind::invalid_format,
                         "trace '" + std::string(source) +
                             "' is neither a .mktrace file nor a JSONL trace (its first line is "
                             "not a JSON object with 'format', 'token_pos' or 'token_idx')");
}

/// Parses a trace in any of the formats above; `source` names it in errors.
[[nodiscard]] inline RoutingTrace parse_trace_file(std::span<const std::byte> bytes,
                                                   std::string_view source = "<memory>") {
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  switch (detect_trace_format(bytes, source)) {
    case TraceFileFormat::binary:
      return parse_trace_binary(bytes, source);
    case TraceFileFormat::moekit_jsonl:
      return parse_trace_jsonl(text, source);
    case TraceFileFormat::mixtral_decode:
      return parse_mixtral_decode_jsonl(text, source);
    case TraceFileFormat::mixtral_raw:
      return parse_mixtral_raw_jsonl(text, source);
  }
  ::moekit::detail::fail(ErrorKind::internal, "parse_trace_file: unknown format");
}

/// Reads the trace file at `path` in any of the formats above.
[[nodiscard]] inline RoutingTrace read_trace_file(const std::string& path) {
  const auto bytes = detail::read_file_bytes(path);
  return parse_trace_file(bytes, path);
}

}  // namespace moekit::sim
