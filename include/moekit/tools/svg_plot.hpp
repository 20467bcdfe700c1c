#pragma once
/// \file moekit's one plotting component: a line plot written as SVG with no plotting library
/// (moe-sim's sweeps, moe-plot for the quality harness and the scale benchmark), and a PNG beside
/// it when an SVG converter is installed.
///
/// Axes get "nice" ticks (steps of 1, 2 or 5 times a power of ten, labels with the fewest
/// decimals the step needs and k/M/G/T beyond 10^4) or the caller's own x values (a sweep's);
/// a log y axis has its decades as ticks. Each series family (a policy and its reference) has one
/// colour; references are dashed with hollow markers, so no two series of a plot look alike
/// (up to `plot_palette.size()` families, three series of each kind per family). Titles and
/// legend names are shortened to what fits.

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moekit/error.hpp"
#include "moekit/io/output_file.hpp"

extern char** environ;

namespace moekit::tools {

/// One line of a plot.
struct PlotSeries {
  std::string name;
  std::vector<double> x, y;
  std::string family;      ///< series of one family share a colour ("" = its own name)
  bool reference = false;  ///< a reference line (e.g. Belady's optimum): dashed, hollow markers
};

/// What a plot shows besides its series.
struct PlotSpec {
  std::string title, x_label, y_label;
  bool log_y = false;  ///< y on a log scale (values <= 0 are left out, and the plot says so)
  /// x ticks at these values (e.g. a sweep's own values) instead of nice ticks; ignored when
  /// more than `max_explicit_x_ticks` are given.
  std::vector<double> x_ticks;
};

/// Ticks of an axis: their values and the step between them (0 for a log axis).
struct Ticks {
  std::vector<double> values;
  double step = 0;
};

inline constexpr std::size_t max_explicit_x_ticks = 12;
/// Most characters of a title (15 px font over the 760 px plot) and of a legend entry.
inline constexpr std::size_t max_title_chars = 84, max_legend_chars = 20;
inline constexpr std::array<std::string_view, 10> plot_palette = {
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"};
/// The colour of a family made only of references (Belady's optimum) when it is the only one.
inline constexpr std::string_view reference_colour = "#222222";
inline constexpr std::array<std::string_view, 3> line_dashes = {"", "2,3", "1,5"};
inline constexpr std::array<std::string_view, 3> reference_dashes = {"7,4", "12,4,2,4", "3,6"};

/// Ticks covering [lo, hi] at a step of 1, 2 or 5 times a power of ten: the smallest such step
/// that needs at most `max_ticks` ticks, from the multiple of the step at or below `lo` to the
/// one at or above `hi`.
[[nodiscard]] inline Ticks nice_ticks(double lo, double hi, std::size_t max_ticks = 6) {
  MOEKIT_EXPECTS(std::isfinite(lo) && std::isfinite(hi) && lo <= hi,
                 "nice_ticks: the range must be finite and ordered");
  MOEKIT_EXPECTS(max_ticks >= 2, "nice_ticks: at least two ticks");
  if (hi == lo) {  // one value: a unit around it
    const double half = lo == 0 ? 1.0 : std::pow(10.0, std::floor(std::log10(std::abs(lo))));
    lo -= half, hi += half;
  }
  const double smallest = (hi - lo) / double(max_ticks - 1);
  double decade = std::pow(10.0, std::floor(std::log10(smallest)));
  for (;; decade *= 10)
    for (const double m : {1.0, 2.0, 5.0}) {
      const double step = m * decade;
      const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
      if (last - first + 1 > double(max_ticks)) continue;
      Ticks t;
      t.step = step;
      for (double i = first; i <= last; ++i) t.values.push_back(i * step);
      return t;
    }
}

/// Ticks of a log axis over [lo, hi] (both > 0): powers of ten from the one at or below `lo` to
/// the one at or above `hi` (every second, third... when that is more than 8); over two decades or
/// fewer, 1, 2 and 5 times them, from the last at or below `lo` to the first at or above `hi`.
[[nodiscard]] inline Ticks log_ticks(double lo, double hi) {
  MOEKIT_EXPECTS(lo > 0 && hi >= lo && std::isfinite(hi), "log_ticks: needs 0 < lo <= hi");
  const int first = int(std::floor(std::log10(lo) + 1e-9));
  int last = int(std::ceil(std::log10(hi) - 1e-9));
  if (last == first) ++last;
  Ticks t;
  const bool fine = last - first <= 2;
  const int stride = (last - first + 6) / 7;  // at most 8 decades labelled: every stride-th
  last = first + (last - first + stride - 1) / stride * stride;
  for (int e = first; e <= last; e += stride) {
    const double d = std::pow(10.0, e);
    t.values.push_back(d);
    if (fine && e < last) t.values.push_back(2 * d), t.values.push_back(5 * d);
  }
  if (fine) {  // trim to the values around [lo, hi]
    const double tol = 1e-9;
    while (t.values.size() > 2 && t.values[1] <= lo * (1 + tol)) t.values.erase(t.values.begin());
    while (t.values.size() > 2 && t.values[t.values.size() - 2] >= hi * (1 - tol))
      t.values.pop_back();
  }
  return t;
}

namespace detail {

/// The power of 1000 labels use (k, M, G, T): none below 10^4, so 5000 stays "5000".
inline int thousands_power(double largest) {
  if (!(largest >= 1e4)) return 0;
  return std::min(4, int(std::floor(std::log10(largest) / 3 + 1e-9)));
}

inline std::string with_suffix(double v, int decimals, int power) {
  static constexpr const char* suffix[] = {"", "k", "M", "G", "T"};
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", std::max(0, decimals), v / std::pow(1000.0, power));
  std::string s = buf;
  if (s.find_first_not_of("-0.") == std::string::npos) return "0";  // not "-0.0", "0k"
  return s + suffix[power];
}

}  // namespace detail

/// A tick's label: the fewest decimals `step` needs (k/M/G/T from 10^4 on, `largest` deciding
/// which); `step` 0 (a log axis or explicit ticks): three significant digits.
[[nodiscard]] inline std::string tick_label(double v, double step, double largest) {
  const int power = detail::thousands_power(std::abs(largest));
  const double scale = std::pow(1000.0, power);
  if (step > 0)
    return detail::with_suffix(v, int(std::ceil(-std::log10(step / scale) - 1e-9)), power);
  if (v == 0) return "0";
  if (std::abs(v) < 1e-3) {  // 1e-09 -> 1e-9
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", v);
    std::string e = buf;
    const std::size_t at = e.find("e-");
    if (at != std::string::npos)
      while (at + 2 < e.size() - 1 && e[at + 2] == '0') e.erase(at + 2, 1);
    return e;
  }
  const int digits = int(std::floor(std::log10(std::abs(v) / scale) + 1e-9));
  std::string s = detail::with_suffix(v, std::max(0, 2 - digits), power);
  if (s.find('.') != std::string::npos) {  // 2.50 -> 2.5, 3.00 -> 3
    const std::size_t end = s.find_first_not_of("0123456789.-");
    std::string num = s.substr(0, end), suf = end == std::string::npos ? "" : s.substr(end);
    num.erase(num.find_last_not_of('0') + 1);
    if (num.back() == '.') num.pop_back();
    s = num + suf;
  }
  return s;
}

/// `text` shortened to at most `max_chars` characters (UTF-8 code points), ending in "…" when cut.
[[nodiscard]] inline std::string shorten(std::string_view text, std::size_t max_chars) {
  auto starts_char = [](char c) { return (static_cast<unsigned char>(c) & 0xc0) != 0x80; };
  if (std::size_t(std::count_if(text.begin(), text.end(), starts_char)) <= max_chars)
    return std::string(text);
  std::size_t at = 0;  // the byte where character max_chars - 1 (from 0) starts
  for (std::size_t chars = 0; at < text.size(); ++at)
    if (starts_char(text[at]) && chars++ == max_chars - 1) break;
  return std::string(text.substr(0, at)) + "\xe2\x80\xa6";
}

/// How a series is drawn.
struct SeriesStyle {
  std::string_view colour, dash;  ///< dash "" = solid
  bool hollow = false;            ///< hollow markers (references)
};

/// Each series' style: its family's colour (in order of first appearance; a plot's only
/// all-reference family is near-black), solid for lines and dashed for references, the next
/// pattern of its kind for a family's second and third series of a kind.
[[nodiscard]] inline std::vector<SeriesStyle> series_styles(const std::vector<PlotSeries>& series) {
  std::vector<std::string> families;
  std::vector<bool> has_line;
  std::vector<std::size_t> family_of;
  for (const PlotSeries& s : series) {
    const std::string f = s.family.empty() ? s.name : s.family;
    auto it = std::find(families.begin(), families.end(), f);
    if (it == families.end()) families.push_back(f), has_line.push_back(false);
    const auto i = std::size_t(std::find(families.begin(), families.end(), f) - families.begin());
    if (!s.reference) has_line[i] = true;
    family_of.push_back(i);
  }
  const auto only_refs = std::count(has_line.begin(), has_line.end(), false);
  std::vector<std::string_view> colour(families.size());
  for (std::size_t f = 0, next = 0; f < families.size(); ++f)
    colour[f] = only_refs == 1 && !has_line[f] ? reference_colour
                                               : plot_palette[next++ % plot_palette.size()];
  std::vector<SeriesStyle> out;
  std::vector<std::array<std::size_t, 2>> used(families.size(), {0, 0});
  for (std::size_t i = 0; i < series.size(); ++i) {
    const std::size_t f = family_of[i], kind = series[i].reference ? 1 : 0;
    const std::size_t n = used[f][kind]++;
    out.push_back(
        {colour[f],
         kind ? reference_dashes[n % reference_dashes.size()] : line_dashes[n % line_dashes.size()],
         kind == 1});
  }
  return out;
}

namespace detail {

inline std::string xml_escape(std::string_view s) {
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
}

/// A coordinate with one decimal.
inline std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

/// An axis: its data range, ticks and their labels, and where it lies on the page.
struct PlotAxis {
  double lo = 0, hi = 1;
  bool log = false;
  std::vector<double> ticks;
  std::vector<std::string> labels;
  double from = 0, to = 1;  ///< page coordinates of lo and hi
  [[nodiscard]] double at(double v) const {
    const double f = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo))
                         : (v - lo) / (hi - lo);
    return from + f * (to - from);
  }
};

/// Whether point j of `s` is drawn on these axes.
inline bool drawn(const PlotSeries& s, std::size_t j, bool log_y) {
  return std::isfinite(s.x[j]) && std::isfinite(s.y[j]) && (!log_y || s.y[j] > 0);
}

inline PlotAxis x_axis_of(const std::vector<PlotSeries>& series, const PlotSpec& spec) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const PlotSeries& s : series)
    for (std::size_t j = 0; j < s.x.size(); ++j)
      if (drawn(s, j, spec.log_y)) lo = std::min(lo, s.x[j]), hi = std::max(hi, s.x[j]);
  PlotAxis a;
  std::vector<double> given;
  for (double v : spec.x_ticks)
    if (std::isfinite(v)) given.push_back(v);
  if (!given.empty() && given.size() <= max_explicit_x_ticks) {
    for (double v : given) lo = std::min(lo, v), hi = std::max(hi, v);
    const double pad = hi > lo ? (hi - lo) * 0.04 : std::max(1.0, std::abs(lo) * 0.1);
    a.lo = lo - pad, a.hi = hi + pad, a.ticks = given;
    for (double v : given) a.labels.push_back(tick_label(v, 0, hi));
    return a;
  }
  if (!(hi >= lo)) lo = 0, hi = 1;
  const Ticks t = nice_ticks(lo, hi, 7);
  a.lo = t.values.front(), a.hi = t.values.back(), a.ticks = t.values;
  for (double v : t.values) a.labels.push_back(tick_label(v, t.step, a.hi));
  return a;
}

