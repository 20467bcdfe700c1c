#pragma once
/// \file Writers for replay results: a JSON object per ReplayReport, CSV tables, a small SVG line
/// plot (no plotting library needed), and a progress bar for long sweeps.

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
          {"prediction", pred},
          {"total_s", r.total_s},
          {"stall_s", r.stall_s},
          {"compute_s", r.compute_s},
          {"decode_tokens_per_s", r.decode_tokens_per_s()},
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

/// One line of a plot.
struct PlotSeries {
  std::string name;
  std::vector<double> x, y;
  bool dashed = false;  ///< e.g. the Belady reference
};

/// A minimal SVG line plot: linear axes with ticks, one polyline per series, a legend.
[[nodiscard]] inline std::string svg_line_plot(const std::string& title, const std::string& x_label,
                                               const std::string& y_label,
                                               const std::vector<PlotSeries>& series) {
  auto esc = [](const std::string& s) {
    std::string o;
    for (char c : s) {
      if (c == '<')
        o += "&lt;";
      else if (c == '>')
        o += "&gt;";
      else if (c == '&')
        o += "&amp;";
      else if (c == '"')
        o += "&quot;";
      else
        o += c;
    }
    return o;
  };
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = 0.0, y1 = -x0;
  for (const PlotSeries& s : series) {
    MOEKIT_EXPECTS(s.x.size() == s.y.size(), "svg_line_plot: series '" + s.name +
                                                 "' has different numbers of x and y values");
    for (double v : s.x)
      if (std::isfinite(v)) x0 = std::min(x0, v), x1 = std::max(x1, v);
    for (double v : s.y)
      if (std::isfinite(v)) y0 = std::min(y0, v), y1 = std::max(y1, v);
  }
  if (!(x1 >= x0)) x0 = 0, x1 = 1;
  if (x1 == x0) x0 -= 0.5, x1 += 0.5;
  if (!(y1 > y0)) y1 = y0 + 1;
  y1 += (y1 - y0) * 0.05;
  const double W = 720, H = 440, L = 80, R = 200, T = 40, B = 60;
  const double pw = W - L - R, ph = H - T - B;
  auto px = [&](double v) { return L + (v - x0) / (x1 - x0) * pw; };
  auto py = [&](double v) { return T + ph - (v - y0) / (y1 - y0) * ph; };
  static constexpr const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                           "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  std::ostringstream o;
  o.precision(6);
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << L + pw / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">"
    << esc(title) << "</text>\n"
    << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"black\"/>\n";
  for (int i = 0; i <= 5; ++i) {
    const double xv = x0 + (x1 - x0) * i / 5, yv = y0 + (y1 - y0) * i / 5;
    o << "<line x1=\"" << px(xv) << "\" y1=\"" << T + ph << "\" x2=\"" << px(xv) << "\" y2=\""
      << T + ph + 5 << "\" stroke=\"black\"/>"
      << "<text x=\"" << px(xv) << "\" y=\"" << T + ph + 18 << "\" text-anchor=\"middle\">" << xv
      << "</text>\n"
      << "<line x1=\"" << L - 5 << "\" y1=\"" << py(yv) << "\" x2=\"" << L + pw << "\" y2=\""
      << py(yv) << "\" stroke=\"#ddd\"/>"
      << "<text x=\"" << L - 8 << "\" y=\"" << py(yv) + 4 << "\" text-anchor=\"end\">" << yv
      << "</text>\n";
  }
  o << "<text x=\"" << L + pw / 2 << "\" y=\"" << H - 15 << "\" text-anchor=\"middle\">"
    << esc(x_label) << "</text>\n"
    << "<text transform=\"translate(18," << T + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << esc(y_label) << "</text>\n";
  for (std::size_t i = 0; i < series.size(); ++i) {
    const PlotSeries& s = series[i];
    const char* c = colors[i % std::size(colors)];
    o << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"2\""
      << (s.dashed ? " stroke-dasharray=\"6,4\"" : "") << " points=\"";
    for (std::size_t j = 0; j < s.x.size(); ++j)
      if (std::isfinite(s.x[j]) && std::isfinite(s.y[j]))
        o << px(s.x[j]) << "," << py(s.y[j]) << " ";
    o << "\"/>\n";
    for (std::size_t j = 0; j < s.x.size(); ++j)
      if (std::isfinite(s.x[j]) && std::isfinite(s.y[j]))
        o << "<circle cx=\"" << px(s.x[j]) << "\" cy=\"" << py(s.y[j]) << "\" r=\"3\" fill=\"" << c
          << "\"/>";
    const double ly = T + 14 + 20.0 * double(i);
    o << "\n<line x1=\"" << L + pw + 12 << "\" y1=\"" << ly << "\" x2=\"" << L + pw + 40
      << "\" y2=\"" << ly << "\" stroke=\"" << c << "\" stroke-width=\"2\""
      << (s.dashed ? " stroke-dasharray=\"6,4\"" : "") << "/><text x=\"" << L + pw + 46 << "\" y=\""
      << ly + 4 << "\">" << esc(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

/// A one-line progress bar redrawn in place on a terminal stream (`\r`); prints nothing when
/// `enabled` is false (e.g. stderr is not a terminal), so logs stay clean.
class ProgressBar {
 public:
  ProgressBar(std::FILE* out, std::size_t total, bool enabled)
      : out_(out), total_(total), enabled_(enabled && total > 1) {}
  ~ProgressBar() { finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// Shows `done` of `total` steps with a label (truncated to 40 characters).
  void update(std::size_t done, std::string_view label = {}) {
    if (!enabled_) return;
    constexpr int width = 30;
    const double f = total_ ? double(std::min(done, total_)) / double(total_) : 1.0;
    const int fill = static_cast<int>(f * width + 0.5);
    std::string bar(static_cast<std::size_t>(fill), '#');
    bar.resize(width, '.');
    std::fprintf(out_, "\r[%s] %zu/%zu %-40.40s", bar.c_str(), done, total_,
                 std::string(label).c_str());
    std::fflush(out_);
    drawn_ = true;
  }
  /// Ends the line (called by the destructor too).
  void finish() {
    if (drawn_) std::fputc('\n', out_), std::fflush(out_);
    drawn_ = false;
  }

 private:
  std::FILE* out_;
  std::size_t total_;
  bool enabled_;
  bool drawn_ = false;
};

}  // namespace moekit::sim
