#pragma once
/// \file The --popularity profile moe-run reads (Fiddler's expert placement): JSON
/// `[[tokens of layer 0's experts], [layer 1], ...]`, one row per MoE layer, one non-negative
/// number per expert. Kept apart from calibration.hpp (which writes such profiles) so the reader
/// builds without the engine (the fuzz target tests/fuzz/fuzz_popularity.cpp).

#include <cstddef>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/core/model_shape.hpp"
#include "moekit/error.hpp"

namespace moekit::engine {

/// Checks and decodes the text of a popularity profile (see load_popularity); `path` names it in
/// errors.
inline std::vector<double> parse_popularity(std::string_view text, const std::string& path,
                                            const moekit::ModelShape& s) {
  auto bad = [&](const std::string& why) {
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         "--popularity: '" + path + "' " + why);
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("is not JSON: ") + e.what());
  }
  if (!j.is_array() || j.size() != s.n_layers)
    bad("must be an array of " + std::to_string(s.n_layers) + " rows (one per MoE layer)");
  std::vector<double> out;
  for (std::size_t l = 0; l < j.size(); ++l) {
    if (!j[l].is_array() || j[l].size() != s.n_experts)
      bad("row " + std::to_string(l) + " must hold " + std::to_string(s.n_experts) + " numbers");
    for (const auto& v : j[l]) {
      if (!v.is_number() || v.get<double>() < 0)
        bad("row " + std::to_string(l) + " holds a value that is not a non-negative number");
      out.push_back(v.get<double>());
    }
  }
  return out;
}

/// Reads a popularity profile for a model of shape `s`. Throws naming --popularity and the file.
inline std::vector<double> load_popularity(const std::string& path, const moekit::ModelShape& s) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         "--popularity: '" + path + "' cannot be opened");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_popularity(text, path, s);
}

}  // namespace moekit::engine
