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
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/sim/hardware.hpp"
#include "moekit/sim/replay.hpp"
#include "moekit/sim/report.hpp"
#include "moekit/sim/trace.hpp"
#include "moekit/sim/trace_binary.hpp"
#include "moekit/sim/trace_jsonl.hpp"

#include "preset_table.hpp"

#ifndef MOEKIT_SOURCE_DIR
#define MOEKIT_SOURCE_DIR "."
#endif

namespace fs = std::filesystem;
using namespace moekit;
using namespace moekit::sim;
using namespace moe_sim;

namespace {

[[noreturn]] void bad_flag(const std::string& flag, const std::string& why) {
  moekit::detail::fail(ErrorKind::invalid_argument, flag + ": " + why);
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
                             {{"b", 1.0}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
                              {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}},
                             &unit);
    b.kind = unit.empty() ? Kind::slots : Kind::bytes;
    if (b.kind == Kind::slots && b.value != std::floor(b.value))
      bad_flag(flag, "a slot count must be a whole number (use a unit for bytes, % for a share)");
    if (b.value <= 0) bad_flag(flag, "budget must be > 0");
    return b;
  }
  /// Bytes for `shape` at `base` precision.
  [[nodiscard]] std::size_t bytes(const ModelShape& shape, Precision base) const {
    const std::size_t one = shape.expert_bytes(base);
    switch (kind) {
      case Kind::slots: return static_cast<std::size_t>(value) * one;
      case Kind::bytes: return static_cast<std::size_t>(value);
      case Kind::percent:
        return static_cast<std::size_t>(
                   std::floor(double(shape.expert_count()) * value / 100.0 + 1e-9)) * one;
    }
    return 0;
  }
};

double parse_bandwidth(const std::string& flag, const std::string& s) {
  const double v = parse_quantity(flag, s,
                                  {{"b/s", 1.0}, {"kb/s", 1e3}, {"mb/s", 1e6}, {"gb/s", 1e9},
                                   {"mib/s", 1048576.0}, {"gib/s", 1073741824.0}});
  if (v <= 0) bad_flag(flag, "bandwidth must be > 0");
  return v;
}

/// A sweep "param=v1,v2,...".
struct Sweep {
  std::string param;  ///< budget | bandwidth | t1 | t2 | gamma
  std::vector<std::string> values;
};

Sweep parse_sweep(const std::string& s) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
    bad_flag("--sweep", "expected PARAM=V1,V2,... (e.g. budget=25%,50%,75%), got '" + s + "'");
  Sweep w;
  w.param = s.substr(0, eq);
  if (w.param != "budget" && w.param != "bandwidth" && w.param != "t1" && w.param != "t2" &&
      w.param != "gamma")
    bad_flag("--sweep", "unknown parameter '" + w.param + "' (budget, bandwidth, t1, t2, gamma)");
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
  std::ifstream f(path, std::ios::binary);
  if (!f) moekit::detail::fail(ErrorKind::io, "--trace: cannot open '" + path + "'");
  char magic[8] = {};
  f.read(magic, 8);
  if (f.gcount() == 8 && std::memcmp(magic, trace_magic, 8) == 0) return read_trace_binary(path);
  return read_trace_jsonl(path);
}

/// Reads one of the shared Mixtral JSONL traces: forward-call order ("token_pos") or per-layer
/// decode order ("token_idx").
RoutingTrace load_mixtral(const std::string& path) {
  std::ifstream f(path);
  if (!f) moekit::detail::fail(ErrorKind::io, "--import-mixtral: cannot open '" + path + "'");
  std::string first;
  std::getline(f, first);
  RoutingTrace t = first.find("\"token_pos\"") != std::string::npos ? read_mixtral_raw_jsonl(path)
                                                                    : read_mixtral_decode_jsonl(path);
  return t;
}

struct Options {
  std::vector<std::string> traces, mixtral;
  std::string preset = "baseline";
  std::string budget = "50%";
  std::string hardware = "rtx4090-pcie4";
  std::string hardware_file;
  std::string bandwidth;
  std::string precision = "f16";
  std::uint32_t hidden = 0, ffn = 0;
  std::vector<std::string> sweeps;
  std::string out = "moe-sim-sweep";
  bool json = false, compare = false, no_belady = false, list = false;
  double t1 = 0.6, t2 = 0.9, gamma = 0.7;
};

