#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/tools/svg_plot.hpp"

using namespace moekit::tools;

namespace {

// The 1-2-5 step just below `step` (5 -> 2, 2 -> 1, 1 -> 0.5).
double smaller_nice_step(double step) {
  const double decade = std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  const double m = std::round(step / decade);
  return m == 1 ? decade / 2 : m == 2 ? decade : 2 * decade;
}

bool is_nice(double step) {
  const double decade = std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  const double m = step / decade;
  return std::abs(m - 1) < 1e-9 || std::abs(m - 2) < 1e-9 || std::abs(m - 5) < 1e-9;
}

std::size_t ticks_needed(double lo, double hi, double step) {
  return std::size_t(std::ceil(hi / step - 1e-9) - std::floor(lo / step + 1e-9) + 1);
}

// A small XML well-formedness check: every tag closed in order, attributes quoted, entities
// known, no stray '<' or '&' in text. Returns "" or what is wrong.
std::string xml_problem(const std::string& x) {
  std::vector<std::string> open;
  std::size_t i = 0;
  auto entity_ok = [&](std::size_t at) {
    for (const char* e : {"&lt;", "&gt;", "&amp;", "&quot;", "&apos;"})
      if (x.compare(at, std::strlen(e), e) == 0) return true;
    return false;
  };
  while (i < x.size()) {
    if (x[i] == '&' && !entity_ok(i)) return "bad entity at " + std::to_string(i);
    if (x[i] != '<') {
      if (x[i] == '>') return "stray '>' at " + std::to_string(i);
      ++i;
      continue;
    }
    const std::size_t end = x.find('>', i);
    if (end == std::string::npos) return "unterminated tag";
    std::string tag = x.substr(i + 1, end - i - 1);
    i = end + 1;
    const bool closing = !tag.empty() && tag[0] == '/';
    const bool self = !tag.empty() && tag.back() == '/';
    if (closing) tag.erase(0, 1);
    if (self) tag.pop_back();
    const std::string name = tag.substr(0, tag.find_first_of(" \n"));
    if (name.empty()) return "empty tag name";
    if (closing) {
      if (open.empty() || open.back() != name) return "</" + name + "> closes nothing open";
      open.pop_back();
      continue;
    }
    // attributes: name="value" pairs
    std::size_t a = name.size();
    while (a < tag.size()) {
      while (a < tag.size() && tag[a] == ' ') ++a;
      if (a >= tag.size()) break;
      const std::size_t eq = tag.find('=', a);
      if (eq == std::string::npos || eq + 1 >= tag.size() || tag[eq + 1] != '"')
        return "unquoted attribute in <" + name + ">";
      const std::size_t close = tag.find('"', eq + 2);
      if (close == std::string::npos) return "unterminated attribute in <" + name + ">";
      if (tag.substr(eq + 2, close - eq - 2).find('<') != std::string::npos)
        return "'<' in an attribute";
      a = close + 1;
    }
    if (!self) open.push_back(name);
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  return "";
}

std::vector<std::string> texts_of(const std::string& svg) {
  std::vector<std::string> out;
  for (std::size_t at = svg.find("<text"); at != std::string::npos;
       at = svg.find("<text", at + 1)) {
    const std::size_t from = svg.find('>', at) + 1;
    out.push_back(svg.substr(from, svg.find("</text>", from) - from));
  }
  return out;
}

std::size_t count_of(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

std::size_t code_points(const std::string& s) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

}  // namespace

TEST_CASE("svg plot: nice ticks, worked examples", "[tools][plot]") {
  // 0..22.8125 in at most 6 ticks: step 2 needs 0..24 = 13 ticks, step 5 needs 0..25 = 6.
  Ticks t = nice_ticks(0, 22.8125, 6);
  CHECK(t.step == 5);
  CHECK(t.values == std::vector<double>{0, 5, 10, 15, 20, 25});
  // 0..16566.9: step 2000 needs 0..18000 = 10 ticks, step 5000 needs 0..20000 = 5.
  t = nice_ticks(0, 16566.9, 6);
  CHECK(t.step == 5000);
  CHECK(t.values == std::vector<double>{0, 5000, 10000, 15000, 20000});
  // 0.3..0.87: step 0.1 needs 0.3..0.9 = 7 ticks, step 0.2 needs 0.2..1.0 = 5.
  t = nice_ticks(0.3, 0.87, 6);
  CHECK(t.step == Approx(0.2));
  REQUIRE(t.values.size() == 5);
  CHECK(t.values.front() == Approx(0.2));
  CHECK(t.values.back() == Approx(1.0));
  // One value: a unit of its decade around it.
  t = nice_ticks(40, 40, 6);
  CHECK(t.values.front() <= 30);
  CHECK(t.values.back() >= 50);
  CHECK_THROWS_AS(nice_ticks(2, 1), moekit::Error);
}

TEST_CASE("svg plot: nice ticks are the smallest 1-2-5 step within the count (random ranges)",
          "[tools][plot]") {
  const unsigned seed = 20261128;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> exponent(-4, 10), unit(0, 1);
  for (int i = 0; i < 2000; ++i) {
    const double scale = std::pow(10.0, exponent(rng));
    double lo = scale * (unit(rng) - 0.3), hi = lo + scale * unit(rng) + scale * 1e-3;
    const std::size_t max_ticks = 3 + std::size_t(unit(rng) * 8);
    const Ticks t = nice_ticks(lo, hi, max_ticks);
    INFO("range " << lo << ".." << hi << ", at most " << max_ticks << " ticks");
    REQUIRE(is_nice(t.step));
    CHECK(t.values.size() <= max_ticks);
    CHECK(t.values.size() >= 2);
    CHECK(t.values.front() <= lo + 1e-9 * scale);
    CHECK(t.values.back() >= hi - 1e-9 * scale);
    CHECK(ticks_needed(lo, hi, smaller_nice_step(t.step)) > max_ticks);
    for (std::size_t k = 1; k < t.values.size(); ++k)
      CHECK(t.values[k] - t.values[k - 1] == Approx(t.step));
  }
}

TEST_CASE("svg plot: log ticks are decades, with 2 and 5 over two decades or fewer",
          "[tools][plot]") {
  CHECK(log_ticks(3, 4000).values == std::vector<double>{1, 10, 100, 1000, 10000});
  // 1e-13..0.1: 12 decades, every second one labelled (stride (12 + 6) / 7 = 2): 7 ticks.
  const std::vector<double> wide = log_ticks(1e-13, 0.1).values;
  REQUIRE(wide.size() == 7);
  CHECK(wide.front() == Approx(1e-13));
  CHECK(wide[1] == Approx(1e-11));
  CHECK(wide.back() == Approx(0.1));
  // 3..40 spans two decades (1..100): 1, 2, 5, 10, 20, 50, 100 trimmed to the last at or below 3
  // (2) and the first at or above 40 (50).
  const std::vector<double> fine = log_ticks(3, 40).values;
  const std::vector<double> want = {2, 5, 10, 20, 50};
  REQUIRE(fine.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(fine[i] == Approx(want[i]));
  // 1600..2800 in one decade: 1000, 2000, 5000 (10000 and the rest beyond).
  const std::vector<double> narrow = log_ticks(1600, 2800).values;
  REQUIRE(narrow.size() == 3);
  CHECK(narrow[0] == Approx(1000));
  CHECK(narrow[2] == Approx(5000));
  CHECK_THROWS_AS(log_ticks(0, 1), moekit::Error);
}

TEST_CASE("svg plot: tick labels are round", "[tools][plot]") {
  CHECK(tick_label(15, 5, 25) == "15");
  CHECK(tick_label(0.4, 0.2, 1) == "0.4");       // one decimal for a step of 0.2
  CHECK(tick_label(0.25, 0.05, 0.5) == "0.25");  // two for 0.05
  CHECK(tick_label(5000, 5000, 20000) == "5k");  // 10^4 and above: k
  CHECK(tick_label(2.5e10, 5e9, 3e10) == "25G");
  CHECK(tick_label(2000, 1000, 5000) == "2000");  // below 10^4: plain
  CHECK(tick_label(9.765625, 0, 50) == "9.77");   // explicit ticks: three significant digits
  CHECK(tick_label(50, 0, 50) == "50");
  CHECK(tick_label(1.6e10, 0, 3.2e10) == "16G");
  CHECK(tick_label(0.125, 0, 1) == "0.125");
  CHECK(tick_label(0, 0, 1) == "0");
  CHECK(tick_label(1e-9, 0, 1) == "1e-9");  // log axes of small values: exponents
  CHECK(tick_label(2e-5, 0, 1) == "2e-5");
  CHECK(tick_label(0, 2000, 10000) == "0");   // not "0k"
  CHECK(tick_label(-0.0001, 0.5, 1) == "0");  // no "-0.0"
}

TEST_CASE("svg plot: each family its colour, references dashed, no two series alike",
          "[tools][plot]") {
  std::vector<PlotSeries> s;
  for (const char* p : {"baseline", "hobbit", "fate", "edgemoe", "mobile", "fiddler", "nextuse"})
    s.push_back({p, {}, {}, p, false});
  s.push_back({"belady", {}, {}, "belady", true});
  for (const char* p : {"hobbit", "fate", "edgemoe"})
    s.push_back({std::string("belady-") + p, {}, {}, p, true});
  s.push_back({"hobbit-variant", {}, {}, "hobbit", false});  // a second line of a family
  const std::vector<SeriesStyle> st = series_styles(s);
  REQUIRE(st.size() == s.size());
  std::set<std::pair<std::string, std::string>> looks;
  for (std::size_t i = 0; i < s.size(); ++i) {
    INFO(s[i].name);
    CHECK(looks.insert({std::string(st[i].colour), std::string(st[i].dash)}).second);
    CHECK(st[i].dash.empty() == (!s[i].reference && s[i].name != "hobbit-variant"));
    CHECK(st[i].hollow == s[i].reference);
    for (std::size_t j = 0; j < s.size(); ++j)
      CHECK((st[i].colour == st[j].colour) == (s[i].family == s[j].family));
  }
  CHECK(st[7].colour == reference_colour);  // the only all-reference family (Belady)
}

TEST_CASE("svg plot: well-formed, escaped, short title, sweep values as x ticks", "[tools][plot]") {
  PlotSpec spec;
  spec.title = "miss penalty vs cache size: " + std::string(300, 'p') + "/trace <a&b>.jsonl";
  spec.x_label = "cache (% of experts)";
  spec.y_label = "penalty";
  spec.x_ticks = {9.765625, 25, 50};
  const std::vector<PlotSeries> series = {
      {"lru & \"friends\" with a very long legend name",
       {9.765625, 25, 50},
       {30, 20, 10},
       "lru",
       false},
      {"belady", {9.765625, 25, 50}, {22.8125, 12, NAN}, "belady", true}};
  const std::string svg = svg_line_plot(spec, series);
  INFO(svg);
  CHECK(xml_problem(svg).empty());
  CHECK_FALSE(xml_problem("<svg><text>a < b</text></svg>").empty());  // the check checks
  CHECK_FALSE(xml_problem("<svg><g></svg>").empty());
  CHECK(count_of(svg, "<polyline") == 2);
  CHECK(count_of(svg, "stroke-dasharray") == 2);  // Belady's line and its legend entry
  const std::vector<std::string> texts = texts_of(svg);
  REQUIRE(!texts.empty());
  CHECK(code_points(texts[0]) <= max_title_chars);  // the title, shortened
  CHECK(texts[0].find("\xe2\x80\xa6") != std::string::npos);
  for (const char* label : {"9.77", "25", "50"})
    CHECK(std::find(texts.begin(), texts.end(), label) != texts.end());
  CHECK(std::find(texts.begin(), texts.end(), "22.8125") == texts.end());
  CHECK(svg.find("lru &amp; &quot;friends&quot;") != std::string::npos);
  for (const std::string& t : texts) CHECK(code_points(t) <= max_title_chars);
  CHECK(svg.find("1 point not finite, not shown") != std::string::npos);
  CHECK_THROWS_AS(svg_line_plot(spec, {{"bad", {1, 2}, {1}, "", false}}), moekit::Error);
}

TEST_CASE("svg plot: log y leaves out values <= 0 and says so", "[tools][plot]") {
  PlotSpec spec{"t", "x", "y", true, {}};
  const std::string svg = svg_line_plot(spec, {{"a", {1, 2, 3}, {0, 10, 1000}, "", false}});
  CHECK(xml_problem(svg).empty());
  CHECK(svg.find("1 point &lt;= 0 not shown") != std::string::npos);
  CHECK(svg.find("(log scale)") != std::string::npos);
  const std::vector<std::string> texts = texts_of(svg);
  for (const char* label : {"10", "100", "1000"})
    CHECK(std::find(texts.begin(), texts.end(), label) != texts.end());
}

TEST_CASE("svg plot: written with a PNG beside it, or a note saying why not", "[tools][plot]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("moekit-plot-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string svg = (dir / "p.svg").string();
  const PlotFiles f =
      write_plot(svg, {"t", "x", "y", false, {}}, {{"a", {1, 2}, {1, 2}, "", false}}, false);
  REQUIRE(!f.written.empty());
  CHECK(f.written[0] == svg);
  const std::string png = (dir / "p.png").string();
  if (f.note.empty()) {
    REQUIRE(f.written.size() == 2);
    CHECK(f.written[1] == png);
    std::ifstream in(png, std::ios::binary);
    std::string magic(8, '\0');
    in.read(magic.data(), 8);
    CHECK(magic == "\x89PNG\r\n\x1a\n");
  } else {
    WARN(f.note);
    CHECK(f.written.size() == 1);
    CHECK_FALSE(std::filesystem::exists(png));
  }
  // An existing plot is replaced only with overwrite.
  CHECK_THROWS_AS(write_plot(svg, {"t", "x", "y", false, {}}, {}, false), moekit::Error);
  CHECK_NOTHROW(write_plot(svg, {"t", "x", "y", false, {}}, {}, true));
  for (const auto& e : std::filesystem::directory_iterator(dir))
    CHECK(e.path().filename().string().find(".convert-") == std::string::npos);  // no leftovers
  std::filesystem::remove_all(dir);
}
