#pragma once
/// \file moe-run's command line (CLI11), in the spirit of llama.cpp's tools. Parsing only: every
/// bad value is reported naming its flag; checks that need the model (budget too small, vocabulary
/// mismatch) happen after loading, and name their flag too.

#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "moekit/core/precision.hpp"
#include "moekit/error.hpp"
#include "moekit/io/output_file.hpp"

#include "moekit/engine/activations.hpp"
#include "moekit/engine/chat_template.hpp"
#include "moekit/engine/expert_layout.hpp"
#include "moekit/engine/kv_cache.hpp"
#include "moekit/engine/offload.hpp"

#ifndef MOE_RUN_DEFAULT_MODEL
#define MOE_RUN_DEFAULT_MODEL "models/moekit-tiny-moe"
#endif

namespace moekit::engine {

/// An expert budget as written on the command line.
struct BudgetSpec {
  /// automatic: sized from the memory this process may use (memory_budget.hpp), by the caller.
  enum class Kind { all, bytes, percent, automatic } kind = Kind::all;
  double value = 0;  ///< bytes, or percent of the all-resident size

  /// Bytes for a model whose experts take `all_bytes` when all resident (0 = all resident).
  [[nodiscard]] std::size_t resolve(std::size_t all_bytes) const noexcept {
    switch (kind) {
      case Kind::all:
      case Kind::automatic:
        return 0;
      case Kind::bytes:
        return static_cast<std::size_t>(value);
      case Kind::percent:
        return static_cast<std::size_t>(std::ceil(all_bytes * value / 100.0));
    }
    return 0;
  }
};

/// Parses "auto", "all", "50%", "2GiB", "1.5G", "512MiB", "300MB", "123456" (bytes). Binary units
/// (KiB/MiB/GiB/TiB and the bare K/M/G/T) are powers of 1024, KB/MB/GB/TB powers of 1000.
/// Throws `Error(invalid_argument)` naming `flag` otherwise.
inline BudgetSpec parse_budget(std::string_view s, std::string_view flag = "--expert-budget") {
  auto bad = [&](const std::string& why) {
    moekit::detail::fail(moekit::ErrorKind::invalid_argument,
                         std::string(flag) + ": '" + std::string(s) + "' " + why +
                             " (examples: auto, 2GiB, 512MiB, 1.5G, 50%, all)");
  };
  if (s == "all") return {};
  if (s == "auto") return {BudgetSpec::Kind::automatic, 0};
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) bad("is not a size");
  double v = 0;
  try {
    std::size_t used = 0;
    v = std::stod(std::string(s.substr(0, i)), &used);
    if (used != i) bad("is not a size");
  } catch (const std::logic_error&) {
    bad("is not a size");
  }
  std::string unit(s.substr(i));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (unit == "%") {
    if (!(v > 0 && v <= 100)) bad("must be a percentage in (0, 100]");
    return {BudgetSpec::Kind::percent, v};
  }
  struct Unit {
    std::string_view name;
    double factor;
  };
  static constexpr Unit units[] = {{"", 1},
                                   {"b", 1},
                                   {"k", 1024.0},
                                   {"kib", 1024.0},
                                   {"kb", 1e3},
                                   {"m", 1048576.0},
                                   {"mib", 1048576.0},
                                   {"mb", 1e6},
                                   {"g", 1073741824.0},
                                   {"gib", 1073741824.0},
                                   {"gb", 1e9},
                                   {"t", 1099511627776.0},
                                   {"tib", 1099511627776.0},
                                   {"tb", 1e12}};
  for (const Unit& u : units)
    if (unit == u.name) {
      const double bytes = v * u.factor;
      if (!(bytes >= 1) || bytes > 1e18) bad("is not a usable number of bytes");
      return {BudgetSpec::Kind::bytes, std::floor(bytes)};
    }
  bad("has an unknown unit '" + std::string(s.substr(i)) + "'");
  return {};
}

