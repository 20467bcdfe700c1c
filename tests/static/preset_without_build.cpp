// expect: moekit::presets::PresetSpec: missing `template <class Loader> static
#include "moekit/presets.hpp"

// A preset that names its pipeline but forgot how to build it.
struct Unbuilt : moekit::presets::PresetDefaults {
  static constexpr std::string_view name = "unbuilt";
  static constexpr std::string_view summary = "no build";
  template <class Loader>
  using Pipeline = moekit::presets::Baseline<Loader>;
  struct Config {};
  static Config configure(const moekit::ModelShape&, moekit::Precision,
                          const moekit::presets::PresetParams&) {
    return {};
  }
};
using L = moekit::presets::PresetList<moekit::presets::BaselineSpec, Unbuilt>;
int main() { return L::size == 2 ? 0 : 1; }
