// moe-sim: replays routing traces through moekit's presets on a simulated machine and scores them
// against Belady's optimum. See docs/simulator.md.

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/io/dequantize.hpp"
#include "moekit/io/output_file.hpp"
#include "moekit/io/safetensors.hpp"
#include "moekit/io/tensor_names.hpp"
#include "moekit/sim/fill_missing_records.hpp"
#include "moekit/sim/hardware.hpp"
#include "moekit/sim/npy.hpp"
#include "moekit/sim/replay.hpp"
#include "moekit/sim/report.hpp"
#include "moekit/sim/synthetic_trace.hpp"
#include "moekit/sim/trace.hpp"
#include "moekit/sim/trace_binary.hpp"
#include "moekit/sim/trace_jsonl.hpp"
#include "moekit/tools/progress.hpp"
#include "moekit/tools/svg_plot.hpp"

#include "moekit/sim/preset_runs.hpp"

#ifndef MOEKIT_SOURCE_DIR
#define MOEKIT_SOURCE_DIR "."
#endif

namespace fs = std::filesystem;
using namespace moekit;
using namespace moekit::sim;
using namespace moekit::sim::preset_runs;

namespace {

[[noreturn]] void bad_flag(const std::string& flag, const std::string& why) {
  throw moekit::Error(ErrorKind::invalid_argument, flag + ": " + why);
}

/// Parses "12", "1.5e9", with an optional unit suffix from `units` (case-insensitive).
double parse_quantity(const std::string& flag, std::string s,
                      std::initializer_list<std::pair<const char*, double>> units,
                      std::string* unit_out = nullptr) {
  std::string lower;
  for (char c : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 1.0;
  std::string best;
  for (auto [u, f] : units) {
    const std::string us(u);
    if (lower.size() > us.size() && lower.ends_with(us) && us.size() > best.size())
      best = us, scale = f;
  }
  lower.resize(lower.size() - best.size());
  if (unit_out) *unit_out = best;
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(lower, &used);
  } catch (...) {
    bad_flag(flag, "'" + s + "' is not a number");
  }
  while (used < lower.size() && std::isspace(static_cast<unsigned char>(lower[used]))) ++used;
  if (used != lower.size() || !std::isfinite(v) || v < 0)
    bad_flag(flag, "cannot read '" + s + "' (a non-negative number with an optional unit)");
  return v * scale;
}

/// An expert budget: slots (a plain number), bytes (with a unit) or a percentage of all experts.
struct BudgetSpec {
  enum class Kind { slots, bytes, percent } kind = Kind::percent;
  double value = 50;
  std::string text = "50%";

  static BudgetSpec parse(const std::string& flag, const std::string& s) {
    BudgetSpec b;
    b.text = s;
    if (!s.empty() && s.back() == '%') {
      b.kind = Kind::percent;
      b.value = parse_quantity(flag, s.substr(0, s.size() - 1), {});
      if (b.value <= 0 || b.value > 100) bad_flag(flag, "percentage must be in (0, 100]");
      return b;
    }
    std::string unit;
    b.value = parse_quantity(flag, s,
                             {{"b", 1.0},
                              {"kb", 1e3},
                              {"mb", 1e6},
                              {"gb", 1e9},
                              {"tb", 1e12},
                              {"kib", 1024.0},
                              {"mib", 1048576.0},
                              {"gib", 1073741824.0}},
                             &unit);
    b.kind = unit.empty() ? Kind::slots : Kind::bytes;
    if (b.value > 1e18) bad_flag(flag, "'" + s + "' is too large (at most 1e18 bytes or slots)");
    if (b.kind == Kind::slots && b.value != std::floor(b.value))
      bad_flag(flag, "a slot count must be a whole number (use a unit for bytes, % for a share)");
    if (b.value <= 0) bad_flag(flag, "budget must be > 0");
    return b;
  }
  /// Bytes for `shape` at `base` precision.
  [[nodiscard]] std::size_t bytes(const ModelShape& shape, Precision base) const {
    const std::size_t one = shape.expert_bytes(base);
    if (kind == Kind::slots && value > double(shape.expert_count()))
      bad_flag("--budget", "'" + text + "' slots exceed the trace's " +
                               std::to_string(shape.expert_count()) +
                               " experts (a plain number counts experts; use a unit for bytes)");
    switch (kind) {
      case Kind::slots:
        return static_cast<std::size_t>(value) * one;
      case Kind::bytes:
        return static_cast<std::size_t>(value);
      case Kind::percent:
        return static_cast<std::size_t>(
                   std::floor(double(shape.expert_count()) * value / 100.0 + 1e-9)) *
               one;
    }
    return 0;
  }
};

double parse_bandwidth(const std::string& flag, const std::string& s) {
  const double v = parse_quantity(flag, s,
                                  {{"b/s", 1.0},
                                   {"kb/s", 1e3},
                                   {"mb/s", 1e6},
                                   {"gb/s", 1e9},
                                   {"mib/s", 1048576.0},
                                   {"gib/s", 1073741824.0}});
  if (v <= 0) bad_flag(flag, "bandwidth must be > 0");
  return v;
}

/// A sweep "param=v1,v2,...".
struct Sweep {
  std::string param;  ///< budget | bandwidth | t1 | t2 | fallback
  std::vector<std::string> values;
};

Sweep parse_sweep(const std::string& s) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
    bad_flag("--sweep", "expected PARAM=V1,V2,... (e.g. budget=25%,50%,75%), got '" + s + "'");
  Sweep w;
  w.param = s.substr(0, eq);
  if (w.param == "gamma")
    bad_flag("--sweep",
             "gamma decides MoBiLE's fallback from the model's output logits, which "
             "traces do not store; sweep 'fallback' (the fallback ratio) instead");
  if (w.param != "budget" && w.param != "bandwidth" && w.param != "t1" && w.param != "t2" &&
      w.param != "fallback")
    bad_flag("--sweep",
             "unknown parameter '" + w.param + "' (budget, bandwidth, t1, t2, fallback)");
  std::string rest = s.substr(eq + 1), item;
  for (std::size_t i = 0; i <= rest.size(); ++i) {
    if (i == rest.size() || rest[i] == ',') {
      if (item.empty()) bad_flag("--sweep", "empty value in '" + s + "'");
      w.values.push_back(item);
      item.clear();
    } else {
      item += rest[i];
    }
  }
  return w;
}

/// Reads a trace in moekit's binary or JSONL format (told apart by the magic bytes).
RoutingTrace load_trace(const std::string& path) {
  if (fs::exists(path) && !fs::is_regular_file(path))  // /dev/zero would be read without end
    bad_flag("--trace", "'" + path + "' is not a regular file (a directory, device or pipe)");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw moekit::Error(ErrorKind::io, "--trace: cannot open '" + path + "'");
  char magic[8] = {};
  f.read(magic, 8);
  if (f.gcount() == 8 && std::memcmp(magic, trace_magic, 8) == 0) return read_trace_binary(path);
  return read_trace_jsonl(path);
}

