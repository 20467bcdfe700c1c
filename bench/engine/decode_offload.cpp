// Decode speed of moe-run's presets with experts read from an expert store with O_DIRECT, as a
// fraction of the I/O bound measured in the same run.
//
// For each preset: half of the experts fit in the budget (f16), the prompt is prefilled, then N
// greedy tokens are decoded. The I/O bound of a preset is the decode rate the disk allows for
// the bytes that preset read per decoded token: bandwidth / (bytes loaded during decode / tokens),
// with the bandwidth measured here through the same io::AsyncLoader + O_DIRECT source reading
// every f16 expert of the store (best of 3 passes). "compute" is the decode rate with every
// expert resident (no reads), the other bound; "serial bound" = 1 / (1/compute + 1/I/O), the rate
// with no overlap of reads and compute (a fraction above 1 means reads overlapped compute).
// Fiddler's CPU-executed misses read expert bytes
// through a mapping of the store (page cache), not counted as loads — noted in its row. Bytes read
// per token are split into prefetched and on-demand loads (the pipeline's own attribution); Fate's
// decode prefetch cap n = floor(T / t_expert) is measured here as moe-run measures it
// (engine/decode_timing.hpp) and shown in its row.
//
//   moekit_bench_decode_offload [model_dir] [decode_tokens]     (default: the tiny model, 48)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "moekit/cache/expert_arena.hpp"
#include "moekit/pipeline.hpp"  // WeightView, used by moe_layer.hpp
#include "moekit/precision/thread_pool.hpp"

// moe-run's components (quoted includes resolve inside examples/moe-run).
#include "moekit/engine/calibration.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/decode_timing.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/weights.hpp"

using namespace moekit::engine;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Bytes/s of reading every expert at `p` through a fresh store loader (O_DIRECT), best of 3.
double measure_bandwidth(const ExpertBacking& b, const moekit::ModelShape& s, moekit::Precision p) {
  const std::size_t n = s.expert_count(), bytes = s.expert_bytes(p);
  moekit::ExpertArena arena(n, n * bytes + bytes);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    ExpertLoader loader = b.make_loader();
    std::vector<moekit::LoadTicket> t;
    const auto t0 = clock_type::now();
    for (std::uint32_t i = 0; i < n; ++i)
      t.push_back(loader.submit({{i / s.n_experts, i % s.n_experts},
                                 p,
                                 moekit::LoadPriority::on_demand,
                                 arena.acquire(i, bytes)}));
    for (auto x : t) loader.wait(x);
    best = std::max(best, double(n * bytes) / seconds(t0));
  }
  return best;
}

struct Row {
  std::string preset;
  double tok_s = 0, bytes_per_token = 0, prefetch_per_token = 0, hit_rate = 0;
  std::uint64_t host_cpu_runs = 0, fallbacks = 0;
};

}  // namespace