/// The model shape behind a trace: Mixtral-8x7B when the dims are its, else --hidden/--ffn.
ModelShape shape_for(const RoutingTrace& tr, const Options& o) {
  const TraceDims& d = tr.dims();
  if (o.hidden == 0 && o.ffn == 0 && d.n_layers == mixtral_8x7b.n_layers &&
      d.n_experts == mixtral_8x7b.n_experts && d.top_k == mixtral_8x7b.top_k)
    return mixtral_8x7b;
  if (o.hidden == 0 || o.ffn == 0)
    bad_flag("--hidden/--ffn", "trace '" + tr.name() + "' is not Mixtral-8x7B-shaped (" +
                                   std::to_string(d.n_layers) + " layers × " +
                                   std::to_string(d.n_experts) + " experts, top-" +
                                   std::to_string(d.top_k) +
                                   "): give the expert's hidden and ffn sizes");
  ModelShape s{.n_layers = d.n_layers, .n_experts = d.n_experts, .top_k = d.top_k,
               .hidden = o.hidden, .ffn = o.ffn};
  s.validate();
  return s;
}

DenseLayerShape dense_for(const ModelShape& s) {
  if (s == mixtral_8x7b) return mixtral_8x7b_dense();
  // Not Mixtral: assume multi-head attention (4·d² projections) plus the router.
  return DenseLayerShape{4ull * s.hidden * s.hidden + std::uint64_t{s.n_experts} * s.hidden,
                         Precision::bf16};
}

HardwareModel hardware_for(const Options& o) {
  std::string name = o.hardware;
  if (name == "orin-ssd") name = "jetson-orin-ssd";
  if (name == "this-machine") name = "this_machine";
  if (name == "this_machine" && o.hardware_file.empty())
    bad_flag("--hardware this-machine", "needs --hardware-file (the JSON the calibration "
                                        "command writes)");
  HardwareModel h = hardware_preset(name, o.hardware_file);
  if (!o.bandwidth.empty()) h.link.bandwidth_bytes_per_s = parse_bandwidth("--bandwidth", o.bandwidth);
  return h;
}

/// Traces `--compare` runs on: bench/traces/ of the repository, then the shared Mixtral traces.
std::vector<RoutingTrace> compare_traces(std::vector<std::string>& notes) {
  std::vector<RoutingTrace> out;
  const fs::path repo(MOEKIT_SOURCE_DIR);
  const fs::path bench = repo / "bench" / "traces";
  if (fs::is_directory(bench)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(bench))
      if (e.is_regular_file() && (e.path().extension() == ".mktrace" ||
                                  e.path().extension() == ".jsonl"))
        files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) out.push_back(load_trace(f.string()));
  } else {
    notes.push_back("no engine traces yet (" + bench.string() + " does not exist)");
  }
  const fs::path shared = repo.parent_path() / "shared" / "data" / "traces" / "mixtral-8x7b";
  // GSM8K decode (per-layer order) and HumanEval in forward order (aligned, with prefill); the
  // HumanEval decode file is the same run as the latter.
  for (const char* f : {"gsm8k-p0-p1.decode.jsonl", "humaneval-p0.prefill-decode.raw.jsonl"}) {
    const fs::path p = shared / f;
    if (fs::exists(p)) out.push_back(load_mixtral(p.string()));
    else notes.push_back("shared trace not found: " + p.string());
  }
  return out;
}