/// Everything the command line sets.
struct Options {
  std::string model = MOE_RUN_DEFAULT_MODEL;
  std::string prompt = "The";
  int n_predict = 64;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  float temperature = 0.8f;
  float top_p = 0.95f;
  std::uint32_t top_k = 0;  ///< --top-k: 0 = the whole vocabulary (llama.cpp's default is 40)
  std::uint64_t seed = 42;
  std::string preset = "baseline";
  BudgetSpec budget{};
  std::string budget_text = "auto";
  /// --precision: what the experts run at; `precision_auto` (the default): the checkpoint's own
  /// type, resolved once the model is open (then `precision` holds it).
  moekit::Precision precision = moekit::Precision::f16;
  bool precision_auto = true;
  /// --low-precision auto (the default): q4, or q2 when the experts themselves run at q4 or
  /// narrower (a checkpoint read in place at q4), resolved with the precision.
  bool low_precision_auto = true;
  /// --dense-precision: what the dense matrices are held at (nullopt = auto: each at its
  /// checkpoint's own float type, bf16/f16 or f32)
  std::optional<moekit::Precision> dense_precision;
  ActivationMode activations = ActivationMode::automatic;  ///< --activations (activations.hpp)
  /// --row-streaming: how the int8 kernels stream rows (nullopt = this CPU core's table)
  std::optional<moekit::RowStreaming> row_streaming;
  /// --expert-layout: rows or (blocked) panels for the quantized experts of a store moe-run builds
  /// or opens (nullopt = auto: with int8 activations, rows or blocked panels as the per-core
  /// table of expert_layout.hpp says; rows with float activations)
  std::optional<moekit::MatrixOrder> expert_layout;
  /// --group-size: weights per scale of the experts moekit quantizes, 0 = per output channel
  /// (nullopt = auto: the preset's codec, e.g. EdgeMoE's per channel)
  std::optional<std::uint32_t> group_size;
  // Offloading (offload.hpp, expert_source.hpp, calibration.hpp).
  PresetParams preset_params{};  ///< the presets' parameters (--t1, --gamma, ...)
  std::string store;             ///< --store: expert store file ("" = per -m)
  bool in_memory = false;        ///< --in-memory: experts from the checkpoint into host memory
  bool lazy_load = false;        ///< --lazy-load: no loading of every expert before the prompt
  /// Measure the loss of experts converted into a store (conversion_loss.hpp); --no-conversion-loss
  bool conversion_loss = true;
  std::string conversion_loss_text;  ///< --conversion-loss-text ("" = moe-run's built-in default)
  bool direct = true;                ///< O_DIRECT store reads (--no-direct: page cache)
  bool uring = true;                 ///< io_uring when available (--pread: never)
  bool verify = true;                ///< XXH64 of every blob read from a store (--no-verify: off)
  unsigned io_threads = 2;           ///< --io-threads: store loader threads
  /// --calib-tokens: tokens of the calibration text, or greedy tokens after the prompt with
  /// --calib-text prompt (-1: 128 / 16)
  int calib_tokens = -1;
  std::string calib_text;     ///< --calib-text: file, "prompt", or "" = moe-run's built-in default
  std::uint32_t context = 0;  ///< 0 = prompt + n_predict
  std::uint32_t ubatch =
      512;  ///< --ubatch-size: most prompt tokens per prefill forward (llama.cpp's default)
  /// --kv-type (llama.cpp's --cache-type-k/-v): the KV cache's element type; f16 by default, as
  /// llama.cpp's (docs/engine.md, "KV cache")
  KvType kv_type = KvType::f16;
  bool no_bos = false;
  bool json = false;
  bool profile = false;  ///< --profile: where each decode token's time goes (token_profile.hpp)
  // Quality and traces (perplexity.hpp, trace_recorder.hpp).
  std::string perplexity;           ///< text file to score ("" = generate)
  std::uint32_t chunks = 0;         ///< --chunks: score at most this many chunks (0 = all)
  bool ppl_decode = false;          ///< score token by token through decode forwards
  std::string save_logits;          ///< .mklogp file to write (top-K log-probs per position)
  std::uint32_t logits_top_k = 32;  ///< K of --save-logits
  std::string kl_reference;         ///< .mklogp file to compare with (KL divergence)
  std::string trace_out;            ///< .mktrace file to record the routing into
  /// --routing-trace: trace whose experts and gate weights replace the router's
  /// (routing_replay.hpp)
  std::string routing_trace;
  bool force = false;                 ///< overwrite --trace-out / --save-logits files
  bool shallow_layers_given = false;  ///< --shallow-layers was on the command line
  // Chat and serving (chat_template.hpp, chat_session.hpp, examples/moe-server/).
  /// --chat-template: "" = -p is completed as it is; "auto" (the model's own) or a format name
  std::string chat_template;
  bool chat = false;                      ///< --chat: a conversation on stdin, KV cache kept
  bool serve = false;                     ///< --serve: OpenAI-compatible HTTP server
  std::string host = "127.0.0.1";         ///< --host
  int port = 8080;                        ///< --port (0: any free port)
  std::size_t server_max_body = 1 << 20;  ///< --server-max-body (bytes)
  int server_max_tokens = 1024;           ///< --server-max-tokens: most max_tokens a request asks
  unsigned server_queue = 4;              ///< --server-queue: requests waiting while one runs
  double server_timeout = 300;            ///< --server-timeout: seconds per request (wait + run)
};

