// moe-run: generate text with a Mixture-of-Experts model whose experts are served through a moekit
// OffloadPipeline under a byte budget. See docs/engine.md.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/error.hpp"
#include "moekit/io/checkpoint_experts.hpp"
#include "moekit/io/finite_check.hpp"
#include "moekit/io/memory_limit.hpp"
#include "moekit/io/output_file.hpp"
#include "moekit/precision/thread_pool.hpp"
#include "moekit/tools/progress.hpp"

#include "moekit/engine/activations.hpp"
#include "moekit/engine/calibration.hpp"
#include "moekit/engine/chat_session.hpp"
#include "moekit/engine/chat_template.hpp"
#include "moekit/engine/cli.hpp"
#include "moekit/engine/config.hpp"
#include "moekit/engine/conversion_loss.hpp"
#include "moekit/engine/decode_timing.hpp"
#include "moekit/engine/expert_source.hpp"
#include "moekit/engine/gguf_model.hpp"
#include "moekit/engine/memory_budget.hpp"
#include "moekit/engine/model.hpp"
#include "moekit/engine/offload.hpp"
#include "moekit/engine/perplexity.hpp"
#include "moekit/engine/routing_replay.hpp"
#include "moekit/engine/sampler.hpp"
#include "moekit/engine/store_origin.hpp"
#include "moekit/engine/token_profile.hpp"
#include "moekit/engine/tokenizer.hpp"
#include "moekit/engine/trace_recorder.hpp"
#include "moekit/engine/weights.hpp"
#include "moekit/sim/calibration_split.hpp"

#if MOE_RUN_HAS_SERVER
#include "openai_server.hpp"  // examples/moe-server/
#endif
#include <unistd.h>  // isatty

#ifndef MOE_RUN_LOSS_TEXT
#define MOE_RUN_LOSS_TEXT "bench/quality/heldout.txt"
#endif
#ifndef MOE_RUN_CALIB_TEXT
#define MOE_RUN_CALIB_TEXT "bench/quality/calibration.txt"
#endif
#ifndef MOE_RUN_STORE_DIR
#define MOE_RUN_STORE_DIR "build/moe-run-stores"
#endif

namespace fs = std::filesystem;
using namespace moekit::engine;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw moekit::Error(moekit::ErrorKind::invalid_argument, msg);
}

// A Hugging Face model directory or a GGUF file; names what else -m was given and why it is
// refused.
struct ModelPath {
  fs::path dir;   // Hugging Face directory, or empty
  fs::path gguf;  // GGUF file, or empty
};

ModelPath check_model_path(const std::string& path) {
  const fs::path p = path;
  if (!fs::exists(p)) {
    if (path == MOE_RUN_DEFAULT_MODEL)
      fail("-m: the default model '" + path +
           "' does not exist yet (it is trained by scripts/train_and_commit.sh); pass -m with a "
           "Hugging Face model directory or a GGUF file");
    fail("-m: '" + path + "' does not exist");
  }
  if (fs::is_regular_file(p) && is_gguf_file(p)) return {{}, p};
  if (!fs::is_directory(p) || !fs::exists(p / "config.json"))
    throw moekit::Error(moekit::ErrorKind::unsupported,
                        "-m: '" + path +
                            "' is neither a Hugging Face model directory (no "
                            "config.json), a GGUF file nor an expert store (moe-convert)");
  return {p, {}};
}

// Where the dense part and the experts come from: -m DIR|GGUF [--store FILE], or -m STORE (the
// checkpoint directory or GGUF file recorded in the store's meta).
struct ModelSource {
  ModelPath model;
  std::string store;  // "" = none given
};

// The store (if any) is checked against the checkpoint it is used with (store_origin.hpp): built
// from it, and not changed since (--force: used anyway).
ModelSource resolve_model(const Options& o) {
  if (fs::is_regular_file(o.model) && is_expert_store(o.model)) {
    if (!o.store.empty()) fail("--store: -m already names an expert store ('" + o.model + "')");
    const auto st = moekit::io::ExpertStore::open(o.model);
    const auto& meta = st.manifest().meta;
    for (const char* key : {"checkpoint_dir", "gguf"})
      if (meta.contains(key) && meta[key].is_string()) {
        ModelSource src{check_model_path(meta[key].get<std::string>()), o.model};
        check_store_origin(st, src.model.dir, src.model.gguf, o.force, "-m");
        return src;
      }
    fail("-m: expert store '" + o.model +
         "' records neither checkpoint_dir nor gguf in its "
         "meta; pass the checkpoint with -m DIR|GGUF and the store with --store");
  }
  ModelSource src{check_model_path(o.model), o.store};
  if (!o.store.empty())
    check_store_origin(moekit::io::ExpertStore::open(o.store), src.model.dir, src.model.gguf,
                       o.force, "--store");
  return src;
}

// How the model runs: int8 activations for the quantized experts and dense matrices, decode and
// prefill (activations.hpp), and the routing replayed from --routing-trace (null: the router's
// own). Where the experts' rows are comes with each resolved expert (WeightView::order).
struct ModelSetup {
  ModelKernels kernels;  // --activations, --kv-type, --row-streaming
  RoutingReplay* replay = nullptr;
  const ChatTemplate* chat = nullptr;  // --chat-template (null: -p as it is)

  template <class M>
  void apply(M& model) const {
    kernels.apply(model);
    model.set_routing_replay(replay);
  }
};

