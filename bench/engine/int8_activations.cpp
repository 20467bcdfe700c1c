// Decode speed of moe-run with int8 vs f32 expert activations (`--activations`, activations.hpp)
// on one thread, every expert resident in host memory, at q8 and q4.
//
// Per round, each (precision, activations) configuration decodes the same N tokens (teacher
// forcing on a sequence the f32 model generated greedily once, so every configuration does the
// same work) after a BOS; configurations run in alternating order. Both wall-clock and thread CPU
// time are reported: on a shared machine the CPU time per token is the steadier figure (it does
// not count time the thread was descheduled). "experts" times the fused expert FFN alone, one
// token through each of the model's experts in turn (the engine's access pattern), so the
// kernels' ratio is visible apart from attention and the f32 LM head, which dominate the small
// model's decode. Ratios are int8 / f32 rates of the same round; medians over the rounds.
// Last, "shapes": the fused expert FFN on synthetic experts of growing width (random weights,
// group 32 symmetric, weights in cache: the same expert every call), best of 5 blocks — where
// the int8 kernel's fixed cost per row stops dominating (activations.hpp: int8_min_row_width).
//
//   moekit_bench_int8_activations [model_dir] [decode_tokens] [rounds]  (default: tiny model, 256,
//   7)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "moekit/pipeline.hpp"  // WeightView, used by moe_layer.hpp
#include "moekit/precision/expert_ffn.hpp"
#include "moekit/precision/isa.hpp"
#include "moekit/precision/quantize.hpp"
#include "moekit/presets.hpp"

// moe-run's components (quoted includes resolve inside examples/moe-run).
#include "moekit/engine/config.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
namespace fs = std::filesystem;
using moekit::Precision;
using Baseline = moekit::presets::Baseline<moekit::MemoryLoader>;
using clock_type = std::chrono::steady_clock;

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Timing {
  double wall = 0, cpu = 0;  // seconds
};