/// Reads one of the shared Mixtral JSONL traces: forward-call order ("token_pos") or per-layer
/// decode order ("token_idx").
RoutingTrace load_mixtral(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw moekit::Error(ErrorKind::io, "--import-mixtral: cannot open '" + path + "'");
  std::string first;
  std::getline(f, first);
  RoutingTrace t = first.find("\"token_pos\"") != std::string::npos
                       ? read_mixtral_raw_jsonl(path)
                       : read_mixtral_decode_jsonl(path);
  return t;
}

struct Options {
  std::vector<std::string> traces, mixtral;
  std::string preset = std::string(moekit::presets::BaselineSpec::name);
  std::string budget = "50%";
  std::string hardware = "rtx4090-pcie4";
  std::string hardware_file;
  std::string bandwidth;
  std::string precision = "f16";
  std::string dense_precision = "bf16";  // --dense-precision: the dense matrices' storage
  int group_size = -1;  // --group-size: weights per scale of the experts (-1: the preset's codec)
  std::uint32_t reads_in_flight = 0;  // --reads-in-flight: override the hardware's (0: keep)
  double decode_team_fraction = -1;   // --decode-team-fraction: override the file's (< 0: keep)
  std::uint32_t hidden = 0, ffn = 0;
  std::vector<std::string> sweeps;
  std::string out = "moe-sim-sweep";
  std::string routers, bitwidths;
  bool json = false, compare = false, no_belady = false, list = false, synthetic = false;
  bool force = false;  // --force: replace the sweep's existing output files
  bool log_y = false;  // --log-y: the sweep's plots on a log y axis
  double t1 = RunParams{}.t1, t2 = RunParams{}.t2, gamma = RunParams{}.gamma;
  std::string hobbit_recall = "paper";
  double hobbit_high_pool = RunParams{}.hobbit_high_slots;
  double fate_recall = fate_paper_recall;
  std::uint32_t fate_staging_slots = RunParams{}.fate_staging_slots;
  double fallback_ratio = mobile_paper_fallback_ratio;
  double replay_accuracy = mobile_paper_replay_accuracy;
  std::string big_pass = "little-plan";
  std::uint64_t seed = 1;
  std::vector<std::size_t> replay_slice;  // --replay-slice PROMPT,DECODE (empty: second half)
  std::string missing_records = "fill";   // --missing-records fill|skip
};

/// Router weights of every MoE layer, [n_layers · n_experts · hidden] f32, from a .npy of shape
/// [L, E, H] or [L·E, H], or from safetensors (a file, a directory or an index) holding each
/// layer's router under its Mixtral or Qwen2-MoE/OLMoE name. `layers` × `experts` must match.
std::vector<float> load_routers(const std::string& path, std::uint32_t layers,
                                std::uint32_t experts) {
  const std::string what = "--routers '" + path + "'";
  if (path.ends_with(".npy")) {
    const NpyArray a = read_npy(path);
    const bool ok3 = a.shape.size() == 3 && a.shape[0] == layers && a.shape[1] == experts;
    const bool ok2 = a.shape.size() == 2 && a.shape[0] == std::size_t{layers} * experts;
    if (!ok3 && !ok2)
      bad_flag(what, "expected shape [" + std::to_string(layers) + ", " + std::to_string(experts) +
                         ", hidden] or [" + std::to_string(layers * experts) + ", hidden]");
    return std::vector<float>(a.data.begin(), a.data.end());
  }
  const io::SafetensorsModel m = io::SafetensorsModel::open(path);
  std::vector<float> out;
  std::uint64_t hidden = 0;
  for (std::uint32_t l = 0; l < layers; ++l) {
    std::optional<io::TensorView> t;
    for (io::Architecture a : {io::Architecture::mixtral, io::Architecture::qwen2_moe})
      if (!t) t = m.find(io::router_tensor_name(a, io::TensorFormat::hugging_face, l));
    if (!t)
      bad_flag(what, "no router of layer " + std::to_string(l) + " (looked for '" +
                         io::router_tensor_name(io::Architecture::mixtral,
                                                io::TensorFormat::hugging_face, l) +
                         "' and '" +
                         io::router_tensor_name(io::Architecture::qwen2_moe,
                                                io::TensorFormat::hugging_face, l) +
                         "')");
    if (t->rank != 2 || t->rows() != experts || (hidden && t->cols() != hidden))
      bad_flag(what, t->where() + " is not [" + std::to_string(experts) + ", hidden]" +
                         (hidden ? " with hidden " + std::to_string(hidden) : ""));
    hidden = t->cols();
    const std::vector<float> w = io::dequantize(*t);
    out.insert(out.end(), w.begin(), w.end());
  }
  return out;
}

/// The bundled synthetic trace: Mixtral-8x7B routing generated from the published transition
/// statistics in the repository's data/stats (MIT), 2 sequences of 64 prompt + 128 decode tokens.
RoutingTrace bundled_synthetic_trace() {
  SyntheticConfig c;
  c.sequences = 2;
  c.prefill_tokens = 64;
  c.decode_tokens = 128;
  c.seed = 1;
  c.label = "mixtral-8x7b";
  return generate_synthetic_trace("mixtral-8x7b",
                                  (fs::path(MOEKIT_SOURCE_DIR) / "data" / "stats").string(), c);
}

/// The model shape behind a trace: Mixtral-8x7B when the dims are its, else --hidden/--ffn.
/// What a sidecar `<trace>.json` beside a trace tells: the expert sizes ("hidden"/"ffn", or a
/// "model" directory, relative to the repository, whose config.json has hidden_size and
/// intermediate_size) and that model's checkpoint, whose routers let HOBBIT's and Fate's real gate
/// predictors run. Keyed by trace name.
struct Sidecar {
  std::uint32_t hidden = 0, ffn = 0;
  std::string routers;  ///< model.safetensors of the recorded model, when present
};
using ExpertDims = std::map<std::string, Sidecar>;

void read_sidecar_dims(const fs::path& trace_path, const std::string& trace_name, ExpertDims& out) {
  fs::path side = trace_path;
  side.replace_extension(".json");
  if (!fs::exists(side)) return;
  std::ifstream in(side);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return;
  if (j.contains("hidden") && j.contains("ffn") && j["hidden"].is_number_unsigned() &&
      j["ffn"].is_number_unsigned()) {
    out[trace_name] = {j["hidden"].get<std::uint32_t>(), j["ffn"].get<std::uint32_t>(), ""};
    return;
  }
  if (!j.contains("model") || !j["model"].is_string()) return;
  fs::path model = j["model"].get<std::string>();
  if (model.is_relative()) model = fs::path(MOEKIT_SOURCE_DIR) / model;
  std::ifstream cfg(model / "config.json");
  const nlohmann::json c = nlohmann::json::parse(cfg, nullptr, /*allow_exceptions=*/false);
  if (c.is_object() && c.contains("hidden_size") && c.contains("intermediate_size") &&
      c["hidden_size"].is_number_unsigned() && c["intermediate_size"].is_number_unsigned())
    out[trace_name] = {
        c["hidden_size"].get<std::uint32_t>(), c["intermediate_size"].get<std::uint32_t>(),
        fs::exists(model / "model.safetensors") ? (model / "model.safetensors").string()
                                                : std::string()};
}