struct Timings {
  double prefill_s = 0, decode_s = 0;
  std::size_t prompt_tokens = 0, decoded_tokens = 0, generated_tokens = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What one generation produced and measured.
struct Generation {
  std::string text;
  std::vector<Token> prompt, ids;
  Timings t;
  moekit::PipelineStats after_prefill;        // decode's own counters are the difference
  std::uint64_t host_read_after_prefill = 0;  // the loader's host_read_bytes() then
  nlohmann::json profile;                     // --profile: the parts of a decode token (null: off)
  double team_fraction = 1;                // decode steps the pool ran on all threads (StepChooser)
  std::uint64_t moves_off_caller_cpu = 0;  // decode: workers that moved off the caller's CPU
};

// --profile's JSON: decode tokens timed, seconds per token, and each part's fraction of it.
nlohmann::json profile_json(const TokenProfile& p) {
  nlohmann::json j;
  j["tokens"] = p.tokens();
  j["seconds_per_token"] = p.tokens() ? p.seconds() / static_cast<double>(p.tokens()) : 0.0;
  for (std::size_t i = 0; i < token_part_count; ++i)
    j[std::string(name(static_cast<TokenPart>(i)))] = p.fraction(static_cast<TokenPart>(i));
  return j;
}

// MoBiLE: which big pass ran, and how often the little pass's plans agreed with the big passes'
// own top-K.
template <class Pipeline>
void add_big_pass_stats(nlohmann::json& j, const Pipeline& pipeline) {
  using Base = std::remove_cvref_t<decltype(base_pipeline(pipeline))>;
  if constexpr (std::is_same_v<typename Base::Predictor, moekit::RouterReplayPredictor>) {
    // MoBiLE: agreement of the little pass's plans with the big passes' own top-K
    const auto& replay = base_pipeline(pipeline).predictor();
    j["big_pass_plan_accuracy"] = replay.stats().accuracy();
    j["big_pass"] = replay.config().big_pass == moekit::RouterReplayPredictor::BigPass::little_plan
                        ? "little-plan"
                        : "recompute";
  }
}

// Expert memory: the most held at once (cache and staging), the misses loaded outside the cache
// (beyond the budget) and the lazy upgrades.
template <class Pipeline>
void add_expert_memory_stats(nlohmann::json& j, const Pipeline& pipeline) {
  const auto s = pipeline.stats();
  j["expert_memory_peak_bytes"] = pipeline.memory_peak_bytes();
  j["staged_misses"] = s.staged;
  j["upgrades"] = s.upgrades;
}

// The prefetcher's counters over the whole run (moe-sim --json gives the same pipeline counters:
// the two can be set side by side).
template <class Pipeline>
void add_prefetch_stats(nlohmann::json& j, const Pipeline& pipeline) {
  const auto s = pipeline.stats();
  j["prefetches"] = {{"issued", s.prefetches_issued},
                     {"redundant", s.prefetches_redundant},
                     {"dropped", s.prefetches_dropped},
                     {"waited", s.prefetches_waited},
                     {"cancelled", s.prefetches_cancelled},
                     {"unused", s.prefetches_unused},
                     {"late", s.late_prefetches},
                     {"bytes", s.bytes_prefetched},
                     {"wasted_bytes", s.cache.wasted_prefetch_bytes},
                     {"demand_bytes", s.bytes_demand_loaded}};
}

// The --json object of a generation (also what the text mode prints from).
template <class Pipeline>
nlohmann::json generation_json(const Options& o, const ModelConfig& cfg, const ModelWeights& w,
                               const ModelSetup& k, const Pipeline& pipeline,
                               std::size_t kv_cache_bytes, const Generation& g) {
  const auto s = pipeline.stats();
  moekit::PredictionStats pred;
  for (const auto& p : s.prediction) {
    pred.true_positive += p.true_positive;
    pred.false_positive += p.false_positive;
    pred.false_negative += p.false_negative;
  }
  nlohmann::json j;
  j["text"] = g.text;
  j["prompt_ids"] = g.prompt;
  j["token_ids"] = g.ids;
  j["model"] = o.model;
  j["architecture"] = name(cfg.arch);
  j["preset"] = o.preset;
  j["precision"] = std::string(moekit::name(o.precision));
  j["activations"] = std::string(activations_name(k.kernels.int8_experts));
  j["dense_activations"] = std::string(activations_name(k.kernels.int8_dense));
  j["threads"] = o.threads;
  j["expert_budget_bytes"] = pipeline.config().expert_budget_bytes;
  const Timings& t = g.t;
  j["prompt_tokens"] = t.prompt_tokens;
  j["ubatch"] = o.ubatch;
  j["kv_type"] = std::string(name(o.kv_type));
  j["generated_tokens"] = t.generated_tokens;
  j["prefill_seconds"] = t.prefill_s;
  j["decode_seconds"] = t.decode_s;
  j["prefill_tokens_per_s"] = t.prefill_s > 0 ? t.prompt_tokens / t.prefill_s : 0.0;
  j["decode_tokens_per_s"] = t.decode_s > 0 ? t.decoded_tokens / t.decode_s : 0.0;
  j["hit_rate"] = s.hit_rate();
  j["hits"] = s.hits;
  j["misses"] = s.misses;
  j["bytes_loaded"] = s.bytes_loaded();
  j["decode_bytes_loaded"] = s.bytes_loaded() - g.after_prefill.bytes_loaded();
  // Experts read to run once on the CPU (Fiddler, experts not in host memory): not in the cache.
  const std::uint64_t host_read = pipeline.loader().host_read_bytes();
  j["host_read_bytes"] = host_read;
  j["decode_host_read_bytes"] = host_read - g.host_read_after_prefill;
  const auto decode_hits = s.hits - g.after_prefill.hits;
  const auto decode_demands = decode_hits + s.misses - g.after_prefill.misses;
  j["decode_hit_rate"] = decode_demands ? double(decode_hits) / double(decode_demands) : 0.0;
  j["stall_seconds"] = s.stall_seconds;
  j["decode_stall_seconds"] = s.stall_seconds - g.after_prefill.stall_seconds;
  j["prediction_precision"] = pred.precision();
  j["prediction_recall"] = pred.recall();
  j["predictions_made"] = pred.true_positive + pred.false_positive > 0;
  j["fallbacks"] = s.fallbacks;
  add_big_pass_stats(j, pipeline);
  j["evictions"] = s.cache.evictions;
  add_expert_memory_stats(j, pipeline);
  add_prefetch_stats(j, pipeline);
  j["dense_bytes"] = w.dense.bytes();
  j["dense_precision"] = w.dense.precisions();
  j["kv_cache_bytes"] = kv_cache_bytes;
  j["host_expert_bytes"] = w.experts.total_bytes();
  j["decode_steps_on_all_threads"] = g.team_fraction;
  j["worker_moves_off_caller_cpu"] = g.moves_off_caller_cpu;
  if (!g.profile.is_null()) j["profile"] = g.profile;
  return j;
}

// A NaN or infinite logit stops the run: sampling from it prints garbage with exit code 0.
// (Non-finite weights are refused as they are read; this catches the rest, e.g. an overflow.)
void require_finite_logits(std::span<const float> logits, std::size_t position) {
  if (const auto i = moekit::io::first_non_finite(logits))
    throw moekit::Error(moekit::ErrorKind::invalid_format,
                        "the model's logit of token " + std::to_string(*i) + " at position " +
                            std::to_string(position) + " is " + std::to_string(logits[*i]) +
                            " (not finite): the weights or experts hold NaN/Inf, or an "
                            "activation overflowed; stopping rather than sampling from it");
}

// -c beyond the model's max_position_embeddings: refused before the KV cache is allocated (-c
// 100000000 once zero-filled ~77 GB until the kernel killed the process).
// Without -c, the context is the prompt plus -n: a prompt beyond the model's positions is refused
// naming -p before the prefill (a 25 k-token prompt used to run on for minutes past them).
void check_context(std::size_t ctx, const ModelConfig& cfg, bool from_prompt = false) {
  if (ctx <= cfg.max_positions) return;
  if (from_prompt)
    fail("-p: the prompt and -n need " + std::to_string(ctx) +
         " positions, more than the model's max_position_embeddings (" +
         std::to_string(cfg.max_positions) + "); shorten the prompt or -n");
  fail("-c: context length " + std::to_string(ctx) +
       " exceeds the model's "
       "max_position_embeddings (" +
       std::to_string(cfg.max_positions) + ")");
}

// -p's token ids: after a BOS as given, or the user message of the chat template's prompt (which
// writes its own BOS).
std::vector<Token> prompt_ids(const Options& o, const ModelConfig& cfg, const Tokenizer& tok,
                              const ChatTemplate* tmpl, const ChatEncoder& enc) {
  std::vector<Token> ids;
  if (tmpl) {
    const std::vector<ChatMessage> user{{"user", o.prompt}};
    ids = enc.encode(tmpl->render(user, true));
  } else {
    ids = tok.encode(o.prompt, false);
    if (!o.no_bos && cfg.bos_token_id) ids.insert(ids.begin(), *cfg.bos_token_id);
  }
  if (ids.empty()) fail("-p: the prompt encodes to no tokens (and --no-bos is set)");
  return ids;
}

template <class Pipeline>
nlohmann::json generate(const Options& o, const ModelConfig& cfg, const ModelWeights& w,
                        const Tokenizer& tok, Pipeline& pipeline, moekit::ThreadPool& pool,
                        const ModelSetup& k) {
  const ChatEncoder enc = k.chat ? ChatEncoder(tok, *k.chat) : ChatEncoder(tok);
  std::vector<Token> prompt = prompt_ids(o, cfg, tok, k.chat, enc);
  const std::uint32_t ctx =
      o.context ? o.context : static_cast<std::uint32_t>(prompt.size() + o.n_predict);
  if (prompt.size() + o.n_predict > ctx)
    fail("-c: context length " + std::to_string(ctx) + " is shorter than the prompt (" +
         std::to_string(prompt.size()) + " tokens) plus -n " + std::to_string(o.n_predict));
  check_context(ctx, cfg, o.context == 0);

  Model<Pipeline> model(cfg, w.dense, pipeline, ctx, &pool);
  model.set_ubatch(o.ubatch);
  k.apply(model);
  Sampler sampler({o.temperature, o.top_p, o.seed, o.top_k});
  sampler.set_thread_pool(&pool);  // its passes over the vocabulary too
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
  std::vector<Token> ids;  // generated, for comparing engines token by token
  model.begin_sequence();
  auto t0 = std::chrono::steady_clock::now();
  std::span<const float> logits = model.prefill(prompt);
  require_finite_logits(logits, prompt.size() - 1);
  t.prefill_s = seconds_since(t0);
  const auto after_prefill = pipeline.stats();  // decode's own counters are the difference
  const std::uint64_t host_read_after_prefill = pipeline.loader().host_read_bytes();
  TokenProfile profile;
  TokenProfile* const timed = o.profile ? &profile : nullptr;  // decode tokens only
  model.set_profile(timed);
  const std::uint64_t steps0 = pool.adaptive_steps(), team0 = pool.team_steps(),
                      moves0 = pool.moves_off_caller_cpu();
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.n_predict; ++i) {
    const TokenProfile::Token token(timed);
    const Token next = [&] {
      const TokenProfile::Scope sampling(timed, TokenPart::sampling);
      return sampler.sample(logits);
    }();
    ids.push_back(next);
    ++t.generated_tokens;
    const bool eos = std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), next) !=
                         cfg.eos_token_ids.end() ||
                     (k.chat && enc.is_stop(next));  // the template's end of turn too
    if (eos) break;
    emit(stream.push(next));
    if (i + 1 == o.n_predict) break;
    logits = model.decode(next);
    require_finite_logits(logits, prompt.size() + ids.size() - 1);
    ++t.decoded_tokens;
  }
  t.decode_s = seconds_since(t0);
  model.set_profile(nullptr);
  const std::uint64_t steps = pool.adaptive_steps() - steps0;
  const double team = steps ? double(pool.team_steps() - team0) / double(steps) : 1.0;
  if (!o.json) {  // end the text before the statistics on stderr
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }

  return generation_json(o, cfg, w, k, pipeline, model.kv_cache().bytes(),
                         {std::move(text), std::move(prompt), std::move(ids), t, after_prefill,
                          host_read_after_prefill, timed ? profile_json(profile) : nlohmann::json(),
                          team, pool.moves_off_caller_cpu() - moves0});
}

// Pipeline counters shared by generation and --perplexity output.
template <class Pipeline>
void add_pipeline_stats(nlohmann::json& j, const Pipeline& pipeline) {
  const auto s = pipeline.stats();
  add_expert_memory_stats(j, pipeline);
  j["hit_rate"] = s.hit_rate();
  j["hits"] = s.hits;
  j["misses"] = s.misses;
  nlohmann::json by_precision = nlohmann::json::object();
  for (std::size_t i = 0; i < s.misses_by_precision.size(); ++i)
    if (s.misses_by_precision[i])
      by_precision[std::string(moekit::name(static_cast<moekit::Precision>(i)))] =
          s.misses_by_precision[i];
  j["misses_by_precision"] = by_precision;
  j["skipped"] = s.skipped;
  j["bytes_loaded"] = s.bytes_loaded();
  j["fallbacks"] = s.fallbacks;
  j["tokens_accepted"] = s.tokens_accepted;
  j["fallback_ratio"] = s.tokens_accepted ? double(s.fallbacks) / double(s.tokens_accepted) : 0.0;
  j["evictions"] = s.cache.evictions;
  add_big_pass_stats(j, pipeline);
}

