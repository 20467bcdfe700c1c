// docs/presets.md against the registry (issue 22, "Done when" and "Claims"): a section per
// registered preset with a table of what the paper describes and what moekit runs; every paper
// preset's defaults marked paper / authors' code / moekit; what moekit does not run written
// **not done**; and no page saying a preset is "its paper's whole mechanism" or that the
// `Config` defaults are "the papers' parameters" (what README, docs/simulator.md, presets.hpp and
// the simulator's preset table said before).
#include <catch2/catch.hpp>

#include <cctype>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/presets.hpp"

namespace {

std::string source_file(const std::string& relative) {
  std::ifstream in(std::string(MOEKIT_SOURCE_DIR) + "/" + relative);
  INFO(relative);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The words of `text`, lower case, '-' dropped ("NextUseFit" and "nextuse-fit" both nextusefit).
std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out(1);
  for (const char c : text) {
    if (c == '-') continue;
    if (std::isalnum(static_cast<unsigned char>(c)))
      out.back() += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (!out.back().empty())
      out.emplace_back();
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

struct Section {
  std::string heading, body;
};

// The "## " sections of a markdown page.
std::vector<Section> sections(const std::string& md) {
  std::vector<Section> out;
  std::istringstream in(md);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0)
      out.push_back({line, ""});
    else if (!out.empty())
      out.back().body += line + "\n";
  }
  return out;
}

// The section whose heading names `preset` as a word, or nullptr.
const Section* section_of(const std::vector<Section>& all, std::string_view preset) {
  const std::string want = words(std::string(preset)).at(0);
  for (const Section& s : all)
    for (const std::string& w : words(s.heading))
      if (w == want) return &s;
  return nullptr;
}

// The paragraph of `body` that starts with `start` (up to the next blank line), or "".
std::string paragraph(const std::string& body, const std::string& start) {
  const auto at = body.find("\n" + start);
  if (at == std::string::npos) return {};
  const auto end = body.find("\n\n", at + 1);
  return body.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
}

// The table row of `body` whose first cell is `mechanism`, or "".
std::string row(const std::string& body, const std::string& mechanism) {
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("| " + mechanism + " |", 0) == 0) return line;
  return {};
}

}  // namespace

TEST_CASE("docs/presets.md: one table per registered preset, paper beside moekit (issue 22)",
          "[preset][docs]") {
  const std::vector<Section> all = sections(source_file("docs/presets.md"));
  for (const moekit::presets::PresetEntry& e : moekit::presets::entries) {
    INFO(e.name);
    const Section* s = section_of(all, e.name);
    REQUIRE(s != nullptr);
    // The table's header: what the paper describes, then what moekit runs (and its stand-in).
    CHECK_THAT(s->body, Catch::Contains("| paper | moekit"));
  }
}

TEST_CASE("docs/presets.md: each paper preset's defaults are marked by their source (issue 22)",
          "[preset][docs]") {
  const std::vector<Section> all = sections(source_file("docs/presets.md"));
  for (const char* name : {"hobbit", "fate", "edgemoe", "mobile", "fiddler"}) {
    INFO(name);
    const Section* s = section_of(all, name);
    REQUIRE(s != nullptr);
    const std::string defaults = paragraph(s->body, "Defaults:");
    REQUIRE_FALSE(defaults.empty());
    // Each default says whether the paper, the authors' code or moekit chose it; HOBBIT's score
    // weights and the pool split are moekit's, Fiddler's 7 ms / 70 ms the authors' code's.
    CHECK_THAT(defaults, Catch::Contains("**paper**") || Catch::Contains("**moekit**") ||
                             Catch::Contains("**authors' code**"));
  }
  CHECK_THAT(paragraph(section_of(all, "hobbit")->body, "Defaults:"),
             Catch::Contains("0.25 each (**moekit**"));
  CHECK_THAT(paragraph(section_of(all, "fiddler")->body, "Defaults:"),
             Catch::Contains("70 ms") && Catch::Contains("**authors' code**"));
  // What moekit does not run is written so: EdgeMoE's non-expert format search.
  CHECK_THAT(row(section_of(all, "edgemoe")->body, "non-expert format"),
             Catch::Contains("**not done**"));
  // MoBiLE's router replay in moe-sim is a stated stand-in, not the trace's own (perfect) routing.
  CHECK_THAT(row(section_of(all, "mobile")->body, "plan prefetch"),
             Catch::Contains("`--replay-accuracy` 0.8"));
}

TEST_CASE("No page claims a preset is its paper's whole mechanism (issue 22, claims)",
          "[preset][docs]") {
  for (const char* file : {"README.md", "docs/simulator.md", "docs/presets.md", "docs/engine.md",
                           "include/moekit/presets.hpp", "include/moekit/sim/preset_runs.hpp",
                           "examples/moe-sim/main.cpp"}) {
    INFO(file);
    const std::string text = source_file(file);
    // The phrasings of before (simulator.md and moe-sim's preset table; presets.hpp; README).
    for (const char* claim :
         {"whole mechanism where the trace allows", "whole mechanism from `presets.hpp`",
          "the papers' parameters", "with the paper's value as its default"})
      CHECK_THAT(text, !Catch::Contains(claim, Catch::CaseSensitive::No));
  }
  // --bitwidth-table is a text file: every page that names it says so where it is described.
  CHECK_THAT(row(source_file("docs/engine.md"), "`--bitwidth-table FILE`"),
             Catch::Contains("not JSON"));
  CHECK_THAT(source_file("docs/presets.md"), Catch::Contains("**text, not JSON**"));
}