struct Row {
  std::string trace, preset, sweep_param, sweep_value;
  double x = 0;  ///< plot abscissa
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

std::string csv_of(const std::vector<Row>& rows) {
  std::vector<std::string> header = {"trace", "synthetic", "preset", "sweep_param", "sweep_value",
                                     "hardware", "bandwidth_bytes_per_s", "budget_bytes",
                                     "budget_slots", "budget_percent", "t1", "t2", "gamma"};
  const std::vector<std::string> metrics = {
      "demands", "hits", "misses", "hit_rate", "miss_penalty", "skipped", "host_cpu_runs",
      "bytes_moved", "wasted_bytes", "late_bytes", "total_s", "stall_s", "compute_s",
      "decode_tokens_per_s", "prefill_latency_s", "records_missing", "layer_calls_unrouted"};
  header.insert(header.end(), metrics.begin(), metrics.end());
  for (int d = 1; d <= 3; ++d) {
    header.push_back("precision_d" + std::to_string(d));
    header.push_back("recall_d" + std::to_string(d));
  }
  CsvTable csv(header);
  for (const Row& r : rows) {
    const nlohmann::json j = report_json(r.rep);
    std::vector<std::string> f = {r.trace, r.rep.synthetic ? "1" : "0", r.preset, r.sweep_param,
                                  r.sweep_value, r.hardware, CsvTable::num(r.bandwidth),
                                  std::to_string(r.budget_bytes), std::to_string(r.budget_slots),
                                  CsvTable::num(r.budget_percent), CsvTable::num(r.t1),
                                  CsvTable::num(r.t2), CsvTable::num(r.gamma)};
    for (const auto& m : metrics) f.push_back(j[m].is_number_float()
                                                  ? CsvTable::num(j[m].get<double>())
                                                  : j[m].dump());
    for (std::size_t d = 1; d <= 3; ++d) {
      f.push_back(CsvTable::num(r.rep.pipeline.prediction[d].precision()));
      f.push_back(CsvTable::num(r.rep.pipeline.prediction[d].recall()));
    }
    csv.add_row(f);
  }
  return csv.text();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) moekit::detail::fail(ErrorKind::io, "cannot open '" + path + "' for writing");
  f << text;
  if (!f) moekit::detail::fail(ErrorKind::io, "write error on '" + path + "'");
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{"moe-sim: replay routing traces through moekit's offloading presets on a "
               "simulated machine, scored against Belady's optimum"};
  app.add_option("--trace", o.traces, "trace file: moekit binary (.mktrace) or JSONL");
  app.add_option("--import-mixtral", o.mixtral,
                 "shared Mixtral JSONL trace (*.decode.jsonl or *.prefill-decode.raw.jsonl)");
  app.add_option("--preset", o.preset,
                 "baseline|hobbit|fate|edgemoe|mobile|fiddler|all (default baseline)");
  app.add_option("--budget", o.budget,
                 "expert cache: slots (128), bytes (24GiB, 1.5e9B) or share of experts (50%)");
  app.add_option("--hardware", o.hardware,
                 "rtx4090-pcie4|jetson-orin-ssd (orin-ssd)|rtx3090-pcie3|rtx4080-pcie4|"
                 "quadro-rtx6000-pcie3|this-machine");
  app.add_option("--hardware-file", o.hardware_file, "JSON for --hardware this-machine");
  app.add_option("--bandwidth", o.bandwidth, "override the link bandwidth (e.g. 16GB/s)");
  app.add_option("--precision", o.precision, "the model's own (base) precision (default f16)");
  app.add_option("--hidden", o.hidden, "expert hidden size, for traces not shaped like Mixtral");
  app.add_option("--ffn", o.ffn, "expert ffn size, for traces not shaped like Mixtral");
  app.add_option("--t1", o.t1, "HOBBIT T1 (presets that use it)");
  app.add_option("--t2", o.t2, "HOBBIT T2 (presets that use it)");
  app.add_option("--gamma", o.gamma, "MoBiLE gamma (presets that use it)");
  app.add_option("--sweep", o.sweeps,
                 "PARAM=V1,V2,...: budget, bandwidth, t1, t2 or gamma (one sweep per run)");
  app.add_option("--out", o.out, "file prefix of the sweep's CSV and SVG (default moe-sim-sweep)");
  app.add_flag("--json", o.json, "print JSON instead of the table");
  app.add_flag("--compare", o.compare,
               "every available preset + Belady on the repository's and the shared traces");
  app.add_flag("--no-belady", o.no_belady, "leave out the Belady reference");
  app.add_flag("--list", o.list, "list presets and hardware models, then exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (o.list) {
    std::printf("presets:\n");
    for (const auto& p : preset_table)
      std::printf("  %-9s %s%s%s\n", std::string(p.name).c_str(), std::string(p.what).c_str(),
                  p.run ? "" : "  [not available: ",
                  p.run ? "" : (std::string(p.unavailable) + "]").c_str());
    std::printf("  %-9s %s\nhardware:\n", "belady", std::string(belady_entry.what).c_str());
    for (const auto& n : hardware_preset_names())
      std::printf("  %-21s %s\n", n.c_str(), hardware_preset(n).source.c_str());
    std::printf("  %-21s measured; needs --hardware-file\n", "this-machine");
    return 0;
  }

  const auto base = parse_precision(o.precision);
  if (!base || *base == Precision::skip) bad_flag("--precision", "unknown precision '" + o.precision + "'");
  if (o.sweeps.size() > 1) bad_flag("--sweep", "give one sweep per run");
  std::optional<Sweep> sweep;
  if (!o.sweeps.empty()) sweep = parse_sweep(o.sweeps[0]);
  const BudgetSpec budget = BudgetSpec::parse("--budget", o.budget);
  const HardwareModel hw = hardware_for(o);