// --perplexity FILE: scores the text (perplexity.hpp), optionally saving top-K log-probs or
// comparing with a reference run's.
template <class Pipeline>
nlohmann::json perplexity(const Options& o, const ModelConfig& cfg, const ModelWeights& w,
                          const Tokenizer& tok, Pipeline& pipeline, moekit::ThreadPool& pool,
                          const ModelSetup& k, TraceRecorder* recorder) {
  if (!cfg.bos_token_id)
    fail("--perplexity: the model's config has no bos_token_id; chunks are scored after a BOS");
  const std::vector<Token> tokens = tok.encode(read_text_stripped(o.perplexity), false);
  const PerplexitySettings s{o.context ? o.context : 512u, o.chunks, o.ppl_decode};
  if (o.context) check_context(s.ctx, cfg);
  std::optional<LogProbFile> save, reference;
  if (!o.save_logits.empty()) {
    moekit::io::check_output_path(o.save_logits, o.force, "--save-logits");
    if (o.logits_top_k > cfg.vocab_size)
      fail("--logits-top-k: " + std::to_string(o.logits_top_k) + " exceeds the vocabulary (" +
           std::to_string(cfg.vocab_size) + ")");
    save.emplace(cfg.vocab_size, o.logits_top_k);
    save->set_context(s.ctx);
  }
  if (!o.kl_reference.empty()) {
    reference = LogProbFile::load(o.kl_reference);
    if (reference->context() != 0 && reference->context() != s.ctx)
      fail("--kl-reference: '" + o.kl_reference + "' was scored in chunks of " +
           std::to_string(reference->context()) + " tokens (-c " +
           std::to_string(reference->context()) + "), this run scores chunks of " +
           std::to_string(s.ctx) + "; its positions do not correspond (run with -c " +
           std::to_string(reference->context()) + ")");
  }
  PerplexityMeter meter(cfg.vocab_size, save ? &*save : nullptr, reference ? &*reference : nullptr);
  Model<Pipeline> model(cfg, w.dense, pipeline, s.ctx, &pool);
  model.set_ubatch(o.ubatch);
  k.apply(model);
  const auto t0 = std::chrono::steady_clock::now();
  moekit::tools::Progress bar("perplexity: chunk", 0, moekit::tools::ProgressUnit::items, o.json);
  const PerplexityResult r =
      score_text(model, tokens, *cfg.bos_token_id, s, meter, [&](std::size_t c, std::size_t n) {
        if (recorder) recorder->name_next_sequence("chunk-" + std::to_string(c));
        char so_far[64] = "";
        if (c > 0)
          std::snprintf(so_far, sizeof so_far, "perplexity so far %.4f",
                        meter.result().perplexity());
        bar.set_total(n);
        bar.update(c, so_far);
      });
  bar.finish();
  const double seconds = seconds_since(t0);
  if (reference && r.tokens != reference->positions())
    fail("--kl-reference: the reference has " + std::to_string(reference->positions()) +
         " positions, this run scored " + std::to_string(r.tokens) +
         "; run with the same text, --ctx-size and --chunks");
  if (save) save->save(o.save_logits, o.force);

  nlohmann::json j;
  j["model"] = o.model;
  j["file"] = o.perplexity;
  j["preset"] = o.preset;
  j["precision"] = std::string(moekit::name(o.precision));
  j["activations"] = std::string(activations_name(k.kernels.int8_experts));
  j["dense_activations"] = std::string(activations_name(k.kernels.int8_dense));
  j["mode"] = s.decode ? "decode" : "prefill";
  j["ctx"] = s.ctx;
  j["chunks"] = r.chunks;
  j["tokens"] = r.tokens;
  j["mean_nll"] = r.mean_nll();
  j["perplexity"] = r.perplexity();
  if (r.has_kl) {
    j["kl_mean"] = r.mean_kl();
    j["kl_max"] = r.kl_max;
    j["top1_agreement"] = r.top1_agreement();
    j["kl_reference_top_k"] = reference->top_k();
  }
  j["seconds"] = seconds;
  j["tokens_per_s"] = seconds > 0 ? r.tokens / seconds : 0.0;
  j["expert_budget_bytes"] = pipeline.config().expert_budget_bytes;
  add_pipeline_stats(j, pipeline);
  return j;
}

void print_perplexity(const nlohmann::json& j) {
  std::printf(
      "perplexity: %zu chunks of <= %u tokens (%s), %zu tokens scored, mean NLL %.6f, "
      "perplexity %.4f\n",
      j["chunks"].get<std::size_t>(), j["ctx"].get<unsigned>(),
      j["mode"].get<std::string>().c_str(), j["tokens"].get<std::size_t>(),
      j["mean_nll"].get<double>(), j["perplexity"].get<double>());
  if (j.contains("kl_mean"))
    std::printf("KL vs reference (top-%u + rest): mean %.6f, max %.6f, top-1 agreement %.2f%%\n",
                j["kl_reference_top_k"].get<unsigned>(), j["kl_mean"].get<double>(),
                j["kl_max"].get<double>(), 100 * j["top1_agreement"].get<double>());
  std::fprintf(stderr,
               "%.1f tokens/s | experts: preset %s at %s, %s activations, hit rate %.1f%%, %llu "
               "skipped | fallbacks: %llu (ratio %.3f)\n",
               j["tokens_per_s"].get<double>(), j["preset"].get<std::string>().c_str(),
               j["precision"].get<std::string>().c_str(),
               j["activations"].get<std::string>().c_str(), 100 * j["hit_rate"].get<double>(),
               j["skipped"].get<unsigned long long>(), j["fallbacks"].get<unsigned long long>(),
               j["fallback_ratio"].get<double>());
}

// --routing-trace, said before the text: what is replayed, and that the text means nothing.
void announce_replay(const Options& o, const RoutingReplay& r) {
  const auto& t = r.trace();
  std::size_t prefill = 0;
  for (std::size_t s = 0; s < t.sequence_count(); ++s) prefill += t.prefill_length(s);
  std::fprintf(stderr,
               "routing: replayed from %s (%zu trace tokens: %zu prefill, %zu decode; of %zu "
               "records %zu were missing and take the previous token's, %zu left to the router); "
               "the generated text is MEANINGLESS: experts and gate weights come from the trace, "
               "not the router\n",
               o.routing_trace.c_str(), t.token_count(), prefill, t.token_count() - prefill,
               t.record_count(), r.filled(), t.missing_count());
}

// --routing-trace's counters in the output (JSON fields; a line on stderr).
void report_replay(nlohmann::json& j, const Options& o, const RoutingReplay& r) {
  j["routing_trace"] = o.routing_trace;
  j["routing_trace_note"] =
      "experts and gate weights replayed from the trace, not chosen by the router: the generated "
      "text is meaningless; hit rates and bytes loaded follow the trace";
  j["routing_trace_tokens"] = r.tokens();
  j["routing_trace_replayed"] = r.replayed();
  j["routing_trace_filled"] = r.filled();
  j["routing_trace_missing"] = r.missing();
  if (!o.json)
    std::fprintf(stderr,
                 "routing: %zu tokens replayed, %zu layer records from the trace, %zu missing "
                 "(the router's own top-k used); the text above is meaningless\n",
                 r.tokens(), r.replayed(), r.missing());
}

// The context of --chat and --serve: -c, else the model's positions up to 4096.
std::uint32_t chat_context(const Options& o, const ModelConfig& cfg) {
  const std::uint32_t ctx = o.context ? o.context : std::min(cfg.max_positions, 4096u);
  check_context(ctx, cfg);
  return ctx;
}

// A Model for --chat and --serve, set up as generate() sets up its own.
template <class Pipeline>
std::unique_ptr<Model<Pipeline>> chat_model(const Options& o, const ModelConfig& cfg,
                                            const ModelWeights& w, Pipeline& pipeline,
                                            moekit::ThreadPool& pool, const ModelSetup& k) {
  auto model =
      std::make_unique<Model<Pipeline>>(cfg, w.dense, pipeline, chat_context(o, cfg), &pool);
  model->set_ubatch(o.ubatch);
  k.apply(*model);
  return model;
}

// A turn's counts added to a Generation (for the statistics of --chat and --serve).
void add_turn(Generation& g, const TurnResult& r) {
  g.t.prompt_tokens += r.prompt_tokens;
  g.t.generated_tokens += r.generated_tokens;
  g.t.decoded_tokens += r.decoded_tokens;
  g.t.prefill_s += r.prefill_seconds;
  g.t.decode_s += r.decode_seconds;
}