ModelShape shape_for(const RoutingTrace& tr, Options o, const ExpertDims& dims) {
  if (o.hidden == 0 && o.ffn == 0)
    if (const auto it = dims.find(tr.name()); it != dims.end())
      o.hidden = it->second.hidden, o.ffn = it->second.ffn;
  const TraceDims& d = tr.dims();
  if (o.hidden == 0 && o.ffn == 0 && d.n_layers == mixtral_8x7b.n_layers &&
      d.n_experts == mixtral_8x7b.n_experts && d.top_k == mixtral_8x7b.top_k)
    return mixtral_8x7b;
  if (o.hidden == 0 || o.ffn == 0)
    bad_flag("--hidden/--ffn",
             "trace '" + tr.name() + "' is not Mixtral-8x7B-shaped (" + std::to_string(d.n_layers) +
                 " layers × " + std::to_string(d.n_experts) + " experts, top-" +
                 std::to_string(d.top_k) + "): give the expert's hidden and ffn sizes");
  ModelShape s{.n_layers = d.n_layers,
               .n_experts = d.n_experts,
               .top_k = d.top_k,
               .hidden = o.hidden,
               .ffn = o.ffn};
  s.validate();
  return s;
}

DenseLayerShape dense_for(const ModelShape& s, Precision p) {
  // Mixtral-8x7B's layers (any number of them: a model cut to its first layers has the same).
  if (s.hidden == mixtral_8x7b.hidden && s.ffn == mixtral_8x7b.ffn &&
      s.n_experts == mixtral_8x7b.n_experts && s.top_k == mixtral_8x7b.top_k)
    return {mixtral_8x7b_dense().params, p};
  // Not Mixtral: assume multi-head attention (4·d² projections) plus the router.
  return DenseLayerShape{4ull * s.hidden * s.hidden + std::uint64_t{s.n_experts} * s.hidden, p};
}

HardwareModel hardware_for(const Options& o) {
  // One spelling: the names sim/hardware.hpp defines (hardware_preset_names() + this_machine).
  const std::string& name = o.hardware;
  if (name == "this_machine" && o.hardware_file.empty())
    bad_flag("--hardware this_machine", "needs --hardware-file (the JSON moe-calibrate writes)");
  if (name != "this_machine" && !o.hardware_file.empty())
    bad_flag("--hardware-file", "is read only with --hardware this_machine");
  HardwareModel h = hardware_preset(name, o.hardware_file);
  if (!o.bandwidth.empty()) h.link.set_bandwidth(parse_bandwidth("--bandwidth", o.bandwidth));
  if (o.reads_in_flight != 0) h.link.reads_in_flight = o.reads_in_flight;
  if (o.decode_team_fraction >= 0) {
    if (!h.solo)
      bad_flag("--decode-team-fraction",
               "needs a hardware file with \"solo\" (one-thread rates: moe-calibrate writes them)");
    h.decode_team_fraction = o.decode_team_fraction;
  }
  return h;
}

/// Traces `--compare` runs on: bench/traces/ of the repository, then the shared Mixtral traces;
/// without the shared data (or with `synthetic`), the bundled synthetic Mixtral trace.
std::vector<RoutingTrace> compare_traces(std::vector<std::string>& notes, bool synthetic,
                                         ExpertDims& dims) {
  std::vector<RoutingTrace> out;
  const fs::path repo(MOEKIT_SOURCE_DIR);
  const fs::path bench = repo / "bench" / "traces";
  if (fs::is_directory(bench)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(bench))
      if (e.is_regular_file() &&
          (e.path().extension() == ".mktrace" || e.path().extension() == ".jsonl"))
        files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      out.push_back(load_trace(f.string()));
      read_sidecar_dims(f, out.back().name(), dims);
    }
  } else {
    notes.push_back("no engine traces yet (" + bench.string() + " does not exist)");
  }
  const fs::path shared = repo.parent_path() / "shared" / "data" / "traces" / "mixtral-8x7b";
  // GSM8K decode (per-layer order) and HumanEval in forward order (aligned, with prefill); the
  // HumanEval decode file is the same run as the latter.
  bool shared_found = false;
  for (const char* f : {"gsm8k-p0-p1.decode.jsonl", "humaneval-p0.prefill-decode.raw.jsonl"}) {
    const fs::path p = shared / f;
    if (fs::exists(p))
      out.push_back(load_mixtral(p.string())), shared_found = true;
    else
      notes.push_back("shared trace not found: " + p.string());
  }
  if (!shared_found || synthetic) {
    out.push_back(bundled_synthetic_trace());
    notes.push_back("added the bundled SYNTHETIC Mixtral trace (generated now from data/stats)");
  }
  return out;
}

struct Row {
  std::string trace, preset, sweep_param, sweep_value;
  std::string label, note, reference;  ///< what ran, why a substitute ran, its reference row
  double x = 0;                        ///< plot abscissa
  std::size_t budget_bytes = 0, budget_slots = 0;
  double budget_percent = 0;
  std::string hardware;
  double bandwidth = 0, t1 = 0, t2 = 0, gamma = 0;
  ReplayReport rep;
};

void print_table(const std::vector<Row>& rows, bool show_sweep) {
  std::printf("%-26s %-9s %s%8s %9s %10s %9s %9s %9s %11s %10s\n", "trace", "policy",
              show_sweep ? "       value " : "", "budget", "hit rate", "misses", "penalty",
              "GB moved", "stall s", "decode t/s", "prefill ms");
  for (const Row& r : rows) {
    std::string t = r.trace.substr(r.trace.find_last_of('/') + 1);  // the file name
    if (t.size() > 26) t = t.substr(0, 26);
    std::printf("%-26s %-9s ", t.c_str(), r.preset.c_str());
    if (show_sweep) std::printf("%12s ", r.sweep_value.c_str());
    std::printf("%7.1f%% %8.1f%% %10llu %9.1f %9.2f %9.3f %11.2f %10.1f\n", r.budget_percent,
                100.0 * r.rep.hit_rate(), static_cast<unsigned long long>(r.rep.misses()),
                r.rep.miss_penalty(), double(r.rep.bytes_moved()) / 1e9, r.rep.stall_s,
                r.rep.decode_tokens_per_s(), 1e3 * r.rep.prefill_latency_s());
  }
}

/// Penalty of the row named `ref` on the same trace and sweep value (0 if absent).
double reference_penalty(const std::vector<Row>& rows, const Row& r, const std::string& ref) {
  for (const Row& x : rows)
    if (x.trace == r.trace && x.sweep_value == r.sweep_value && x.preset == ref)
      return x.rep.miss_penalty();
  return 0;
}

/// A trace's name for tables: the file name, or a synthetic trace's "synthetic:<model>".
std::string short_name(const std::string& name) {
  std::string n = name.substr(0, name.find(" ("));
  return n.substr(n.find_last_of('/') + 1);
}