inline PlotAxis y_axis_of(const std::vector<PlotSeries>& series, bool log_y) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const PlotSeries& s : series)
    for (std::size_t j = 0; j < s.y.size(); ++j)
      if (drawn(s, j, log_y)) lo = std::min(lo, s.y[j]), hi = std::max(hi, s.y[j]);
  PlotAxis a;
  a.log = log_y;
  if (!(hi >= lo)) lo = log_y ? 1 : 0, hi = log_y ? 10 : 1;
  const Ticks t = log_y ? log_ticks(lo, hi) : nice_ticks(std::min(lo, 0.0), hi, 7);
  a.lo = t.values.front(), a.hi = t.values.back(), a.ticks = t.values;
  for (double v : t.values) a.labels.push_back(tick_label(v, t.step, a.hi));
  return a;
}

/// Page layout: 760 x 460, the legend on the right.
struct PlotFrame {
  double width = 760, height = 460, left = 72, right = 196, top = 48, bottom = 58;
  [[nodiscard]] double plot_width() const { return width - left - right; }
  [[nodiscard]] double plot_height() const { return height - top - bottom; }
};

inline void write_axes(std::ostream& o, const PlotFrame& f, const PlotAxis& x, const PlotAxis& y,
                       const PlotSpec& spec) {
  const double bottom = f.top + f.plot_height(), right = f.left + f.plot_width();
  double last_label_end = -1e9;  // x labels that would overlap the previous one are left out
  for (std::size_t i = 0; i < x.ticks.size(); ++i) {
    const double at = x.at(x.ticks[i]), half = 3.6 * double(x.labels[i].size());
    o << "<line x1=\"" << px(at) << "\" y1=\"" << px(f.top) << "\" x2=\"" << px(at) << "\" y2=\""
      << px(bottom + 5) << "\" stroke=\"#e4e4e4\"/>\n";
    if (at - half < last_label_end + 6) continue;
    last_label_end = at + half;
    o << "<text x=\"" << px(at) << "\" y=\"" << px(bottom + 19) << "\" text-anchor=\"middle\">"
      << xml_escape(x.labels[i]) << "</text>\n";
  }
  for (std::size_t i = 0; i < y.ticks.size(); ++i) {
    const double at = y.at(y.ticks[i]);
    o << "<line x1=\"" << px(f.left - 5) << "\" y1=\"" << px(at) << "\" x2=\"" << px(right)
      << "\" y2=\"" << px(at) << "\" stroke=\"#e4e4e4\"/>\n"
      << "<text x=\"" << px(f.left - 8) << "\" y=\"" << px(at + 4) << "\" text-anchor=\"end\">"
      << xml_escape(y.labels[i]) << "</text>\n";
  }
  o << "<rect x=\"" << px(f.left) << "\" y=\"" << px(f.top) << "\" width=\"" << px(f.plot_width())
    << "\" height=\"" << px(f.plot_height()) << "\" fill=\"none\" stroke=\"black\"/>\n"
    << "<text x=\"" << px(f.left + f.plot_width() / 2) << "\" y=\"" << px(f.height - 16)
    << "\" text-anchor=\"middle\">" << xml_escape(shorten(spec.x_label, 80)) << "</text>\n"
    << "<text transform=\"translate(16," << px(f.top + f.plot_height() / 2)
    << ") rotate(-90)\" text-anchor=\"middle\">"
    << xml_escape(shorten(spec.y_label, 60) + (spec.log_y ? " (log scale)" : "")) << "</text>\n";
}

