#pragma once
// moe-run --serve: an OpenAI-compatible HTTP server (cpp-httplib, Debian's libcpp-httplib-dev)
// over one engine that runs one sequence at a time. See docs/engine.md, "Server".
//
//   POST /v1/chat/completions, POST /v1/completions   (stream: server-sent events)
//   GET  /health, /metrics (Prometheus text), /v1/models
//
// Requests wait for the engine in a bounded queue: one runs, at most `queue` wait, more are
// answered 503 at once; a request that waits longer than its timeout is answered 503 too. The
// engine is reached only by the request that holds the turn, so it needs no locking of its own;
// /metrics reads a snapshot of its counters taken after each request.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "moekit/engine/chat_session.hpp"
#include "moekit/engine/chat_template.hpp"
#include "moekit/engine/sampler.hpp"
#include "moekit/error.hpp"

namespace moe_server {

using moekit::engine::ChatMessage;
using moekit::engine::SamplerConfig;
using moekit::engine::TurnRequest;
using moekit::engine::TurnResult;

struct ServerConfig {
  std::string host = "127.0.0.1";  ///< loopback unless asked
  int port = 8080;                 ///< 0: any free port (printed)
  std::size_t max_body_bytes = 1 << 20;
  int max_tokens_limit = 1024;   ///< a request's max_tokens above it is refused
  int default_max_tokens = 64;   ///< when a request gives none
  unsigned queue = 4;            ///< requests that may wait while one runs
  double timeout_seconds = 300;  ///< queue wait + generation of one request
  std::string model_name;        ///< reported in responses and /v1/models
  SamplerConfig sampling;        ///< defaults of temperature, top_p, top_k, seed
};

/// What the server runs requests on (moe-run supplies these over its Model and pipeline).
struct ServerEngine {
  /// nullopt when the model has no chat template (the chat endpoint then answers 400)
  std::function<TurnResult(std::span<const ChatMessage>, const SamplerConfig&, const TurnRequest&)>
      chat;
  std::function<TurnResult(const std::string&, const SamplerConfig&, const TurnRequest&)> complete;
  bool has_chat_template = false;
  std::string no_chat_template_reason;
  /// The offloading counters as name → value (hit rate, bytes loaded, prefetch precision...).
  std::function<std::vector<std::pair<std::string, double>>()> counters;
};

/// Totals over the server's life, printed at shutdown.
struct ServerTotals {
  std::uint64_t requests = 0, rejected = 0, failed = 0, cancelled = 0;
  std::uint64_t prompt_tokens = 0, generated_tokens = 0, decoded_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

// The HTTP side of the server (stop signal, admission queue, request parsing, error replies): used
// by OpenAiServer only.
namespace http_internal {

inline std::atomic<bool> stop_requested{false};
extern "C" inline void on_stop_signal(int) { stop_requested.store(true); }

/// A request's error: HTTP status and OpenAI's error object.
struct HttpError {
  HttpError(int s, std::string m, std::string t = "invalid_request_error", std::string p = {})
      : status(s), message(std::move(m)), type(std::move(t)), param(std::move(p)) {}
  int status;
  std::string message;
  std::string type;
  std::string param;
};

inline std::string error_body(const HttpError& e) {
  nlohmann::json j;
  j["error"] = {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? nlohmann::json() : nlohmann::json(e.param)},
                {"code", nullptr}};
  return j.dump();
}

inline void send_error(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  res.set_content(error_body(e), "application/json");
}

/// One running request and a bounded number waiting: a ticket is a place in the queue, then
/// the turn.
class Admission {
 public:
  explicit Admission(unsigned queue) : limit_(queue + 1) {}

  class Ticket {
   public:
    explicit Ticket(Admission& a) : a_(a) {}
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { a_.leave(turn_); }
    /// Waits for the turn until `deadline`; false: timed out or the server stops.
    bool wait_turn(std::chrono::steady_clock::time_point deadline) {
      std::unique_lock lock(a_.m_);
      if (!a_.cv_.wait_until(lock, deadline, [&] { return !a_.busy_ || stop_requested.load(); }) ||
          stop_requested.load())
        return false;
      a_.busy_ = turn_ = true;
      return true;
    }

   private:
    Admission& a_;
    bool turn_ = false;
  };