template <class F>
Timing timed(F&& f) {
  const auto t0 = clock_type::now();
  const double c0 = thread_cpu_seconds();
  f();
  return {std::chrono::duration<double>(clock_type::now() - t0).count(), thread_cpu_seconds() - c0};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Decodes `tokens` (teacher forcing) after a prefill of tokens[0]; returns the time of the decode.
Timing decode(const ModelConfig& cfg, const ModelWeights& w, Precision p, bool int8,
              const std::vector<Token>& tokens) {
  const auto shape = cfg.shape();
  Baseline pipeline(shape, pipeline_config(shape, {0, p}), host_loader(w.experts),
                    moekit::UniformScorer({p}));
  Model<Baseline> model(cfg, w.dense, pipeline, static_cast<std::uint32_t>(tokens.size() + 1));
  model.set_int8_expert_activations(int8);
  model.begin_sequence();
  (void)model.prefill(std::vector<Token>{tokens[0]});
  return timed([&] {
    for (std::size_t t = 1; t < tokens.size(); ++t) (void)model.decode(tokens[t]);
  });
}

// One token through each expert at `p`, `passes` times over all experts.
Timing experts_only(const ModelConfig& cfg, const ModelWeights& w, Precision p, bool int8,
                    int passes) {
  const auto shape = cfg.shape();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(shape.hidden), y(shape.hidden);
  for (float& v : x) v = nd(rng);
  moekit::KernelOptions opts{};
  opts.int8_activations = int8;
  auto pass = [&] {
    for (std::uint32_t l = 0; l < shape.n_layers; ++l)
      for (std::uint32_t e = 0; e < shape.n_experts; ++e)
        moekit::expert_ffn(moekit::io::expert_view(shape, w.experts.bytes({l, e}, p), p), x, 1, y,
                           1.f, opts);
  };
  pass();  // warm
  return timed([&] {
    for (int i = 0; i < passes; ++i) pass();
  });
}

// Best-of-5 microseconds per fused FFN call on a random hidden × ffn expert at `p`.
double synthetic_us(std::size_t hidden, std::size_t ffn, Precision p, bool int8) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 0.05f);
  auto matrix = [&](std::size_t r, std::size_t c) {
    std::vector<float> v(r * c);
    for (float& x : v) x = nd(rng);
    return moekit::encode_matrix<float>(v, r, c, p, {32, false});
  };
  const auto w1 = matrix(ffn, hidden), w3 = matrix(ffn, hidden), w2 = matrix(hidden, ffn);
  const moekit::QuantScheme s{32, false};
  const moekit::ExpertWeights e{{w1.data(), ffn, hidden, p, s},
                                {w3.data(), ffn, hidden, p, s},
                                {w2.data(), hidden, ffn, p, s}};
  std::vector<float> x(hidden), y(hidden);
  for (float& v : x) v = nd(rng) * 20.f;
  moekit::KernelOptions opts{};
  opts.int8_activations = int8;
  const int calls = std::max(4, int(4e8 / double(3 * hidden * ffn)));  // ~0.1 s per block
  double best = 1e9;
  for (int b = 0; b < 6; ++b) {  // the first block warms
    const Timing t = timed([&] {
      for (int i = 0; i < calls; ++i) moekit::expert_ffn(e, x, 1, y, 1.f, opts);
    });
    if (b > 0) best = std::min(best, t.cpu / calls);
  }
  return 1e6 * best;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path dir =
      argc > 1 ? fs::path(argv[1]) : fs::path(MOEKIT_SOURCE_DIR) / "models/moekit-tiny-moe";
  const int n = argc > 2 ? std::atoi(argv[2]) : 256;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 7;
  if (n < 2 || rounds < 1) {
    std::fprintf(stderr, "usage: %s [model_dir] [decode_tokens >= 2] [rounds >= 1]\n", argv[0]);
    return 2;
  }
  if (!moekit::isa_supported(moekit::Isa::avx2)) {
    std::printf("SKIPPED: this CPU has no AVX2 (int8 activations cannot run)\n");
    return 0;
  }
  const ModelConfig cfg = load_config(dir);
  const std::vector<Precision> precisions{Precision::q8, Precision::q4};
  std::vector<Precision> stored = precisions;
  stored.push_back(Precision::f32);
  const ModelWeights w = load_weights(cfg, dir, stored);
  const auto shape = cfg.shape();

  // The token sequence: greedy from BOS with f32 experts.
  std::vector<Token> tokens{cfg.bos_token_id.value_or(1)};
  {
    Baseline pipeline(shape, pipeline_config(shape, {0, Precision::f32}), host_loader(w.experts),
                      moekit::UniformScorer({Precision::f32}));
    Model<Baseline> model(cfg, w.dense, pipeline, static_cast<std::uint32_t>(n + 1));
    model.begin_sequence();
    auto logits = model.prefill(tokens);
    while (tokens.size() < static_cast<std::size_t>(n)) {
      const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
      tokens.push_back(static_cast<Token>(best));
      logits = model.decode(tokens.back());
    }
  }

  const int passes = std::max(10, n / 4);
  std::printf(
      "# %s: %u layers x %u experts, hidden %u, expert ffn %u; %d decode tokens, %d "
      "rounds, 1 thread; experts-only: %d passes over all experts\n",
      dir.filename().string().c_str(), shape.n_layers, shape.n_experts, shape.hidden, shape.ffn,
      n - 1, rounds, passes);
  std::printf("%-4s | %-23s | %-23s | %-29s\n", "", "decode tok/s (cpu) f32/int8",
              "ratio wall / cpu", "experts: us per call f32/int8");
  for (Precision p : precisions) {
    std::vector<double> wall_ratio, cpu_ratio, f32_rate, int8_rate, ex_ratio, ex_f32, ex_int8;
    for (int r = 0; r < rounds; ++r) {
      Timing d[2], e[2];
      for (int k = 0; k < 2; ++k) {
        const bool int8 = (k + r) % 2 == 1;  // alternate which goes first
        d[int8] = decode(cfg, w, p, int8, tokens);
        e[int8] = experts_only(cfg, w, p, int8, passes);
      }
      const double tok = n - 1;
      f32_rate.push_back(tok / d[0].cpu);
      int8_rate.push_back(tok / d[1].cpu);
      wall_ratio.push_back(d[0].wall / d[1].wall);
      cpu_ratio.push_back(d[0].cpu / d[1].cpu);
      const double calls = double(passes) * shape.expert_count();
      ex_f32.push_back(1e6 * e[0].cpu / calls);
      ex_int8.push_back(1e6 * e[1].cpu / calls);
      ex_ratio.push_back(e[0].cpu / e[1].cpu);
    }
    std::printf("%-4s | %9.1f / %-11.1f | %5.2f / %-15.2f | %6.2f / %-6.2f (x%.2f)\n",
                std::string(moekit::name(p)).c_str(), median(f32_rate), median(int8_rate),
                median(wall_ratio), median(cpu_ratio), median(ex_f32), median(ex_int8),
                median(ex_ratio));
    std::printf("     per-round cpu ratios:");
    for (double v : cpu_ratio) std::printf(" %.2f", v);
    std::printf("\n");
  }
  std::printf("\nshapes (hidden x ffn): us per fused expert FFN call (thread cpu), f32 / int8\n");
  const std::size_t shapes[][2] = {{256, 512}, {512, 1024}, {1024, 2048}, {2048, 1408}};
  for (const auto& sh : shapes)
    for (Precision p : precisions) {
      const double f = synthetic_us(sh[0], sh[1], p, false),
                   i = synthetic_us(sh[0], sh[1], p, true);
      std::printf("%5zu x %-5zu %-3s %9.1f / %-9.1f (x%.2f)\n", sh[0], sh[1],
                  std::string(moekit::name(p)).c_str(), f, i, f / i);
    }
  return 0;
}