inline std::string dash_attr(const SeriesStyle& st) {
  return st.dash.empty() ? "" : " stroke-dasharray=\"" + std::string(st.dash) + "\"";
}

inline void write_marker(std::ostream& o, double x, double y, const SeriesStyle& st) {
  o << "<circle cx=\"" << px(x) << "\" cy=\"" << px(y) << "\" r=\"3.2\" fill=\""
    << (st.hollow ? std::string("white") : std::string(st.colour)) << "\" stroke=\"" << st.colour
    << "\" stroke-width=\"1.5\"/>";
}

/// The series' lines and markers, then the legend; returns the number of points left out.
inline std::size_t write_series(std::ostream& o, const PlotFrame& f, const PlotAxis& x,
                                const PlotAxis& y, const std::vector<PlotSeries>& series) {
  const std::vector<SeriesStyle> styles = series_styles(series);
  std::size_t left_out = 0;
  for (std::size_t i = 0; i < series.size(); ++i) {
    const PlotSeries& s = series[i];
    const SeriesStyle& st = styles[i];
    o << "<polyline fill=\"none\" stroke=\"" << st.colour << "\" stroke-width=\"2\""
      << dash_attr(st) << " points=\"";
    for (std::size_t j = 0; j < s.x.size(); ++j)
      if (drawn(s, j, y.log)) o << px(x.at(s.x[j])) << "," << px(y.at(s.y[j])) << " ";
    o << "\"/>\n";
    for (std::size_t j = 0; j < s.x.size(); ++j)
      if (drawn(s, j, y.log))
        write_marker(o, x.at(s.x[j]), y.at(s.y[j]), st);
      else
        ++left_out;
    const double lx = f.left + f.plot_width() + 12, ly = f.top + 10 + 20.0 * double(i);
    o << "\n<line x1=\"" << px(lx) << "\" y1=\"" << px(ly) << "\" x2=\"" << px(lx + 30)
      << "\" y2=\"" << px(ly) << "\" stroke=\"" << st.colour << "\" stroke-width=\"2\""
      << dash_attr(st) << "/>";
    write_marker(o, lx + 15, ly, st);
    o << "<text x=\"" << px(lx + 36) << "\" y=\"" << px(ly + 4) << "\">"
      << xml_escape(shorten(s.name, max_legend_chars)) << "</text>\n";
  }
  return left_out;
}

}  // namespace detail