/// The --compare table: per trace, each preset and reference with the headline metrics.
void print_compare(const std::vector<Row>& rows) {
  std::printf("%-9s %-15s %7s %9s %8s %8s %9s %7s %7s %10s\n", "trace", "policy", "miss %",
              "penalty", "/belady", "/ref", "GB moved", "pf prec", "pf rec", "decode t/s");
  std::string last;
  for (const Row& r : rows) {
    const std::string t = short_name(r.trace);
    if (t != last) {
      std::printf("-- %s%s\n", t.c_str(), r.rep.synthetic ? "  [SYNTHETIC]" : "");
      last = t;
    }
    const double miss = r.rep.pipeline.demands
                            ? 100.0 * double(r.rep.misses()) / double(r.rep.pipeline.demands)
                            : 0.0;
    const double bel = reference_penalty(rows, r, "belady");
    const double ref = reference_penalty(rows, r, r.reference);
    auto ratio = [](double a, double b) {
      char buf[16];
      if (b > 0)
        std::snprintf(buf, sizeof buf, "%.2f", a / b);
      else
        std::snprintf(buf, sizeof buf, "-");
      return std::string(buf);
    };
    const auto& pr = r.rep.pipeline.prediction[1];
    const bool predicts = pr.true_positive + pr.false_positive > 0;
    std::printf(
        "%-9s %-15s %6.1f%% %9.1f %8s %8s %9.2f %7s %7s %10.2f\n", "", r.preset.c_str(), miss,
        r.rep.miss_penalty(), ratio(r.rep.miss_penalty(), bel).c_str(),
        ratio(r.rep.miss_penalty(), ref).c_str(), double(r.rep.bytes_moved()) / 1e9,
        predicts ? (std::to_string(int(std::lround(100 * pr.precision()))) + "%").c_str() : "-",
        predicts ? (std::to_string(int(std::lround(100 * pr.recall()))) + "%").c_str() : "-",
        r.rep.decode_tokens_per_s());
  }
}

std::string csv_of(const std::vector<Row>& rows) {
  std::vector<std::string> header = {
      "trace",        "synthetic",    "preset",         "label",
      "sweep_param",  "sweep_value",  "hardware",       "bandwidth_bytes_per_s",
      "budget_bytes", "budget_slots", "budget_percent", "t1",
      "t2",           "gamma"};
  const std::vector<std::string> metrics = {"demands",
                                            "hits",
                                            "misses",
                                            "hit_rate",
                                            "miss_penalty",
                                            "skipped",
                                            "host_cpu_runs",
                                            "bytes_moved",
                                            "wasted_bytes",
                                            "late_bytes",
                                            "total_s",
                                            "stall_s",
                                            "compute_s",
                                            "decode_tokens_per_s",
                                            "prefill_latency_s",
                                            "records_missing",
                                            "layer_calls_unrouted"};
  header.insert(header.end(), metrics.begin(), metrics.end());
  for (int d = 1; d <= 3; ++d) {
    header.push_back("precision_d" + std::to_string(d));
    header.push_back("recall_d" + std::to_string(d));
  }
  CsvTable csv(header);
  for (const Row& r : rows) {
    const nlohmann::json j = report_json(r.rep);
    std::vector<std::string> f = {r.trace,
                                  r.rep.synthetic ? "1" : "0",
                                  r.preset,
                                  r.label,
                                  r.sweep_param,
                                  r.sweep_value,
                                  r.hardware,
                                  CsvTable::num(r.bandwidth),
                                  std::to_string(r.budget_bytes),
                                  std::to_string(r.budget_slots),
                                  CsvTable::num(r.budget_percent),
                                  CsvTable::num(r.t1),
                                  CsvTable::num(r.t2),
                                  CsvTable::num(r.gamma)};
    for (const auto& m : metrics)
      f.push_back(j[m].is_number_float() ? CsvTable::num(j[m].get<double>()) : j[m].dump());
    for (std::size_t d = 1; d <= 3; ++d) {
      f.push_back(CsvTable::num(r.rep.pipeline.prediction[d].precision()));
      f.push_back(CsvTable::num(r.rep.pipeline.prediction[d].recall()));
    }
    csv.add_row(f);
  }
  return csv.text();
}

// A sweep's output file, written to a temporary file renamed into place (a full disk leaves
// nothing behind); an existing file is replaced only with --force.
void write_text(const std::string& path, const std::string& text, bool force) {
  moekit::io::write_text_atomically(path, text, force, "--out");
}

// The files a sweep writes: the CSV, and one SVG per trace (a PNG beside each when a converter
// is installed, tools/svg_plot.hpp).
std::vector<std::string> sweep_paths(const std::string& prefix, std::size_t n_traces) {
  std::vector<std::string> out{prefix + ".csv"};
  for (std::size_t ti = 0; ti < n_traces; ++ti)
    out.push_back(n_traces == 1 ? prefix + ".svg" : prefix + "-" + std::to_string(ti) + ".svg");
  return out;
}

/// The names of the presets moe-sim replays, separated by `sep`.
std::string preset_names(std::string_view sep) {
  std::string out;
  for (const SimEntry& p : sim_presets())
    out += (out.empty() ? "" : std::string(sep)) + std::string(p.name);
  return out;
}

/// The presets `--preset` names: one of the registry's (looked up once), or "all" of those moe-sim
/// replays.
std::vector<const SimEntry*> chosen_presets(const std::string& name) {
  std::vector<const SimEntry*> out;
  if (name == "all") {
    for (const SimEntry& p : sim_presets()) out.push_back(&p);
    return out;
  }
  const presets::PresetEntry* preset = presets::find(name);
  if (!preset)
    bad_flag("--preset", "unknown preset '" + name + "' (" + preset_names(", ") + ", all)");
  const SimEntry* sim = sim_preset(*preset);
  if (!sim)
    bad_flag("--preset",
             "moe-sim does not replay preset '" + name + "' (" + preset_names(", ") + ", all)");
  out.push_back(sim);
  return out;
}

/// The simulated machine and the model's storage: --hardware and what overrides or completes it.
void add_machine_flags(CLI::App& app, Options& o) {
  app.add_option("--hardware", o.hardware,
                 "rtx4090-pcie4|jetson-orin-ssd|rtx3090-pcie3|rtx4080-pcie4|"
                 "quadro-rtx6000-pcie3|this_machine (default rtx4090-pcie4)");
  app.add_option("--hardware-file", o.hardware_file,
                 "JSON for --hardware this_machine (written by moe-calibrate)");
  app.add_option("--bandwidth", o.bandwidth,
                 "override the link bandwidth (e.g. 16GB/s; with an expert store's path, "
                 "it and the disk scale by the same factor)");
  app.add_option("--precision", o.precision, "the model's own (base) precision (default f16)");
  app.add_option("--dense-precision", o.dense_precision,
                 "what the dense matrices (attention, router) are stored at (default bf16; "
                 "moe-run's --json says dense_precision)");
  app.add_option("--group-size", o.group_size,
                 "weights per scale of the quantized experts: 0 (per output channel), 32, 64, "
                 "128; default: the preset's codec (per channel for edgemoe, else 32). moe-run's "
                 "--json says expert_group_size: experts read in place keep the file's (Q4_0: 32)")
      ->check(CLI::IsMember({0, 32, 64, 128}));
  app.add_option("--reads-in-flight", o.reads_in_flight,
                 "transfers the link runs at once, sharing its bandwidth (default: the "
                 "hardware's; 1 for the paper presets)")
      ->check(CLI::Range(1u, LinkModel::max_reads_in_flight));
  app.add_option("--decode-team-fraction", o.decode_team_fraction,
                 "share of decode steps run on all threads, the rest at the hardware file's "
                 "one-thread (\"solo\") rates (default: the file's; moe-run's --json says "
                 "decode_steps_on_all_threads)")
      ->check(CLI::Range(0.0, 1.0));
}