/// Refuses preset flags beyond the model's shape, once it is known (the presets would clamp them
/// silently): --k-little above top-k, --shallow-layers above the MoE layers.
inline void check_shape_flags(const Options& o, const moekit::ModelShape& shape) {
  const PresetParams& q = o.preset_params;
  if (q.k_little > shape.top_k)
    throw moekit::Error(moekit::ErrorKind::invalid_argument,
                        "--k-little: " + std::to_string(q.k_little) +
                            " experts in the little pass is more than the model's top-k (" +
                            std::to_string(shape.top_k) + ")");
  if (o.shallow_layers_given && q.shallow_layers > shape.n_layers)
    throw moekit::Error(moekit::ErrorKind::invalid_argument,
                        "--shallow-layers: " + std::to_string(q.shallow_layers) +
                            " is more than the model's " + std::to_string(shape.n_layers) +
                            " MoE layers");
}

/// The parser. `parse` returns 0 with `options()` filled, or the exit code after printing help
/// or an error (which names the flag) to the given streams.
class Cli {
 public:
  Cli() : app_("moe-run: Mixture-of-Experts inference with expert offloading (moekit)") {
    app_.option_defaults()->always_capture_default();
    add_generation_options();
    add_expert_format_options();
    add_offload_options();
    add_hobbit_options();
    add_context_and_output_options();
    add_quality_options();
    add_chat_options();
  }

  int parse(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
    try {
      app_.parse(argc, argv);
      finish();
    } catch (const CLI::ParseError& e) {
      stop_ = true;  // --help printed (exit code 0) or an error reported
      return app_.exit(e, out, err);
    } catch (const moekit::Error& e) {
      err << "moe-run: " << e.message() << "\n";
      return 2;
    }
    return 0;
  }

  [[nodiscard]] const Options& options() const noexcept { return o_; }
  /// True when `parse` printed help or an error: there is nothing to run.
  [[nodiscard]] bool stop() const noexcept { return stop_; }

 private:
  void finish() {
    if (o_.preset.empty())
      throw moekit::Error(moekit::ErrorKind::invalid_argument, "--preset: empty");
    find_preset(o_.preset);  // throws naming --preset and the known presets
    if (!(o_.top_p > 0))
      throw moekit::Error(moekit::ErrorKind::invalid_argument, "--top-p: must be in (0, 1]");
    o_.budget = parse_budget(o_.budget_text);
    o_.precision_auto = precision_text_ == "auto";
    if (!o_.precision_auto) {
      const auto p = moekit::parse_precision(precision_text_);
      if (!p || *p == moekit::Precision::skip)
        throw moekit::Error(moekit::ErrorKind::invalid_argument,
                            "--precision: '" + precision_text_ +
                                "' is not one of auto, f32, bf16, f16, q8, q4, q2");
      o_.precision = *p;
    }
    if (dense_precision_text_ != "auto") {
      const auto d = moekit::parse_precision(dense_precision_text_);
      if (!d || *d == moekit::Precision::skip || *d == moekit::Precision::q2)
        throw moekit::Error(moekit::ErrorKind::invalid_argument,
                            "--dense-precision: '" + dense_precision_text_ +
                                "' is not one of auto, f32, bf16, f16, q8, q4");
      o_.dense_precision = d;
    }
    if (group_size_text_ != "auto") o_.group_size = std::uint32_t(std::stoul(group_size_text_));
    const auto a = parse_activation_mode(activations_text_);
    if (!a)
      throw moekit::Error(
          moekit::ErrorKind::invalid_argument,
          "--activations: '" + activations_text_ + "' is not one of auto, f32, int8");
    o_.activations = *a;
    if (expert_layout_text_ != "auto") {
      o_.expert_layout = parse_layout_word(expert_layout_text_);
      if (!o_.expert_layout)
        throw moekit::Error(
            moekit::ErrorKind::invalid_argument,
            "--expert-layout: '" + expert_layout_text_ + "' is not one of auto, " + layout_words);
    }
    if (row_streaming_text_ != "auto") {
      o_.row_streaming = moekit::parse_row_streaming(row_streaming_text_);
      if (!o_.row_streaming)
        throw moekit::Error(moekit::ErrorKind::invalid_argument,
                            "--row-streaming: '" + row_streaming_text_ +
                                "' is not one of auto, 1, 1p, 2, 2p, 4, 4p");
    }
    finish_offload();
    finish_kv_type();
    if (!o_.routing_trace.empty() && !o_.perplexity.empty())
      throw moekit::Error(moekit::ErrorKind::invalid_argument,
                          "--routing-trace: cannot be combined with --perplexity (with replayed "
                          "routing the model's predictions, and so their perplexity, are "
                          "meaningless)");
    if (o_.perplexity.empty()) {
      for (const auto& [flag, set] :
           {std::pair<const char*, bool>{"--save-logits", !o_.save_logits.empty()},
            {"--kl-reference", !o_.kl_reference.empty()},
            {"--chunks", o_.chunks != 0},
            {"--ppl-decode", o_.ppl_decode}})
        if (set)
          throw moekit::Error(moekit::ErrorKind::invalid_argument,
                              std::string(flag) + ": only meaningful with --perplexity FILE");
    }
    check_chat_flags();
    check_file_flags();
    // Output files are checked before any work: a run is not spent to find the file unwritable.
    for (const auto& [flag, path] :
         {std::pair<const char*, const std::string&>{"--trace-out", o_.trace_out},
          {"--save-logits", o_.save_logits}})
      if (!path.empty()) moekit::io::check_output_path(path, o_.force, flag);
  }

