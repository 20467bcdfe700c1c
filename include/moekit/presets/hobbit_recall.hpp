#pragma once
/// \file The accuracy of HOBBIT's stacked gate that its stand-ins assume (`--hobbit-recall`, in
/// moe-run for `hobbit-oracle` and in moe-sim for HOBBIT on traces without gate inputs): the
/// recall of each token's actual top-1 expert and of its lower-ranked ones at +1, +2, +3 layers
/// (predict/ranked_guess.hpp runs them), and where the figures come from.

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "moekit/core/plan.hpp"
#include "moekit/error.hpp"

namespace moekit::presets {

/// The recall of HOBBIT's stacked gate at 1, 2, 3 layers ahead: top-1 accuracy ~96 % at the next
/// layer, ~90 % at +2/+3 (Tang et al., arXiv:2411.01433, Fig. 7; paper).
inline constexpr std::array<double, 3> hobbit_paper_recall{0.96, 0.90, 0.90};

/// The stand-in's figures: the recall of the actual top-1 and of the actual ranks 2..k at +1, +2,
/// +3 layers, and their source (printed with every run).
struct HobbitRecallProfile {
  std::vector<double> top1;   ///< recall of the actual top-1 at +1, +2, +3 (last: farther)
  std::vector<double> lower;  ///< recall of the actual ranks 2..k at +1, +2, +3
  std::string source;         ///< e.g. "paper"
};

/// The paper's: top-1 accuracy ~96 / ~90 / ~90 % (Fig. 7) as the top-1's recall (a lower bound:
/// a top-1 predicted at rank 2 is still prefetched). The paper gives no figure for the lower ranks;
/// moekit's choice: the same figures.
inline HobbitRecallProfile hobbit_paper_profile() {
  const std::vector<double> r(hobbit_paper_recall.begin(), hobbit_paper_recall.end());
  return {r, r, "paper (Fig. 7 top-1; lower ranks assumed equal)"};
}

/// moekit's measurement of the real stacked gate (HobbitSpec with the model's routers) on the
/// default model's recorded traces: the recall of the actual top-1 and of rank 2 among the
/// predicted top-2 (bench/quality/predictor_accuracy.cpp; bench/RESULTS.md, "Cross-layer
/// predictors on the engine's own traces").
inline HobbitRecallProfile hobbit_measured_profile() {
  return {{0.941, 0.846, 0.833}, {0.764, 0.726, 0.665}, "measured (moekit-tiny-moe traces)"};
}

/// `--hobbit-recall`: `paper`, `measured`, figures at +1[,+2[,+3]] for every rank, or
/// `TOP1,../LOWER,..` with figures for the actual top-1 and for ranks 2+. Throws naming the flag.
inline HobbitRecallProfile parse_hobbit_recall(const std::string& text) {
  if (text == "paper") return hobbit_paper_profile();
  if (text == "measured") return hobbit_measured_profile();
  auto bad = [&](const std::string& why) {
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         "--hobbit-recall '" + text + "': " + why +
                             " (paper, measured, R1[,R2[,R3]] or TOP1,../LOWER,..)");
  };
  auto figures = [&](std::string_view part) {
    std::vector<double> v;
    while (!part.empty()) {
      const std::size_t comma = std::min(part.find(','), part.size());
      double x = 0;
      const auto [end, ec] = std::from_chars(part.data(), part.data() + comma, x);
      if (ec != std::errc{} || end != part.data() + comma) bad("not a number list");
      if (!(x >= 0 && x <= 1)) bad("every figure must be in [0, 1]");
      v.push_back(x);
      part.remove_prefix(std::min(comma + 1, part.size()));
    }
    if (v.empty() || v.size() > max_prediction_distance)
      bad("needs 1 to 3 figures (+1, +2, +3 layers ahead)");
    return v;
  };
  const std::size_t slash = text.find('/');
  const std::string_view all(text);
  HobbitRecallProfile r;
  r.top1 = figures(all.substr(0, slash));
  r.lower = slash == std::string::npos ? r.top1 : figures(all.substr(slash + 1));
  r.source = "given";
  return r;
}

/// "paper (...) recall: top-1 0.96/0.90/0.90, ranks 2+ 0.96/0.90/0.90 at +1/+2/+3": the figures
/// as moe-run and moe-sim print them.
inline std::string describe(const HobbitRecallProfile& r) {
  auto figures = [](const std::vector<double>& v) {
    std::string s;
    for (std::size_t d = 0; d < v.size(); ++d) {
      char b[32];
      std::snprintf(b, sizeof b, "%.2f", v[d]);
      if (d) s += '/';  // appended apart: GCC 12 warns (-Wrestrict) on "/" + std::string
      s += b;
    }
    return s;
  };
  std::string at;
  for (std::size_t d = 0; d < std::max(r.top1.size(), r.lower.size()); ++d)
    at += d ? "/+" : "+", at += std::to_string(d + 1);
  return r.source + " recall: top-1 " + figures(r.top1) + ", ranks 2+ " + figures(r.lower) +
         " at " + at;
}

}  // namespace moekit::presets