void add_flags(CLI::App& app, Options& o) {
  app.add_option("--trace", o.traces, "trace file: moekit binary (.mktrace) or JSONL");
  app.add_option("--import-mixtral", o.mixtral,
                 "shared Mixtral JSONL trace (*.decode.jsonl or *.prefill-decode.raw.jsonl)");
  app.add_option("--preset", o.preset, preset_names("|") + "|all (default " + o.preset + ")");
  app.add_option("--budget", o.budget,
                 "expert cache: slots (128), bytes (24GiB, 1.5e9B) or share of experts (50%)");
  add_machine_flags(app, o);
  // Bounded so that an expert's bytes (3·hidden·ffn·4) cannot overflow.
  app.add_option("--hidden", o.hidden, "expert hidden size, for traces not shaped like Mixtral")
      ->check(CLI::Range(0u, 1u << 20));
  app.add_option("--ffn", o.ffn, "expert ffn size, for traces not shaped like Mixtral")
      ->check(CLI::Range(0u, 1u << 20));
  app.add_option("--t1", o.t1, "HOBBIT T1 (presets that use it)");
  app.add_option("--t2", o.t2, "HOBBIT T2 (presets that use it)");
  app.add_option("--gamma", o.gamma,
                 "MoBiLE gamma, in [0, 1] (needs output logits, which traces do not store)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--fallback-ratio", o.fallback_ratio,
                 "MoBiLE: share of decode tokens that fall back (default 0.1375, MoBiLE Table II)");
  app.add_option("--replay-accuracy", o.replay_accuracy,
                 "MoBiLE: share of the little pass's plan in the big pass's top-K, standing in for "
                 "the real little pass (default 0.8, MoBiLE \"more than 80%\")");
  app.add_option("--big-pass", o.big_pass,
                 "MoBiLE's big pass: little-plan (runs the little pass's plan, the paper) or "
                 "recompute (re-routes; the plan is only prefetched)")
      ->check(CLI::IsMember({"little-plan", "recompute"}));
  app.add_option("--hobbit-recall", o.hobbit_recall,
                 "noisy-oracle recall standing in for HOBBIT's stacked gate: paper (default: "
                 "top-1 0.96,0.90,0.90 at +1,+2,+3, the lower ranks assumed equal), measured "
                 "(moekit's stacked gate on its default model), R1[,R2[,R3]] for every rank, or "
                 "TOP1,../LOWER,.. for the top-1 and ranks 2+");
  app.add_option("--hobbit-high-pool", o.hobbit_high_pool,
                 "HOBBIT: share of the cache's slots in the high-precision pool (default 0.69: "
                 "the paper's 67 : 30 split of high and low decisions; 0.5: equal)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--fate-recall", o.fate_recall,
                 "noisy-oracle recall standing in for Fate's cross-layer gate (default 0.9715)");
  app.add_option("--fate-staging-slots", o.fate_staging_slots,
                 "Fate: prefetch staging slots, taken from the budget (default 0: one per expert "
                 "of a layer, at most half the budget's slots); a prefetch waits for a free one")
      ->check(CLI::Range(0u, 1u << 16));
  app.add_option("--seed", o.seed, "noisy-oracle seed (default 1)");
  app.add_option("--missing-records", o.missing_records,
                 "a trace's missing records: fill (the previous token's at that layer, as moe-run "
                 "--routing-trace does) or skip (no expert for that token; default fill)")
      ->check(CLI::IsMember({"fill", "skip"}));
  app.add_option("--replay-slice", o.replay_slice,
                 "PROMPT,DECODE: replay the tokens moe-run --routing-trace replays with a "
                 "PROMPT-token prompt and DECODE decode tokens (the rest calibrates); default: "
                 "the second half of each trace, the first calibrating")
      ->delimiter(',')
      ->expected(2);
  app.add_option("--routers", o.routers,
                 "router weights (.npy [L,E,H] or safetensors): HOBBIT/Fate run their real gate "
                 "predictors on traces with hidden states");
  app.add_option("--bitwidths", o.bitwidths,
                 "EdgeMoE bit-width table (moekit-precision-table; default: every expert q4)");
  app.add_flag("--synthetic", o.synthetic,
               "add the bundled synthetic Mixtral trace (--compare adds it when the shared "
               "traces are absent)");
  app.add_option("--sweep", o.sweeps,
                 "PARAM=V1,V2,...: budget, bandwidth, t1, t2 or fallback (one sweep per run)");
  app.add_option("--out", o.out, "file prefix of the sweep's CSV and SVG (default moe-sim-sweep)");
  app.add_flag("--force", o.force, "overwrite the sweep's existing CSV, SVG and PNG files");
  app.add_flag("--log-y", o.log_y, "the sweep's plots with a log y axis");
  app.add_flag("--json", o.json, "print JSON instead of the table");
  app.add_flag("--compare", o.compare,
               "every available preset + Belady on the repository's and the shared traces");
  app.add_flag("--no-belady", o.no_belady, "leave out the Belady reference");
  app.add_flag("--list", o.list, "list presets and hardware models, then exit");
}

void print_list() {
  std::printf("presets:\n");
  for (const SimEntry& p : sim_presets())
    std::printf("  %-14s %s\n", std::string(p.name).c_str(), std::string(p.what).c_str());
  std::printf("references:\n  %-14s %s\n", "belady", std::string(belady_entry.what).c_str());
  for (const auto& p : cost_aware_table)
    std::printf("  %-14s %s\n", std::string(p.name).c_str(), std::string(p.what).c_str());
  std::printf("hardware:\n");
  for (const auto& n : hardware_preset_names())
    std::printf("  %-21s %s\n", n.c_str(), hardware_preset(n).source.c_str());
  std::printf("  %-21s measured by moe-calibrate; needs --hardware-file\n", "this_machine");
}

/// The flags that hold for every run, checked and read.
struct Setup {
  Options o;
  Precision base = Precision::f16;
  Precision dense = Precision::bf16;
  std::optional<Sweep> sweep;
  BudgetSpec budget;
  HardwareModel hw;
  std::shared_ptr<const PrecisionTable> bitwidths;
};

