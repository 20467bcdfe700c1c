#!/usr/bin/env python3
"""Two threads against one, quiet and beside a `nice -n 19` busy loop, moe-run and llama.cpp
(issue 28, point 2). Run by bench/engine/thread_scaling.sh, which makes the GGUF.

    thread_scaling.py MOE_RUN MODEL_DIR GGUF [-n N] [--rounds R] [-p PROMPT] [--sampling S[,S]]
                      [--budgets B[,B]]

Each round runs both conditions in turn (A/B/A/B: a load that comes and goes hits both), and in
each condition both thread counts of both engines, greedy and with each engine's default sampler
(moe-run: temperature 0.8, top-p 0.95; llama-cpp-python's default chain: top-k 40, typical 1,
top-p 0.95, min-p 0.05, temperature 0.8). moe-run runs at each of `--budgets`: `resident` (every
expert in memory, `--expert-budget all --in-memory`) and any `--expert-budget` value, such as the
README's main command's `50%` (half of the experts cached, the rest read with O_DIRECT from the
checkpoint); llama.cpp maps the whole GGUF either way. The busy loop is a child of this script at
nice 19 (so in its scheduling group). Prints the medians, two threads / one thread per engine and
condition (targets for moe-run: >= 1.3 quiet, >= 1.0 beside the loop), moe-run / llama.cpp, and
the load average of every round.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_cpp_peer import llama_decode, load  # noqa: E402  (the peer benchmark's settings)

CONDITIONS = ("quiet", "busy")


def budget_flags(budget: str) -> list:
    return ["--expert-budget", "all", "--in-memory"] if budget == "resident" else [
        "--expert-budget", budget]


def moe_run_tps(moe_run: Path, model_dir: Path, prompt: str, n: int, threads: int,
                sampling: str, budget: str) -> float:
    cmd = [str(moe_run), "-m", str(model_dir), "-p", prompt, "-n", str(n), "-t", str(threads),
           "--json"] + budget_flags(budget)
    if sampling == "greedy":
        cmd += ["--temp", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    j = json.loads(r.stdout)
    return j["decode_tokens_per_s"]


def busy_loop() -> subprocess.Popen:
    return subprocess.Popen(["nice", "-n", "19", "sh", "-c", "while :; do :; done"])


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(a, llms, prompts, results) -> None:
    for t in (1, 2):
        for s in a.sampling:
            for b in a.budgets:
                results.setdefault((f"moe-run {b}", s, t), []).append(
                    moe_run_tps(a.moe_run, a.model_dir, a.prompt, a.n, t, s, b))
            results.setdefault(("llama.cpp", s, t), []).append(llama_decode(llms[t], prompts[t], a.n, s)[0])


def report(a, res) -> None:
    moe_runs = [f"moe-run {b}" for b in a.budgets]
    engines = moe_runs + ["llama.cpp"]
    w = max(len(e) for e in engines)
    print(f"\n{'engine':{w}s} {'sampling':8s} {'condition':9s} {'1 thread':>9s} {'2 threads':>9s} "
          f"{'2t/1t':>6s}  range 1t / 2t (tok/s)")
    for engine in engines:
        for s in a.sampling:
            for c in CONDITIONS:
                one, two = res[c][(engine, s, 1)], res[c][(engine, s, 2)]
                m1, m2 = statistics.median(one), statistics.median(two)
                target = "" if engine == "llama.cpp" else (
                    "  (target >= 1.30)" if c == "quiet" else "  (target >= 1.00)")
                print(f"{engine:{w}s} {s:8s} {c:9s} {m1:9.1f} {m2:9.1f} {m2 / m1:6.2f}  "
                      f"{min(one):.0f}-{max(one):.0f} / {min(two):.0f}-{max(two):.0f}{target}")
    print(f"\nmoe-run / llama.cpp (medians)")
    for e in moe_runs:
        for s in a.sampling:
            for c in CONDITIONS:
                cells = [f"{t} thread{'s' if t > 1 else ''} "
                         f"{statistics.median(res[c][(e, s, t)]) / statistics.median(res[c][('llama.cpp', s, t)]):.2f}x"
                         for t in (1, 2)]
                print(f"  {e:{w}s} {s:8s} {c:9s} " + ", ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("moe_run", type=Path)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("gguf", type=Path)
    ap.add_argument("-p", "--prompt", default="The history of the")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sampling", default="greedy,default")
    ap.add_argument("--budgets", default="resident,50%",
                    help="moe-run's expert budgets: resident and/or --expert-budget values")
    a = ap.parse_args()
    a.budgets = a.budgets.split(",")
    a.sampling = a.sampling.split(",")
    if any(s not in ("greedy", "default") for s in a.sampling):
        raise SystemExit("--sampling: greedy and/or default")
    print(f"decode tok/s, -p {a.prompt!r} -n {a.n}, {a.rounds} rounds (+1 discarded warm-up), "
          f"conditions alternating quiet/busy (busy: `nice -n 19` busy loop beside); "
          f"llama-cpp-python {llama_cpp.__version__} on {a.gguf.name}")
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    print(f"CPU: {cpu}, {os.cpu_count()} logical CPUs; start load average {load_average()}")
    llms = {t: load(a.gguf, 512, t, logits_all=False) for t in (1, 2)}
    prompts = {t: llms[t].tokenize(a.prompt.encode(), add_bos=True, special=False) for t in (1, 2)}
    res = {c: {} for c in CONDITIONS}
    for r in range(a.rounds + 1):
        for c in CONDITIONS:
            loop = busy_loop() if c == "busy" else None
            try:
                time.sleep(0.2 if loop else 0)  # let the loop start
                sink = {} if r == 0 else res[c]  # round 0 warms caches and page tables
                measure(a, llms, prompts, sink)
            finally:
                if loop:
                    loop.kill()
                    loop.wait()
            print(f"round {r}{' (warm-up)' if r == 0 else ''} {c}: load average {load_average()}",
                  flush=True)
    report(a, res)
    print(f"end load average {load_average()}")


if __name__ == "__main__":
    main()
