#pragma once
/// \file Writers for replay results: a JSON object per ReplayReport and CSV tables (plots:
/// tools/svg_plot.hpp).

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/sim/replay.hpp"

namespace moekit::sim {

/// Every metric of `r` as a JSON object (field names are the CSV column names too).
[[nodiscard]] inline nlohmann::json report_json(const ReplayReport& r) {
  nlohmann::json pred = nlohmann::json::array();
  for (std::size_t d = 1; d < r.pipeline.prediction.size(); ++d) {
    const PredictionStats& p = r.pipeline.prediction[d];
    pred.push_back({{"distance", d},
                    {"precision", p.precision()},
                    {"recall", p.recall()},
                    {"true_positive", p.true_positive},
                    {"false_positive", p.false_positive},
                    {"false_negative", p.false_negative}});
  }
  return {{"trace", r.trace_name},
          {"synthetic", r.synthetic},
          {"sequences", r.sequences},
          {"prefill_tokens", r.prefill_tokens},
          {"decode_tokens", r.decode_tokens},
          {"records_missing", r.records_missing},
          {"layer_calls_unrouted", r.layer_calls_unrouted},
          {"demands", r.pipeline.demands},
          {"hits", r.pipeline.hits},
          {"misses", r.pipeline.misses},
          {"hit_rate", r.hit_rate()},
          {"miss_penalty", r.miss_penalty()},
          {"skipped", r.pipeline.skipped},
          {"host_cpu_runs", r.pipeline.host_cpu_runs},
          {"fallbacks", r.pipeline.fallbacks},
          {"bytes_moved", r.bytes_moved()},
          {"bytes_demand", r.loader.demand_bytes},
          {"bytes_prefetch", r.loader.prefetch_bytes},
          {"wasted_bytes", r.wasted_bytes()},
          {"late_bytes", r.late_bytes()},
          {"prefetches_issued", r.pipeline.prefetches_issued},
          {"prefetches_cancelled", r.pipeline.prefetches_cancelled},
          {"prefetches_redundant", r.pipeline.prefetches_redundant},
          {"prefetches_dropped", r.pipeline.prefetches_dropped},
          {"prefetches_unused", r.pipeline.prefetches_unused},
          {"late_prefetches", r.pipeline.late_prefetches},
          {"prediction", pred},
          {"total_s", r.total_s},
          {"stall_s", r.stall_s},
          {"compute_s", r.compute_s},
          {"decode_tokens_per_s", r.decode_tokens_per_s()},
          {"decode_bytes", r.decode_bytes},
          {"decode_stall_s", r.decode_stall_s},
          {"prefill_latency_s", r.prefill_latency_s()}};
}

/// A CSV table built row by row; fields are quoted when they need it (RFC 4180).
class CsvTable {
 public:
  explicit CsvTable(std::vector<std::string> header) : cols_(header.size()) {
    MOEKIT_EXPECTS(!header.empty(), "CsvTable: header must not be empty");
    add_row(header);
  }
  /// Appends a row; it must have as many fields as the header.
  void add_row(const std::vector<std::string>& fields) {
    MOEKIT_EXPECTS(fields.size() == cols_, "CsvTable: row has " + std::to_string(fields.size()) +
                                               " fields, header has " + std::to_string(cols_));
    for (std::size_t i = 0; i < fields.size(); ++i) {
      if (i) text_ += ',';
      text_ += quote(fields[i]);
    }
    text_ += '\n';
  }
  [[nodiscard]] const std::string& text() const noexcept { return text_; }
  /// Formats a number for a field (shortest form that reads back to the same double).
  [[nodiscard]] static std::string num(double v) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  }

 private:
  static std::string quote(const std::string& f) {
    if (f.find_first_of(",\"\n\r") == std::string::npos) return f;
    std::string q = "\"";
    for (char c : f) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }
  std::size_t cols_;
  std::string text_;
};

}  // namespace moekit::sim
