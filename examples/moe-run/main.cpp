// moe-run: generate text with a Mixture-of-Experts model whose experts are served through a moekit
// OffloadPipeline under a byte budget. See docs/engine.md.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/precision/thread_pool.hpp"

#include "cli.hpp"
#include "config.hpp"
#include "model.hpp"
#include "offload.hpp"
#include "sampler.hpp"
#include "tokenizer.hpp"
#include "weights.hpp"

namespace fs = std::filesystem;
using namespace moe_run;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw moekit::Error(moekit::ErrorKind::invalid_argument, msg);
}

// Accepts a Hugging Face model directory; names what else -m was given and why it is refused.
fs::path check_model_path(const Options& o) {
  const fs::path p = o.model;
  if (!fs::exists(p)) {
    if (o.model == MOE_RUN_DEFAULT_MODEL)
      fail("-m: the default model '" + o.model +
           "' does not exist yet (it is trained by scripts/train_and_commit.sh); pass -m with a "
           "Hugging Face model directory");
    fail("-m: '" + o.model + "' does not exist");
  }
  if (fs::is_regular_file(p) && p.extension() == ".gguf")
    throw moekit::Error(moekit::ErrorKind::unsupported,
                        "-m: '" + o.model + "' is a GGUF file; moe-run does not read GGUF models "
                        "yet. Pass a Hugging Face model directory (config.json + safetensors)");
  if (!fs::is_directory(p) || !fs::exists(p / "config.json"))
    throw moekit::Error(moekit::ErrorKind::unsupported,
                        "-m: '" + o.model + "' is not a Hugging Face model directory (no "
                        "config.json); expert stores are not supported by moe-run yet");
  return p;
}

struct Timings {
  double prefill_s = 0, decode_s = 0;
  std::size_t prompt_tokens = 0, decoded_tokens = 0, generated_tokens = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class Pipeline>
nlohmann::json generate(const Options& o, const ModelConfig& cfg, const ModelWeights& w,
                        const Tokenizer& tok, Pipeline& pipeline, moekit::ThreadPool& pool) {
  const bool bos = !o.no_bos && cfg.bos_token_id.has_value();
  std::vector<Token> prompt = tok.encode(o.prompt, false);
  if (bos) prompt.insert(prompt.begin(), *cfg.bos_token_id);
  if (prompt.empty()) fail("-p: the prompt encodes to no tokens (and --no-bos is set)");
  const std::uint32_t ctx = o.context ? o.context
                                      : static_cast<std::uint32_t>(prompt.size() + o.n_predict);
  if (prompt.size() + o.n_predict > ctx)
    fail("-c: context length " + std::to_string(ctx) + " is shorter than the prompt (" +
         std::to_string(prompt.size()) + " tokens) plus -n " + std::to_string(o.n_predict));

  Model<Pipeline> model(cfg, w.dense, pipeline, ctx, &pool);
  Sampler sampler({o.temperature, o.top_p, o.seed});
  StreamDecoder stream(tok, prompt);
  std::string text;
  auto emit = [&](const std::string& piece) {
    text += piece;
    if (!o.json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  };
  if (!o.json) {
    std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);  // echo, as llama.cpp does
    std::fflush(stdout);
  }

  Timings t;
  t.prompt_tokens = prompt.size();
  model.begin_sequence();
  auto t0 = std::chrono::steady_clock::now();
  std::span<const float> logits = model.prefill(prompt);
  t.prefill_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.n_predict; ++i) {
    const Token next = sampler.sample(logits);
    ++t.generated_tokens;
    const bool eos = std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), next) !=
                     cfg.eos_token_ids.end();
    if (eos) break;
    emit(stream.push(next));
    if (i + 1 == o.n_predict) break;
    logits = model.decode(next);
    ++t.decoded_tokens;
  }
  t.decode_s = seconds_since(t0);
  if (!o.json) std::fputs("\n", stdout);

  const auto s = pipeline.stats();
  moekit::PredictionStats pred;
  for (const auto& p : s.prediction) {
    pred.true_positive += p.true_positive;
    pred.false_positive += p.false_positive;
    pred.false_negative += p.false_negative;
  }
  nlohmann::json j;
  j["text"] = text;
  j["model"] = o.model;
  j["architecture"] = name(cfg.arch);
  j["preset"] = o.preset;
  j["precision"] = std::string(moekit::name(o.precision));
  j["threads"] = o.threads;
  j["expert_budget_bytes"] = pipeline.config().expert_budget_bytes;
  j["prompt_tokens"] = t.prompt_tokens;
  j["generated_tokens"] = t.generated_tokens;
  j["prefill_seconds"] = t.prefill_s;
  j["decode_seconds"] = t.decode_s;
  j["prefill_tokens_per_s"] = t.prefill_s > 0 ? t.prompt_tokens / t.prefill_s : 0.0;
  j["decode_tokens_per_s"] = t.decode_s > 0 ? t.decoded_tokens / t.decode_s : 0.0;
  j["hit_rate"] = s.hit_rate();
  j["hits"] = s.hits;
  j["misses"] = s.misses;
  j["bytes_loaded"] = s.bytes_loaded();
  j["prediction_precision"] = pred.precision();
  j["prediction_recall"] = pred.recall();
  j["predictions_made"] = pred.true_positive + pred.false_positive > 0;
  j["fallbacks"] = s.fallbacks;
  j["evictions"] = s.cache.evictions;
  j["dense_bytes"] = w.dense.bytes();
  j["kv_cache_bytes"] = model.kv_cache().bytes();
  j["host_expert_bytes"] = w.experts.total_bytes();
  return j;
}