/// The plot as an SVG document. Throws `Error(invalid_argument)` naming a series whose x and y
/// differ in length.
[[nodiscard]] inline std::string svg_line_plot(const PlotSpec& spec,
                                               const std::vector<PlotSeries>& series) {
  for (const PlotSeries& s : series)
    MOEKIT_EXPECTS(s.x.size() == s.y.size(), "svg_line_plot: series '" + s.name +
                                                 "' has different numbers of x and y values");
  const detail::PlotFrame f;
  detail::PlotAxis x = detail::x_axis_of(series, spec), y = detail::y_axis_of(series, spec.log_y);
  x.from = f.left, x.to = f.left + f.plot_width();
  y.from = f.top + f.plot_height(), y.to = f.top;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << f.width << "\" height=\"" << f.height
    << "\" viewBox=\"0 0 " << f.width << " " << f.height
    << "\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << f.width / 2 << "\" y=\"26\" text-anchor=\"middle\" font-size=\"15\">"
    << detail::xml_escape(shorten(spec.title, max_title_chars)) << "</text>\n";
  detail::write_axes(o, f, x, y, spec);
  const std::size_t left_out = detail::write_series(o, f, x, y, series);
  if (left_out > 0)
    o << "<text x=\"" << detail::px(f.left + f.plot_width() + 12) << "\" y=\""
      << detail::px(f.height - 16) << "\" font-size=\"10\">"
      << detail::xml_escape(std::to_string(left_out) + (left_out == 1 ? " point" : " points") +
                            (spec.log_y ? " <= 0 not shown" : " not finite, not shown"))
      << "</text>\n";
  o << "</svg>\n";
  return o.str();
}