// --chat: each line of stdin is the user's message; the reply is printed as it is generated.
// The KV cache is kept across turns (chat_session.hpp).
template <class Pipeline>
nlohmann::json chat_on(const Options& o, const ModelConfig& cfg, const ModelWeights& w,
                       const Tokenizer& tok, Pipeline& pipeline, moekit::ThreadPool& pool,
                       const ModelSetup& k) {
  const auto model = chat_model(o, cfg, w, pipeline, pool, k);
  ChatEncoder enc(tok, *k.chat);
  for (const Token id : cfg.eos_token_ids) enc.add_stop(id);
  ChatSession<Model<Pipeline>> session(*model, tok, k.chat, enc);
  Sampler sampler({o.temperature, o.top_p, o.seed, o.top_k});
  sampler.set_thread_pool(&pool);  // its passes over the vocabulary too
  const bool prompt_user = isatty(0) && !o.json;
  TurnRequest req{o.n_predict,
                  [&](std::string_view piece) {
                    if (!o.json)
                      std::fwrite(piece.data(), 1, piece.size(), stdout), std::fflush(stdout);
                    return true;
                  },
                  nullptr};
  Generation g;
  g.after_prefill = pipeline.stats();  // the decode_* counters then cover the whole chat
  nlohmann::json turns = nlohmann::json::array();
  for (std::string line;;) {
    if (prompt_user) std::fputs("> ", stdout), std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line.ends_with('\r')) line.pop_back();  // CRLF input
    if (line == "/exit") break;
    if (line.empty()) continue;
    const TurnResult r = session.say(line, sampler, req);
    if (!o.json) std::fputs("\n", stdout), std::fflush(stdout);
    if (!r.cache_kept && turns.size() > 0 && !o.json)
      std::fprintf(stderr,
                   "chat: the template renders the history differently from what was "
                   "generated; the KV cache was rebuilt for this turn\n");
    add_turn(g, r);
    g.text += (g.text.empty() ? "" : "\n") + r.text;
    turns.push_back({{"user", line},
                     {"reply", r.text},
                     {"prompt_tokens", r.prompt_tokens},
                     {"generated_tokens", r.generated_tokens},
                     {"cache_kept", r.cache_kept},
                     {"finish_reason", r.finish_reason}});
  }
  nlohmann::json j = generation_json(o, cfg, w, k, pipeline, model->kv_cache().bytes(), g);
  j["chat_template"] = std::string(k.chat->name());
  j["turns"] = std::move(turns);
  return j;
}

// The offloading counters /metrics reports (as in --json: hit rate, bytes, prefetch quality).
template <class Pipeline>
std::vector<std::pair<std::string, double>> offload_counters(const Pipeline& pipeline) {
  const auto s = pipeline.stats();
  moekit::PredictionStats pred;
  for (const auto& p : s.prediction) {
    pred.true_positive += p.true_positive;
    pred.false_positive += p.false_positive;
    pred.false_negative += p.false_negative;
  }
  return {{"expert_cache_hit_rate", s.hit_rate()},
          {"expert_cache_hits_total", double(s.hits)},
          {"expert_cache_misses_total", double(s.misses)},
          {"expert_cache_evictions_total", double(s.cache.evictions)},
          {"expert_bytes_loaded_total", double(s.bytes_loaded())},
          {"expert_load_stall_seconds_total", s.stall_seconds},
          {"prefetch_precision", pred.precision()},
          {"prefetch_recall", pred.recall()},
          {"token_fallbacks_total", double(s.fallbacks)}};
}

// --serve: the OpenAI-compatible server (examples/moe-server/openai_server.hpp) over one Model;
// a chat request continuing the previous conversation keeps its KV cache.
template <class Pipeline>
nlohmann::json serve_on(const Options& o, const ModelConfig& cfg, const ModelWeights& w,
                        const Tokenizer& tok, Pipeline& pipeline, moekit::ThreadPool& pool,
                        const ModelSetup& k) {
#if MOE_RUN_HAS_SERVER
  const auto model = chat_model(o, cfg, w, pipeline, pool, k);
  ChatEncoder enc = k.chat ? ChatEncoder(tok, *k.chat) : ChatEncoder(tok);
  for (const Token id : cfg.eos_token_ids) enc.add_stop(id);
  ChatSession<Model<Pipeline>> session(*model, tok, k.chat, enc);
  moe_server::ServerEngine e;
  e.has_chat_template = k.chat != nullptr;
  e.no_chat_template_reason =
      "the model has no chat template: start moe-run --serve with "
      "--chat-template one of " +
      chat_format_list();
  e.chat = [&](std::span<const ChatMessage> m, const SamplerConfig& s, const TurnRequest& r) {
    Sampler sampler(s);
    sampler.set_thread_pool(&pool);  // its passes over the vocabulary too
    return session.reply(m, sampler, r);
  };
  e.complete = [&](const std::string& prompt, const SamplerConfig& s, const TurnRequest& r) {
    Sampler sampler(s);
    sampler.set_thread_pool(&pool);  // its passes over the vocabulary too
    std::vector<Token> ids = tok.encode(prompt, false);
    if (!o.no_bos && cfg.bos_token_id) ids.insert(ids.begin(), *cfg.bos_token_id);
    return session.complete(ids, sampler, r);
  };
  e.counters = [&] { return offload_counters(pipeline); };
  moe_server::ServerConfig sc{o.host,
                              o.port,
                              o.server_max_body,
                              o.server_max_tokens,
                              std::min(o.n_predict, o.server_max_tokens),
                              o.server_queue,
                              o.server_timeout,
                              fs::path(o.model).filename().string(),
                              {o.temperature, o.top_p, o.seed, o.top_k}};
  const moe_server::ServerTotals t = moe_server::OpenAiServer(sc, std::move(e)).run();
  Generation g;
  g.t = {t.prefill_seconds, t.decode_seconds, t.prompt_tokens, t.decoded_tokens,
         t.generated_tokens};
  nlohmann::json j = generation_json(o, cfg, w, k, pipeline, model->kv_cache().bytes(), g);
  j["server_requests"] = t.requests;
  j["server_rejected"] = t.rejected;
  j["server_failed"] = t.failed;
  j["server_cancelled"] = t.cancelled;
  return j;
#else
  (void)o, (void)cfg, (void)w, (void)tok, (void)pipeline, (void)pool, (void)k;
  fail(
      "--serve: this moe-run was built without cpp-httplib (Debian's libcpp-httplib-dev, "
      "installed by scripts/install-deps.sh)");
#endif
}

// Generation or --perplexity on `pipeline`, behind a TracingPipeline when --trace-out is set.
template <class Pipeline>
nlohmann::json run_on(const Options& o, const ModelConfig& cfg, const ModelWeights& w,
                      const Tokenizer& tok, Pipeline& pipeline, moekit::ThreadPool& pool,
                      const ModelSetup& k) {
  auto go = [&](auto& p, TraceRecorder* recorder) {
    if (o.chat) return chat_on(o, cfg, w, tok, p, pool, k);
    if (o.serve) return serve_on(o, cfg, w, tok, p, pool, k);
    return o.perplexity.empty() ? generate(o, cfg, w, tok, p, pool, k)
                                : perplexity(o, cfg, w, tok, p, pool, k, recorder);
  };
  if (o.trace_out.empty()) {
    nlohmann::json j = go(pipeline, nullptr);
    if (k.replay) report_replay(j, o, *k.replay);
    return j;
  }
  moekit::io::check_output_path(o.trace_out, o.force, "--trace-out");
  TraceRecorder recorder(cfg, fs::path(o.trace_out).stem().string());
  TracingPipeline<Pipeline> traced(pipeline, recorder);
  nlohmann::json j = go(traced, &recorder);
  if (k.replay) report_replay(j, o, *k.replay);
  recorder.write(o.trace_out, o.force);
  j["trace_out"] = o.trace_out;
  j["trace_tokens"] = recorder.trace().token_count();
  if (!o.json)
    std::fprintf(stderr, "trace: %zu tokens x %u layers written to %s\n",
                 recorder.trace().token_count(), cfg.n_moe_layers, o.trace_out.c_str());
  return j;
}

void print_stats(const nlohmann::json& j) {
  char buf[96] = "none made";
  if (j["predictions_made"].get<bool>())
    std::snprintf(buf, sizeof buf, "precision %.3f, recall %.3f",
                  j["prediction_precision"].get<double>(), j["prediction_recall"].get<double>());
  const std::string prediction = buf;
  std::fprintf(
      stderr,
      "\nprefill: %zu tokens, %.2f tokens/s | generated: %zu tokens, decode %.2f tokens/s\n"
      "experts: preset %s at %s, %s activations, budget %zu bytes, hit rate %.1f%% (%llu "
      "hits, %llu misses), %llu bytes loaded, %llu evictions\n"
      "prediction: %s | fallbacks: %llu | dense part: %s, %.1f MiB, %s activations\n",
      j["prompt_tokens"].get<std::size_t>(), j["prefill_tokens_per_s"].get<double>(),
      j["generated_tokens"].get<std::size_t>(), j["decode_tokens_per_s"].get<double>(),
      j["preset"].get<std::string>().c_str(), j["precision"].get<std::string>().c_str(),
      j["activations"].get<std::string>().c_str(), j["expert_budget_bytes"].get<std::size_t>(),
      100 * j["hit_rate"].get<double>(), j["hits"].get<unsigned long long>(),
      j["misses"].get<unsigned long long>(), j["bytes_loaded"].get<unsigned long long>(),
      j["evictions"].get<unsigned long long>(), prediction.c_str(),
      j["fallbacks"].get<unsigned long long>(), j["dense_precision"].get<std::string>().c_str(),
      j["dense_bytes"].get<double>() / (1 << 20),
      j["dense_activations"].get<std::string>().c_str());
  if (!j.contains("profile")) return;
  const nlohmann::json& p = j["profile"];
  std::fprintf(stderr, "profile: %zu decode tokens, %.1f us per token\n",
               p["tokens"].get<std::size_t>(), 1e6 * p["seconds_per_token"].get<double>());
  for (std::size_t i = 0; i < token_part_count; ++i) {
    const std::string part(name(static_cast<TokenPart>(i)));
    std::fprintf(stderr, "  %-18s %5.1f%%\n", part.c_str(), 100 * p[part].get<double>());
  }
}

// ---- expert source and preset inputs (offload wiring) -------------------------------------

struct ExpertPlacement {
  std::shared_ptr<const moekit::io::ExpertStore> store;  // null: host memory or in place only
  std::shared_ptr<const moekit::io::CheckpointExperts> checkpoint;  // read in place, or null
  bool built = false;
};

std::string precision_list(std::span<const moekit::Precision> ps) {
  std::string s;
  for (moekit::Precision p : ps) {
    if (!s.empty()) s += ',';
    s += moekit::name(p);
  }
  return s;
}

