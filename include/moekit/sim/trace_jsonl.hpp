#pragma once
/// \file JSONL import/export of RoutingTrace, and importers for the shared Mixtral traces.
///
/// moekit's own JSONL schema (version 1), one JSON object per line:
///   line 1:   {"format": "moekit-trace", "version": 1, "name": str, "synthetic": bool,
///              "n_layers": int, "n_experts": int, "top_k": int, "hidden": int (0 = none),
///              "has_logits": bool}
///   then for each sequence: {"sequence": str} followed by its tokens in order, one line each:
///             {"phase": "prefill"|"decode",
///              "layers": [ null (missing record) | {"experts": [int…], "weights": [float…],
///                                                   "logits": [float…]?, "hidden": [float…]?} ]}
///   ("layers" has n_layers entries; "logits"/"hidden" appear exactly when the header says so.)
///
/// Shared Mixtral-8x7B traces (../shared/data/traces/mixtral-8x7b/, see data/README.md):
///  * `*.decode.jsonl`: one record per (token, layer) {"dataset", "problem_id", "layer",
///    "token_idx", "experts" [2], "gating_probs" [2]}; decode tokens only. `token_idx` counts the
///    records *of that layer*, so when the collector dropped a record (ties at 0.5/0.5) the later
///    tokens of that layer shift down by one. The importer places record i of a layer at token i
///    and leaves the tail of short layers missing; cross-layer alignment is approximate after a
///    drop (fine for per-layer studies, not for cross-layer prediction).
///  * `*.prefill-decode.raw.jsonl`: forward-call order. {"layer", "token_pos", …}: the first
///    forward of a problem is the prompt (every layer, `token_pos` = position in the batch), then
///    one forward per generated token (`token_pos` = 0). A new forward starts whenever
///    (layer, token_pos) does not increase; dropped records stay missing, so layers are aligned.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/sim/trace.hpp"

namespace moekit::sim {

/// Upper bound on n_layers · (2·top_k + logits + hidden) accepted by the JSONL reader.
inline constexpr std::size_t max_jsonl_values_per_token = std::size_t{1} << 24;

/// Largest prompt (tokens of one prefill forward) the raw importer accepts.
inline constexpr std::uint64_t max_raw_prompt_tokens = std::uint64_t{1} << 16;

namespace detail {

/// Calls `f(line_number, line)` for each non-blank line of `text` (1-based numbers).
template <class F>
void for_each_line(std::string_view text, F&& f) {
  std::size_t line_no = 0, pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") != std::string_view::npos) f(line_no, line);
    if (end == text.size()) break;
    pos = end + 1;
  }
}

class JsonlContext {
 public:
  explicit JsonlContext(std::string_view source) : source_(source) {}
  void at_line(std::size_t n) noexcept { line_ = n; }
  [[noreturn]] void bad(std::string_view field, std::string_view why) const {
    ::moekit::detail::fail(ErrorKind::invalid_format,
                           "trace '" + std::string(source_) + "' line " + std::to_string(line_) +
                               ": field '" + std::string(field) + "': " + std::string(why));
  }
  nlohmann::json parse(std::string_view line) const {
    try {
      nlohmann::json j = nlohmann::json::parse(line);
      if (!j.is_object()) bad("<line>", "not a JSON object");
      return j;
    } catch (const nlohmann::json::exception& e) {
      bad("<line>", std::string("invalid JSON: ") + e.what());
    }
  }
  const nlohmann::json& member(const nlohmann::json& obj, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) bad(key, "missing");
    return *it;
  }
  std::uint64_t get_uint(const nlohmann::json& obj, const char* key,
                         std::uint64_t max = UINT32_MAX) const {
    const auto& v = member(obj, key);
    if (!v.is_number_integer() ||
        (v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() < 0))
      bad(key, "must be a non-negative integer");
    const auto x = v.get<std::uint64_t>();
    if (x > max) bad(key, "too large");
    return x;
  }
  std::string get_string(const nlohmann::json& obj, const char* key) const {
    const auto& v = member(obj, key);
    if (!v.is_string()) bad(key, "must be a string");
    return v.get<std::string>();
  }
  bool get_bool(const nlohmann::json& obj, const char* key) const {
    const auto& v = member(obj, key);
    if (!v.is_boolean()) bad(key, "must be true or false");
    return v.get<bool>();
  }
  std::vector<std::uint32_t> get_ids(const nlohmann::json& obj, const char* key) const {
    const auto& v = member(obj, key);
    if (!v.is_array()) bad(key, "must be an array");
    std::vector<std::uint32_t> out;
    for (const auto& x : v) {
      if (!x.is_number_integer() || (!x.is_number_unsigned() && x.get<std::int64_t>() < 0) ||
          x.get<std::uint64_t>() >= missing_expert)
        bad(key, "must hold non-negative integer expert ids");
      out.push_back(static_cast<std::uint32_t>(x.get<std::uint64_t>()));
    }
    return out;
  }
  std::vector<float> get_floats(const nlohmann::json& obj, const char* key) const {
    const auto& v = member(obj, key);
    if (!v.is_array()) bad(key, "must be an array");
    std::vector<float> out;
    out.reserve(v.size());
    for (const auto& x : v) {
      if (!x.is_number()) bad(key, "must hold numbers");
      const float f = x.get<float>();
      if (!std::isfinite(f)) bad(key, "holds a value that is not finite in f32");
      out.push_back(f);
    }
    return out;
  }
  void check_route(const TraceDims& d, std::span<const std::uint32_t> ids,
                   std::span<const float> w) const {
    const std::string why = detail::check_route(d, ids, w);
    if (!why.empty()) bad(why.find("weight") != std::string::npos ? "weights" : "experts", why);
  }

