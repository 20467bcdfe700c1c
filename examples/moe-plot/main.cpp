// moe-plot: writes moekit's line plot (tools/svg_plot.hpp) as SVG, and a PNG beside it when an
// SVG converter is installed, from a JSON description:
//
//   {"title": "...", "x_label": "...", "y_label": "...", "log_y": false, "x_ticks": [1, 2],
//    "series": [{"name": "baseline", "family": "baseline", "reference": false,
//                "x": [1, 2], "y": [3.5, 4.25]}, ...]}
//
//   moe-plot --spec plot.json --out plot.svg [--force]
//
// Used by scripts/quality.sh and bench/scale/run.sh, so their plots look like moe-sim's.

#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/tools/svg_plot.hpp"

namespace {

using moekit::tools::PlotSeries;
using moekit::tools::PlotSpec;

[[noreturn]] void bad_spec(const std::string& path, const std::string& why) {
  throw moekit::Error(moekit::ErrorKind::invalid_argument, "--spec '" + path + "': " + why);
}

PlotSeries series_of(const nlohmann::json& j, const std::string& path, std::size_t i) {
  const std::string where = "series[" + std::to_string(i) + "]";
  if (!j.is_object() || !j.contains("name") || !j.contains("x") || !j.contains("y"))
    bad_spec(path, where + " needs \"name\", \"x\" and \"y\"");
  PlotSeries s;
  s.name = j.at("name").get<std::string>();
  s.family = j.value("family", std::string());
  s.reference = j.value("reference", false);
  for (const char* axis : {"x", "y"}) {
    const nlohmann::json& a = j.at(axis);
    if (!a.is_array()) bad_spec(path, where + "." + axis + " is not an array");
    for (const nlohmann::json& v : a)  // null: a missing value (not drawn)
      (axis[0] == 'x' ? s.x : s.y).push_back(v.is_null() ? NAN : v.get<double>());
  }
  if (s.x.size() != s.y.size()) bad_spec(path, where + " has x and y of different lengths");
  return s;
}

int run(const std::string& spec_path, const std::string& out, bool force) {
  std::ifstream in(spec_path);
  if (!in) bad_spec(spec_path, "cannot be read");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
    PlotSpec spec;
    spec.title = j.value("title", std::string());
    spec.x_label = j.value("x_label", std::string());
    spec.y_label = j.value("y_label", std::string());
    spec.log_y = j.value("log_y", false);
    spec.x_ticks = j.value("x_ticks", std::vector<double>{});
    if (!j.contains("series") || !j["series"].is_array())
      bad_spec(spec_path, "no \"series\" array");
    std::vector<PlotSeries> series;
    for (std::size_t i = 0; i < j["series"].size(); ++i)
      series.push_back(series_of(j["series"][i], spec_path, i));
    const moekit::tools::PlotFiles f = moekit::tools::write_plot(out, spec, series, force);
    for (const std::string& w : f.written) std::printf("wrote %s\n", w.c_str());
    if (!f.note.empty()) std::printf("note: %s\n", f.note.c_str());
  } catch (const nlohmann::json::exception& e) {
    bad_spec(spec_path, e.what());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("moe-plot: moekit's line plot (SVG, and PNG when a converter is installed)");
  std::string spec, out;
  bool force = false;
  app.add_option("--spec", spec, "JSON description of the plot (see the source's header)")
      ->required();
  app.add_option("--out", out, "SVG file to write (the PNG goes beside it)")->required();
  app.add_flag("--force", force, "overwrite existing files");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run(spec, out, force);
  } catch (const moekit::Error& e) {
    std::fprintf(stderr, "moe-plot: %s\n", e.message().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-plot: %s\n", e.what());
    return 2;
  }
}
