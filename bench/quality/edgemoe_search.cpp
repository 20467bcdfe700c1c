// EdgeMoE's expert-wise bit-width search (tools/bitwidth_search.hpp) with an evaluator that runs
// the engine: each evaluation writes the candidate PrecisionTable and runs
//   moe-run --in-memory --preset edgemoe --bitwidth-table T --perplexity TEXT -c CTX --chunks N
//   --json
// and the loss, in %, is EdgeMoE's "accuracy loss P" measured against an f32 run of the same
// slice: `--loss top1` (default) = next-token top-1 disagreement with the f32 model
// (100 · (1 − top-1 agreement)), an accuracy drop; `--loss ppl` = relative perplexity increase
// (on a small under-trained model this moves by fractions of a percent either way, so the search
// degenerates to "all at the lowest precision"). Evaluations are memoised by table, so several
// budgets P share the uniform and per-expert importance runs when their (b_lo, b_hi) agree.
//
// usage: moekit_bench_edgemoe_search --moe-run PATH --text FILE [--model DIR] [--ctx N]
//        [--chunks N] [--loss top1|ppl] [--budget P]... --out-prefix PREFIX
// writes PREFIX-P<P>.table (moekit-precision-table) and PREFIX.json (what the search measured).

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/score/static_bitwidth.hpp"
#include "moekit/tools/bitwidth_search.hpp"

namespace fs = std::filesystem;

namespace {

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs a command, returns its stdout; throws on a non-zero exit.
std::string run(const std::string& cmd) {
  std::FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!p) throw moekit::Error(moekit::ErrorKind::io, "cannot run: " + cmd);
  std::string out;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (pclose(p) != 0) throw moekit::Error(moekit::ErrorKind::internal, "command failed: " + cmd);
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string moe_run, text, prefix,
      model = std::string(MOEKIT_SOURCE_DIR) + "/models/moekit-tiny-moe";
  unsigned ctx = 512, chunks = 1;
  std::string loss = "top1";
  std::vector<double> budgets;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--moe-run")
      moe_run = v;
    else if (a == "--text")
      text = v;
    else if (a == "--model")
      model = v;
    else if (a == "--ctx")
      ctx = std::stoul(v);
    else if (a == "--chunks")
      chunks = std::stoul(v);
    else if (a == "--budget")
      budgets.push_back(std::stod(v));
    else if (a == "--out-prefix")
      prefix = v;
    else if (a == "--loss")
      loss = v;
    else
      throw moekit::Error(moekit::ErrorKind::invalid_argument, "unknown argument " + a);
  }
  if (moe_run.empty() || text.empty() || prefix.empty())
    throw moekit::Error(moekit::ErrorKind::invalid_argument,
                        "usage: --moe-run PATH --text FILE --out-prefix PREFIX [--budget P]...");
  if (budgets.empty()) budgets = {1.0, 5.0};
  if (loss != "top1" && loss != "ppl")
    throw moekit::Error(moekit::ErrorKind::invalid_argument, "--loss: top1 or ppl");

  const std::string base = quote(moe_run) + " -m " + quote(model) + " --in-memory --perplexity " +
                           quote(text) + " -c " + std::to_string(ctx) + " --chunks " +
                           std::to_string(chunks) + " --json";
  auto engine = [&](const std::string& extra) {
    const std::string out = run(base + " " + extra);
    return nlohmann::json::parse(out.substr(out.find('{')));
  };
  const std::string ref_file = prefix + "-reference.mklogp";
  const double reference = engine("--precision f32 --force --save-logits " + quote(ref_file))
                               .at("perplexity")
                               .get<double>();
  const std::string table_file = prefix + "-candidate.table";
  std::size_t calls = 0;
  std::map<std::string, double> memo;  // table text → loss: budgets share the uniform and
                                       // importance evaluations when (b_lo, b_hi) agree
  const auto t0 = std::chrono::steady_clock::now();
  const moekit::tools::PrecisionEvaluator evaluate = [&](const moekit::PrecisionTable& t) {
    t.save(table_file);
    std::ifstream in(table_file);
    const std::string key((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (const auto it = memo.find(key); it != memo.end()) return it->second;
    ++calls;
    const auto j = engine("--preset edgemoe --precision f16 --bitwidth-table " + quote(table_file) +
                          " --kl-reference " + quote(ref_file));
    const double l = loss == "top1" ? 100.0 * (1.0 - j.at("top1_agreement").get<double>())
                                    : 100.0 * (j.at("perplexity").get<double>() / reference - 1.0);
    return memo[key] = l;
  };
  std::ifstream cfg_in(fs::path(model) / "config.json");
  const auto config = nlohmann::json::parse(cfg_in);
  const auto n_layers = config.at("num_hidden_layers").get<std::uint32_t>();
  const auto n_experts = config.at("num_local_experts").get<std::uint32_t>();

  nlohmann::json report;
  report["reference_perplexity_f32"] = reference;
  report["slice"] = {{"text", text}, {"ctx", ctx}, {"chunks", chunks}};
  report["loss"] = loss == "top1" ? "top-1 disagreement with f32, percent"
                                  : "relative perplexity increase over f32, percent";
  for (double P : budgets) {
    const auto r = moekit::tools::bitwidth_search(
        n_layers, n_experts, evaluate,
        {.loss_budget = P,
         .candidates = {moekit::Precision::q2, moekit::Precision::q4, moekit::Precision::q8,
                        moekit::Precision::f16}});
    std::ostringstream name;
    name << prefix << "-P" << P << ".table";
    r.table.save(name.str());
    std::map<std::string, int> counts;
    for (std::uint32_t l = 0; l < r.table.n_layers(); ++l)
      for (std::uint32_t e = 0; e < r.table.n_experts(); ++e)
        ++counts[std::string(moekit::name(r.table.at({l, e})))];
    report["searches"].push_back({{"budget_percent", P},
                                  {"table", name.str()},
                                  {"low", std::string(moekit::name(r.low))},
                                  {"high", std::string(moekit::name(r.high))},
                                  {"experts_at_low", r.k},
                                  {"counts", counts},
                                  {"loss_percent", r.loss},
                                  {"uniform_loss_percent", r.uniform_loss},
                                  {"evaluations", r.evaluations}});
    std::printf(
        "P = %g %%: %zu of %u experts at %s, the rest at %s; loss %.3f %% (%zu evaluations, "
        "%zu engine runs so far)\n",
        P, r.k, n_layers * n_experts, std::string(moekit::name(r.low)).c_str(),
        std::string(moekit::name(r.high)).c_str(), r.loss, r.evaluations, calls);
    std::fflush(stdout);
  }
  fs::remove(table_file);
  fs::remove(ref_file);
  report["engine_runs"] = calls + 1;
  report["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ofstream(prefix + ".json") << report.dump(1) << "\n";
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "edgemoe_search: %s\n", e.what());
  return 1;
}
