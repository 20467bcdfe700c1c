#!/usr/bin/env python3
"""ctest examples/moe-server-*: moe-run --serve on 127.0.0.1 against real clients, and moe-run --chat.

    server_test.py MOE_RUN curl     # curl: endpoints, SSE, malformed JSON, limits, a client that
                                    # disconnects mid-stream, concurrent requests (503), SIGTERM
    server_test.py MOE_RUN openai   # the `openai` package (build/server-test-venv, made by
                                    # scripts/make-server-test-venv.sh; exit 77 = skipped offline)
    server_test.py MOE_RUN chat     # --chat on piped stdin keeps the KV cache across turns

Every server runs the default model with half its experts in the cache (so experts are loaded and
the counters move), on one thread, on a port the kernel picks. Python's standard library only,
except the openai part.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

MOE_RUN = sys.argv[1]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER_ARGS = ["--serve", "--port", "0", "--chat-template", "mistral-v1", "-t", "1",
               "--expert-budget", "50%", "--temp", "0", "-n", "8", "--server-max-tokens", "200",
               "--server-max-body", "4096", "--server-queue", "1", "--server-timeout", "60"]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def with_flags(args, **flags):
    """`args` with the value of each --flag_name replaced (or added)."""
    args = list(args)
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if flag in args:
            args[args.index(flag) + 1] = str(value)
        else:
            args += [flag, str(value)]
    return args


class Server:
    def __init__(self, extra=(), args=SERVER_ARGS):
        self.proc = subprocess.Popen([MOE_RUN, *args, *extra], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.port = None
        deadline = time.time() + 60
        self.err_lines = []
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.err_lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            sys.exit("server did not start: " + "".join(self.err_lines) + self.proc.stderr.read())
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        try:
            out, err = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            return None, "".join(self.err_lines) + err
        return self.proc.returncode, "".join(self.err_lines) + err


def curl(server, path, body=None, extra=()):
    """(status, body text) of one curl request; body: dict (sent as JSON) or str (sent as is)."""
    cmd = ["curl", "-s", "-N", "-o", "-", "-w", "\n%{http_code}", server.url + path, *extra]
    if body is not None:
        data = body if isinstance(body, str) else json.dumps(body)
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    else:
        data = None
    r = subprocess.run(cmd, input=data, capture_output=True, text=True, timeout=120)
    text, _, code = r.stdout.rpartition("\n")
    return int(code or 0), text


def metrics(server):
    _, text = curl(server, "/metrics")
    return {k: float(v) for k, v in re.findall(r"^moekit_(\w+) (\S+)$", text, re.M)}


def sse_events(text):
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


def test_endpoints(s):
    code, text = curl(s, "/health")
    check(code == 200 and json.loads(text)["status"] == "ok", "/health answers ok")
    chat = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6}
    code, text = curl(s, "/v1/chat/completions", chat)
    j = json.loads(text)
    check(code == 200 and j["object"] == "chat.completion", "chat completion: 200")
    msg = j["choices"][0]["message"]
    check(msg["role"] == "assistant" and isinstance(msg["content"], str), "chat: assistant message")
    check(j["usage"]["completion_tokens"] <= 6 and j["usage"]["prompt_tokens"] > 0,
          "chat: usage within max_tokens")
    check(j["choices"][0]["finish_reason"] in ("stop", "length"), "chat: finish_reason")
    # The next request continues the conversation: only its new part is prefilled.
    follow = {"messages": chat["messages"] + [msg, {"role": "user", "content": "More"}],
              "max_tokens": 4}
    code, text = curl(s, "/v1/chat/completions", follow)
    kept = json.loads(text)["usage"]["prompt_tokens"]
    curl(s, "/v1/completions", {"prompt": "Unrelated", "max_tokens": 1})
    code, text = curl(s, "/v1/chat/completions", follow)
    full = json.loads(text)["usage"]["prompt_tokens"]
    check(code == 200 and 0 < kept < full,
          f"a continued conversation prefills only its new part ({kept} < {full} tokens)")

    code, text = curl(s, "/v1/completions", {"prompt": "The history of", "max_tokens": 5,
                                             "stream": True})
    events = sse_events(text)
    check(code == 200 and events and events[-1] == "[DONE]", "completion stream ends with [DONE]")
    chunks = [json.loads(e) for e in events[:-1]]
    check(all(c["object"] == "text_completion" for c in chunks), "stream chunks are completions")
    check(chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length"),
          "the last chunk carries finish_reason")
    code, text = curl(s, "/v1/chat/completions", dict(chat, stream=True))
    chunks = [json.loads(e) for e in sse_events(text)[:-1]]
    check(chunks[0]["choices"][0]["delta"].get("role") == "assistant" and
          all(c["object"] == "chat.completion.chunk" for c in chunks), "chat stream: deltas")


def test_bad_requests(s):
    def error(code, text):
        try:
            return code, json.loads(text)["error"]["message"]
        except (ValueError, KeyError):
            return code, None

    code, msg = error(*curl(s, "/v1/chat/completions", '{"messages": [ {"role": "user"'))
    check(code == 400 and msg and "not JSON" in msg, "malformed JSON: 400 saying so")
    code, msg = error(*curl(s, "/v1/completions", "[1, 2]"))
    check(code == 400 and "JSON object" in msg, "a JSON array body: 400")
    code, msg = error(*curl(s, "/v1/chat/completions", {"messages": "hi"}))
    check(code == 400 and "messages" in msg, "messages not an array: 400 naming it")
    code, msg = error(*curl(s, "/v1/completions", {"prompt": "x", "max_tokens": 5000}))
    check(code == 400 and "max_tokens" in msg and "200" in msg,
          "max_tokens above --server-max-tokens: 400 naming the limit")
    code, msg = error(*curl(s, "/v1/completions", {"prompt": "x", "temperature": "hot"}))
    check(code == 400 and "temperature" in msg, "a string temperature: 400 naming it")
    code, msg = error(*curl(s, "/v1/completions", {"prompt": "x" * 5000}))
    check(code == 413, f"a body above --server-max-body: 413 (got {code})")
    code, msg = error(*curl(s, "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "a"},
                                          {"role": "user", "content": "b"}]}))
    check(code == 400 and "alternate" in msg, "the template's own refusal: 400 with its message")
    code, msg = error(*curl(s, "/nowhere"))
    check(code == 404, "an unknown path: 404")
    check(curl(s, "/health")[0] == 200, "healthy after bad requests")


def test_disconnect(s):
    before = metrics(s)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 200, "stream": True})
    req = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
           f"\r\nContent-Length: {len(body)}\r\n\r\n{body}")
    with socket.create_connection(("127.0.0.1", s.port), timeout=30) as c:
        c.sendall(req.encode())
        got = b""
        while b"data: " not in got:
            got += c.recv(4096)
    t0 = time.time()  # the client is gone after its first chunk
    code, _ = curl(s, "/v1/completions", {"prompt": "Next", "max_tokens": 2})
    waited = time.time() - t0
    after = metrics(s)
    check(code == 200, "a request after a client vanished mid-stream is served")
    check(after["requests_cancelled_total"] > before["requests_cancelled_total"],
          "the vanished client's generation was cancelled")
    check(after["generated_tokens_total"] - before["generated_tokens_total"] < 200,
          f"it stopped before its 200 tokens (waited {waited:.2f} s)")


def test_concurrency(s):
    body = {"prompt": "The", "max_tokens": 60}
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: curl(s, "/v1/completions", body), range(6)))
    codes = sorted(c for c, _ in results)
    ok = [json.loads(t) for c, t in results if c == 200]
    check(all(c in (200, 503) for c in codes), f"6 concurrent requests: 200 or 503 ({codes})")
    check(len(ok) >= 2 and codes.count(503) >= 1,
          "one runs, one waits in the queue of 1, the rest are refused with 503")
    check(all(j["usage"]["completion_tokens"] > 0 for j in ok), "the admitted ones completed")
    rejected = [json.loads(t)["error"]["type"] for c, t in results if c == 503]
    check(all(t == "server_overloaded" for t in rejected), "503 bodies are OpenAI errors")


def test_metrics(s):
    m = metrics(s)
    for name in ("expert_cache_hit_rate", "expert_bytes_loaded_total", "prefetch_precision",
                 "prefetch_recall", "decode_tokens_per_second", "requests_rejected_total"):
        check(name in m, f"/metrics has {name}")
    check(0 < m.get("expert_cache_hit_rate", 0) < 1, "hit rate strictly between 0 and 1 at 50%")
    check(m.get("expert_bytes_loaded_total", 0) > 0, "bytes loaded > 0 at 50%")
    check(m.get("decode_tokens_per_second", 0) > 0, "decode tokens/s > 0")
    check(m.get("requests_rejected_total", 0) >= 1, "the 503s are counted")


def run_curl():
    s = Server()
    try:
        test_endpoints(s)
        test_bad_requests(s)
        test_disconnect(s)
        test_concurrency(s)
        test_metrics(s)
        r = subprocess.run([MOE_RUN, "--serve", "--port", str(s.port), "-t", "1"],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode != 0 and "--host/--port" in r.stderr,
              "a port in use is refused naming --host/--port")
    finally:
        rc, err = s.stop(signal.SIGTERM)
    check(rc == 0 and "moe-server: stopped" in err, f"SIGTERM: clean exit 0 (rc {rc})")
    check("generated:" in err, "the statistics are printed at shutdown")
    s = Server(["--json"])
    rc, err = s.stop(signal.SIGINT)
    check(rc == 0, "SIGINT: clean exit 0")
    test_timeout_and_shutdown_mid_stream()


def test_timeout_and_shutdown_mid_stream():
    s = Server(args=with_flags(SERVER_ARGS, server_timeout=0.3, server_max_tokens=100000))
    t0 = time.time()
    code, text = curl(s, "/v1/completions", {"prompt": "The", "max_tokens": 4000})
    j = json.loads(text)
    check(code == 200 and j["choices"][0]["finish_reason"] == "length" and
          j["usage"]["completion_tokens"] < 4000 and time.time() - t0 < 10,
          "--server-timeout cuts a long reply short (finish_reason length)")
    with ThreadPoolExecutor(1) as pool:
        streamed = pool.submit(curl, s, "/v1/completions",
                               {"prompt": "The", "max_tokens": 4000, "stream": True})
        time.sleep(0.1)
        rc, err = s.stop(signal.SIGTERM)
        code, text = streamed.result()
    check(rc == 0, "SIGTERM with a stream running: exit 0")
    check(code == 200 and sse_events(text)[-1:] == ["[DONE]"], "the running stream ends cleanly")


def run_openai():
    venv_python = os.path.join(ROOT, "build", "server-test-venv", "bin", "python")
    if os.environ.get("MOEKIT_IN_VENV") != "1":
        if not os.path.exists(venv_python):
            r = subprocess.run([os.path.join(ROOT, "scripts", "make-server-test-venv.sh")])
            if r.returncode != 0:
                print("SKIP: the openai package could not be installed (offline?)")
                sys.exit(77)
        os.environ["MOEKIT_IN_VENV"] = "1"
        os.execv(venv_python, [venv_python, *sys.argv])
    import openai
    s = Server()
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(model="moekit-tiny-moe", max_tokens=6,
                                           messages=[{"role": "user", "content": "Hi"}])
        check(r.choices[0].message.role == "assistant" and r.usage.completion_tokens <= 6,
              "openai: chat.completions.create")
        text = ""
        for chunk in client.chat.completions.create(
                model="m", max_tokens=6, stream=True,
                messages=[{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Hi"}]):
            text += chunk.choices[0].delta.content or ""
        check(isinstance(text, str), f"openai: streamed chat ({text!r})")
        r = client.completions.create(model="m", prompt="The history of", max_tokens=5)
        check(r.choices[0].finish_reason in ("stop", "length"), "openai: completions.create")
        pieces = [c.choices[0].text for c in
                  client.completions.create(model="m", prompt="The", max_tokens=5, stream=True)]
        check(len(pieces) >= 2, "openai: streamed completion")
        try:
            client.completions.create(model="m", prompt="x", max_tokens=100000)
            check(False, "openai: max_tokens above the limit is refused")
        except openai.BadRequestError as e:
            check("max_tokens" in str(e), "openai: BadRequestError naming max_tokens")
        check([m.id for m in client.models.list()] == ["moekit-tiny-moe"], "openai: models.list")
    finally:
        rc, _ = s.stop()
    check(rc == 0, "clean exit")


def run_chat():
    turns = "Hello there\nTell me more\n/exit\nnever read\n"
    r = subprocess.run([MOE_RUN, "--chat", "--chat-template", "mistral-v1", "-n", "6", "-t", "1",
                        "--temp", "0", "--json"], input=turns, capture_output=True, text=True,
                       timeout=120)
    check(r.returncode == 0, f"--chat exits 0 ({r.stderr[-300:]})")
    j = json.loads(r.stdout)
    t = j["turns"]
    check([x["user"] for x in t] == ["Hello there", "Tell me more"], "/exit ends the chat")
    check(not t[0]["cache_kept"] and t[1]["cache_kept"], "the second turn keeps the KV cache")
    check(t[1]["prompt_tokens"] < 20, f"only the new turn is prefilled ({t[1]['prompt_tokens']})")
    check(j["chat_template"] == "mistral-v1", "the template is reported")
    r = subprocess.run([MOE_RUN, "--chat", "-t", "1"], input="", capture_output=True, text=True,
                       timeout=60)
    check(r.returncode != 0 and "tokenizer_config.json" in r.stderr and "--chat-template" in r.stderr,
          "auto without a template in the model is refused naming where it looked")
    r = subprocess.run([MOE_RUN, "--chat-template", "jinja"], capture_output=True, text=True)
    check(r.returncode != 0 and "--chat-template: 'jinja'" in r.stderr, "an unknown name: refused")


{"curl": run_curl, "openai": run_openai, "chat": run_chat}[sys.argv[2]]()
if failures:
    sys.exit(f"{len(failures)} failed: {failures}")
print("all passed")