std::shared_ptr<const moekit::io::ExpertStore> open_store(const std::string& path,
                                                          const moekit::ModelShape& shape,
                                                          std::span<const moekit::Precision> need,
                                                          const char* flag) {
  auto st = std::make_shared<moekit::io::ExpertStore>(moekit::io::ExpertStore::open(path, shape));
  for (moekit::Precision p : need) {
    const auto& have = st->manifest().precisions;
    if (std::find(have.begin(), have.end(), p) == have.end())
      fail(std::string(flag) + ": expert store '" + path + "' holds " + precision_list(have) +
           ", but this run needs " + precision_list(need) +
           " (rebuild it with moe-convert "
           "--precisions " +
           precision_list(need) + ")");
  }
  return st;
}

// `order`: where the quantized experts' rows go in a store built here. A store given with --store
// or -m keeps its own order; an explicit --expert-layout must match it. Experts in host memory
// (no store) are packed by the caller. Otherwise the experts are read in place from the
// checkpoint at its own precision, and a store is built only for the precisions it lacks.
ExpertPlacement place_experts(const Options& o, const ModelConfig& cfg, const ModelPath& m,
                              const std::string& store, const std::vector<moekit::Precision>& need,
                              moekit::MatrixOrder order,
                              std::shared_ptr<const moekit::io::CheckpointExperts> in_place) {
  if (!store.empty()) {
    const char* flag = o.store.empty() ? "-m" : "--store";
    auto st = open_store(store, cfg.shape(), need, flag);
    if (o.expert_layout && *o.expert_layout != st->manifest().order)
      fail(std::string("--expert-layout ") + layout_word(*o.expert_layout) + ": expert store '" +
           store + "' (" + flag + ") holds its quantized experts in " +
           layout_word(st->manifest().order) + " (rebuild it with moe-convert --layout " +
           layout_word(*o.expert_layout) + ")");
    return {std::move(st), nullptr, false};
  }
  if (o.in_memory) return {};
  std::vector<moekit::Precision> extras = need;
  if (in_place) std::erase(extras, in_place->precision());
  if (in_place && extras.size() == need.size()) in_place = nullptr;  // not read at its own type
  if (in_place && extras.empty()) return {nullptr, std::move(in_place), false};
  CachedStore c = !m.gguf.empty()
                      ? cached_gguf_store(m.gguf, extras, MOE_RUN_STORE_DIR, o.json, order)
                      : cached_store(cfg, m.dir, extras, MOE_RUN_STORE_DIR, o.json, order);
  return {std::move(c.store), std::move(in_place), c.built};
}

// The calibration run's routing (calibration is not evaluation): the first --calib-tokens (128)
// tokens of --calib-text (default: the built-in WikiText-2 slice beside heldout.txt, when the
// source tree is there), or with --calib-text prompt the prompt plus --calib-tokens (16) greedy
// tokens. With --routing-trace the calibration run replays the trace's tokens that the measured
// run does not (held_out_replay), by default as many as there are (at most 512).
// The routing the calibration run replays with --routing-trace: the trace's tokens that the
// measured run (this prompt, -n) does not replay, as moe-sim --replay-slice calibrates
// (sim/calibration_split.hpp), so that a preset's profile is never fitted to the tokens it is
// measured on and both tools calibrate on the same routing.
RoutingReplay held_out_replay(const Options& o, const ModelConfig& cfg, const Tokenizer& tok,
                              const ModelSetup& setup) {
  const ChatEncoder enc = setup.chat ? ChatEncoder(tok, *setup.chat) : ChatEncoder(tok);
  const std::size_t prompt = prompt_ids(o, cfg, tok, setup.chat, enc).size();
  const std::size_t decode = o.n_predict > 1 ? std::size_t(o.n_predict - 1) : 0;
  moekit::sim::CalibrationSplit split =
      moekit::sim::slice_like_routing_replay(setup.replay->trace(), prompt, decode);
  if (split.calibration.token_count() < 2)
    fail("--routing-trace '" + o.routing_trace + "': a " + std::to_string(prompt) +
         "-token prompt and -n " + std::to_string(o.n_predict) + " replay all but " +
         std::to_string(split.calibration.token_count()) +
         " of its tokens, and the calibration run needs 2 others (a shorter prompt or -n, or a "
         "longer trace)");
  RoutingReplay r(std::move(split.calibration), cfg, "--routing-trace (calibration part)");
  r.set_replace_logits(setup.replay->replaces_logits());
  return r;
}

Calibration calibration_run(const Options& o, const ModelConfig& cfg, const ModelWeights& w,
                            const Tokenizer& tok, const OffloadSettings& settings,
                            const ExpertBacking& backing, moekit::ThreadPool& pool,
                            const ModelSetup& setup) {
  const std::optional<Token> bos = o.no_bos ? std::nullopt : std::optional<Token>(cfg.bos_token_id);
  std::string file = o.calib_text.empty() ? MOE_RUN_CALIB_TEXT : o.calib_text;
  std::string fallback;
  if (o.calib_text.empty() && !std::filesystem::exists(file))
    fallback = " (" + file + " not found)", file = "prompt";
  moekit::tools::Progress bar("calibration: layer", 0, moekit::tools::ProgressUnit::items, o.json);
  const moekit::engine::LayerProgress progress = [&](std::uint64_t done, std::uint64_t total) {
    bar.set_total(total);
    bar.update(done);
  };
  std::optional<RoutingReplay> held_out;
  if (setup.replay) held_out.emplace(held_out_replay(o, cfg, tok, setup));
  RoutingReplay* const replay = held_out ? &*held_out : nullptr;
  std::size_t count = 128;
  if (o.calib_tokens >= 0)
    count = std::size_t(o.calib_tokens);
  else if (held_out)  // the text's tokens after its BOS: the held-out tokens, BOS included
    count = std::clamp<std::size_t>(held_out->trace().token_count() - (bos ? 1 : 0), 2, 512);
  Calibration c;
  if (file == "prompt") {
    std::vector<Token> prompt = tok.encode(o.prompt, false);
    if (bos) prompt.insert(prompt.begin(), *bos);
    if (prompt.empty()) fail("-p: the prompt encodes to no tokens (calibration run)");
    const int extra = o.calib_tokens < 0 ? 16 : o.calib_tokens;
    c = calibrate(cfg, w.dense, settings, backing, prompt, extra, &pool, setup.kernels, replay,
                  progress);
    c.source = "the prompt plus " + std::to_string(extra) + " greedy tokens" + fallback +
               (o.perplexity.empty() ? ": the start of the generated text itself" : "");
  } else {
    const CalibrationText t = calibration_text(file, tok, bos, count, o.perplexity);
    c = calibrate(cfg, w.dense, settings, backing, t.tokens, 0, &pool, setup.kernels, replay,
                  progress);
    c.source = t.source;
  }
  bar.finish();
  if (held_out)
    c.source += ", routed by " + std::to_string(c.tokens) + " of the " +
                std::to_string(held_out->trace().token_count()) +
                " --routing-trace tokens the measured run does not replay (held out)";
  if (!o.json) std::fprintf(stderr, "calibration: routing of %s counted\n", c.source.c_str());
  return c;
}

// Fate's decode cap n = floor(T / t_expert) from this machine's decode compute per layer (T) and
// one expert's load at the decode prefetch precision (t_expert); engine/decode_timing.hpp.
void measure_fate_timing(const Options& o, const ModelConfig& cfg, const ModelWeights& w,
                         const Tokenizer& tok, const OffloadSettings& settings,
                         const ExpertBacking& backing, moekit::ThreadPool& pool,
                         const ModelKernels& kernels, PresetInputs& in, nlohmann::json& notes) {
  std::vector<Token> prompt = tok.encode(o.prompt, false);
  if (!o.no_bos && cfg.bos_token_id) prompt.insert(prompt.begin(), *cfg.bos_token_id);
  if (prompt.empty()) fail("-p: the prompt encodes to no tokens (decode timing run)");
  const DecodeTiming t = measure_decode_timing(cfg, w.dense, settings, backing, prompt,
                                               /*decode_tokens=*/8, o.precision, &pool, kernels);
  in.layer_seconds = t.layer_seconds;
  in.expert_load_seconds = t.expert_load_seconds;
  notes["fate_decode_timing"] = {
      {"layer_seconds", t.layer_seconds},
      {"expert_load_seconds", t.expert_load_seconds},
      {"decode_cap", std::floor(t.layer_seconds / t.expert_load_seconds)}};
  if (!o.json)
    std::fprintf(stderr,
                 "fate: measured T = %.3f ms of decode compute per layer (median of %zu), "
                 "t_expert = %.3f ms per %s expert load: decode prefetch cap n = %.0f\n",
                 1e3 * t.layer_seconds, t.layer_samples, 1e3 * t.expert_load_seconds,
                 std::string(moekit::name(o.precision)).c_str(),
                 std::floor(t.layer_seconds / t.expert_load_seconds));
}

// hobbit-oracle's figures (--hobbit-recall), as moe-sim prints its HOBBIT stand-in's.
void note_hobbit_recall(const Options& o, nlohmann::json& notes) {
  const std::string figures = moekit::presets::describe(
      moekit::presets::parse_hobbit_recall(o.preset_params.hobbit_recall));
  notes["hobbit_oracle_recall"] = figures;
  if (!o.json)
    std::fprintf(stderr,
                 "hobbit-oracle: noisy oracle over the replayed routing, %s, precisions by T1/T2 "
                 "on the predicted gate weights\n",
                 figures.c_str());
}