void print_stats(const nlohmann::json& j) {
  char buf[96] = "none made";
  if (j["predictions_made"].get<bool>())
    std::snprintf(buf, sizeof buf, "precision %.3f, recall %.3f",
                  j["prediction_precision"].get<double>(), j["prediction_recall"].get<double>());
  const std::string prediction = buf;
  std::fprintf(stderr,
               "\nprefill: %zu tokens, %.2f tokens/s | generated: %zu tokens, decode %.2f tokens/s\n"
               "experts: preset %s at %s, budget %zu bytes, hit rate %.1f%% (%llu hits, %llu "
               "misses), %llu bytes loaded, %llu evictions\n"
               "prediction: %s | fallbacks: %llu\n",
               j["prompt_tokens"].get<std::size_t>(), j["prefill_tokens_per_s"].get<double>(),
               j["generated_tokens"].get<std::size_t>(), j["decode_tokens_per_s"].get<double>(),
               j["preset"].get<std::string>().c_str(), j["precision"].get<std::string>().c_str(),
               j["expert_budget_bytes"].get<std::size_t>(), 100 * j["hit_rate"].get<double>(),
               j["hits"].get<unsigned long long>(), j["misses"].get<unsigned long long>(),
               j["bytes_loaded"].get<unsigned long long>(),
               j["evictions"].get<unsigned long long>(), prediction.c_str(),
               j["fallbacks"].get<unsigned long long>());
}

int run(const Options& o) {
  const fs::path dir = check_model_path(o);
  const ModelConfig cfg = load_config(dir);
  const Tokenizer tok(dir / "tokenizer.model");
  if (tok.vocab_size() > cfg.vocab_size)
    fail("-m: tokenizer.model has " + std::to_string(tok.vocab_size()) +
         " pieces, more than the model's vocab_size " + std::to_string(cfg.vocab_size));

  // Refuse an impossible budget before loading any weight.
  const moekit::ModelShape shape = cfg.shape();
  const OffloadSettings settings{o.budget.resolve(all_resident_budget(shape, o.precision)),
                                 o.precision};
  check_budget(shape, settings);

  const ModelWeights w = load_weights(cfg, dir, {o.precision});
  moekit::ThreadPool pool(o.threads);
  const nlohmann::json stats = with_preset(
      o.preset, shape, settings, w.experts,
      [&](auto& pipeline) { return generate(o, cfg, w, tok, pipeline, pool); });
  if (o.json) std::cout << stats.dump(1) << "\n";
  else print_stats(stats);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Cli cli;
  if (const int rc = cli.parse(argc, argv, std::cout, std::cerr); rc != 0) return rc;
  try {
    return run(cli.options());
  } catch (const moekit::Error& e) {
    std::cerr << "moe-run: " << e.message() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "moe-run: " << e.what() << "\n";
  }
  return 1;
}