  // The KV cache's element type: --kv-type, or llama.cpp's spelling per keys and values.
  void add_kv_options() {
    app_.add_option("--kv-type", kv_type_text_,
                    "element type of the KV cache's keys and values: f16 (default, as "
                    "llama.cpp's; half the bytes a long-context decode reads, values rounded to "
                    "nearest) or f32 (exact)");
    app_.add_option("--cache-type-k", cache_type_k_text_,
                    "llama.cpp's -ctk: the keys' type (f32, f16); moe-run stores keys and values "
                    "at one type, so it must equal the values'");
    app_.add_option("--cache-type-v", cache_type_v_text_,
                    "llama.cpp's -ctv: the values' type (f32, f16); must equal the keys'");
  }

  // --kv-type, --cache-type-k, --cache-type-v: each a known type, keys and values at one type.
  void finish_kv_type() {
    auto parse = [](const char* flag, const std::string& text) {
      const auto t = parse_kv_type(text);
      if (!t)
        throw moekit::Error(moekit::ErrorKind::invalid_argument,
                            std::string(flag) + ": '" + text + "' is not one of f32, f16");
      return *t;
    };
    const KvType both = parse("--kv-type", kv_type_text_);
    const KvType k =
        cache_type_k_text_.empty() ? both : parse("--cache-type-k", cache_type_k_text_);
    const KvType v =
        cache_type_v_text_.empty() ? both : parse("--cache-type-v", cache_type_v_text_);
    if (k != v)
      throw moekit::Error(moekit::ErrorKind::invalid_argument,
                          "--cache-type-k: keys at " + std::string(name(k)) + " and values at " +
                              std::string(name(v)) +
                              " (--cache-type-v, --kv-type): moe-run stores both at one type");
    o_.kv_type = k;
  }

  // --chat, --chat-template and the server (--serve and its limits).
  void add_chat_options() {
    app_.add_option("--chat-template", o_.chat_template,
                    "wrap -p (and --chat's, --serve's messages) in a chat template: auto (the "
                    "model's own, from GGUF tokenizer.chat_template or tokenizer_config.json; "
                    "the default of --chat and --serve) or one of " +
                        chat_format_list());
    app_.add_flag("--chat", o_.chat,
                  "interactive chat: each line of stdin is a user message, the reply follows; "
                  "the KV cache is kept across turns (-n: most tokens per reply; /exit or EOF "
                  "ends)");
    app_.add_flag("--serve", o_.serve,
                  "OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, "
                  "streaming, /health, /metrics) until SIGINT/SIGTERM");
    app_.add_option("--host", o_.host, "--serve: address to listen on (default loopback)");
    app_.add_option("--port", o_.port, "--serve: port (0 = any free port, printed)")
        ->check(CLI::Range(0, 65535));
    app_.add_option("--server-max-body", o_.server_max_body,
                    "--serve: largest request body in bytes (larger: 413)")
        ->check(CLI::Range(std::size_t{64}, std::size_t{1} << 30));
    app_.add_option("--server-max-tokens", o_.server_max_tokens,
                    "--serve: largest max_tokens a request may ask (more: 400); -n is the "
                    "default of a request that gives none")
        ->check(CLI::Range(1, 1 << 20));
    app_.add_option("--server-queue", o_.server_queue,
                    "--serve: requests that may wait while one runs (more: 503)")
        ->check(CLI::Range(0u, 1024u));
    app_.add_option("--server-timeout", o_.server_timeout,
                    "--serve: seconds a request may wait and run; the wait ends in 503, the "
                    "reply is cut short (finish_reason length)")
        ->check(CLI::Range(0.1, 1e6));
  }