  /// A place in the queue, or null when it is full.
  std::shared_ptr<Ticket> enter() {
    std::lock_guard lock(m_);
    if (admitted_ >= limit_) return nullptr;
    ++admitted_;
    return std::make_shared<Ticket>(*this);
  }
  void wake_all() { cv_.notify_all(); }

 private:
  void leave(bool had_turn) {
    {
      std::lock_guard lock(m_);
      --admitted_;
      if (had_turn) busy_ = false;
    }
    cv_.notify_all();
  }

  std::mutex m_;
  std::condition_variable cv_;
  unsigned limit_, admitted_ = 0;
  bool busy_ = false;
};

/// Sampling and length of a request: OpenAI's fields over the server's defaults; a bad value is
/// refused naming its field.
struct RequestParams {
  SamplerConfig sampling;
  int max_tokens = 0;
  bool stream = false;
};

inline RequestParams request_params(const nlohmann::json& body, const ServerConfig& cfg) {
  RequestParams p{cfg.sampling, cfg.default_max_tokens, false};
  auto number = [&](const char* field, double lo, double hi) -> std::optional<double> {
    if (!body.contains(field) || body[field].is_null()) return std::nullopt;
    if (!body[field].is_number())
      throw HttpError{400, std::string(field) + " must be a number", "invalid_request_error",
                      field};
    const double v = body[field].get<double>();
    if (!(v >= lo && v <= hi))
      throw HttpError{400,
                      std::string(field) + " must be in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]",
                      "invalid_request_error", field};
    return v;
  };
  if (auto v = number("temperature", 0, 2)) p.sampling.temperature = static_cast<float>(*v);
  if (auto v = number("top_p", 0, 1)) p.sampling.top_p = static_cast<float>(*v);
  if (auto v = number("top_k", 0, 1e9)) p.sampling.top_k = static_cast<std::uint32_t>(*v);
  if (auto v = number("seed", 0, 9.2e18)) p.sampling.seed = static_cast<std::uint64_t>(*v);
  for (const char* field : {"max_tokens", "max_completion_tokens"})
    if (auto v = number(field, 1, 1e9)) {
      if (*v > cfg.max_tokens_limit)
        throw HttpError{400,
                        std::string(field) + " " + std::to_string(static_cast<long long>(*v)) +
                            " is above this server's limit " +
                            std::to_string(cfg.max_tokens_limit) + " (--server-max-tokens)",
                        "invalid_request_error", field};
      p.max_tokens = static_cast<int>(*v);
    }
  if (body.contains("n") && !(body["n"].is_number_integer() && body["n"].get<long long>() == 1))
    throw HttpError{400, "n: only one choice per request is supported", "invalid_request_error",
                    "n"};
  if (body.contains("stop") && !body["stop"].is_null() &&
      !(body["stop"].is_array() && body["stop"].empty()))
    throw HttpError{400, "stop: stop sequences are not supported (generation ends at EOS)",
                    "invalid_request_error", "stop"};
  if (body.contains("stream")) {
    if (!body["stream"].is_boolean())
      throw HttpError{400, "stream must be a boolean", "invalid_request_error", "stream"};
    p.stream = body["stream"].get<bool>();
  }
  return p;
}

/// The messages of a chat request: role and content, content a string or text parts.
inline std::vector<ChatMessage> request_messages(const nlohmann::json& body) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    throw HttpError{400, "messages must be a non-empty array", "invalid_request_error", "messages"};
  std::vector<ChatMessage> out;
  for (const auto& m : body["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw HttpError{400, "each message needs a string role", "invalid_request_error", "messages"};
    ChatMessage msg{m["role"].get<std::string>(), {}};
    const auto& c = m.contains("content") ? m["content"] : nlohmann::json();
    if (c.is_string()) {
      msg.content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const auto& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          throw HttpError{400, "message content parts must be {\"type\": \"text\", \"text\": ...}",
                          "invalid_request_error", "messages"};
        msg.content += part["text"].get<std::string>();
      }
    } else if (!c.is_null()) {
      throw HttpError{400, "message content must be a string or an array of text parts",
                      "invalid_request_error", "messages"};
    }
    out.push_back(std::move(msg));
  }
  return out;
}

inline std::string request_prompt(const nlohmann::json& body) {
  if (!body.contains("prompt"))
    throw HttpError{400, "prompt is required", "invalid_request_error", "prompt"};
  const auto& p = body["prompt"];
  if (p.is_string()) return p.get<std::string>();
  if (p.is_array() && p.size() == 1 && p[0].is_string()) return p[0].get<std::string>();
  throw HttpError{400, "prompt must be a string (or an array of one string)",
                  "invalid_request_error", "prompt"};
}

inline std::string sse(const nlohmann::json& j) { return "data: " + j.dump() + "\n\n"; }

}  // namespace http_internal

