#!/usr/bin/env python3
"""llama.cpp's log-probabilities on the positions a moe-run --perplexity run scored, written as a
.mklogp file (include/moekit/engine/perplexity.hpp) so that `moe-run --kl-reference` measures
KL(llama.cpp ‖ moe-run) on the same weights: how far apart the two engines' next-token
distributions are, position by position, where greedy tokens only say whether two near-tied
logits swapped.

    llama_cpp_logprobs.py GGUF --targets MOE.mklogp --out LLAMA.mklogp [--threads T] [--repack on|off]

The scored tokens are read from MOE.mklogp (its per-position targets); moe-run's protocol is one
chunk after a BOS, so the input is BOS, t0 … t(n−2) and position i predicts t(i). Only
single-chunk files are supported (run moe-run with --chunks 1). K is MOE.mklogp's.
"""
import argparse
import struct
import sys

import numpy as np

import llama_cpp_decode  # set_repack: bench/scale/llama_cpp_decode.py

MAGIC = b"MKLOGP\0\0"


def read_targets(path: str):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        raise SystemExit(f"{path}: not a .mklogp file (bad magic)")
    version, vocab, k, ctx, n = struct.unpack_from("<IIIIQ", data, 8)
    if version not in (1, 2):
        raise SystemExit(f"{path}: version {version} is not supported (expected 1 or 2)")
    record = 8 + 8 * k
    if len(data) != 32 + n * record:
        raise SystemExit(f"{path}: {len(data)} bytes, expected {32 + n * record} for {n} positions")
    targets = [struct.unpack_from("<I", data, 32 + i * record)[0] for i in range(n)]
    return vocab, k, ctx, targets


def write_logprobs(path: str, vocab: int, k: int, ctx: int, targets, logprobs: np.ndarray) -> None:
    # version 2: ctx (moe-run's --ctx-size of the targets' run, 0 = unknown) at offset 20
    out = bytearray(MAGIC + struct.pack("<IIIIQ", 2, vocab, k, ctx, len(targets)))
    for i, t in enumerate(targets):
        lp = logprobs[i].astype(np.float32)
        order = np.lexsort((np.arange(vocab), -lp))[:k]  # descending, ties -> lower id
        out += struct.pack("<If", t, float(lp[t]))
        out += order.astype("<u4").tobytes() + lp[order].astype("<f4").tobytes()
    with open(path + ".partial", "wb") as f:
        f.write(out)
    import os
    os.replace(path + ".partial", path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--targets", required=True, help="moe-run's --save-logits file (one chunk)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repack", choices=["on", "off"], default="off")
    a = ap.parse_args()
    vocab, k, ctx, targets = read_targets(a.targets)
    llama_cpp_decode.set_repack(a.repack == "on")
    import llama_cpp
    n = len(targets)
    llm = llama_cpp.Llama(model_path=a.gguf, n_ctx=n + 8, n_batch=n, n_ubatch=min(n, 512),
                          n_threads=a.threads, n_threads_batch=a.threads, flash_attn=False,
                          seed=0, verbose=False, logits_all=True)
    if llm.n_vocab() != vocab:
        raise SystemExit(f"{a.targets} has vocab {vocab}, {a.gguf} has {llm.n_vocab()}")
    llm.eval([llm.token_bos()] + targets[:-1])
    logits = np.array(llm.scores[:n], dtype=np.float64)
    m = logits.max(axis=1, keepdims=True)
    logprobs = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    write_logprobs(a.out, vocab, k, ctx, targets, logprobs)
    print(f"wrote {a.out}: {n} positions, K = {k}")


if __name__ == "__main__":
    sys.exit(main())