  void check_chat_flags() const {
    auto bad = [](const std::string& msg) {
      throw moekit::Error(moekit::ErrorKind::invalid_argument, msg);
    };
    if (!o_.chat_template.empty() && o_.chat_template != "auto" &&
        !chat_format_from_name(o_.chat_template))
      bad("--chat-template: '" + o_.chat_template + "' is not auto or one of " +
          chat_format_list());
    if (o_.chat && o_.serve) bad("--chat: cannot be combined with --serve");
    for (const auto& [flag, set] :
         {std::pair<const char*, bool>{"--chat", o_.chat}, {"--serve", o_.serve}})
      if (set && (!o_.perplexity.empty() || !o_.trace_out.empty()))
        bad(std::string(flag) + ": cannot be combined with --perplexity or --trace-out");
  }

  // --perplexity and its companions, routing traces recorded (--trace-out) and replayed
  // (--routing-trace).
  void add_quality_options() {
    app_.add_option("--perplexity", o_.perplexity,
                    "score a text file instead of generating: chunks of --ctx-size tokens, each "
                    "after a BOS; prints tokens, mean NLL and perplexity");
    app_.add_option("--chunks", o_.chunks, "--perplexity: score at most N chunks (0 = all)");
    app_.add_flag("--ppl-decode", o_.ppl_decode,
                  "--perplexity: feed each chunk token by token (decode forwards, where token "
                  "policies such as MoBiLE's fallback act) instead of one prefill");
    app_.add_option("--save-logits", o_.save_logits,
                    "--perplexity: save the top-K log-probs of every position (.mklogp)");
    app_.add_option("--logits-top-k", o_.logits_top_k, "K of --save-logits (default 32)")
        ->check(CLI::Range(1u, 1u << 24));
    app_.add_option("--kl-reference", o_.kl_reference,
                    "--perplexity: KL divergence against a --save-logits file of a reference run");
    app_.add_option("--trace-out", o_.trace_out,
                    "record the routing (top-k, router logits, gate inputs) as a .mktrace file");
    app_.add_option("--routing-trace", o_.routing_trace,
                    "replay a routing trace: each token's experts and gate weights come from the "
                    "trace (.mktrace from --trace-out, moekit JSONL, or a shared Mixtral JSONL "
                    "trace) instead of the router, so expert loads and hit rates follow real "
                    "routing; the generated text is meaningless. Decode tokens walk the trace's "
                    "decode tokens in order (wrapping around), prompt tokens its prefill tokens "
                    "(or, without any, the same decode walk)");
    app_.add_flag("--force", o_.force,
                  "overwrite the --trace-out / --save-logits file; use an expert store whose "
                  "recorded checkpoint fingerprint differs from the checkpoint's");
  }

  // HOBBIT's cache beyond the T1/T2 rule and its stand-in's accuracy, Fate's staging
  // (docs/presets.md, "HOBBIT" and "Fate").
  void add_hobbit_options() {
    PresetParams& q = o_.preset_params;
    app_.add_option("--hobbit-high-pool", q.high_slot_fraction,
                    "hobbit: share of the cache's slots in the high-precision pool (default "
                    "0.69: the paper's 67 : 30 split of high and low decisions; 0.5: equal)")
        ->check(CLI::Range(0.0, 1.0));
    app_.add_option("--hobbit-recall", q.hobbit_recall,
                    "hobbit-oracle: the noisy oracle's recall per rank, as moe-sim's: paper "
                    "(default: top-1 0.96,0.90,0.90 at +1,+2,+3, the lower ranks assumed equal), "
                    "measured (moekit's stacked gate on its default model), R1[,R2[,R3]] for "
                    "every rank, or TOP1,../LOWER,.. for the top-1 and ranks 2+");
    app_.add_option("--fate-staging-slots", q.fate_staging_slots,
                    "fate, fate-oracle: prefetch staging slots, taken from the budget (default 0: "
                    "one per expert of a layer, at most half the budget's slots); a prefetch "
                    "waits for a free one")
        ->check(CLI::Range(0u, 1u << 16));
  }

  // The model, the prompt, generation and sampling.
  void add_generation_options() {
    app_.add_option(
        "-m,--model", o_.model,
        "Hugging Face model directory (config.json, *.safetensors, tokenizer.model), a GGUF "
        "file (its experts go to an expert store built at first use), or an expert "
        "store made by moe-convert");
    app_.add_option("-p,--prompt", o_.prompt, "prompt text");
    app_.add_option("-n,--n-predict", o_.n_predict, "tokens to generate")
        ->check(CLI::Range(0, 1 << 20));
    app_.add_option("-t,--threads", o_.threads, "CPU threads")->check(CLI::Range(1u, 1024u));
    app_.add_option("--temp", o_.temperature, "sampling temperature (0 = greedy)")
        ->check(CLI::Range(0.0f, 100.0f));
    app_.add_option("--top-p", o_.top_p, "nucleus sampling mass, in (0, 1]")
        ->check(CLI::Range(0.0f, 1.0f));
    app_.add_option("--top-k", o_.top_k,
                    "sample among the k highest logits only, before --top-p (0 = all)");
    app_.add_option("--seed", o_.seed, "sampling seed (0 .. 2^64-1)")
        ->check(CLI::Validator(
            [](const std::string& s) {  // "-1" would otherwise wrap to 2^64-1 silently
              return !s.empty() && s.front() == '-' ? std::string("must not be negative")
                                                    : std::string();
            },
            "NONNEGATIVE"));
  }