// Router weights, calibration routing and measured latencies, for the presets that need them.
PresetInputs preset_inputs(const Options& o, const PresetEntry& preset, const ModelConfig& cfg,
                           const ModelWeights& w, const Tokenizer& tok,
                           const OffloadSettings& settings, const ExpertBacking& backing,
                           moekit::ThreadPool& pool, const ModelSetup& setup,
                           nlohmann::json& notes) {
  const StartupNeeds needs = startup_needs(preset, settings);
  const moekit::ModelShape shape = cfg.shape();
  PresetInputs in;
  if (!o.preset_params.popularity_file.empty())
    in.popularity = load_popularity(o.preset_params.popularity_file, shape);
  if (needs.calibration) {
    const Calibration c = calibration_run(o, cfg, w, tok, settings, backing, pool, setup);
    if (in.popularity.empty()) in.popularity = c.counts;
    in.paths = c.paths;
    notes["calibration"] = c.source;
  }
  if (needs.bitwidths) in.bitwidths = bitwidth_table(shape, settings);
  if (preset.needs.lookahead && setup.replay)  // not owned: the replay outlives the pipeline
    in.lookahead = std::shared_ptr<moekit::RoutingLookahead>(std::shared_ptr<void>{}, setup.replay);
  if (moekit::presets::is<moekit::presets::HobbitOracleSpec>(preset)) note_hobbit_recall(o, notes);
  if (needs.decode_timing)
    measure_fate_timing(o, cfg, w, tok, settings, backing, pool, setup.kernels, in, notes);
  in.cpu_seconds_per_token = o.preset_params.cpu_seconds_per_token;
  in.copy_seconds = o.preset_params.copy_seconds;
  if (needs.latencies) {
    const FiddlerLatencies l =
        measure_fiddler_latencies(shape, o.precision, backing, &pool, setup.kernels);
    if (!(in.cpu_seconds_per_token > 0)) {  // the measured line (--cpu-latency: its own slope)
      in.cpu_seconds_per_token = l.cpu_seconds_per_token;
      in.cpu_seconds_per_expert = l.cpu_seconds_per_expert;
    }
    if (!(in.copy_seconds > 0)) in.copy_seconds = l.copy_seconds;
    if (!o.json)
      std::fprintf(stderr,
                   "fiddler: CPU time per expert call %.1f us + %.1f us per token (fitted over "
                   "%u experts at 1-32 tokens), %.1f us to load + run one expert\n",
                   1e6 * in.cpu_seconds_per_expert, 1e6 * in.cpu_seconds_per_token,
                   l.experts_sampled, 1e6 * in.copy_seconds);
  }
  return in;
}

// The tokenizer of a model: the embedded vocabulary of a GGUF file (SentencePiece "llama" or
// byte-level BPE "gpt2"); in a Hugging Face directory tokenizer.model (SentencePiece), else a
// byte-level BPE tokenizer.json.
Tokenizer load_tokenizer(const ModelPath& m, const moekit::io::GgufFile* gguf) {
  if (gguf) return Tokenizer::from_gguf(*gguf);
  return Tokenizer::from_hf_dir(m.dir);
}

// --precision auto: the experts' own type in the checkpoint when read in place; otherwise (types
// without an exact path, or K-quants held in host memory) the nearest moekit format, into which
// they are converted once, said on stderr.
moekit::Precision auto_precision(const moekit::io::CheckpointExperts* in_place,
                                 const moekit::io::GgufFile* gguf, const ModelConfig& cfg,
                                 bool quiet) {
  if (in_place) return in_place->precision();
  moekit::Precision p = moekit::Precision::q4;
  std::string from = "?";
  if (gguf) {
    const auto m = moekit::io::find_expert_matrices(*gguf, io_architecture(cfg.arch),
                                                    moekit::io::TensorFormat::gguf, {0, 0});
    from = std::string(moekit::io::name(m.gate.dtype));
    p = moekit::io::nearest_moekit_precision(m.gate.dtype);
  }
  if (!quiet)
    std::fprintf(stderr,
                 "--precision auto: the experts' type %s has no exact in-place path; "
                 "they are converted once into a store at %s (dequantized, then quantized again)\n",
                 from.c_str(), std::string(moekit::name(p)).c_str());
  return p;
}

// --precision auto with an expert store (--store, -m STORE): the most precise precision it holds.
moekit::Precision most_precise(std::span<const moekit::Precision> held) {
  return *std::max_element(held.begin(), held.end(), [](moekit::Precision a, moekit::Precision b) {
    return moekit::bits(a) < moekit::bits(b);
  });
}

// Bytes of KV cache at context `ctx` (an upper bound: sliding-window layers keep less);
// saturates at SIZE_MAX rather than wrap for absurd sizes.
std::size_t kv_cache_bytes(const ModelConfig& cfg, std::size_t ctx, KvType type) {
  const long double bytes = static_cast<long double>(cfg.n_layers) * 2 * ctx * cfg.kv_dim() *
                            static_cast<long double>(moekit::engine::kv_element_bytes(type));
  return bytes < 0x1p64L ? static_cast<std::size_t>(bytes) : SIZE_MAX;
}

// Expert memory the pipeline may hold beyond its budget: the arena's one expert, and for a preset
// that stages misses a layer's experts and an upgrade more (PresetNeeds::staged_misses).
std::size_t staging_beyond_budget(const Options& o, const moekit::ModelShape& shape,
                                  const PresetEntry& preset) {
  return shape.expert_bytes(o.precision) *
         (1 + (preset.needs.staged_misses ? std::size_t{shape.n_experts} + 1 : 0));
}

// --expert-budget auto: what the memory this process may use leaves for the expert cache after
// the dense part, the KV cache and the loader's buffers (memory_budget.hpp); refused, naming the
// flag and the missing bytes, when not even one token's experts fit.
// `host_expert_bytes`: experts held in host memory besides the cache (--in-memory, or the ring
// Fiddler reads experts into to run them on the CPU).
// `limits`: read before anything was loaded (what is loaded since is counted by its own terms).
moekit::engine::AutoBudget auto_budget(const Options& o, const ModelConfig& cfg,
                                       const PresetEntry& preset,
                                       const moekit::io::MemoryLimits& limits,
                                       std::size_t dense_bytes, std::size_t prompt_tokens,
                                       std::size_t host_expert_bytes) {
  const moekit::ModelShape shape = cfg.shape();
  moekit::engine::AutoBudgetInputs in;
  in.usable_bytes = limits.usable_bytes();
  in.usable_source = limits.source();
  in.dense_bytes = dense_bytes;
  const std::size_t ctx = o.context ? o.context : prompt_tokens + o.n_predict + 1;
  in.kv_cache_bytes =
      kv_cache_bytes(cfg, std::max<std::size_t>(ctx, o.perplexity.empty() ? 0 : 512), o.kv_type);
  // Per loader thread (the checkpoint reader runs two per --io-threads): the checkpoint source's
  // two staging buffers (one chunk read ahead while one is converted) and O_DIRECT's bounce
  // buffer.
  in.io_buffer_bytes = 2 * std::size_t{o.io_threads} * (20u << 20);
  in.other_bytes = host_expert_bytes;
  in.staging_bytes = staging_beyond_budget(o, shape, preset);
  in.minimum_expert_bytes = minimum_expert_budget(shape, o.precision);
  in.all_resident_expert_bytes = all_resident_budget(shape, o.precision);
  return moekit::engine::auto_expert_budget(in);
}

// The dense part's bytes in the file, as a lower bound of what it takes in memory: checked
// against the usable memory before anything is loaded.
std::size_t dense_file_bytes(const ModelPath& m, const moekit::io::CheckpointExperts& e) {
  std::size_t total = 0;
  for (const std::string& f : e.files()) total += fs::file_size(f);
  if (m.gguf.empty())
    for (const auto& entry : fs::directory_iterator(m.dir))
      if (entry.path().extension() == ".safetensors" &&
          std::find(e.files().begin(), e.files().end(), entry.path().string()) == e.files().end())
        total += entry.file_size();
  return total - std::min<std::size_t>(total, e.stored_bytes());
}

// The run's large allocations against the memory this process may use, before any is made
// (memory_budget.hpp's require_memory_fit; --expert-budget auto has its own check). `located`:
// the checkpoint's experts, whose file gives the dense part's size (a lower bound of its memory).
void check_memory_fit(const Options& o, const ModelConfig& cfg, const ModelPath& model,
                      const moekit::io::CheckpointExperts* located, const PresetEntry& preset,
                      const OffloadSettings& settings, std::size_t prompt_tokens,
                      const moekit::io::MemoryLimits& limits) {
  if (o.budget.kind == BudgetSpec::Kind::automatic) return;
  const moekit::ModelShape shape = cfg.shape();
  const std::size_t all = all_resident_budget(shape, settings.precision);
  const std::size_t budget = settings.expert_budget ? std::min(settings.expert_budget, all) : all;
  const std::size_t ctx = std::max<std::size_t>(o.context ? o.context : prompt_tokens + o.n_predict,
                                                o.perplexity.empty() ? 0 : 512);
  const std::string ctx_words =
      o.context ? "-c " + std::to_string(ctx) : std::to_string(ctx) + " tokens (prompt + -n)";
  moekit::engine::require_memory_fit(
      limits.usable_bytes(), limits.source(),
      {{kv_cache_bytes(cfg, ctx, o.kv_type),
        "KV cache (" + std::string(name(o.kv_type)) + ") at " + ctx_words, o.context ? "-c" : "-p"},
       {located ? dense_file_bytes(model, *located) : 0, "dense weights", "--dense-precision"},
       {budget, "expert cache", "--expert-budget"},
       {staging_beyond_budget(o, shape, preset), "expert staging beyond the budget",
        "--expert-budget"},
       {o.in_memory ? all : 0, "experts in host memory", "--in-memory"}});
}