Setup setup_of(const Options& o) {
  for (auto [flag, v] :
       {std::pair{"--fate-recall", o.fate_recall}, std::pair{"--fallback-ratio", o.fallback_ratio},
        std::pair{"--replay-accuracy", o.replay_accuracy}})
    if (!(v >= 0 && v <= 1)) bad_flag(flag, "must be in [0, 1]");
  (void)parse_hobbit_recall(o.hobbit_recall);  // refuses a bad one before any trace is read
  for (auto [flag, path] :
       {std::pair<const char*, const std::string&>{"--hardware-file", o.hardware_file},
        {"--routers", o.routers},
        {"--bitwidths", o.bitwidths}})  // /dev/zero would be read without end
    if (!path.empty() && fs::exists(path) && !fs::is_regular_file(path))
      bad_flag(flag, "'" + path + "' is not a regular file (a directory, device or pipe)");
  Setup s;
  s.o = o;
  if (!o.bitwidths.empty())
    s.bitwidths = std::make_shared<const PrecisionTable>(PrecisionTable::load(o.bitwidths));
  const auto base = parse_precision(o.precision);
  if (!base || *base == Precision::skip)
    bad_flag("--precision", "unknown precision '" + o.precision + "'");
  s.base = *base;
  const auto dense = parse_precision(o.dense_precision);
  if (!dense || std::find(std::begin(all_precisions), std::end(all_precisions), *dense) ==
                    std::end(all_precisions))
    bad_flag("--dense-precision", "unknown precision '" + o.dense_precision + "'");
  s.dense = *dense;
  if (!o.replay_slice.empty() && o.replay_slice[0] + o.replay_slice[1] == 0)
    bad_flag("--replay-slice", "replays no token (give PROMPT,DECODE with a token in either)");
  if (o.sweeps.size() > 1) bad_flag("--sweep", "give one sweep per run");
  if (!o.sweeps.empty()) s.sweep = parse_sweep(o.sweeps[0]);
  s.budget = BudgetSpec::parse("--budget", o.budget);
  s.hw = hardware_for(o);
  return s;
}

/// The traces to replay, with the notes --compare makes and the expert sizes of their sidecars.
struct Traces {
  std::vector<RoutingTrace> list;
  std::vector<std::string> notes;
  ExpertDims dims;
};

Traces load_traces(const Options& o) {
  Traces t;
  if (o.compare) {
    if (!o.traces.empty() || !o.mixtral.empty())
      bad_flag("--compare", "runs on the repository's traces; do not combine with --trace");
    t.list = compare_traces(t.notes, o.synthetic, t.dims);
  } else if (o.synthetic) {
    t.list.push_back(bundled_synthetic_trace());
  }
  for (const auto& path : o.traces) {
    t.list.push_back(load_trace(path));
    read_sidecar_dims(path, t.list.back().name(), t.dims);
  }
  for (const auto& path : o.mixtral) t.list.push_back(load_mixtral(path));
  if (t.list.empty())
    bad_flag("--trace", o.compare ? "no traces found for --compare"
                                  : "give --trace, --import-mixtral or --compare");
  if (o.missing_records == "fill")
    for (RoutingTrace& tr : t.list)
      if (const std::size_t n = moekit::sim::fill_missing_records(tr); n > 0)
        t.notes.push_back(tr.name() + ": " + std::to_string(n) +
                          " missing records filled with the previous token's at that layer "
                          "(--missing-records skip leaves them out)");
  return t;
}

/// The presets `preset` names that the sweep applies to, then the references to score them
/// against (`with_belady` says whether they run).
std::vector<const SimEntry*> chosen_runs(const std::string& preset,
                                         const std::optional<Sweep>& sweep, bool no_belady,
                                         bool& with_belady) {
  std::vector<const SimEntry*> chosen = chosen_presets(preset);
  if (sweep && (sweep->param == "t1" || sweep->param == "t2" || sweep->param == "fallback")) {
    const bool t = sweep->param != "fallback";
    std::vector<const SimEntry*> keep;
    for (const auto* p : chosen)
      if (t ? p->uses_t1_t2 : p->uses_fallback) keep.push_back(p);
    if (keep.empty()) {
      std::string to;
      for (const SimEntry& p : sim_presets())
        if (t ? p.uses_t1_t2 : p.uses_fallback)
          to += (to.empty() ? "" : ", ") + std::string(p.name);
      bad_flag("--sweep",
               sweep->param + " applies to " + to + ", which is not among the chosen presets");
    }
    chosen = keep;
  }
  with_belady = !no_belady && (!sweep || sweep->param == "budget" || sweep->param == "bandwidth" ||
                               sweep->param == "t1" || sweep->param == "t2");
  if (with_belady) {
    // Belady, and the cost-aware reference of each mixed-precision preset (T1/T2 sweeps: only
    // the latter, whose precisions follow T1/T2).
    std::vector<const SimEntry*> refs;
    if (!sweep || (sweep->param != "t1" && sweep->param != "t2")) refs.push_back(&belady_entry);
    for (const auto* p : chosen)
      if (p->reference != "belady")
        if (const SimEntry* r = find_reference(p->reference);
            r && std::find(refs.begin(), refs.end(), r) == refs.end())
          refs.push_back(r);  // once, however many presets it is the reference of
    chosen.insert(chosen.end(), refs.begin(), refs.end());
  }
  if (chosen.empty()) bad_flag("--preset", "no available preset to run");
  return chosen;
}

/// One trace at one sweep value: the presets' parameters, and what the rows say about them.
struct Point {
  RunParams rp;
  double x = 0;         ///< plot abscissa
  double percent = 0;   ///< the budget as a share of all experts
  std::size_t one = 0;  ///< bytes of one expert at the base precision
};