 private:
  std::string_view source_;
  std::size_t line_ = 0;
};

inline nlohmann::json floats_json(std::span<const float> v) {
  nlohmann::json a = nlohmann::json::array();
  for (float x : v) a.push_back(x);
  return a;
}

}  // namespace detail

/// Writes `trace` in moekit's JSONL schema (see the file comment). Floats are written with
/// enough digits to read back bit-identical.
[[nodiscard]] inline std::string serialize_trace_jsonl(const RoutingTrace& trace) {
  const TraceDims& d = trace.dims();
  std::string out;
  nlohmann::json h = {{"format", "moekit-trace"},  {"version", 1},
                      {"name", trace.name()},      {"synthetic", trace.synthetic()},
                      {"n_layers", d.n_layers},    {"n_experts", d.n_experts},
                      {"top_k", d.top_k},          {"hidden", d.hidden},
                      {"has_logits", d.has_logits}};
  out += h.dump() + '\n';
  for (std::size_t s = 0; s < trace.sequence_count(); ++s) {
    out += nlohmann::json{{"sequence", trace.sequence_name(s)}}.dump() + '\n';
    for (std::size_t t = 0; t < trace.sequence_length(s); ++t) {
      const std::size_t g = trace.global_token(s, t);
      nlohmann::json layers = nlohmann::json::array();
      for (std::uint32_t l = 0; l < d.n_layers; ++l) {
        if (!trace.valid(g, l)) {
          layers.push_back(nullptr);
          continue;
        }
        nlohmann::json rec;
        rec["experts"] =
            std::vector<std::uint32_t>(trace.experts(g, l).begin(), trace.experts(g, l).end());
        rec["weights"] = detail::floats_json(trace.weights(g, l));
        if (d.has_logits) rec["logits"] = detail::floats_json(trace.logits(g, l));
        if (d.hidden) rec["hidden"] = detail::floats_json(trace.hidden(g, l));
        layers.push_back(std::move(rec));
      }
      nlohmann::json tok = {{"phase", trace.phase(g) == Phase::prefill ? "prefill" : "decode"},
                            {"layers", std::move(layers)}};
      out += tok.dump() + '\n';
    }
  }
  return out;
}