int main(int argc, char** argv) try {
  const fs::path dir =
      argc > 1 ? fs::path(argv[1]) : fs::path(MOEKIT_SOURCE_DIR) / "models/moekit-tiny-moe";
  const int steps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 48;
  const ModelConfig cfg = load_config(dir);
  const moekit::ModelShape s = cfg.shape();
  const moekit::Precision p = moekit::Precision::f16;
  // "The history of the city began" in the Mixtral tokenizer, after BOS (moe-run's README prompt).
  const std::vector<Token> prompt = dir.filename() == "moekit-tiny-moe"
                                        ? std::vector<Token>{1, 415, 3340, 302, 272, 2990, 3125}
                                        : std::vector<Token>{1, 2, 3, 4, 5, 6, 7};
  const fs::path store_path = fs::temp_directory_path() / "moekit-bench-decode-offload.moestore";
  fs::remove(store_path);
  const std::vector<moekit::Precision> ps{p, moekit::Precision::q4};
  build_store_from_checkpoint(cfg, dir, ps, store_path, {});
  auto store = std::make_shared<moekit::io::ExpertStore>(
      moekit::io::ExpertStore::open(store_path.string(), s));
  const ModelWeights w = load_weights(cfg, dir, {});
  const std::vector<float> routers = router_stack(cfg, w.dense);
  const ExpertBacking disk{nullptr, store, StoreIo{.direct = true, .uring = true, .io_threads = 2}};
  moekit::ThreadPool pool(2);
  const std::string reads = disk.make_loader().kind();

  const double bw = measure_bandwidth(disk, s, p);
  std::printf(
      "model %s: %u MoE layers x %u experts, top-%u, expert %zu bytes at f16; store %s read "
      "with %s + O_DIRECT, 2 I/O threads\n",
      dir.filename().c_str(), s.n_layers, s.n_experts, s.top_k, s.expert_bytes(p),
      store_path.c_str(), reads.c_str());
  std::printf("disk bandwidth (every f16 expert through the loader, best of 3): %.1f MB/s\n",
              bw / 1e6);

  auto decode_run = [&](const PresetEntry& preset, const OffloadSettings& o,
                        const PresetInputs& in) {
    return with_pipeline(preset, s, o, disk.make_loader(), in, [&](auto& pipeline) {
      Model<std::remove_reference_t<decltype(pipeline)>> model(
          cfg, w.dense, pipeline, static_cast<std::uint32_t>(prompt.size() + steps + 1), &pool);
      model.begin_sequence();
      auto logits = model.prefill(prompt);
      const auto before = pipeline.stats();
      const auto t0 = clock_type::now();
      for (int i = 0; i < steps; ++i) {
        const auto next =
            static_cast<Token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        logits = model.decode(next);
      }
      const double t = seconds(t0);
      const auto after = pipeline.stats();
      Row r;
      r.preset = preset.name;
      r.tok_s = steps / t;
      r.bytes_per_token = double(after.bytes_loaded() - before.bytes_loaded()) / steps;
      r.prefetch_per_token = double(after.bytes_prefetched - before.bytes_prefetched) / steps;
      const auto h = after.hits - before.hits, m = after.misses - before.misses;
      r.hit_rate = h + m ? double(h) / double(h + m) : 0.0;
      r.host_cpu_runs = after.host_cpu_runs - before.host_cpu_runs;
      r.fallbacks = after.fallbacks - before.fallbacks;
      return r;
    });
  };

  const Row compute = decode_run(moekit::presets::entry_of<moekit::presets::BaselineSpec>,
                                 OffloadSettings{0, p}, PresetInputs{});
  std::printf("compute bound (every expert resident, no reads): %.1f tokens/s\n\n", compute.tok_s);
  std::printf(
      "| preset | decode tok/s | bytes read / token | of which prefetched | I/O bound tok/s | "
      "fraction of I/O bound | fraction of serial bound | hit rate | notes |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  auto print_row = [&](const std::string& name, const Row& r, const char* timing) {
    const double io_bound = r.bytes_per_token > 0 ? bw / r.bytes_per_token : 0;
    char note[128];
    std::snprintf(note, sizeof note, "%s", timing);
    if (r.host_cpu_runs)
      std::snprintf(note, sizeof note, "%llu misses run on the CPU from the mapped store",
                    static_cast<unsigned long long>(r.host_cpu_runs));
    if (r.fallbacks)
      std::snprintf(note, sizeof note, "%llu fallbacks (tokens recomputed)",
                    static_cast<unsigned long long>(r.fallbacks));
    if (io_bound > 0)
      std::printf("| %s | %.1f | %.0f | %.0f | %.1f | %.3f | %.3f | %.1f%% | %s |\n", name.c_str(),
                  r.tok_s, r.bytes_per_token, r.prefetch_per_token, io_bound, r.tok_s / io_bound,
                  r.tok_s * (1 / compute.tok_s + 1 / io_bound), 100 * r.hit_rate, note);
    else
      std::printf("| %s | %.1f | 0 | 0 | - | - (no reads) | %.3f | %.1f%% | %s |\n", name.c_str(),
                  r.tok_s, r.tok_s / compute.tok_s, 100 * r.hit_rate, note);
  };
  const OffloadSettings half{all_resident_budget(s, p) / 2, p};
  for (const PresetEntry& preset : moekit::presets::entries) {
    if (preset.needs.lookahead) continue;  // oracle stand-ins: only under a replayed trace
    const std::string name(preset.name);
    PresetInputs in;
    in.routers = routers;
    const StartupNeeds needs = startup_needs(preset, half);
    if (needs.calibration) {
      const Calibration c = calibrate(cfg, w.dense, half, disk, prompt, 16, &pool, {});
      in.popularity = c.counts;
      in.paths = c.paths;
    }
    if (needs.latencies) {
      const FiddlerLatencies l = measure_fiddler_latencies(s, p, disk, &pool, {});
      in.cpu_seconds_per_token = l.cpu_seconds_per_token;
      in.cpu_seconds_per_expert = l.cpu_seconds_per_expert;
      in.copy_seconds = l.copy_seconds;
    }
    char note[128] = "";
    if (needs.decode_timing) {
      const DecodeTiming t =
          measure_decode_timing(cfg, w.dense, half, disk, prompt, 8, p, &pool, {});
      in.layer_seconds = t.layer_seconds;
      in.expert_load_seconds = t.expert_load_seconds;
      std::snprintf(note, sizeof note, "decode cap n = floor(%.3f ms / %.3f ms) = %.0f",
                    1e3 * t.layer_seconds, 1e3 * t.expert_load_seconds,
                    std::floor(t.layer_seconds / t.expert_load_seconds));
    }
    print_row(name, decode_run(preset, half, in), note);
    if (needs.decode_timing) {  // the same without the cap: every candidate moves
      in.layer_seconds = in.expert_load_seconds = 0;
      print_row(name + " (no decode cap)", decode_run(preset, half, in), "");
    }
  }
  fs::remove(store_path);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "decode_offload: %s\n", e.what());
  return 1;
}