  // ---- traces ---------------------------------------------------------------------------------
  std::vector<std::string> notes;
  std::vector<RoutingTrace> traces;
  if (o.compare) {
    if (!o.traces.empty() || !o.mixtral.empty())
      bad_flag("--compare", "runs on the repository's traces; do not combine with --trace");
    traces = compare_traces(notes);
    o.preset = "all";
  }
  for (const auto& t : o.traces) traces.push_back(load_trace(t));
  for (const auto& t : o.mixtral) traces.push_back(load_mixtral(t));
  if (traces.empty())
    bad_flag("--trace", o.compare ? "no traces found for --compare" : "give --trace, "
                                                                      "--import-mixtral or --compare");

  // ---- presets --------------------------------------------------------------------------------
  std::vector<const PresetEntry*> chosen;
  std::vector<std::string> unavailable;
  bool known = o.preset == "all";
  for (const auto& p : preset_table) {
    if (o.preset != "all" && p.name != o.preset) continue;
    known = true;
    if (p.run) chosen.push_back(&p);
    else unavailable.push_back(std::string(p.name) + ": not available (" +
                               std::string(p.unavailable) + ")");
  }
  if (!known) bad_flag("--preset", "unknown preset '" + o.preset + "' (baseline, hobbit, fate, "
                                   "edgemoe, mobile, fiddler, all)");
  if (sweep && (sweep->param == "t1" || sweep->param == "t2" || sweep->param == "gamma")) {
    const bool t = sweep->param != "gamma";
    std::vector<const PresetEntry*> keep;
    for (const auto* p : chosen)
      if (t ? p->uses_t1_t2 : p->uses_gamma) keep.push_back(p);
    if (keep.empty())
      bad_flag("--sweep", sweep->param + " applies to " + (t ? "hobbit" : "mobile") +
                              ", which is not available among the chosen presets");
    chosen = keep;
  }
  const bool with_belady = !o.no_belady && (!sweep || sweep->param == "budget" ||
                                            sweep->param == "bandwidth");
  if (with_belady) chosen.push_back(&belady_entry);
  if (chosen.empty()) bad_flag("--preset", "no available preset to run");

