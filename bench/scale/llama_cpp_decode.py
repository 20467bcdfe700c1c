#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) on one GGUF, as bench/scale/run.sh's peer: prefill of the prompt,
then greedy decode of N tokens, timed by wall clock like moe-run's --json; prints one JSON line.

    llama_cpp_decode.py GGUF --prompt-ids IDS_JSON -n N [--threads T] [--repack on|off] [--mmap on|off]

The prompt is given as token ids (moe-run's tokenisation, with BOS), so both engines see the same
sequence. --repack off keeps llama.cpp's weights in the mapped file (no CPU "extra buffer types",
which repack Q4_0 into anonymous memory); on is llama.cpp's default. The tokens generated are
printed so run.sh can check both engines agree.
"""
import argparse
import json
import sys
import time

import numpy as np
import llama_cpp


def set_repack(repack: bool) -> None:
    """llama-cpp-python's Llama() has no argument for llama_model_params.use_extra_bufts (the CPU
    repack of Q4_0 into anonymous memory), but fills its params from llama_model_default_params:
    wrap that so the field is set before the model loads."""
    if "use_extra_bufts" not in {f[0] for f in llama_cpp.llama_model_params._fields_}:
        if not repack:
            raise SystemExit("this llama-cpp-python has no use_extra_bufts: --repack off unavailable")
        return
    default = llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = repack
        return p
    llama_cpp.llama_model_default_params = params


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--prompt-ids", required=True, help="JSON list of token ids")
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repack", choices=["on", "off"], default="on")
    ap.add_argument("--mmap", choices=["on", "off"], default="on")
    a = ap.parse_args()
    prompt = json.loads(a.prompt_ids)
    set_repack(a.repack == "on")
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=a.gguf, n_ctx=len(prompt) + a.n + 8, n_batch=512,
                          n_ubatch=512, n_threads=a.threads, n_threads_batch=a.threads,
                          flash_attn=False, seed=0, verbose=False, use_mmap=a.mmap == "on")
    load_s = time.perf_counter() - t0
    last = lambda: int(np.argmax(np.ctypeslib.as_array(
        llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))))
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill_s = time.perf_counter() - t0
    tokens = [last()]
    t0 = time.perf_counter()
    for _ in range(a.n - 1):
        llm.eval([tokens[-1]])
        tokens.append(last())
    decode_s = time.perf_counter() - t0
    print(json.dumps({
        "engine": "llama.cpp", "llama_cpp_python": llama_cpp.__version__,
        "repack": a.repack, "mmap": a.mmap, "threads": a.threads,
        "load_seconds": load_s, "prompt_tokens": len(prompt),
        "prefill_tokens_per_s": len(prompt) / prefill_s,
        "decode_tokens_per_s": (a.n - 1) / decode_s if a.n > 1 else 0.0,
        "tokens": tokens}))


if __name__ == "__main__":
    sys.exit(main())