  // The preset, the budget, and how experts and dense matrices are stored and run.
  void add_expert_format_options() {
    std::string presets;
    for (const auto& p : moekit::presets::entries)
      presets += "\n  " + std::string(p.name) + ": " + std::string(p.summary);
    app_.add_option("--preset", o_.preset, "offloading preset:" + presets);
    app_.add_option("--expert-budget", o_.budget_text,
                    "bytes of expert cache: auto (default: what the memory this process may use "
                    "leaves after the dense part, KV cache and buffers), all, 2GiB, 512MiB, 1.5G, "
                    "50% (of all experts)");
    app_.add_option("--precision", precision_text_,
                    "precision experts are stored and run at: auto (default: the checkpoint's "
                    "own type, read in place), f32, bf16, f16, q8, q4, q2");
    app_.add_option("--dense-precision", dense_precision_text_,
                    "precision the dense matrices (embeddings, attention, LM head, shared "
                    "experts) are held and run at: auto (the checkpoint's own float type: bf16 "
                    "or f16 where stored so, else f32; lossless), f32, bf16, f16, q8, q4 "
                    "(grouped as the experts); routers and norms stay f32");
    app_.add_option("--group-size", group_size_text_,
                    "weights per f16 scale of the experts moekit quantizes: auto (default: the "
                    "preset's codec, per channel for edgemoe, else 32; experts read in place at "
                    "a quantized type keep theirs), 0 (per output channel), 32, 64, 128")
        ->check(CLI::IsMember({"auto", "0", "32", "64", "128"}));
    app_.add_option("--activations", activations_text_,
                    "activations of quantized experts and dense matrices, decode and prefill: f32, "
                    "int8 (rounded per 32 values, VNNI kernels, like ggml's q8_0), auto (int8 on "
                    "CPUs with AVX2 when the expert rows are >= 512 wide, where it is faster)");
    app_.add_option("--row-streaming", row_streaming_text_,
                    "how the int8-activation kernels read rows: auto (the table for this CPU "
                    "core), or 1, 2, 4 streams per thread, with p: each prefetched in software "
                    "(1p, 2p, 4p); moekit_bench_row_streaming measures each on this machine");
    app_.add_option(
        "--expert-layout", expert_layout_text_,
        "where the rows of quantized experts are in the expert store: rows, panels "
        "(four rows interleaved every 512 columns, one stream per thread for the int8 "
        "kernels), blocked-panels (panels in groups of 16 in column blocks of at most "
        "4096 columns; docs/formats.md), auto (with int8 activations what this CPU core "
        "streams fastest, from a table: rows on Ice Lake server and Xeons with AMX, "
        "blocked-panels elsewhere; rows with f32 activations); a store given with --store "
        "or -m keeps its own, and must match an explicit choice; experts in host memory are "
        "packed after loading");
  }

  // Context, batching, and what is printed.
  void add_context_and_output_options() {
    app_.add_option("-c,--ctx-size,--ctx", o_.context,
                    "context length (0 = prompt + n-predict; with --perplexity: tokens per chunk, "
                    "0 = 512)");
    // llama.cpp spells it -ub; CLI11 takes only one-letter short names.
    app_.add_option("--ubatch-size,--ubatch", o_.ubatch,
                    "most prompt tokens per prefill forward (llama.cpp's -ub; chunked prefill, "
                    "the logits do not depend on it)")
        ->check(CLI::Range(1u, 1u << 24));
    add_kv_options();
    app_.add_flag("--no-bos", o_.no_bos, "do not prepend the BOS token to the prompt");
    app_.add_flag("--json", o_.json, "print the text and statistics as one JSON object");
    app_.add_flag("--profile", o_.profile,
                  "time the parts of each decode token (attention, dense matrices, routing, "
                  "experts, LM head, sampling, load waits, thread synchronisation): a table on "
                  "stderr, or \"profile\" in --json");
  }

  // Preset parameters and the expert store (docs/engine.md, "Presets" and "Expert store").
  void add_offload_options() {
    add_preset_parameter_options();
    add_store_options();
  }