/// Serves until SIGINT or SIGTERM (in-flight requests end, their replies cut short), then
/// returns the totals. Throws `moekit::Error` when the address cannot be bound.
class OpenAiServer {
 public:
  OpenAiServer(ServerConfig cfg, ServerEngine engine)
      : cfg_(std::move(cfg)), engine_(std::move(engine)), admission_(cfg_.queue) {}

  ServerTotals run() {
    httplib::Server svr;
    // One thread per request that may run or wait, plus room for /health and /metrics.
    const std::size_t threads = cfg_.queue + 1 + 4;
    svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    svr.set_payload_max_length(cfg_.max_body_bytes);
    // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which lets a second server bind a
    // port in use (and share its connections) instead of failing.
    svr.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof yes);
    });
    const auto t = static_cast<time_t>(std::max(1.0, cfg_.timeout_seconds));
    svr.set_read_timeout(t);
    svr.set_write_timeout(t);
    routes(svr);
    const int port = cfg_.port == 0 ? svr.bind_to_any_port(cfg_.host)
                                    : (svr.bind_to_port(cfg_.host, cfg_.port) ? cfg_.port : -1);
    if (port < 0)
      throw moekit::Error(moekit::ErrorKind::io, "--host/--port: cannot listen on " + cfg_.host +
                                                     ":" + std::to_string(cfg_.port));
    snapshot_counters();
    http_internal::stop_requested.store(false);
    struct sigaction sa {};
    sa.sa_handler = http_internal::on_stop_signal;
    sigemptyset(&sa.sa_mask);
    struct sigaction old_int {
    }, old_term{};
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    std::fprintf(stderr, "moe-server: listening on http://%s:%d (model %s)\n", cfg_.host.c_str(),
                 port, cfg_.model_name.c_str());
    std::fflush(stderr);
    std::atomic<bool> listener_returned{false};
    std::thread watcher([&] {  // a signal handler may only set a flag: stop from a thread
      while (!http_internal::stop_requested.load())
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      admission_.wake_all();
      // A stop() before the listener runs is lost (a signal right after "listening on", on a
      // loaded machine): wait until it runs (or has returned), then stop it once.
      while (!svr.is_running() && !listener_returned.load())
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      svr.stop();
    });
    const bool ok = svr.listen_after_bind();
    listener_returned.store(true);
    http_internal::stop_requested.store(true);
    watcher.join();
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    std::fprintf(stderr, "moe-server: stopped%s\n", ok ? "" : " (the listener failed)");
    std::lock_guard lock(totals_m_);
    return totals_;
  }

 private:
  using Clock = std::chrono::steady_clock;

  void routes(httplib::Server& svr) {
    svr.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      nlohmann::json j = {
          {"object", "list"},
          {"data", {{{"id", cfg_.model_name}, {"object", "model"}, {"owned_by", "moekit"}}}}};
      res.set_content(j.dump(), "application/json");
    });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      handle(req, res, true);
    });
    svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      handle(req, res, false);
    });
    svr.set_error_handler(
        httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
          if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
          const std::string msg = res.status == 413   ? "request body larger than --server-max-body"
                                  : res.status == 404 ? "no such endpoint"
                                                      : "HTTP error " + std::to_string(res.status);
          http_internal::send_error(res, {res.status, msg});
          return httplib::Server::HandlerResponse::Handled;
        }));
    svr.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string msg = "internal error";
          try {
            std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            msg = e.what();
          } catch (...) {
          }
          http_internal::send_error(res, {500, msg, "server_error"});
        });
  }

  // One completion request: parsed and checked, admitted to the queue (503 when full), then run
  // when its turn comes, streamed or answered at the end.
  void handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    const auto start = Clock::now();
    try {
      nlohmann::json body;
      try {
        body = nlohmann::json::parse(req.body);
      } catch (const nlohmann::json::exception& e) {
        throw http_internal::HttpError{400, std::string("request body is not JSON: ") + e.what()};
      }
      if (!body.is_object())
        throw http_internal::HttpError{400, "request body must be a JSON object"};
      const http_internal::RequestParams p = http_internal::request_params(body, cfg_);
      std::vector<ChatMessage> messages;
      std::string prompt;
      if (chat) {
        if (!engine_.has_chat_template)
          throw http_internal::HttpError{400, engine_.no_chat_template_reason};
        messages = http_internal::request_messages(body);
      } else {
        prompt = http_internal::request_prompt(body);
      }
      auto ticket = admission_.enter();
      if (!ticket) {
        count([](ServerTotals& t) { ++t.rejected; });
        throw http_internal::HttpError{503, "the server is busy: its queue is full, retry later",
                                       "server_overloaded"};
      }
      const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(cfg_.timeout_seconds));
      if (!ticket->wait_turn(deadline)) {
        count([](ServerTotals& t) { ++t.rejected; });
        throw http_internal::HttpError{503, "timed out waiting for the engine (--server-timeout)",
                                       "server_overloaded"};
      }
      auto job = std::make_shared<Job>(Job{chat, std::move(messages), std::move(prompt), p,
                                           deadline, next_id(chat), std::time(nullptr)});
      if (p.stream)
        stream(res, job, ticket);
      else
        respond(res, *job);
    } catch (const http_internal::HttpError& e) {
      http_internal::send_error(res, e);
    }
  }

  struct Job {
    bool chat;
    std::vector<ChatMessage> messages;
    std::string prompt;
    http_internal::RequestParams params;
    Clock::time_point deadline;
    std::string id;
    std::time_t created;
  };

  std::string next_id(bool chat) { return (chat ? "chatcmpl-" : "cmpl-") + std::to_string(++ids_); }

  // Runs `job` on the engine (the caller holds the turn); text pieces go to `on_text`.
  TurnResult run_job(const Job& job, std::function<bool(std::string_view)> on_text) {
    TurnRequest tr;
    tr.max_tokens = job.params.max_tokens;
    tr.on_text = std::move(on_text);
    tr.should_stop = [&] {
      return http_internal::stop_requested.load() || Clock::now() > job.deadline;
    };
    TurnResult r;
    try {
      r = job.chat ? engine_.chat(job.messages, job.params.sampling, tr)
                   : engine_.complete(job.prompt, job.params.sampling, tr);
    } catch (const moekit::Error& e) {  // the request's fault: a refused conversation, no room
      count([](ServerTotals& t) { ++t.failed; });
      snapshot_counters();
      throw http_internal::HttpError{400, e.message()};
    } catch (const std::exception& e) {
      count([](ServerTotals& t) { ++t.failed; });
      throw http_internal::HttpError{500, e.what(), "server_error"};
    }
    if (r.finish_reason == "cancelled") r.finish_reason = "length";  // timeout or shutdown
    count([&](ServerTotals& t) {
      ++t.requests;
      t.prompt_tokens += r.prompt_tokens;
      t.generated_tokens += r.generated_tokens;
      t.decoded_tokens += r.decoded_tokens;
      t.prefill_seconds += r.prefill_seconds;
      t.decode_seconds += r.decode_seconds;
    });
    last_decode_tps_ = r.decode_seconds > 0 ? r.decoded_tokens / r.decode_seconds : 0.0;
    snapshot_counters();
    return r;
  }

  static nlohmann::json usage(const TurnResult& r) {
    return {{"prompt_tokens", r.prompt_tokens},
            {"completion_tokens", r.generated_tokens},
            {"total_tokens", r.prompt_tokens + r.generated_tokens}};
  }

  void respond(httplib::Response& res, const Job& job) {
    const TurnResult r = run_job(job, nullptr);
    nlohmann::json choice = {{"index", 0}, {"finish_reason", r.finish_reason}};
    if (job.chat)
      choice["message"] = {{"role", "assistant"}, {"content", r.text}};
    else
      choice["text"] = r.text, choice["logprobs"] = nullptr;
    nlohmann::json j = {
        {"id", job.id},           {"object", job.chat ? "chat.completion" : "text_completion"},
        {"created", job.created}, {"model", cfg_.model_name},
        {"choices", {choice}},    {"usage", usage(r)}};
    res.set_content(j.dump(), "application/json");
  }

  nlohmann::json chunk(const Job& job, const nlohmann::json& choice) const {
    return {{"id", job.id},
            {"object", job.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", job.created},
            {"model", cfg_.model_name},
            {"choices", {choice}}};
  }

  // Server-sent events: one chunk per piece of text, a last one with the finish reason, then
  // [DONE]. A client that goes away stops the generation at its next piece.
  void stream(httplib::Response& res, std::shared_ptr<Job> job,
              std::shared_ptr<http_internal::Admission::Ticket> ticket) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [this, job, ticket](std::size_t, httplib::DataSink& sink) {
          auto send = [&](const nlohmann::json& choice) {
            const std::string s = http_internal::sse(chunk(*job, choice));
            return sink.write(s.data(), s.size());
          };
          bool open = true;
          if (job->chat)
            open = send({{"index", 0},
                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                         {"finish_reason", nullptr}});
          auto piece = [&](std::string_view text) {
            nlohmann::json c = {{"index", 0}, {"finish_reason", nullptr}};
            if (job->chat)
              c["delta"] = {{"content", std::string(text)}};
            else
              c["text"] = std::string(text), c["logprobs"] = nullptr;
            return open = open && send(c);
          };
          if (!open) {  // gone before the first chunk: nothing to generate for
            count([](ServerTotals& t) { ++t.cancelled; });
            return false;
          }
          TurnResult r;
          try {
            r = run_job(*job, piece);
          } catch (const http_internal::HttpError& e) {
            const std::string s = "data: " + http_internal::error_body(e) + "\n\n";
            sink.write(s.data(), s.size());
            sink.done();
            return true;
          }
          if (!open) {
            count([](ServerTotals& t) { ++t.cancelled; });
            return false;  // the client is gone: close
          }
          nlohmann::json last = {{"index", 0}, {"finish_reason", r.finish_reason}};
          if (job->chat)
            last["delta"] = nlohmann::json::object();
          else
            last["text"] = "", last["logprobs"] = nullptr;
          if (send(last)) {
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
          }
          sink.done();
          return true;
        });
  }

  void count(const std::function<void(ServerTotals&)>& f) {
    std::lock_guard lock(totals_m_);
    f(totals_);
  }

  void snapshot_counters() {
    auto c = engine_.counters ? engine_.counters() : decltype(engine_.counters())();
    std::lock_guard lock(totals_m_);
    counters_ = std::move(c);
  }

  std::string metrics_text() {
    std::lock_guard lock(totals_m_);
    std::string s;
    auto line = [&](const std::string& name, double v, const char* help) {
      s += "# HELP moekit_" + name + " " + help + "\n# TYPE moekit_" + name + " gauge\nmoekit_" +
           name + " " + std::to_string(v) + "\n";
    };
    const ServerTotals& t = totals_;
    line("requests_total", double(t.requests), "completion requests answered");
    line("requests_rejected_total", double(t.rejected),
         "requests refused: queue full or timed out");
    line("requests_failed_total", double(t.failed), "requests the engine refused");
    line("requests_cancelled_total", double(t.cancelled), "streams whose client went away");
    line("prompt_tokens_total", double(t.prompt_tokens), "tokens prefilled");
    line("generated_tokens_total", double(t.generated_tokens), "tokens sampled");
    line("prefill_tokens_per_second",
         t.prefill_seconds > 0 ? double(t.prompt_tokens) / t.prefill_seconds : 0.0,
         "prefill speed over all requests");
    line("decode_tokens_per_second",
         t.decode_seconds > 0 ? double(t.decoded_tokens) / t.decode_seconds : 0.0,
         "decode speed over all requests");
    line("last_decode_tokens_per_second", last_decode_tps_, "decode speed of the last request");
    for (const auto& [name, v] : counters_) line(name, v, "offloading pipeline counter");
    return s;
  }

  ServerConfig cfg_;
  ServerEngine engine_;
  http_internal::Admission admission_;
  std::mutex totals_m_;
  ServerTotals totals_;
  std::vector<std::pair<std::string, double>> counters_;
  std::atomic<double> last_decode_tps_{0.0};
  std::atomic<std::uint64_t> ids_{0};
};

}  // namespace moe_server