/// Parses moekit's JSONL schema from memory; `source` names it in errors.
[[nodiscard]] inline RoutingTrace parse_trace_jsonl(std::string_view text,
                                                    std::string_view source = "<memory>") {
  detail::JsonlContext cx(source);
  RoutingTrace trace;
  bool have_header = false;
  detail::for_each_line(text, [&](std::size_t n, std::string_view line) {
    cx.at_line(n);
    const nlohmann::json j = cx.parse(line);
    if (!have_header) {
      if (cx.get_string(j, "format") != "moekit-trace") cx.bad("format", "not 'moekit-trace'");
      if (cx.get_uint(j, "version") != 1) cx.bad("version", "unsupported (this reader: 1)");
      TraceDims d;
      d.n_layers = static_cast<std::uint32_t>(cx.get_uint(j, "n_layers"));
      d.n_experts = static_cast<std::uint32_t>(cx.get_uint(j, "n_experts", missing_expert - 1));
      d.top_k = static_cast<std::uint32_t>(cx.get_uint(j, "top_k"));
      d.hidden = static_cast<std::uint32_t>(cx.get_uint(j, "hidden"));
      d.has_logits = cx.get_bool(j, "has_logits");
      if (d.n_layers == 0) cx.bad("n_layers", "must be > 0");
      if (d.n_experts == 0) cx.bad("n_experts", "must be > 0");
      if (d.top_k == 0 || d.top_k > d.n_experts) cx.bad("top_k", "must be in [1, n_experts]");
      // A token line allocates its records before they are read: bound the values per token
      // (real models: 64 layers × (256 logits + 8192 hidden) ≈ 0.5 M) so that a hostile header
      // cannot request gigabytes.
      const double per_token =
          double(d.n_layers) *
          (2.0 * d.top_k + (d.has_logits ? double(d.n_experts) : 0.0) + double(d.hidden));
      if (per_token > double(max_jsonl_values_per_token))
        cx.bad("n_layers", "dimensions imply more than 2^24 values per token");
      trace = RoutingTrace(d, cx.get_string(j, "name"), cx.get_bool(j, "synthetic"));
      have_header = true;
      return;
    }
    if (j.contains("sequence")) {
      trace.begin_sequence(cx.get_string(j, "sequence"));
      return;
    }
    if (trace.sequence_count() == 0) cx.bad("sequence", "token line before any sequence line");
    const TraceDims& d = trace.dims();
    const std::string ph = cx.get_string(j, "phase");
    if (ph != "prefill" && ph != "decode") cx.bad("phase", "must be 'prefill' or 'decode'");
    const Phase p = ph == "prefill" ? Phase::prefill : Phase::decode;
    const bool after_decode = trace.sequence_length(trace.sequence_count() - 1) > 0 &&
                              trace.phase(trace.token_count() - 1) == Phase::decode;
    if (p == Phase::prefill && after_decode) cx.bad("phase", "prefill token after a decode token");
    const auto& layers = cx.member(j, "layers");
    if (!layers.is_array() || layers.size() != d.n_layers)
      cx.bad("layers", "must be an array of n_layers entries");
    const std::size_t g = trace.append_token(p);
    for (std::uint32_t l = 0; l < d.n_layers; ++l) {
      const auto& rec = layers[l];
      if (rec.is_null()) continue;
      if (!rec.is_object()) cx.bad("layers", "entries must be objects or null");
      const auto ids = cx.get_ids(rec, "experts");
      const auto w = cx.get_floats(rec, "weights");
      cx.check_route(d, ids, w);
      std::vector<float> lg, hd;
      if (d.has_logits) {
        lg = cx.get_floats(rec, "logits");
        if (lg.size() != d.n_experts) cx.bad("logits", "must hold n_experts values");
      } else if (rec.contains("logits")) {
        cx.bad("logits", "present but the header says has_logits = false");
      }
      if (d.hidden) {
        hd = cx.get_floats(rec, "hidden");
        if (hd.size() != d.hidden) cx.bad("hidden", "must hold 'hidden' values");
      } else if (rec.contains("hidden")) {
        cx.bad("hidden", "present but the header says hidden = 0");
      }
      trace.set_route(g, l, ids, w, lg, hd);
    }
  });
  if (!have_header) cx.bad("format", "empty input: no header line");
  return trace;
}