struct OpenModel {
  ModelSource src;
  std::optional<moekit::io::GgufFile> gguf;
  ModelConfig cfg;
};

// Resolves auto precision and the budget's kind before any weight is read. `located`: the
// checkpoint's experts, read in place or not (--in-memory), whose type --precision auto takes.
OffloadSettings offload_settings(Options& o, const OpenModel& m, const PresetEntry& preset,
                                 const moekit::io::CheckpointExperts* in_place,
                                 const moekit::io::CheckpointExperts* located,
                                 std::size_t prompt_tokens,
                                 const moekit::io::MemoryLimits& limits) {
  const moekit::ModelShape shape = m.cfg.shape();
  if (o.precision_auto && !located && !m.src.store.empty())
    o.precision = most_precise(moekit::io::ExpertStore::open(m.src.store).manifest().precisions);
  else if (o.precision_auto)
    o.precision = auto_precision(located, m.gguf ? &*m.gguf : nullptr, m.cfg, o.json);
  if (o.low_precision_auto && moekit::bits(o.precision) <= moekit::bits(moekit::Precision::q4))
    o.preset_params.low = moekit::Precision::q2;
  OffloadSettings settings{o.budget.resolve(all_resident_budget(shape, o.precision)), o.precision,
                           o.preset_params};
  if (o.budget.kind == BudgetSpec::Kind::automatic && in_place)
    (void)auto_budget(o, m.cfg, preset, limits, dense_file_bytes(m.src.model, *in_place),
                      prompt_tokens, 0);
  check_budget(shape, settings);
  check_preset_params(preset, settings);
  moekit::engine::check_shape_flags(o, shape);
  if (o.perplexity.empty() && o.routing_trace.empty())  // the prompt's positions, before loading
    check_context(
        o.context ? o.context : prompt_tokens - 1 + (!o.no_bos && m.cfg.bos_token_id) + o.n_predict,
        m.cfg, o.context == 0);
  check_memory_fit(o, m.cfg, m.src.model, located, preset, settings, prompt_tokens, limits);
  return settings;
}

// Where the experts came from and the budget chosen, then the statistics (JSON or stderr).
void report_source(nlohmann::json& stats, const Options& o, const ExpertPlacement& where,
                   const std::string& loader_kind, moekit::MatrixOrder order,
                   const std::string& budget_note) {
  std::string source = where.checkpoint ? "in place: " + where.checkpoint->files().front() : "";
  if (where.store) source += (source.empty() ? "" : " + ") + where.store->path();
  stats["expert_source"] = source.empty() ? std::string("host memory") : source;
  stats["expert_reads"] = loader_kind;
  stats["expert_layout"] = layout_word(order);
  stats["store_built"] = where.built;
  if (!budget_note.empty()) stats["expert_budget_auto"] = budget_note;
  if (!o.json)
    std::fprintf(stderr, "expert source: %s (%s%s, %s)%s\n",
                 stats["expert_source"].get<std::string>().c_str(), loader_kind.c_str(),
                 (where.store || where.checkpoint) && o.direct ? ", O_DIRECT" : "",
                 stats["expert_layout"].get<std::string>().c_str(),
                 where.built ? " [built now]" : "");
  if (o.json)
    // Generated text may end inside a UTF-8 sequence (bytes of byte-fallback tokens): replaced
    // by U+FFFD rather than thrown as json type_error.316 after the whole run.
    std::cout << stats.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  else if (!o.perplexity.empty())
    print_perplexity(stats);
  else
    print_stats(stats);
}

struct ExpertWarmStart {
  std::uint64_t bytes = 0;  // experts loaded before the prompt
  double seconds = 0;
};

// Every expert loaded before the prompt when the budget holds them all (unless --lazy-load), so
// the prompt's time is compute, as llama.cpp's is after it reads its file.
template <class Pipeline>
ExpertWarmStart warm_start(const Options& o, Pipeline& pipeline) {
  if (o.lazy_load) return {};
  const auto t0 = std::chrono::steady_clock::now();
  moekit::tools::Progress bar("experts: loading layer", 0, moekit::tools::ProgressUnit::items,
                              o.json);
  ExpertWarmStart w{moekit::engine::load_all_experts(pipeline,
                                                     [&](std::size_t l, std::size_t n) {
                                                       bar.set_total(n);
                                                       bar.update(l);
                                                     }),
                    0};
  bar.finish();
  w.seconds = seconds_since(t0);
  if (w.bytes > 0 && !o.json)
    std::fprintf(stderr,
                 "experts: all %s loaded before the prompt in %.2f s (%.2f GB/s; "
                 "--lazy-load reads each on first use)\n",
                 format_bytes(w.bytes).c_str(), w.seconds,
                 double(w.bytes) / std::max(w.seconds, 1e-9) / 1e9);
  return w;
}

// --expert-layout (auto: the per-core table of engine/expert_layout.hpp, rows or blocked panels
// with int8 activations, rows with float ones: the float paths would gather every panel row).
moekit::MatrixOrder expert_order(const Options& o, const moekit::ModelShape& shape, bool int8) {
  const bool panels_fit = moekit::panels_supported(shape.quant);
  if (o.expert_layout && moekit::in_panels(*o.expert_layout) && !panels_fit)
    fail(std::string("--expert-layout ") + layout_word(*o.expert_layout) +
         ": the experts' group size " + std::to_string(shape.quant.group_size) +
         " cannot be in panels (32, 64 or 128)");
  return o.expert_layout.value_or(panels_fit ? auto_expert_order(moekit::detect_core(), int8)
                                             : moekit::MatrixOrder::rows);
}

// --routing-trace: the trace read and checked against the model (nullopt without the flag;
// refused for a preset that needs it).
std::optional<RoutingReplay> load_replay(const Options& o, const ModelConfig& cfg,
                                         const PresetEntry& preset) {
  if (preset.needs.lookahead && o.routing_trace.empty())
    fail("--preset " + std::string(preset.name) +
         ": needs --routing-trace FILE (its predictor is a noisy oracle over the replayed "
         "routing)");
  if (o.routing_trace.empty()) return std::nullopt;
  std::optional<RoutingReplay> r(RoutingReplay::from_file(o.routing_trace, cfg));
  r->set_replace_logits(preset.needs.replayed_logits);
  if (!o.json) announce_replay(o, *r);
  return r;
}

// Experts converted from a GGUF into a store (no exact in-place path): the loss, measured once
// and recorded beside the store (conversion_loss.hpp), in a cache no larger than the run's; null
// for every other source.
nlohmann::json conversion_loss(const Options& o, const OpenModel& m, bool located,
                               const ExpertPlacement& where, const OffloadSettings& settings,
                               const StoreIo& io, const ModelWeights& w, const Tokenizer& tok,
                               moekit::ThreadPool& pool) {
  if (!m.gguf || located || !where.store) return nullptr;
  const std::size_t budget = settings.expert_budget
                                 ? settings.expert_budget
                                 : all_resident_budget(m.cfg.shape(), settings.precision);
  const ConversionLossRequest req{
      o.conversion_loss,
      o.conversion_loss_text.empty() ? MOE_RUN_LOSS_TEXT : o.conversion_loss_text,
      {.expert_budget_bytes = budget, .io = io},
      o.json};
  return store_conversion_loss(req, m.cfg, w.dense, tok, *m.gguf, where.store, &pool);
}

// --expert-budget auto, once the dense part is loaded: sets `settings.expert_budget` and returns
// the arithmetic (printed unless --json); "" for an explicit budget.
std::string resolve_auto_budget(const Options& o, const ModelConfig& cfg,
                                const moekit::io::MemoryLimits& limits, const PresetEntry& preset,
                                const ModelWeights& w, std::size_t prompt_tokens,
                                bool experts_outside, OffloadSettings& settings) {
  if (o.budget.kind != BudgetSpec::Kind::automatic) return "";
  const moekit::ModelShape shape = cfg.shape();
  // Experts run on the CPU without host copies are read into a ring of a layer's experts.
  const std::size_t host_ring = preset.needs.host_bytes && experts_outside
                                    ? std::size_t{shape.n_experts} * shape.expert_bytes(o.precision)
                                    : 0;
  const moekit::engine::AutoBudget b = auto_budget(
      o, cfg, preset, limits, w.dense.bytes(), prompt_tokens, w.experts.total_bytes() + host_ring);
  settings.expert_budget = b.all_resident ? 0 : b.expert_bytes;
  if (!o.json) std::fprintf(stderr, "%s\n", b.explanation.c_str());
  return b.explanation;
}

// The experts' codec in the JSON and on stderr, and the `notes` that are not null in the JSON.
void report_codec(nlohmann::json& stats, const Options& o, const moekit::ModelShape& shape,
                  const std::vector<moekit::Precision>& needed, const nlohmann::json& notes) {
  stats["expert_group_size"] = shape.quant.group_size;
  for (const auto& [key, value] : notes.items())
    if (!value.is_null()) stats[key] = value;
  if (o.json || std::none_of(needed.begin(), needed.end(), moekit::is_quantized)) return;
  const std::string codec = shape.quant.group_size == 0
                                ? std::string("per output channel")
                                : "groups of " + std::to_string(shape.quant.group_size);
  std::fprintf(stderr, "experts: quantized in %s%s\n", codec.c_str(),
               o.group_size ? "" : " (--group-size auto: the preset's codec)");
}