Point point_of(const Setup& s, const RoutingTrace& tr, const ModelShape& shape,
               const ComputeModel& compute, const ExpertDims& dims, const std::string& v) {
  const Options& o = s.o;
  const std::optional<Sweep>& sweep = s.sweep;
  Point pt;
  RunParams& rp = pt.rp;
  rp.shape = shape;
  if (o.group_size >= 0) {
    rp.shape.quant.group_size = static_cast<std::uint32_t>(o.group_size);
    rp.group_size_given = true;
  }
  rp.link = s.hw.link;
  rp.compute = compute;
  rp.t1 = o.t1, rp.t2 = o.t2, rp.gamma = o.gamma;
  rp.hobbit_recall = parse_hobbit_recall(o.hobbit_recall), rp.fate_recall = o.fate_recall;
  rp.fate_staging_slots = o.fate_staging_slots;
  rp.hobbit_high_slots = o.hobbit_high_pool;
  rp.fallback_ratio = o.fallback_ratio, rp.seed = o.seed;
  rp.replay_accuracy = o.replay_accuracy;
  rp.big_pass = o.big_pass == "recompute" ? moekit::RouterReplayPredictor::BigPass::recompute
                                          : moekit::RouterReplayPredictor::BigPass::little_plan;
  rp.bitwidths = s.bitwidths;
  std::string routers = o.routers;  // else the recorded model's own, from the sidecar
  if (const auto it = dims.find(tr.name()); routers.empty() && it != dims.end())
    routers = it->second.routers;
  if (!routers.empty() && tr.has_hidden())  // read once per trace shape
    rp.routers = std::make_shared<const std::vector<float>>(
        load_routers(routers, shape.n_layers, shape.n_experts));
  BudgetSpec b = s.budget;
  double& x = pt.x;
  if (sweep && sweep->param == "budget") b = BudgetSpec::parse("--sweep budget", v);
  if (sweep && sweep->param == "bandwidth")
    rp.link.set_bandwidth(x = parse_bandwidth("--sweep bandwidth", v));
  if (sweep && sweep->param == "t1") rp.t1 = x = parse_quantity("--sweep t1", v, {});
  if (sweep && sweep->param == "t2") rp.t2 = x = parse_quantity("--sweep t2", v, {});
  if (sweep && sweep->param == "fallback") {
    rp.fallback_ratio = x = parse_quantity("--sweep fallback", v, {});
    if (x > 1) bad_flag("--sweep fallback", "a ratio must be in [0, 1]");
  }
  rp.config.base_precision = s.base;
  rp.config.expert_budget_bytes = b.bytes(shape, s.base);
  pt.one = shape.expert_bytes(s.base);
  const std::size_t one = pt.one;
  if (rp.config.expert_budget_bytes < std::size_t{shape.top_k} * one)
    bad_flag(sweep && sweep->param == "budget" ? "--sweep budget" : "--budget",
             "'" + b.text + "' gives " + std::to_string(rp.config.expert_budget_bytes) +
                 " bytes; a token needs top_k = " + std::to_string(shape.top_k) + " experts of " +
                 std::to_string(one) + " bytes at " + std::string(name(s.base)) + " (" +
                 std::to_string(shape.top_k * one) + " bytes = " + std::to_string(shape.top_k) +
                 " slots)");
  pt.percent = 100.0 * double(rp.config.expert_budget_bytes / one) / double(shape.expert_count());
  if (sweep && sweep->param == "budget") x = pt.percent;
  return pt;
}

/// The row of preset `p` at point `pt` of trace `tr`, before it runs.
Row row_of(const Setup& s, const RoutingTrace& tr, const std::string& v, const Point& pt,
           const SimEntry& p) {
  Row r;
  r.trace = tr.name();
  r.preset = std::string(p.name);
  r.sweep_param = s.sweep ? s.sweep->param : "";
  r.sweep_value = v;
  r.x = pt.x;
  r.budget_bytes = pt.rp.config.expert_budget_bytes;
  r.budget_slots = pt.rp.config.expert_budget_bytes / pt.one;
  r.budget_percent = pt.percent;
  r.hardware = s.hw.name;
  r.bandwidth = pt.rp.link.bandwidth_bytes_per_s;
  r.t1 = pt.rp.t1, r.t2 = pt.rp.t2, r.gamma = pt.rp.gamma;
  r.reference = std::string(p.reference);
  return r;
}

/// Every chosen preset on every trace at every sweep value; a preset that cannot run on a trace
/// is listed in `unavailable` instead.
std::vector<Row> run_all(const Setup& s, const Traces& t,
                         const std::vector<const SimEntry*>& chosen,
                         std::vector<std::string>& unavailable,
                         std::vector<std::string>& calibration) {
  const std::vector<std::string> values = s.sweep ? s.sweep->values : std::vector<std::string>{""};
  const std::size_t total = t.list.size() * values.size() * chosen.size();
  tools::Progress bar("moe-sim", total, tools::ProgressUnit::items, s.o.json);
  std::vector<Row> rows;
  std::size_t done = 0;
  for (const RoutingTrace& whole : t.list) {
    // Calibration is not evaluation: every run replays the second half of the trace (or
    // --replay-slice's tokens); the rest calibrates the presets that profile routing.
    CalibrationSplit split =
        s.o.replay_slice.empty()
            ? split_for_calibration(whole)
            : slice_like_routing_replay(whole, s.o.replay_slice[0], s.o.replay_slice[1]);
    const RoutingTrace& tr = split.evaluation;
    const auto cal = std::make_shared<const RoutingTrace>(std::move(split.calibration));
    calibration.push_back(tr.name() + ": " + split.text);
    const ModelShape shape = shape_for(tr, s.o, t.dims);
    const ComputeModel compute = s.hw.compute_model(shape, dense_for(shape, s.dense));
    for (const std::string& v : values) {
      Point pt = point_of(s, tr, shape, compute, t.dims, v);
      pt.rp.calibration = cal;
      for (const SimEntry* p : chosen) {
        bar.update(done, short_name(tr.name()) + " " + std::string(p->name) + " " + v);
        Row r = row_of(s, tr, v, pt, *p);
        ++done;
        try {
          PresetResult res = p->run(pt.rp, tr);
          r.rep = std::move(res.report);
          r.label = std::move(res.label);
          r.note = std::move(res.note);
        } catch (const moekit::Error& e) {  // a preset that cannot run here: say so, go on
          unavailable.push_back(std::string(p->name) + " on " + tr.name() + ": failed (" +
                                e.message() + ")");
          continue;
        }
        rows.push_back(std::move(r));
      }
    }
  }
  bar.update(done);
  bar.finish();
  return rows;
}

/// The plot family of each run: a preset's own name, a reference that of the first chosen preset it
/// is the reference of (its colour, dashed), else its own (Belady's optimum).
std::vector<tools::PlotSeries> plot_series_of(const std::vector<const SimEntry*>& chosen) {
  std::vector<tools::PlotSeries> out;
  for (const SimEntry* p : chosen) {
    if (std::any_of(out.begin(), out.end(), [&](const auto& s) { return s.name == p->name; }))
      continue;  // one line per name
    tools::PlotSeries ps{std::string(p->name), {}, {}, std::string(p->name), p->preset == nullptr};
    if (ps.reference)
      for (const SimEntry* q : chosen)
        if (q->preset != nullptr && q->reference == p->name) {
          ps.family = std::string(q->name);
          break;
        }
    out.push_back(std::move(ps));
  }
  return out;
}