/// Reads a JSONL trace file in moekit's schema.
[[nodiscard]] inline RoutingTrace read_trace_jsonl(const std::string& path) {
  return parse_trace_jsonl(detail::read_file_text(path), path);
}

/// Writes `trace` as JSONL; throws if the file exists unless `overwrite`.
inline void write_trace_jsonl(const RoutingTrace& trace, const std::string& path,
                              bool overwrite = false) {
  const std::string text = serialize_trace_jsonl(trace);
  detail::write_file_bytes(path, std::as_bytes(std::span<const char>(text.data(), text.size())),
                           overwrite);
}

// ---- importers for the shared Mixtral traces ----------------------------------------------------

/// Dimensions of the shared Mixtral-8x7B traces.
inline constexpr TraceDims mixtral_trace_dims{.n_layers = 32, .n_experts = 8, .top_k = 2};

namespace detail {

struct MixtralRecord {
  std::string dataset;
  std::uint64_t problem = 0;
  std::uint32_t layer = 0;
  std::uint64_t pos = 0;  ///< token_idx or token_pos
  std::vector<std::uint32_t> ids;
  std::vector<float> w;
};

inline MixtralRecord parse_mixtral_record(const JsonlContext& cx, std::string_view line,
                                          const TraceDims& d, const char* pos_key) {
  const nlohmann::json j = cx.parse(line);
  MixtralRecord r;
  r.dataset = cx.get_string(j, "dataset");
  r.problem = cx.get_uint(j, "problem_id", UINT64_MAX);
  r.layer = static_cast<std::uint32_t>(cx.get_uint(j, "layer"));
  if (r.layer >= d.n_layers) cx.bad("layer", "out of range [0, n_layers)");
  r.pos = cx.get_uint(j, pos_key, UINT32_MAX);
  r.ids = cx.get_ids(j, "experts");
  r.w = cx.get_floats(j, "gating_probs");
  if (r.ids.size() != d.top_k || r.w.size() != d.top_k)
    cx.bad("experts", "must hold top_k ids and gating_probs");
  for (std::uint32_t id : r.ids)
    if (id >= d.n_experts) cx.bad("experts", "expert id out of range");
  for (float x : r.w)
    if (x < 0) cx.bad("gating_probs", "negative weight");
  try {
    normalize_route(r.ids, r.w);
  } catch (const Error& e) {
    cx.bad("gating_probs", e.message());
  }
  cx.check_route(d, r.ids, r.w);
  return r;
}

}  // namespace detail

/// Imports a shared `*.decode.jsonl` trace (decode tokens only, one sequence per problem, in
/// order of first appearance, named "<dataset>/<problem_id>"). Records must appear with
/// `token_idx` = 0, 1, 2, … within each (problem, layer). A sequence has as many tokens as its
/// longest layer; shorter layers end in missing records (see the file comment for the drift).
[[nodiscard]] inline RoutingTrace parse_mixtral_decode_jsonl(std::string_view text,
                                                             std::string_view source = "<memory>",
                                                             TraceDims dims = mixtral_trace_dims,
                                                             std::string name = "") {
  dims.validate();
  detail::JsonlContext cx(source);
  struct Seq {
    std::string name;
    std::vector<std::vector<detail::MixtralRecord>> layers;
  };
  std::vector<Seq> seqs;
  std::map<std::pair<std::string, std::uint64_t>, std::size_t> index;
  detail::for_each_line(text, [&](std::size_t n, std::string_view line) {
    cx.at_line(n);
    auto r = detail::parse_mixtral_record(cx, line, dims, "token_idx");
    auto key = std::make_pair(r.dataset, r.problem);
    auto [it, fresh] = index.try_emplace(key, seqs.size());
    if (fresh)
      seqs.push_back(Seq{r.dataset + "/" + std::to_string(r.problem),
                         std::vector<std::vector<detail::MixtralRecord>>(dims.n_layers)});
    auto& layer = seqs[it->second].layers[r.layer];
    if (r.pos != layer.size())
      cx.bad("token_idx", "expected " + std::to_string(layer.size()) +
                              " (token_idx counts the "
                              "records of each layer), got " +
                              std::to_string(r.pos));
    layer.push_back(std::move(r));
  });
  if (seqs.empty()) cx.bad("<file>", "no records");
  RoutingTrace trace(dims, name.empty() ? std::string(source) : std::move(name), false);
  for (auto& s : seqs) {
    std::size_t len = 0;
    for (const auto& l : s.layers) len = std::max(len, l.size());
    trace.begin_sequence(s.name);
    const std::size_t first = trace.token_count();
    for (std::size_t t = 0; t < len; ++t) trace.append_token(Phase::decode);
    for (std::uint32_t l = 0; l < dims.n_layers; ++l)
      for (std::size_t t = 0; t < s.layers[l].size(); ++t)
        trace.set_route(first + t, l, s.layers[l][t].ids, s.layers[l][t].w);
  }
  return trace;
}

