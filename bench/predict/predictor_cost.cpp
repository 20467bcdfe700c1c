// Predictor cost per layer call at Mixtral-8x7B shapes (32 layers, 8 experts, d = 4096, f32
// routers, one decode token): HOBBIT's stacked product of p gates vs one gate (the router the
// model runs anyway), vs p sequential gates, and the full predict() of the gate predictors.
// HOBBIT's claim (Fig. 17a): the stacked cost stays flat in p; target here: stacked p = 2 costs
// ≤ 1.5× one gate.
//
// The routers of all 32 layers (4 MiB) are used in turn, layer after layer, as in decode: each
// call reads the next layer's slice. Times are medians of batches; ratios are what to read.
//
// Usage: moekit_bench_predictor_cost [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moekit/precision/gemv.hpp"
#include "moekit/predict/cross_layer_gate.hpp"
#include "moekit/predict/detail/router_bank.hpp"
#include "moekit/predict/stacked_gate.hpp"

using namespace moekit;
using Clock = std::chrono::steady_clock;

namespace {
constexpr std::uint32_t L = 32, E = 8, d = 4096;

bool always_missing(const void*, ExpertKey, Precision) noexcept { return false; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median seconds per call of `fn(layer)` over batches cycling through layers 0..L-2.
template <class F>
double time_per_call(int reps, F&& fn) {
  std::vector<double> batches;
  for (int b = 0; b < 15; ++b) {
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) fn(static_cast<std::uint32_t>(r % (L - 1)));
    batches.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / reps);
  }
  return median(batches);
}
}  // namespace

int main(int argc, char** argv) {
  int reps = 2000;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);

  std::mt19937 g(1);
  std::normal_distribution<float> n(0.0f, 0.02f);
  std::vector<float> w(std::size_t{L} * E * d);
  for (auto& v : w) v = n(g);
  std::vector<float> x(d);
  for (auto& v : x) v = n(g) * 50.0f;
  const detail::RouterBank bank{w, L, E, d};
  std::vector<float> y(3 * E);
  volatile float sink = 0;

  const double one = time_per_call(reps, [&](std::uint32_t l) {
    gemv(bank.layers(l, 1), x, std::span<float>(y).first(E));
    sink = sink + y[0];
  });
  std::printf("predictor cost per decode layer call, Mixtral shapes (E = %u, d = %u, f32 routers)\n",
              E, d);
  std::printf("%-44s %10s %14s\n", "what", "us/call", "ratio to 1 gate");
  std::printf("%-44s %10.3f %14.2f\n", "one gate [8 x 4096] (the model's own router)", one * 1e6,
              1.0);
  for (std::uint32_t p = 1; p <= 3; ++p) {
    const double stacked = time_per_call(reps, [&](std::uint32_t l) {
      const std::uint32_t c = std::min(p, L - 1 - l);
      gemv(bank.layers(l + 1, c), x, std::span<float>(y).first(c * E));
      sink = sink + y[0];
    });
    const double sequential = time_per_call(reps, [&](std::uint32_t l) {
      const std::uint32_t c = std::min(p, L - 1 - l);
      for (std::uint32_t j = 1; j <= c; ++j)
        gemv(bank.layers(l + j, 1), x, std::span<float>(y).subspan((j - 1) * E, E));
      sink = sink + y[0];
    });
    std::printf("%-44s %10.3f %14.2f%s\n",
                ("stacked product of p = " + std::to_string(p) + " gates [p*8 x 4096]").c_str(),
                stacked * 1e6, stacked / one,
                p == 2 ? (stacked / one <= 1.5 ? "   (target <= 1.5: met)" : "   (target <= 1.5: NOT met)")
                       : "");
    std::printf("%-44s %10.3f %14.2f   (stacked saves %.2fx)\n",
                ("p = " + std::to_string(p) + " sequential gates").c_str(), sequential * 1e6,
                sequential / one, sequential / stacked);
  }

  // Whole predict() calls (softmax, top-k, T1/T2 rule, list building), nothing resident.
  const ResidencyView none(nullptr, &always_missing);
  std::vector<Prefetch> buf(64);
  std::vector<std::uint32_t> ids{0, 1};
  std::vector<float> wts{0.6f, 0.4f};
  GateView gv{1, 2, E, {}, ids, wts, x};
  StackedGatePredictor stacked({.router_weights = w, .n_layers = L, .n_experts = E, .hidden = d,
                                .top_k = 2, .lookahead = 2});
  const double sp = time_per_call(reps, [&](std::uint32_t l) {
    PrefetchList list{std::span<Prefetch>(buf)};
    stacked.predict(LayerContext{l, L, 0, Phase::decode, 0, 1}, gv, none, list);
    sink = sink + float(list.size());
  });
  std::printf("%-44s %10.3f %14.2f\n", "StackedGatePredictor::predict, p = 2", sp * 1e6, sp / one);
  CrossLayerGatePredictor cross({.router_weights = w, .n_layers = L, .n_experts = E, .hidden = d});
  const double cp = time_per_call(reps, [&](std::uint32_t l) {
    PrefetchList list{std::span<Prefetch>(buf)};
    cross.predict(LayerContext{l, L, 0, Phase::decode, 0, 1}, gv, none, list);
    sink = sink + float(list.size());
  });
  std::printf("%-44s %10.3f %14.2f\n", "CrossLayerGatePredictor::predict", cp * 1e6, cp / one);
  return 0;
}