  // The presets' own parameters, and the calibration text of those that calibrate.
  void add_preset_parameter_options() {
    PresetParams& q = o_.preset_params;
    app_.add_option("--t1", q.t1, "hobbit/nextuse: cumulative gate weight run at --precision")
        ->check(CLI::Range(0.0f, 1.0f));
    app_.add_option("--t2", q.t2,
                    "hobbit/nextuse: cumulative gate weight run at --low-precision "
                    "(the rest is skipped)")
        ->check(CLI::Range(0.0f, 1.0f));
    app_.add_option("--low-precision", low_text_,
                    "hobbit/nextuse/fate: the low precision (auto, the default: q4, or q2 when the "
                    "experts run at q4 or narrower)");
    app_.add_option("--lookahead", q.lookahead,
                    "hobbit: stacked-gate layers predicted ahead (1..3)")
        ->check(CLI::Range(1u, 3u));  // what StackedGatePredictor supports
    app_.add_option("--shallow-layers", q.shallow_layers, "fate: shallow layers cached in full")
        ->check(CLI::Range(0u, 1u << 16));
    app_.add_option("--fate-low-fraction", q.fate_low_fraction,
                    "fate: least popular share of a prefill layer at --low-precision (0 = none)")
        ->check(CLI::Range(0.0, 1.0));
    app_.add_option("--fate-percentile", q.fate_percentile,
                    "fate: decode prefetch candidates score above this percentile")
        ->check(CLI::Range(0.0, 0.999));
    app_.add_option("--gamma", q.gamma, "mobile: accept a token iff its max probability > gamma")
        ->check(CLI::Range(0.0f, 1.0f));
    app_.add_option("--k-little", q.k_little,
                    "mobile: experts per token in the little pass (0 = K/2)");
    app_.add_option("--fallback-ratio", q.fallback_ratio,
                    "mobile-oracle: share of decode tokens that fall back to the big pass "
                    "(default: MoBiLE Table II's mean)")
        ->check(CLI::Range(0.0, 1.0));
    app_.add_option("--replay-accuracy", q.replay_accuracy,
                    "mobile-oracle: the plan's expected agreement with the trace's experts "
                    "(default: the paper's 0.8)")
        ->check(CLI::Range(0.0, 1.0));
    app_.add_option("--oracle-recall", q.oracle_recall,
                    "fate-oracle: the noisy oracle's recall at +1[,+2[,+3]] layers (default: the "
                    "paper's 0.9715; hobbit-oracle's is --hobbit-recall)")
        ->delimiter(',');
    app_.add_option("--big-pass", big_pass_text_,
                    "mobile: the recomputation after a fallback runs the little pass's plan "
                    "(little-plan, the paper's reading: the top-K of the little pass's router "
                    "logits) or re-routes exactly (recompute; the plan is only prefetched)")
        ->check(CLI::IsMember({"little-plan", "recompute"}));
    app_.add_option("--big-pass-lookahead", q.big_pass_lookahead,
                    "mobile: layers ahead of the big pass its plan is prefetched (1..3)")
        ->check(CLI::Range(1u, 3u));
    app_.add_option(
        "--bitwidth-table", q.bitwidth_table,
        "edgemoe: per-expert precision table, a text file (not JSON): the "
        "moekit-precision-table format of score/static_bitwidth.hpp, docs/presets.md; default: "
        "every expert at --precision");
    app_.add_option("--popularity", q.popularity_file,
                    "fiddler: tokens per expert, JSON [[layer 0 counts], ...] (default: counted "
                    "in the calibration run, --calib-text)");
    app_.add_option("--cpu-latency", q.cpu_seconds_per_token,
                    "fiddler: seconds per token per expert on the CPU (0 = measured at start-up)")
        ->check(CLI::Range(0.0, 1e6));
    app_.add_option("--copy-latency", q.copy_seconds,
                    "fiddler: seconds to load one expert and run it (0 = measured at start-up)")
        ->check(CLI::Range(0.0, 1e6));
    app_.add_option("--calib-text", o_.calib_text,
                    "edgemoe/fiddler: text whose routing calibrates them (default: "
                    "bench/quality/calibration.txt of the source tree, a WikiText-2 slice apart "
                    "from the evaluated heldout.txt; 'prompt': the prompt plus --calib-tokens "
                    "greedy tokens, which is the evaluated text when generating)");
    app_.add_option("--calib-tokens", o_.calib_tokens,
                    "edgemoe/fiddler: tokens of --calib-text in the calibration run (default 128), "
                    "or greedy tokens after the prompt with --calib-text prompt (default 16)")
        ->check(CLI::Range(0, 4096));
  }

