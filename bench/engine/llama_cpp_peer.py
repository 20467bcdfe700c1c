#!/usr/bin/env python3
"""llama.cpp (through llama-cpp-python) as moe-run's peer. Run by bench/engine/llama_cpp_peer.sh.

    llama_cpp_peer.py reference GGUF MODEL_DIR OUT.json [--top-k K] [--threads T]
        llama.cpp's logits for the fixed sequence of MODEL_DIR/reference.json (the transformers
        reference's prompt + greedy tokens), teacher-forced in one batch, f32 KV cache; saves the
        top-K ids and logits of every position, and llama.cpp's own tokenisation of the prompt.
        tests/engine/llama_cpp_reference_test.cpp compares moe-run's logits with it.

    llama_cpp_peer.py bench MOE_RUN MODEL_DIR --pair GGUF:PRECISION [--pair ...] [-p PROMPT]
                      [-n N] [-t T[,T...]] [--rounds R] [--sampling greedy,default]
        Decode tokens/s of llama.cpp on GGUF and of moe-run on MODEL_DIR (safetensors, experts at
        PRECISION, all of them in memory), alternating round by round in this one run (one
        warm-up round discarded), greedy and with each side's default sampler (moe-run:
        temperature 0.8, top-p 0.95; llama-cpp-python's default chain: top-k 40, typical 1,
        top-p 0.95, min-p 0.05, temperature 0.8; its sampling calls' wall time is added to
        llama.cpp's eval time); prints the medians, the ratio moe-run / llama.cpp and the range per
        pair, sampling and thread count, and the load average before and after.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import llama_cpp

GGML_TYPE_F32 = 0


def load(gguf: Path, n_ctx: int, threads: int, logits_all: bool) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                           n_threads=threads, n_threads_batch=threads, logits_all=logits_all,
                           type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, flash_attn=False,
                           use_mmap=True, seed=0, verbose=False)


def reference(a) -> None:
    ref = json.loads((a.model_dir / "reference.json").read_text())
    seq = ref["sequence_ids"]
    llm = load(a.gguf, max(64, len(seq) + 8), a.threads, logits_all=True)
    llama_tokens = llm.tokenize(ref["prompt_text"].encode("utf-8"), add_bos=True, special=False)
    llm.reset()
    llm.eval(seq)
    scores = np.asarray(llm.scores[: len(seq)], dtype=np.float32)
    if scores.shape != (len(seq), llm.n_vocab()) or not np.isfinite(scores).all():
        raise SystemExit(f"llama.cpp returned logits of shape {scores.shape} (or non-finite values)")
    top = np.argsort(-scores, axis=1)[:, : a.top_k]
    out = {
        "what": "llama.cpp logits for MODEL_DIR/reference.json's sequence_ids, teacher-forced in one "
                "batch (logits_all), f32 KV cache, no flash attention",
        "made_by": "bench/engine/llama_cpp_peer.sh reference",
        "gguf": a.gguf.name,
        "gguf_bytes": a.gguf.stat().st_size,
        "model_dir": a.model_dir.name,
        "model_safetensors_sha256": hashlib.sha256(
            (a.model_dir / "model.safetensors").read_bytes()).hexdigest(),
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "threads": a.threads,
        "prompt_text": ref["prompt_text"],
        "prompt_ids": ref["prompt_ids"],
        "llama_prompt_ids": list(map(int, llama_tokens)),
        "sequence_ids": seq,
        "top_k": a.top_k,
        "top_ids": top.tolist(),
        "top_logits": np.take_along_axis(scores, top, axis=1).tolist(),
        "greedy_ids": scores.argmax(axis=1).tolist(),
    }
    a.out.write_text(fixture_json(out))
    print(f"{a.out}: {len(seq)} positions, top-{a.top_k}; llama.cpp prompt tokens "
          f"{'equal' if out['llama_prompt_ids'] == ref['prompt_ids'] else 'DIFFER from'} the reference's")


def fixture_json(obj: dict) -> str:
    """One key per line and one position per line for lists of rows: the committed fixture diffs
    readably when it is regenerated."""
    def value(v):
        if isinstance(v, list) and v and isinstance(v[0], list):
            return "[\n" + ",\n".join("  " + json.dumps(row) for row in v) + "\n ]"
        return json.dumps(v)
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {value(v)}" for k, v in obj.items()) + "\n}\n"


def llama_decode(llm: llama_cpp.Llama, prompt: list[int], n: int,
                 sampling: str = "greedy") -> tuple[float, list[int]]:
    """Decode of n tokens after the prompt, greedy or with llama-cpp-python's default sampler
    chain; tokens/s from llama.cpp's own eval time (llama_perf_context: time inside llama_decode
    for the one-token batches) plus the wall time of the sampling calls (0 for greedy, whose
    argmax is not counted)."""
    llm.reset()
    llm.eval(prompt)
    llama_cpp.llama_perf_context_reset(llm.ctx)
    sampler = llm._init_sampler() if sampling == "default" else None  # the library's defaults
    # Without logits_all, Llama.eval no longer copies logits into llm.scores: read the last
    # position's row from the context.
    last = lambda: int(np.argmax(np.ctypeslib.as_array(
        llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))))
    out, sample_s = [], 0.0
    for _ in range(n + 1):
        if sampler is None:
            tok = last()
        else:
            t0 = time.perf_counter()
            tok = sampler.sample(llm._ctx, -1)
            sample_s += time.perf_counter() - t0
        if len(out) == n:
            break
        out.append(tok)
        llm.eval([tok])
    perf = llama_cpp.llama_perf_context(llm.ctx)
    if perf.n_eval != n:
        raise SystemExit(f"llama.cpp counted {perf.n_eval} decode evals, expected {n}")
    return perf.n_eval / (perf.t_eval_ms / 1e3 + sample_s), out


def moe_run_decode(moe_run: Path, model_dir: Path, precision: str, dense: str, prompt: str, n: int,
                   threads: int, sampling: str = "greedy") -> tuple[float, str]:
    cmd = [str(moe_run), "-m", str(model_dir), "-p", prompt, "-n", str(n), "-t", str(threads),
           "--precision", precision, "--dense-precision", dense, "--expert-budget",
           "all", "--in-memory", "--json"] + (["--temp", "0"] if sampling == "greedy" else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    j = json.loads(r.stdout)
    if sampling == "greedy" and j["generated_tokens"] != n:
        raise SystemExit(f"moe-run generated {j['generated_tokens']} tokens, expected {n}")
    return j["decode_tokens_per_s"], j["text"]


def load_average() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def bench(a) -> None:
    threads = [int(t) for t in a.threads.split(",")]
    samplings = a.sampling.split(",")
    if any(s not in ("greedy", "default") for s in samplings):
        raise SystemExit("--sampling: greedy and/or default")
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    print(f"decode tokens/s, -p {a.prompt!r} -n {a.n}, medians of {a.rounds} alternating "
          f"rounds after one discarded warm-up round (llama-cpp-python {llama_cpp.__version__}, "
          f"{llama_cpp.llama_print_system_info().decode().strip()})")
    print(f"CPU: {cpu}, {os.cpu_count()} logical CPUs")
    print("llama.cpp: eval time of the one-token llama_decode calls (llama_perf_context) + its "
          "sampling calls; moe-run: its decode_tokens_per_s (--json), experts in memory "
          "(--in-memory --expert-budget all); sampling: greedy, or each side's default sampler")
    print(f"start: {load_average()}")
    print(f"{'llama.cpp GGUF':32s} {'moe-run experts/dense':21s} {'sampling':8s} {'-t':>3s} "
          f"{'llama tok/s':>11s} {'moe tok/s':>10s} {'moe/llama':>9s}  same text  llama range / moe range")
    for t in threads:
        for pair in a.pair:
            gguf, precision, dense = pair.rsplit(":", 2)
            gguf = Path(gguf)
            llm = load(gguf, 512, t, logits_all=False)
            prompt = llm.tokenize(a.prompt.encode("utf-8"), add_bos=True, special=False)
            for sampling in samplings:
                lt, mt, same = [], [], True
                for r in range(a.rounds + 1):
                    tps, toks = llama_decode(llm, prompt, a.n, sampling)
                    mps, text = moe_run_decode(a.moe_run, a.model_dir, precision, dense, a.prompt,
                                               a.n, t, sampling)
                    ltext = llm.detokenize(toks).decode("utf-8", errors="replace")
                    same = same and ltext.strip() == text.strip()
                    if r > 0:  # round 0 warms caches, page tables and llama.cpp's graph allocator
                        lt.append(tps)
                        mt.append(mps)
                l, m = statistics.median(lt), statistics.median(mt)
                # Sampled texts differ by construction (two samplers, two random generators).
                same_word = ("yes" if same else "no") if sampling == "greedy" else "-"
                print(f"{gguf.name:32s} {precision + '/' + dense:21s} {sampling:8s} {t:3d} {l:11.1f} "
                      f"{m:10.1f} {m / l:8.2f}x  {same_word:9s}  {min(lt):.0f}-{max(lt):.0f} / "
                      f"{min(mt):.0f}-{max(mt):.0f}", flush=True)
            del llm
    print(f"end: {load_average()}")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("gguf", type=Path)
    r.add_argument("model_dir", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--top-k", type=int, default=8)
    r.add_argument("--threads", type=int, default=2)
    b = sub.add_parser("bench")
    b.add_argument("moe_run", type=Path)
    b.add_argument("model_dir", type=Path)
    b.add_argument("--pair", action="append", required=True, help="GGUF:moe-run expert precision:moe-run dense precision")
    b.add_argument("-p", "--prompt", default="The history of the")
    b.add_argument("-n", type=int, default=128)
    b.add_argument("-t", "--threads", default="2", help="thread counts, comma-separated (1,2)")
    b.add_argument("--rounds", type=int, default=5)
    b.add_argument("--sampling", default="greedy,default",
                   help="greedy and/or default (each side's default sampler), comma-separated")
    a = ap.parse_args()
    reference(a) if a.cmd == "reference" else bench(a)


if __name__ == "__main__":
    main()