/// The sweep's CSV and one SVG (and PNG) per trace; returns the files written, and adds to
/// `notes` why a PNG is missing.
std::vector<std::string> write_sweep(const Setup& s, const std::vector<RoutingTrace>& traces,
                                     const std::vector<const SimEntry*>& chosen,
                                     const std::vector<Row>& rows,
                                     std::vector<std::string>& notes) {
  const Sweep& sweep = *s.sweep;
  const bool by_budget = sweep.param == "budget";
  std::vector<std::string> written;
  const std::vector<std::string> paths = sweep_paths(s.o.out, traces.size());
  write_text(paths[0], csv_of(rows), s.o.force);
  written.push_back(paths[0]);
  tools::PlotSpec spec;
  spec.x_label = by_budget
                     ? "expert cache (% of all experts)"
                     : (sweep.param == "bandwidth" ? "link bandwidth (bytes/s)" : sweep.param);
  spec.y_label =
      by_budget ? "miss penalty (full-precision-equivalent misses)" : "simulated decode tokens/s";
  spec.log_y = s.o.log_y;
  for (std::size_t ti = 0; ti < traces.size(); ++ti) {
    std::vector<tools::PlotSeries> series = plot_series_of(chosen);
    spec.x_ticks.clear();
    for (tools::PlotSeries& line : series)
      for (const Row& r : rows)
        if (r.trace == traces[ti].name() && r.preset == line.name &&
            std::find(line.x.begin(), line.x.end(), r.x) == line.x.end()) {
          line.x.push_back(r.x);
          line.y.push_back(by_budget ? r.rep.miss_penalty() : r.rep.decode_tokens_per_s());
          if (std::find(spec.x_ticks.begin(), spec.x_ticks.end(), r.x) == spec.x_ticks.end())
            spec.x_ticks.push_back(r.x);  // the sweep's own values
        }
    spec.title =
        (by_budget ? "miss penalty vs cache size: " : "decode tokens/s vs " + sweep.param + ": ") +
        short_name(traces[ti].name()) + (traces[ti].synthetic() ? " (SYNTHETIC)" : "");
    const tools::PlotFiles f = tools::write_plot(paths[ti + 1], spec, series, s.o.force);
    written.insert(written.end(), f.written.begin(), f.written.end());
    if (!f.note.empty()) notes.push_back(f.note);
  }
  return written;
}

/// What the runs produced: their rows, the presets that could not run, the files written.
struct Outcome {
  std::vector<Row> rows;
  std::vector<std::string> unavailable, written;
  std::vector<std::string> calibration;  ///< per trace: which part calibrated, which replayed
  std::vector<std::string> notes;        ///< about the files written (a PNG not made)
  bool with_belady = false;
};

void print_json(const Setup& s, const Traces& t, const Outcome& out) {
  nlohmann::json j;
  j["hardware"] = {{"name", s.hw.name}, {"source", s.hw.source}};
  j["runs"] = nlohmann::json::array();
  for (const Row& r : out.rows) {
    nlohmann::json x = report_json(r.rep);
    x["preset"] = r.preset;
    x["label"] = r.label;
    x["substitution"] = r.note;
    x["reference"] = r.reference;
    x["budget_bytes"] = r.budget_bytes;
    x["budget_slots"] = r.budget_slots;
    x["budget_percent"] = r.budget_percent;
    x["bandwidth_bytes_per_s"] = r.bandwidth;
    if (s.sweep) x["sweep"] = {{"param", r.sweep_param}, {"value", r.sweep_value}};
    j["runs"].push_back(std::move(x));
  }
  j["unavailable"] = out.unavailable;
  if (!out.with_belady) j["unavailable"].push_back("belady: left out");
  j["calibration"] = out.calibration;
  j["notes"] = t.notes;
  for (const auto& n : out.notes) j["notes"].push_back(n);
  j["files"] = out.written;
  std::cout << j.dump(2) << "\n";
}

void print_text(const Setup& s, const Traces& t, const Outcome& out, double wall) {
  if (s.hw.link.store)
    std::printf(
        "hardware: %s (link %.2f GB/s for %s in place, %.2f GB/s from the store)   wall time "
        "%.2f s\n",
        s.hw.name.c_str(), s.hw.link.bandwidth_bytes_per_s / 1e9,
        std::string(name(s.hw.link.in_place)).c_str(), s.hw.link.store->bandwidth_bytes_per_s / 1e9,
        wall);
  else
    std::printf("hardware: %s (link %.1f GB/s)   wall time %.2f s\n", s.hw.name.c_str(),
                s.hw.link.bandwidth_bytes_per_s / 1e9, wall);
  if (s.o.compare && !s.sweep) {
    std::printf(
        "budget %s of the experts; penalty = HOBBIT miss penalty (a miss at the base "
        "precision counts 1, lower precisions bits/base bits); /belady = penalty / "
        "Belady's; /ref = penalty / the preset's reference (cost-aware Belady with the "
        "same precisions for mixed-precision presets); pf prec/rec = prefetch "
        "precision/recall at distance 1\n",
        s.budget.text.c_str());
    print_compare(out.rows);
  } else {
    print_table(out.rows, s.sweep.has_value());
  }
  // What ran, per preset: the label (and any substitution) of its first run on each trace.
  std::vector<std::string> said;
  for (const Row& r : out.rows) {
    const std::string line = r.preset + " = " + r.label + (r.note.empty() ? "" : " — " + r.note);
    if (r.label == r.preset && r.note.empty()) continue;
    if (std::find(said.begin(), said.end(), line) != said.end()) continue;
    said.push_back(line);
  }
  for (const auto& l : said) std::printf("%s\n", l.c_str());
  for (const RoutingTrace& tr : t.list)
    if (tr.synthetic()) std::printf("note: %s is SYNTHETIC routing\n", tr.name().c_str());
  for (const auto& u : out.unavailable) std::printf("%s\n", u.c_str());
  for (const auto& c : out.calibration) std::printf("calibration: %s\n", c.c_str());
  for (const auto& n : t.notes) std::printf("note: %s\n", n.c_str());
  for (const auto& n : out.notes) std::printf("note: %s\n", n.c_str());
  for (const auto& w : out.written) std::printf("wrote %s\n", w.c_str());
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{
      "moe-sim: replay routing traces through moekit's offloading presets on a "
      "simulated machine, scored against Belady's optimum"};
  add_flags(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (o.list) {
    print_list();
    return 0;
  }
  const Setup s = setup_of(o);
  const Traces t = load_traces(o);
  if (s.sweep && (o.out.empty() || o.out.back() == '/' || fs::is_directory(o.out)))
    bad_flag("--out", "'" + o.out + "' is a directory or empty; give a file prefix (e.g. " +
                          (o.out.empty() ? std::string("sweep")
                                         : o.out + (o.out.back() == '/' ? "" : "/") + "sweep") +
                          ": writes sweep.csv and sweep.svg)");
  if (s.sweep)  // before the runs: a sweep is not spent to find its files unwritable
    for (const std::string& p : sweep_paths(o.out, t.list.size())) {
      moekit::io::check_output_path(p, o.force, "--out");
      if (p.ends_with(".svg"))
        moekit::io::check_output_path(tools::png_path_of(p), o.force, "--out");
    }
  Outcome out;
  const std::vector<const SimEntry*> chosen =
      chosen_runs(o.compare ? "all" : o.preset, s.sweep, o.no_belady, out.with_belady);
  const auto t_wall = std::chrono::steady_clock::now();
  out.rows = run_all(s, t, chosen, out.unavailable, out.calibration);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_wall).count();
  if (s.sweep) out.written = write_sweep(s, t.list, chosen, out.rows, out.notes);
  if (o.json)
    print_json(s, t, out);
  else
    print_text(s, t, out, wall);
  if (out.rows.empty()) {  // nothing was simulated: not a success
    std::fprintf(stderr, "moe-sim: every run failed or was unavailable (listed above)\n");
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const moekit::Error& e) {
    std::fprintf(stderr, "moe-sim: %s\n", e.message().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-sim: %s\n", e.what());
    return 2;
  }
}
