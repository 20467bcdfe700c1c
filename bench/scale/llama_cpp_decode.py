#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) on one GGUF, as bench/scale/run.sh's peer: prefill of the prompt,
then greedy decode of N tokens, timed by wall clock like moe-run's --json; prints one JSON line.

    llama_cpp_decode.py GGUF --prompt-ids IDS_JSON -n N [--threads T] [--repack on|off] [--mmap on|off]
                        [--kv-type f16|f32]
    llama_cpp_decode.py GGUF --prompt-ids IDS_JSON --check-tokens IDS_JSON [--threads T] ...

The prompt is given as token ids (moe-run's tokenisation, with BOS), so both engines see the same
sequence. --repack off keeps llama.cpp's weights in the mapped file (no CPU "extra buffer types",
which repack Q4_0 into anonymous memory); on is llama.cpp's default. The tokens generated are
printed so run.sh can check both engines agree, with the bytes this process read from storage
while decoding (/proc/self/io read_bytes: page faults on the mapped file included).

--kv-type: the KV cache's element type for keys and values (llama.cpp's --cache-type-k/-v; f16
is llama.cpp's default), so that both engines read the same bytes per cached position.

--progress FILE: the same JSON (with "partial": true) rewritten after the prefill and after every
token, so that a run stopped by a timeout still tells what it measured.

--check-tokens: instead of generating, evaluate the prompt followed by another engine's greedy
tokens in one batch (teacher forcing) and report, for each generated position, whether that
engine's token is llama.cpp's argmax there and otherwise how far below llama.cpp's best logit it
lies, in standard deviations of that position's logits.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import llama_cpp

KV_TYPES = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16}


def set_repack(repack: bool) -> None:
    """llama-cpp-python's Llama() has no argument for llama_model_params.use_extra_bufts (the CPU
    repack of Q4_0 into anonymous memory), but fills its params from llama_model_default_params
    of the module llama_cpp.llama_cpp (the name Llama's code calls; patching the package's
    re-export has no effect): wrap that one so the field is set before the model loads."""
    import llama_cpp.llama_cpp as api
    if "use_extra_bufts" not in {f[0] for f in api.llama_model_params._fields_}:
        if not repack:
            raise SystemExit("this llama-cpp-python has no use_extra_bufts: --repack off unavailable")
        return
    default = api.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = repack
        return p
    api.llama_model_default_params = params


def read_bytes() -> int:
    with open("/proc/self/io") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("read_bytes:"))


def check_tokens(a, prompt: list, tokens: list) -> None:
    """Teacher-forced agreement of llama.cpp with another engine's greedy tokens."""
    seq = prompt + tokens[:-1]
    llm = llama_cpp.Llama(model_path=a.gguf, n_ctx=len(seq) + 8, n_batch=len(seq),
                          n_ubatch=min(len(seq), 512), n_threads=a.threads,
                          n_threads_batch=a.threads, flash_attn=False, seed=0, verbose=False,
                          logits_all=True, use_mmap=a.mmap == "on",
                          type_k=KV_TYPES[a.kv_type], type_v=KV_TYPES[a.kv_type])
    llm.eval(seq)
    logits = np.array(llm.scores[: len(seq)], dtype=np.float64)
    agree, gaps = 0, []
    for i, tok in enumerate(tokens):
        row = logits[len(prompt) - 1 + i]
        best = float(row.max())
        if int(row.argmax()) == tok:
            agree += 1
        else:
            gaps.append((best - float(row[tok])) / float(row.std()))
    print(json.dumps({"engine": "llama.cpp", "model": a.gguf.rsplit("/", 1)[-1],
                      "positions": len(tokens), "argmax_agree": agree,
                      "worst_gap_in_std": max(gaps, default=0.0), "gaps_in_std": gaps}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--prompt-ids", required=True, help="JSON list of token ids")
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repack", choices=["on", "off"], default="on")
    ap.add_argument("--mmap", choices=["on", "off"], default="on")
    ap.add_argument("--kv-type", choices=sorted(KV_TYPES), default="f16",
                    help="KV cache element type of keys and values (llama.cpp's default: f16)")
    ap.add_argument("--progress", help="file rewritten after the prefill and every token")
    ap.add_argument("--check-tokens", help="JSON list of another engine's greedy tokens")
    a = ap.parse_args()
    prompt = json.loads(a.prompt_ids)
    set_repack(a.repack == "on")
    if a.check_tokens:
        return check_tokens(a, prompt, json.loads(a.check_tokens))
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=a.gguf, n_ctx=len(prompt) + a.n + 8, n_batch=512,
                          n_ubatch=512, n_threads=a.threads, n_threads_batch=a.threads,
                          flash_attn=False, seed=0, verbose=False, use_mmap=a.mmap == "on",
                          type_k=KV_TYPES[a.kv_type], type_v=KV_TYPES[a.kv_type])
    run = {"engine": "llama.cpp", "llama_cpp_python": llama_cpp.__version__,
           "repack": a.repack, "mmap": a.mmap, "threads": a.threads, "kv_type": a.kv_type,
           "load_seconds": time.perf_counter() - t0, "prompt_tokens": len(prompt)}
    last = lambda: int(np.argmax(np.ctypeslib.as_array(
        llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))))
    t0 = time.perf_counter()
    llm.eval(prompt)
    run["prefill_tokens_per_s"] = len(prompt) / (time.perf_counter() - t0)
    tokens = [last()]
    read0 = read_bytes()
    t0 = time.perf_counter()

    def update(partial: bool) -> dict:
        run.update(partial=partial, tokens=tokens, decode_read_bytes=read_bytes() - read0,
                   decode_tokens_per_s=(len(tokens) - 1) / (time.perf_counter() - t0)
                   if len(tokens) > 1 else 0.0)
        if a.progress:  # what a run stopped by a timeout had measured so far
            with open(a.progress + ".tmp", "w") as f:
                json.dump(run, f)
            os.replace(a.progress + ".tmp", a.progress)
        return run
    update(True)
    for _ in range(a.n - 1):
        llm.eval([tokens[-1]])
        tokens.append(last())
        update(True)
    print(json.dumps(update(False)))


if __name__ == "__main__":
    sys.exit(main())