  // ---- runs -----------------------------------------------------------------------------------
  const std::vector<std::string> values = sweep ? sweep->values : std::vector<std::string>{""};
  const std::size_t total = traces.size() * values.size() * chosen.size();
  ProgressBar bar(stderr, total, isatty(2) != 0 && !o.json);
  std::vector<Row> rows;
  std::size_t done = 0;
  const auto t_wall = std::chrono::steady_clock::now();
  for (const RoutingTrace& tr : traces) {
    const ModelShape shape = shape_for(tr, o);
    const ComputeModel compute = hw.compute_model(shape, dense_for(shape));
    for (const std::string& v : values) {
      RunParams rp;
      rp.shape = shape;
      rp.link = hw.link;
      rp.compute = compute;
      rp.t1 = o.t1, rp.t2 = o.t2, rp.gamma = o.gamma;
      BudgetSpec b = budget;
      double x = 0;
      if (sweep && sweep->param == "budget") b = BudgetSpec::parse("--sweep budget", v);
      if (sweep && sweep->param == "bandwidth")
        rp.link.bandwidth_bytes_per_s = x = parse_bandwidth("--sweep bandwidth", v);
      if (sweep && sweep->param == "t1") rp.t1 = x = parse_quantity("--sweep t1", v, {});
      if (sweep && sweep->param == "t2") rp.t2 = x = parse_quantity("--sweep t2", v, {});
      if (sweep && sweep->param == "gamma") rp.gamma = x = parse_quantity("--sweep gamma", v, {});
      rp.config.base_precision = *base;
      rp.config.expert_budget_bytes = b.bytes(shape, *base);
      const std::size_t one = shape.expert_bytes(*base);
      if (rp.config.expert_budget_bytes < std::size_t{shape.top_k} * one)
        bad_flag(sweep && sweep->param == "budget" ? "--sweep budget" : "--budget",
                 "'" + b.text + "' gives " + std::to_string(rp.config.expert_budget_bytes) +
                     " bytes; a token needs top_k = " + std::to_string(shape.top_k) +
                     " experts of " + std::to_string(one) + " bytes at " +
                     std::string(name(*base)) + " (" + std::to_string(shape.top_k * one) +
                     " bytes = " + std::to_string(shape.top_k) + " slots)");
      const double percent = 100.0 * double(rp.config.expert_budget_bytes / one) /
                             double(shape.expert_count());
      if (sweep && sweep->param == "budget") x = percent;
      for (const PresetEntry* p : chosen) {
        bar.update(done, tr.name().substr(tr.name().find_last_of('/') + 1) + " " +
                             std::string(p->name) + " " + v);
        Row r;
        r.trace = tr.name();
        r.preset = std::string(p->name);
        r.sweep_param = sweep ? sweep->param : "";
        r.sweep_value = v;
        r.x = x;
        r.budget_bytes = rp.config.expert_budget_bytes;
        r.budget_slots = rp.config.expert_budget_bytes / one;
        r.budget_percent = percent;
        r.hardware = hw.name;
        r.bandwidth = rp.link.bandwidth_bytes_per_s;
        r.t1 = rp.t1, r.t2 = rp.t2, r.gamma = rp.gamma;
        ++done;
        try {
          r.rep = p->run(rp, tr);
        } catch (const moekit::Error& e) {  // a preset that cannot run here: say so, go on
          unavailable.push_back(std::string(p->name) + " on " + tr.name() + ": failed (" +
                                e.message() + ")");
          continue;
        }
        rows.push_back(std::move(r));
      }
    }
  }
  bar.update(done, "done");
  bar.finish();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_wall).count();

  // ---- output ---------------------------------------------------------------------------------
  std::vector<std::string> written;
  if (sweep) {
    const std::string csv_path = o.out + ".csv";
    write_text(csv_path, csv_of(rows));
    written.push_back(csv_path);
    for (std::size_t ti = 0; ti < traces.size(); ++ti) {
      std::vector<PlotSeries> series;
      for (const PresetEntry* p : chosen) {
        PlotSeries s{std::string(p->name), {}, {}, p == &belady_entry};
        for (const Row& r : rows)
          if (r.trace == traces[ti].name() && r.preset == p->name) {
            s.x.push_back(r.x);
            s.y.push_back(sweep->param == "budget" ? r.rep.miss_penalty()
                                                   : r.rep.decode_tokens_per_s());
          }
        series.push_back(std::move(s));
      }
      const bool by_budget = sweep->param == "budget";
      const std::string title =
          (by_budget ? "miss penalty vs cache size — " : "decode tokens/s vs " + sweep->param +
                                                             " — ") +
          traces[ti].name() + (traces[ti].synthetic() ? " (SYNTHETIC)" : "");
      const std::string x_label =
          by_budget ? "expert cache (% of all experts)"
                    : (sweep->param == "bandwidth" ? "link bandwidth (bytes/s)" : sweep->param);
      const std::string y_label = by_budget ? "miss penalty (full-precision-equivalent misses)"
                                            : "simulated decode tokens/s";
      const std::string svg_path =
          traces.size() == 1 ? o.out + ".svg" : o.out + "-" + std::to_string(ti) + ".svg";
      write_text(svg_path, svg_line_plot(title, x_label, y_label, series));
      written.push_back(svg_path);
    }
  }

  if (o.json) {
    nlohmann::json j;
    j["hardware"] = {{"name", hw.name}, {"source", hw.source}};
    j["runs"] = nlohmann::json::array();
    for (const Row& r : rows) {
      nlohmann::json x = report_json(r.rep);
      x["preset"] = r.preset;
      x["budget_bytes"] = r.budget_bytes;
      x["budget_slots"] = r.budget_slots;
      x["budget_percent"] = r.budget_percent;
      x["bandwidth_bytes_per_s"] = r.bandwidth;
      if (sweep) x["sweep"] = {{"param", r.sweep_param}, {"value", r.sweep_value}};
      j["runs"].push_back(std::move(x));
    }
    j["unavailable"] = unavailable;
    if (!with_belady) j["unavailable"].push_back("belady: left out");
    j["notes"] = notes;
    j["files"] = written;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("hardware: %s (link %.1f GB/s)   wall time %.2f s\n", hw.name.c_str(),
              hw.link.bandwidth_bytes_per_s / 1e9, wall);
  print_table(rows, sweep.has_value());
  for (const RoutingTrace& tr : traces)
    if (tr.synthetic()) std::printf("note: %s is SYNTHETIC routing\n", tr.name().c_str());
  for (const auto& u : unavailable) std::printf("%s\n", u.c_str());
  for (const auto& n : notes) std::printf("note: %s\n", n.c_str());
  for (const auto& w : written) std::printf("wrote %s\n", w.c_str());
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