// The config of the model `m` names (opening its GGUF), its layer and expert counts checked
// against the tensors present before anything is sized by them.
const ModelConfig& open_config(OpenModel& m) {
  const ModelPath& mp = m.src.model;
  if (!mp.gguf.empty()) m.gguf.emplace(mp.gguf.string());
  m.cfg = m.gguf ? gguf_config(*m.gguf) : load_config(mp.dir);  // GGUF: checked as it is read
  if (!m.gguf)
    moekit::engine::check_tensor_census(m.cfg, moekit::io::SafetensorsModel::open(mp.dir).names(),
                                        mp.dir.string());
  return m.cfg;
}

// --chat-template: auto (the default of --chat and --serve) is the model's own template, from
// GGUF tokenizer.chat_template or the HF directory's tokenizer_config.json / chat_template.jinja.
// nullopt: -p is completed as it is, or --serve (auto, no template) serves completions only.
std::optional<ChatTemplate> chat_template(const Options& o, const OpenModel& m,
                                          const Tokenizer& tok) {
  const std::string want =
      o.chat_template.empty() && (o.chat || o.serve) ? "auto" : o.chat_template;
  if (want.empty()) return std::nullopt;
  auto text_of = [&](std::optional<std::uint32_t> id) {
    return id ? tok.piece(*id) : std::string();
  };
  const std::string bos = text_of(tok.bos_id()), eos = text_of(tok.eos_id());
  if (want != "auto") return make_chat_template(want, bos, eos, "--chat-template");
  std::optional<std::string> text;
  std::string source;
  if (m.gguf) {
    source = m.src.model.gguf.string() + " (tokenizer.chat_template)";
    if (const auto* v = m.gguf->metadata("tokenizer.chat_template"))
      text = v->as_string("tokenizer.chat_template");
  } else {
    source = (m.src.model.dir / "tokenizer_config.json").string() + " (chat_template)";
    text = read_hf_chat_template(m.src.model.dir);
  }
  if (text) return make_chat_template(*text, bos, eos, source);
  if (o.serve && o.chat_template.empty()) return std::nullopt;
  fail("--chat-template auto: the model has no chat template (" + source +
       "); pass --chat-template with one of " + chat_format_list());
}

// -t's threads; a failure to create them (ulimit -u / -v) names the flag.
moekit::ThreadPool thread_pool(unsigned threads) {
  try {
    return moekit::ThreadPool(threads);
  } catch (const moekit::Error& e) {
    fail("-t " + std::to_string(threads) + ": " + e.message());
  }
}

// The checkpoint's experts (none with a store). Located with --in-memory too: --precision auto
// is the checkpoint's own type either way, except for K-quants, which moekit reads but never
// encodes (host experts are encoded): those go to the nearest moekit format.
std::shared_ptr<const moekit::io::CheckpointExperts> locate_experts(const Options& o,
                                                                    OpenModel& m) {
  if (!m.src.store.empty()) return nullptr;
  auto located = locate_checkpoint_experts(m.cfg, m.src.model.dir, m.gguf ? &*m.gguf : nullptr);
  if (located && located->shape().kquant.set()) {
    if (o.in_memory) return nullptr;
    m.cfg.expert_kquant = located->shape().kquant;  // the blob the pipeline's slots hold
  }
  return located;
}

// The dense part, and the experts when they live in host memory (packed into the run's panels).
ModelWeights load_model_weights(const Options& o, const OpenModel& m,
                                const std::vector<moekit::Precision>& host_precisions,
                                bool experts_outside, moekit::MatrixOrder order) {
  const DenseStorage dense{o.dense_precision, m.cfg.shape().quant};
  ModelWeights l = m.gguf ? load_gguf_weights(m.cfg, *m.gguf, host_precisions, dense)
                          : load_weights(m.cfg, m.src.model.dir, host_precisions, dense);
  if (!experts_outside && moekit::in_panels(order)) l.experts.pack_panels(order);
  return l;
}

// An allocation failed after the up-front checks passed (their sizes are lower bounds: code,
// thread stacks and small buffers come on top): say what bounds this process and what to lower.
std::string out_of_memory_message() {
  const moekit::io::MemoryLimits now = moekit::io::read_memory_limits();
  return "out of memory (std::bad_alloc) with " +
         (now.usable_bytes() ? format_bytes(*now.usable_bytes()) : std::string("?")) +
         " left under " + now.source() +
         ": the run's KV cache, experts and buffers fit the check but not what the process "
         "also needs; lower -c, --expert-budget or -t, or raise the limit";
}

int run(Options o) {
  // Before anything is loaded: the dense part, KV cache and buffers are then counted once each.
  const moekit::io::MemoryLimits limits_at_start = moekit::io::read_memory_limits();
  OpenModel m{resolve_model(o), std::nullopt, {}};
  const ModelPath& mp = m.src.model;
  const ModelConfig& cfg = open_config(m);
  const PresetEntry& preset = find_preset(o.preset);
  // The experts' codec: --group-size, else the preset's; a GGUF file or a store keeps its own.
  m.cfg.expert_quant = expert_codec(o.group_size, preset,
                                    m.gguf                ? std::string("a GGUF file")
                                    : m.src.store.empty() ? ""
                                                          : "--store " + m.src.store);
  const Tokenizer tok = load_tokenizer(mp, m.gguf ? &*m.gguf : nullptr);
  if (tok.vocab_size() > cfg.vocab_size)
    fail("-m: the tokenizer has " + std::to_string(tok.vocab_size()) +
         " pieces, more than the model's vocab_size " + std::to_string(cfg.vocab_size));
  // Read and checked against the model before any weight is loaded.
  std::optional<RoutingReplay> replay = load_replay(o, cfg, preset);
  const std::optional<ChatTemplate> chat = chat_template(o, m, tok);

  const auto located = locate_experts(o, m);
  const auto in_place = o.in_memory ? nullptr : located;
  // Refuse an impossible budget before loading any weight.
  const moekit::ModelShape shape = cfg.shape();
  const std::size_t prompt_tokens = tok.encode(o.prompt, false).size() + 1;
  OffloadSettings settings =
      offload_settings(o, m, preset, in_place.get(), located.get(), prompt_tokens, limits_at_start);

  // Experts: in place from the checkpoint (plus a store of the precisions it lacks), a store read
  // with O_DIRECT (--store, -m STORE) or host memory (--in-memory).
  const auto needed = required_precisions(preset, shape, settings);
  const bool int8 =
      resolve_int8_activations(o.activations, needed, std::min(shape.hidden, shape.ffn));
  const moekit::MatrixOrder order = expert_order(o, shape, int8);
  const ExpertPlacement where = place_experts(o, cfg, mp, m.src.store, needed, order, in_place);
  const bool experts_outside = where.store || where.checkpoint;
  const std::vector<moekit::Precision> host_precisions =
      experts_outside ? std::vector<moekit::Precision>{} : needed;
  const ModelWeights w = load_model_weights(o, m, host_precisions, experts_outside, order);
  const std::string budget_note = resolve_auto_budget(o, cfg, limits_at_start, preset, w,
                                                      prompt_tokens, experts_outside, settings);
  ExpertBacking backing{experts_outside ? nullptr : &w.experts, where.store,
                        StoreIo{.direct = o.direct,
                                .uring = o.uring,
                                .io_threads = o.io_threads,
                                .verify_checksums = o.verify},
                        where.checkpoint, order};
  // The dense matrices follow --activations as the experts do, judged on their own precisions.
  const ModelSetup setup{
      {int8, resolve_int8_activations(o.activations, w.dense.held_precisions(), cfg.hidden),
       o.kv_type, o.row_streaming},
      replay ? &*replay : nullptr,
      chat ? &*chat : nullptr};
  moekit::ThreadPool pool = thread_pool(o.threads);
  nlohmann::json notes;  // conversion_loss and calibration, added to the stats when not null
  // A store made from K-quant experts is a conversion of them, measured as before they were
  // read in place; one made from F32/F16/BF16/Q8_0/Q4_0 experts holds a preset's other precision.
  const bool exact_types = located && !located->shape().kquant.set();
  notes["conversion_loss"] =
      conversion_loss(o, m, exact_types, where, settings, backing.io, w, tok, pool);
  PresetInputs in = preset_inputs(o, preset, cfg, w, tok, settings, backing, pool, setup, notes);
  std::vector<float> routers;
  if (preset.needs.routers) {
    routers = router_stack(cfg, w.dense);
    in.routers = routers;
  }
  std::string loader_kind;
  nlohmann::json stats =
      with_pipeline(preset, shape, settings, backing.make_loader(), in, [&](auto& pipeline) {
        loader_kind = pipeline.loader().kind();
        const ExpertWarmStart warm = warm_start(o, pipeline);
        nlohmann::json j = run_on(o, cfg, w, tok, pipeline, pool, setup);
        j["experts_loaded_at_start_bytes"] = warm.bytes;
        j["experts_load_seconds"] = warm.seconds;
        return j;
      });
  report_codec(stats, o, shape, needed, notes);
  report_source(stats, o, where, loader_kind, backing.order(), budget_note);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Cli cli;
  if (const int rc = cli.parse(argc, argv, std::cout, std::cerr); rc != 0 || cli.stop()) return rc;
  try {
    return run(cli.options());
  } catch (const moekit::Error& e) {
    std::cerr << "moe-run: " << e.message() << "\n";
  } catch (const std::bad_alloc&) {
    std::cerr << "moe-run: " << out_of_memory_message() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "moe-run: " << e.what() << "\n";
  }
  return 1;
}