/// What `write_plot` wrote, and why a PNG is missing when it is.
struct PlotFiles {
  std::vector<std::string> written;
  std::string note;  ///< empty when the PNG was made
};

namespace detail {

/// Runs `argv` (searched on PATH, no shell) with its output discarded; its exit status, or -1
/// when it could not be started.
inline int run_quietly(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace detail

/// The PNG of the SVG file `svg` as `png`, made by rsvg-convert (Debian: librsvg2-bin), else
/// ImageMagick (`magick`, `convert`); nullopt when none is installed or none succeeded, else the
/// converter's name. The PNG goes through a temporary file and replaces `png` only with
/// `overwrite`.
[[nodiscard]] inline std::optional<std::string> svg_to_png(const std::filesystem::path& svg,
                                                           const std::filesystem::path& png,
                                                           bool overwrite) {
  io::check_output_path(png, overwrite, "--out");
  const std::filesystem::path tmp =
      io::detail::output_directory(png) /
      ("." + png.filename().string() + ".convert-" + std::to_string(::getpid()) + ".png");
  const std::vector<std::vector<std::string>> converters = {
      {"rsvg-convert", "--background-color=white", "-o", tmp.string(), svg.string()},
      {"magick", svg.string(), tmp.string()},
      {"convert", svg.string(), tmp.string()}};
  for (const auto& argv : converters) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    if (detail::run_quietly(argv) != 0 || !std::filesystem::is_regular_file(tmp, ec) ||
        std::filesystem::file_size(tmp, ec) == 0)
      continue;
    std::ifstream in(tmp, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::filesystem::remove(tmp, ec);
    if (bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) continue;  // not a PNG: try the next
    io::write_text_atomically(png, bytes, overwrite, "--out");
    return argv[0];
  }
  std::error_code ec;
  std::filesystem::remove(tmp, ec);
  return std::nullopt;
}

/// The PNG path beside an SVG path ("a/b.svg" -> "a/b.png").
[[nodiscard]] inline std::string png_path_of(const std::string& svg_path) {
  std::filesystem::path p(svg_path);
  return p.replace_extension(".png").string();
}

/// Writes the plot to `svg_path` (atomically; an existing file only with `overwrite`) and its PNG
/// beside it when a converter is installed (else `note` says so).
inline PlotFiles write_plot(const std::string& svg_path, const PlotSpec& spec,
                            const std::vector<PlotSeries>& series, bool overwrite) {
  PlotFiles out;
  io::write_text_atomically(svg_path, svg_line_plot(spec, series), overwrite, "--out");
  out.written.push_back(svg_path);
  const std::string png = png_path_of(svg_path);
  if (svg_to_png(svg_path, png, overwrite))
    out.written.push_back(png);
  else
    out.note = "no PNG of " + svg_path +
               ": no SVG converter (rsvg-convert from librsvg2-bin, or ImageMagick) is installed "
               "or none converted it";
  return out;
}

}  // namespace moekit::tools
