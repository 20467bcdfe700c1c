#pragma once
// Helpers shared by the engine tests: fixture discovery and the reference files.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/error.hpp"

namespace engine_test {

inline std::filesystem::path data_dir() { return MOEKIT_TEST_DATA_DIR; }

/// reference.json of a fixture, with its f32 logits [n_positions × vocab].
struct Reference {
  nlohmann::json json;
  std::vector<std::uint32_t> prompt_ids, generated_ids, sequence_ids;
  std::vector<float> logits;
  std::size_t vocab = 0;
};

inline std::vector<float> read_f32(const std::filesystem::path& p, std::size_t count) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw moekit::Error(moekit::ErrorKind::io, "cannot open " + p.string());
  std::vector<float> v(count);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(float)));
  if (in.gcount() != static_cast<std::streamsize>(count * sizeof(float)))
    throw moekit::Error(moekit::ErrorKind::invalid_format, p.string() + " is too short");
  return v;
}

inline Reference load_reference(const std::filesystem::path& dir) {
  Reference r;
  std::ifstream in(dir / "reference.json");
  r.json = nlohmann::json::parse(in);
  r.prompt_ids = r.json.at("prompt_ids").get<std::vector<std::uint32_t>>();
  r.generated_ids = r.json.at("generated_ids").get<std::vector<std::uint32_t>>();
  r.sequence_ids = r.json.at("sequence_ids").get<std::vector<std::uint32_t>>();
  const auto shape = r.json.at("logits").at("shape").get<std::vector<std::size_t>>();
  r.vocab = shape.at(1);
  r.logits = read_f32(dir / r.json.at("logits").at("file").get<std::string>(), shape[0] * shape[1]);
  return r;
}

/// ‖a − b‖∞ / ‖b‖∞.
inline double relative_error(const float* a, const float* b, std::size_t n) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
    ref = std::max(ref, double(std::abs(b[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

inline std::uint32_t argmax(const float* v, std::size_t n) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return static_cast<std::uint32_t>(best);
}

}  // namespace engine_test