/// Imports a shared `*.prefill-decode.raw.jsonl` trace (forward-call order): per problem, the
/// first forward is the prompt (prefill tokens 0..max token_pos), each later forward is one
/// decode token. Missing records stay missing, layers stay aligned.
[[nodiscard]] inline RoutingTrace parse_mixtral_raw_jsonl(std::string_view text,
                                                          std::string_view source = "<memory>",
                                                          TraceDims dims = mixtral_trace_dims,
                                                          std::string name = "") {
  dims.validate();
  detail::JsonlContext cx(source);
  struct Forward {
    std::string seq;
    bool prefill = false;
    std::vector<detail::MixtralRecord> recs;
    std::size_t line = 0;
  };
  std::vector<Forward> fwds;
  std::pair<std::uint32_t, std::uint64_t> prev{};
  std::string prev_seq;
  detail::for_each_line(text, [&](std::size_t n, std::string_view line) {
    cx.at_line(n);
    auto r = detail::parse_mixtral_record(cx, line, dims, "token_pos");
    const std::string seq = r.dataset + "/" + std::to_string(r.problem);
    const std::pair<std::uint32_t, std::uint64_t> key{r.layer, r.pos};
    if (fwds.empty() || seq != prev_seq) {
      for (const auto& f : fwds)
        if (f.seq == seq) cx.bad("problem_id", "records of '" + seq + "' are not contiguous");
      fwds.push_back(Forward{seq, true, {}, n});
    } else if (!(prev < key)) {
      fwds.push_back(Forward{seq, false, {}, n});
    }
    if (!fwds.back().prefill && r.pos != 0)
      cx.bad("token_pos", "a decode forward must have token_pos 0");
    prev = key;
    prev_seq = seq;
    fwds.back().recs.push_back(std::move(r));
  });
  if (fwds.empty()) cx.bad("<file>", "no records");
  RoutingTrace trace(dims, name.empty() ? std::string(source) : std::move(name), false);
  for (const auto& f : fwds) {
    if (f.prefill) trace.begin_sequence(f.seq);
    std::uint64_t n_tok = 1;
    for (const auto& r : f.recs) n_tok = std::max<std::uint64_t>(n_tok, r.pos + 1);
    cx.at_line(f.line);
    if (n_tok > max_raw_prompt_tokens)
      cx.bad("token_pos", "prompt longer than max_raw_prompt_tokens (65536)");
    const std::size_t first = trace.token_count();
    for (std::uint64_t t = 0; t < n_tok; ++t)
      trace.append_token(f.prefill ? Phase::prefill : Phase::decode);
    for (const auto& r : f.recs) trace.set_route(first + r.pos, r.layer, r.ids, r.w);
  }
  return trace;
}

/// File versions of the two importers.
[[nodiscard]] inline RoutingTrace read_mixtral_decode_jsonl(const std::string& path,
                                                            TraceDims dims = mixtral_trace_dims) {
  return parse_mixtral_decode_jsonl(detail::read_file_text(path), path, dims);
}
[[nodiscard]] inline RoutingTrace read_mixtral_raw_jsonl(const std::string& path,
                                                         TraceDims dims = mixtral_trace_dims) {
  return parse_mixtral_raw_jsonl(detail::read_file_text(path), path, dims);
}

}  // namespace moekit::sim