  // Where experts are read from, and how.
  void add_store_options() {
    app_.add_option("--store", o_.store,
                    "expert store (moe-convert) to read experts from with O_DIRECT; -m is the "
                    "checkpoint of the dense part (or the store itself, the checkpoint then comes "
                    "from the store's meta)");
    app_.add_flag("--in-memory", o_.in_memory,
                  "encode the experts from the checkpoint into host memory instead of reading a "
                  "store (the default for models other than the built-in one)");
    app_.add_flag("--lazy-load", o_.lazy_load,
                  "read each expert on its first use, even when the budget holds them all (by "
                  "default they are all loaded before the prompt then)");
    app_.add_flag("!--no-conversion-loss", o_.conversion_loss,
                  "experts converted into a store (GGUF K-quants): do not measure the loss (KL "
                  "against the exact values on a few hundred tokens, once per store; the output "
                  "then says it was not measured)");
    app_.add_option(
        "--conversion-loss-text", o_.conversion_loss_text,
        "text scored to measure a conversion's loss (default: bench/quality/heldout.txt "
        "of the source tree)");
    app_.add_flag("!--no-direct", o_.direct, "store reads through the page cache (no O_DIRECT)");
    app_.add_flag("!--pread", o_.uring, "store reads with pread(2), never io_uring");
    app_.add_flag("!--no-verify", o_.verify,
                  "do not check the XXH64 checksum of each expert read from an expert store "
                  "(checked by default: a damaged store is an error, not changed text)");
    app_.add_option("--io-threads", o_.io_threads, "store loader I/O threads")
        ->check(CLI::Range(1u, 64u));
  }

  // File flags: an empty path, or an input that is not a regular file, refused naming the flag.
  void check_file_flags() {
    // A file flag given an empty path ("--trace-out ''") would be taken as not given at all.
    for (const char* flag : {"--trace-out", "--save-logits", "--kl-reference", "--perplexity",
                             "--routing-trace", "--store", "--popularity", "--bitwidth-table"})
      if (app_.count(flag) > 0 && app_.get_option(flag)->as<std::string>().empty())
        throw moekit::Error(moekit::ErrorKind::invalid_argument,
                            std::string(flag) + ": an empty path");
    // Input files are regular files: /dev/zero would be read without end, a directory fails
    // with the stream's own message (basic_filebuf::underflow) naming neither flag nor file.
    for (const auto& [flag, path] :
         {std::pair<const char*, const std::string&>{"--store", o_.store},
          {"--popularity", o_.preset_params.popularity_file},
          {"--bitwidth-table", o_.preset_params.bitwidth_table},
          {"--conversion-loss-text", o_.conversion_loss_text}}) {
      std::error_code ec;
      const auto st = std::filesystem::status(path, ec);
      if (!path.empty() && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
        throw moekit::Error(moekit::ErrorKind::invalid_argument,
                            std::string(flag) + ": '" + path +
                                "' is not a regular file (a directory, device or pipe)");
    }
  }

  void finish_offload() {
    o_.shallow_layers_given = app_.count("--shallow-layers") > 0;
    for (const auto& [flag, v] :
         {std::pair<const char*, double>{"--cpu-latency", o_.preset_params.cpu_seconds_per_token},
          {"--copy-latency", o_.preset_params.copy_seconds}})
      if (!std::isfinite(v))  // CLI11's range check lets NaN through
        throw moekit::Error(
            moekit::ErrorKind::invalid_argument,
            std::string(flag) + ": must be a number of seconds, not " + std::to_string(v));
    o_.preset_params.big_pass = big_pass_text_ == "recompute"
                                    ? moekit::RouterReplayPredictor::BigPass::recompute
                                    : moekit::RouterReplayPredictor::BigPass::little_plan;
    o_.low_precision_auto = low_text_ == "auto";
    const auto low = moekit::parse_precision(o_.low_precision_auto ? "q4" : low_text_);
    if (!low || *low == moekit::Precision::skip)
      throw moekit::Error(
          moekit::ErrorKind::invalid_argument,
          "--low-precision: '" + low_text_ + "' is not one of f32, bf16, f16, q8, q4, q2");
    o_.preset_params.low = *low;
    if (!o_.store.empty() && o_.in_memory)
      throw moekit::Error(moekit::ErrorKind::invalid_argument,
                          "--in-memory: contradicts --store " + o_.store);
  }

  CLI::App app_;
  Options o_;
  std::string precision_text_ = "auto";
  std::string activations_text_ = "auto";
  std::string dense_precision_text_ = "auto";
  std::string row_streaming_text_ = "auto";
  std::string expert_layout_text_ = "auto";
  std::string group_size_text_ = "auto";
  std::string kv_type_text_ = "f16";
  std::string cache_type_k_text_, cache_type_v_text_;  // "" = --kv-type's
  bool stop_ = false;
  std::string low_text_ = "auto";
  std::string big_pass_text_ = "little-plan";
};

}  // namespace moekit::engine
