#!/usr/bin/env python3
"""Random-weight MoE checkpoints at REAL layer shapes, for larger-than-memory / offloading work.

    scripts/make_real_shape_model.sh --arch mixtral --format gguf-q4_0            # ~26 GB
    scripts/make_real_shape_model.sh --arch qwen2moe --layers 4 --format safetensors-bf16
    scripts/make_real_shape_model.sh --arch olmoe --format gguf-q8_0 --out /data/olmoe.gguf

(the .sh wrapper creates the venv build/real-shape-venv with gguf==0.19.0, numpy==2.4.6,
sentencepiece==0.2.3 and runs this file in it). Outputs are generated on demand and never
committed; the default output is build/real-shape-models/<arch>-<layers>L-<type>.gguf (or a
directory <arch>-<layers>L-bf16/ for safetensors).

Architectures (the published configs' numbers; --layers N keeps the first N layers):

  mixtral   Mixtral-8x7B-v0.1: hidden 4096, expert ffn 14336, 8 experts top-2, 32 heads, 8 kv
            heads (head_dim 128), vocab 32000, 32 layers, rope_theta 1e6, rms eps 1e-5,
            context 32768. GGUF architecture "llama" (llama.cpp's name for Mixtral).
  qwen2moe  Qwen1.5-MoE-A2.7B: hidden 2048, routed expert ffn 1408, 60 experts top-4 (not
            renormalised), a shared expert of ffn 5632 with a sigmoid shared_expert_gate, q/k/v
            biases, 16 heads, 16 kv heads, 24 layers, rope_theta 1e6, rms eps 1e-6, context 8192.
  olmoe     OLMoE-1B-7B-0924: hidden 2048, expert ffn 1024, 64 experts top-8 (not renormalised),
            q_norm / k_norm, 16 heads, 16 kv heads, 16 layers, rope_theta 1e4, rms eps 1e-5,
            context 4096.

Vocabulary: every architecture gets Mixtral's SentencePiece tokenizer
(models/moekit-tiny-moe/tokenizer.model, 32000 pieces) and vocab_size 32000. Qwen1.5-MoE's
(151936) and OLMoE's (50304) byte-level BPE vocabularies are not available offline, and padding
the SentencePiece vocabulary to their sizes would not make a valid "gpt2" tokenizer; so those two
have a smaller embedding / output matrix than the real models (Qwen: 62 M instead of 311 M
parameters each; OLMoE: 66 M instead of 103 M) and everything else at the real shapes — the
shapes that matter for offloading are the expert shapes. GGUF: tokenizer.ggml.model "llama"
for all three (llama.cpp's SPM vocabulary loads with any architecture).

Formats:

  gguf-q4_0 | gguf-q8_0 | gguf-f16   one GGUF file in llama.cpp's conventions (the converter's,
      as bench/engine/llama_cpp_gguf.py): every 2-D weight matrix, token_embd and output included,
      at the chosen type; the routed experts stacked as blk.L.ffn_{gate,up,down}_exps
      [experts, rows, cols]; the router ffn_gate_inp, the norms, biases and Qwen's 1-D
      ffn_gate_inp_shexp in f32, as llama.cpp's convert_hf_to_gguf.py keeps them. Metadata:
      general.{architecture,name,description,file_type,quantization_version}, <arch>.{
      context_length, embedding_length, block_count, feed_forward_length, attention.head_count,
      attention.head_count_kv, attention.layer_norm_rms_epsilon, rope.freq_base, expert_count,
      expert_used_count, vocab_size} (+ rope.dimension_count for llama,
      expert_feed_forward_length and expert_shared_feed_forward_length for qwen2moe) and the
      tokenizer (tokenizer.ggml.{model,tokens,scores,token_type,bos/eos/unk ids,add_bos/eos}).
      Q/K rows are not permuted: they are random, so the llama layout and HF's are the same
      distribution.
  safetensors-bf16   a Hugging Face directory: config.json (the fields moe-run's config.hpp and
      transformers read), model.safetensors or, above --shard-gb (default 4 GB),
      model-0000i-of-0000n.safetensors + model.safetensors.index.json, one tensor per expert
      under the Hub names, tokenizer.model (+ its licence) copied.

Weights: std 0.02 (the models' initializer_range), so a 32-layer forward pass stays finite
(measured: see --check). Q4_0: random nibbles (uniform 0..15) with f16 block scales of
magnitude 0.02/sqrt(21.5) (RMS of q-8 over uniform q) and a random sign per block, so the
dequantized weights have mean 0 and std 0.02; Q8_0: random bytes, scale 0.02/sqrt(5461.5), random
sign. f16 / bf16: a 65536-entry table of a N(0, 0.02) sample indexed by random 16-bit numbers.
RMS norm weights (and OLMoE's q/k norms) are 1, biases 0, the router and the shared-expert gate
N(0, 0.02) in f32 (bf16 in safetensors).

Writing is streamed: one chunk (<= 64 MB) of one tensor at a time, generated on the main thread
and written by a second thread (POSIX_FADV_DONTNEED every 256 MB starts the writeback and drops
the pages already written, so the page cache does not fill with the file; one fsync at the end),
progress on stderr. The header goes through gguf-py's GGUFWriter
(add_tensor_info for every tensor, then write_header/kv/ti_data_to_file) and the data section is
written here with the writer's alignment and offsets (checked at the end). The output is written
to OUT.partial and renamed at the end; an existing OUT is refused without --force; the free
space must cover the output plus 2 GB.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_DIR = ROOT / "models" / "moekit-tiny-moe"
STD = 0.02
MARGIN = 2 << 30
CHUNK = 64 << 20  # bytes per generated piece
SYNC_EVERY = 256 << 20
VOCAB = 32000

ARCHS = {
    "mixtral": dict(
        gguf_arch="llama", model_type="mixtral", hf_arch="MixtralForCausalLM", hidden=4096,
        ffn=14336, n_expert=8, top_k=2, heads=32, kv_heads=8, layers=32, real_vocab=32000,
        ctx=32768, eps=1e-5, theta=1e6),
    "qwen2moe": dict(
        gguf_arch="qwen2moe", model_type="qwen2_moe", hf_arch="Qwen2MoeForCausalLM", hidden=2048,
        ffn=1408, shared_ffn=5632, n_expert=60, top_k=4, heads=16, kv_heads=16, layers=24,
        real_vocab=151936, ctx=8192, eps=1e-6, theta=1e6),
    "olmoe": dict(
        gguf_arch="olmoe", model_type="olmoe", hf_arch="OlmoeForCausalLM", hidden=2048, ffn=1024,
        n_expert=64, top_k=8, heads=16, kv_heads=16, layers=16, real_vocab=50304, ctx=4096,
        eps=1e-5, theta=1e4),
}

FORMATS = ("gguf-q4_0", "gguf-q8_0", "gguf-f16", "safetensors-bf16")
Q = gguf.GGMLQuantizationType
GGUF_TYPE = {"gguf-q4_0": Q.Q4_0, "gguf-q8_0": Q.Q8_0, "gguf-f16": Q.F16}
FILE_TYPE = {"gguf-q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "gguf-q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
             "gguf-f16": gguf.LlamaFileType.MOSTLY_F16}
# Block geometry (elements, bytes) of the types written here.
BLOCK = {Q.Q4_0: (32, 18), Q.Q8_0: (32, 34), Q.F16: (1, 2), Q.F32: (1, 4), Q.BF16: (1, 2)}
# RMS of the integer part of a dequantized weight: Q4_0 (q - 8), q uniform on 0..15; Q8_0 q
# uniform on -128..127 (mean^2 + variance).
Q4_RMS = (0.25 + (16 * 16 - 1) / 12) ** 0.5
Q8_RMS = (0.25 + (256 * 256 - 1) / 12) ** 0.5


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]  # row-major, outermost first
    kind: str  # "matrix" (random, the chosen type), "norm" (ones), "bias" (zeros), "gate" (random, f32)
    dtype: int = 0  # ggml type (GGUF) or Q.BF16 (safetensors)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        be, bb = BLOCK[self.dtype]
        assert self.numel % be == 0, (self.name, self.shape)
        return self.numel // be * bb


# ---------------------------------------------------------------------------------------------
# Tensor plans


def gguf_plan(a: dict, layers: int, fmt: str) -> list[Tensor]:
    t = GGUF_TYPE[fmt]
    H, F, E, V = a["hidden"], a["ffn"], a["n_expert"], VOCAB
    hd = H // a["heads"]
    qd, kvd = a["heads"] * hd, a["kv_heads"] * hd
    out = [Tensor("token_embd.weight", (V, H), "matrix", t)]
    for i in range(layers):
        b = f"blk.{i}."
        out += [Tensor(b + "attn_norm.weight", (H,), "norm", Q.F32),
                Tensor(b + "attn_q.weight", (qd, H), "matrix", t),
                Tensor(b + "attn_k.weight", (kvd, H), "matrix", t),
                Tensor(b + "attn_v.weight", (kvd, H), "matrix", t)]
        if a["gguf_arch"] == "qwen2moe":
            out += [Tensor(b + "attn_q.bias", (qd,), "bias", Q.F32),
                    Tensor(b + "attn_k.bias", (kvd,), "bias", Q.F32),
                    Tensor(b + "attn_v.bias", (kvd,), "bias", Q.F32)]
        if a["gguf_arch"] == "olmoe":
            out += [Tensor(b + "attn_q_norm.weight", (qd,), "norm", Q.F32),
                    Tensor(b + "attn_k_norm.weight", (kvd,), "norm", Q.F32)]
        out += [Tensor(b + "attn_output.weight", (H, qd), "matrix", t),
                Tensor(b + "ffn_norm.weight", (H,), "norm", Q.F32),
                Tensor(b + "ffn_gate_inp.weight", (E, H), "gate", Q.F32),
                Tensor(b + "ffn_gate_exps.weight", (E, F, H), "matrix", t),
                Tensor(b + "ffn_up_exps.weight", (E, F, H), "matrix", t),
                Tensor(b + "ffn_down_exps.weight", (E, H, F), "matrix", t)]
        if "shared_ffn" in a:
            S = a["shared_ffn"]
            out += [Tensor(b + "ffn_gate_inp_shexp.weight", (H,), "gate", Q.F32),
                    Tensor(b + "ffn_gate_shexp.weight", (S, H), "matrix", t),
                    Tensor(b + "ffn_up_shexp.weight", (S, H), "matrix", t),
                    Tensor(b + "ffn_down_shexp.weight", (H, S), "matrix", t)]
    out += [Tensor("output_norm.weight", (H,), "norm", Q.F32),
            Tensor("output.weight", (V, H), "matrix", t)]
    return out


def hf_plan(a: dict, layers: int) -> list[Tensor]:
    H, F, E, V = a["hidden"], a["ffn"], a["n_expert"], VOCAB
    hd = H // a["heads"]
    qd, kvd = a["heads"] * hd, a["kv_heads"] * hd
    mixtral = a["model_type"] == "mixtral"
    out = [Tensor("model.embed_tokens.weight", (V, H), "matrix")]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [Tensor(p + "input_layernorm.weight", (H,), "norm")]
        for n, rows in (("q", qd), ("k", kvd), ("v", kvd)):
            out.append(Tensor(p + f"self_attn.{n}_proj.weight", (rows, H), "matrix"))
            if a["model_type"] == "qwen2_moe":
                out.append(Tensor(p + f"self_attn.{n}_proj.bias", (rows,), "bias"))
        out.append(Tensor(p + "self_attn.o_proj.weight", (H, qd), "matrix"))
        if a["model_type"] == "olmoe":
            out += [Tensor(p + "self_attn.q_norm.weight", (qd,), "norm"),
                    Tensor(p + "self_attn.k_norm.weight", (kvd,), "norm")]
        out.append(Tensor(p + "post_attention_layernorm.weight", (H,), "norm"))
        moe = p + ("block_sparse_moe." if mixtral else "mlp.")
        out.append(Tensor(moe + "gate.weight", (E, H), "gate"))
        for e in range(E):
            x = f"{moe}experts.{e}."
            if mixtral:
                out += [Tensor(x + "w1.weight", (F, H), "matrix"), Tensor(x + "w2.weight", (H, F), "matrix"),
                        Tensor(x + "w3.weight", (F, H), "matrix")]
            else:
                out += [Tensor(x + "gate_proj.weight", (F, H), "matrix"),
                        Tensor(x + "up_proj.weight", (F, H), "matrix"),
                        Tensor(x + "down_proj.weight", (H, F), "matrix")]
        if "shared_ffn" in a:
            S = a["shared_ffn"]
            out += [Tensor(moe + "shared_expert.gate_proj.weight", (S, H), "matrix"),
                    Tensor(moe + "shared_expert.up_proj.weight", (S, H), "matrix"),
                    Tensor(moe + "shared_expert.down_proj.weight", (H, S), "matrix"),
                    Tensor(moe + "shared_expert_gate.weight", (1, H), "gate")]
    out += [Tensor("model.norm.weight", (H,), "norm"), Tensor("lm_head.weight", (V, H), "matrix")]
    for t in out:
        t.dtype = Q.BF16
    return out


def hf_config(a: dict, layers: int) -> dict:
    H = a["hidden"]
    c = {
        "architectures": [a["hf_arch"]],
        "model_type": a["model_type"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,  # Mixtral's tokenizer (see the docstring)
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": H,
        "head_dim": H // a["heads"],
        "initializer_range": STD,
        "max_position_embeddings": a["ctx"],
        "num_attention_heads": a["heads"],
        "num_hidden_layers": layers,
        "num_key_value_heads": a["kv_heads"],
        "num_experts_per_tok": a["top_k"],
        "rms_norm_eps": a["eps"],
        "rope_theta": a["theta"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": VOCAB,
        "output_router_logits": False,
    }
    if a["model_type"] == "mixtral":
        c.update(intermediate_size=a["ffn"], num_local_experts=a["n_expert"], sliding_window=None,
                 router_aux_loss_coef=0.02)
    elif a["model_type"] == "qwen2_moe":
        c.update(intermediate_size=a["shared_ffn"], moe_intermediate_size=a["ffn"],
                 shared_expert_intermediate_size=a["shared_ffn"], num_experts=a["n_expert"],
                 norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=True,
                 use_sliding_window=False, sliding_window=None, max_window_layers=min(21, layers),
                 router_aux_loss_coef=0.001)
    else:
        c.update(intermediate_size=a["ffn"], num_experts=a["n_expert"], norm_topk_prob=False,
                 attention_bias=False, clip_qkv=None, router_aux_loss_coef=0.01)
    c["moekit_note"] = ("random weights at real layer shapes (scripts/make_real_shape_model.py); "
                        f"vocabulary: Mixtral's 32000 SentencePiece pieces (real model: {a['real_vocab']})")
    return dict(sorted(c.items()))


# ---------------------------------------------------------------------------------------------
# Random data


class Gen:
    """Chunks of random tensor data (uint8 arrays), std STD after dequantization."""

    def __init__(self, seed: int):
        self.bits = np.random.PCG64(seed)
        self.rng = np.random.Generator(self.bits)
        table = self.rng.standard_normal(65536)
        table = (table - table.mean()) / table.std() * STD
        self.f16_table = table.astype(np.float16)
        self.bf16_table = ((table.astype(np.float32).view(np.uint32) + 0x8000) >> 16).astype(np.uint16)
        self.q4_d = np.float16(STD / Q4_RMS).view(np.uint16)
        self.q8_d = np.float16(STD / Q8_RMS).view(np.uint16)

    def raw(self, n: int) -> np.ndarray:
        return self.bits.random_raw((n + 7) // 8).view(np.uint8)[:n]

    def quant_blocks(self, n_blocks: int, block_bytes: int, d: int) -> np.ndarray:
        blk = self.raw(n_blocks * block_bytes).reshape(n_blocks, block_bytes)
        blk[:, 0] = d & 0xFF  # f16 scale, little-endian, with the random sign bit kept
        blk[:, 1] = (blk[:, 1] & 0x80) | (d >> 8)
        return blk.reshape(-1)

    def chunks(self, t: Tensor):
        """Yields the tensor's bytes as uint8 arrays of at most ~CHUNK bytes."""
        if t.kind != "matrix":
            if t.kind == "norm":
                v = np.ones(t.numel, np.float32)
            elif t.kind == "bias":
                v = np.zeros(t.numel, np.float32)
            else:
                v = self.rng.standard_normal(t.numel, dtype=np.float32) * np.float32(STD)
            if t.dtype == Q.F32:
                yield v.view(np.uint8)
            else:  # bf16, rounded
                yield ((v.view(np.uint32) + 0x8000) >> 16).astype(np.uint16).view(np.uint8)
            return
        be, bb = BLOCK[t.dtype]
        per = max(1, CHUNK // bb)  # blocks per chunk
        left = t.numel // be
        while left:
            n = min(per, left)
            left -= n
            if t.dtype == Q.Q4_0:
                yield self.quant_blocks(n, 18, int(self.q4_d))
            elif t.dtype == Q.Q8_0:
                yield self.quant_blocks(n, 34, int(self.q8_d))
            elif t.dtype == Q.F16:
                yield self.f16_table[self.raw(2 * n).view(np.uint16)].view(np.uint8)
            elif t.dtype == Q.BF16:
                yield self.bf16_table[self.raw(2 * n).view(np.uint16)].view(np.uint8)
            else:
                raise AssertionError(t)


# ---------------------------------------------------------------------------------------------
# Streaming writer


def fmt_bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


class Writer:
    """Writes byte chunks to file objects on a second thread, with progress on stderr."""

    def __init__(self, total: int):
        self.total, self.done = total, 0
        self.q: queue.Queue = queue.Queue(maxsize=3)
        self.error: BaseException | None = None
        self.t0 = time.monotonic()
        self.last = 0.0
        self.tty = sys.stderr.isatty()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def put(self, f, data) -> None:
        while True:
            if self.error:
                raise RuntimeError(f"writing failed: {self.error}") from self.error
            try:
                self.q.put((f, data), timeout=0.5)
                return
            except queue.Full:
                continue

    def sync(self, f) -> None:
        """Waits until everything queued for `f` is written, then fsyncs it."""
        self.put(f, "sync")
        self.q.join()
        if self.error:
            raise RuntimeError(f"writing failed: {self.error}") from self.error

    def finish(self) -> float:
        self.put(None, None)
        self.thread.join()
        if self.error:
            raise RuntimeError(f"writing failed: {self.error}") from self.error
        dt = time.monotonic() - self.t0
        if self.tty:
            sys.stderr.write("\n")
        return dt

    def _run(self) -> None:
        unsynced: dict[int, int] = {}
        while True:
            f, data = self.q.get()
            try:
                if f is None:
                    return
                fd = f.fileno()
                if isinstance(data, str):  # "sync"
                    f.flush()
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    unsynced[fd] = 0
                    continue
                f.write(memoryview(data))
                self.done += data.nbytes
                unsynced[fd] = unsynced.get(fd, 0) + data.nbytes
                if unsynced[fd] >= SYNC_EVERY:
                    # Keep the page cache from filling with the file (a 26 GB output on a 24 GiB
                    # machine): DONTNEED starts the writeback of the dirty pages written so far
                    # without waiting for it and drops the pages already written back (those
                    # of the previous rounds). The final fsync waits for the rest.
                    f.flush()
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    unsynced[fd] = 0
                self._progress()
            except BaseException as e:  # noqa: BLE001 - reported to the main thread
                self.error = e
                return
            finally:
                self.q.task_done()

    def _progress(self) -> None:
        now = time.monotonic()
        if now - self.last < (1.0 if self.tty else 10.0) and self.done < self.total:
            return
        self.last = now
        dt = max(now - self.t0, 1e-9)
        rate = self.done / dt
        eta = (self.total - self.done) / rate if rate > 0 else 0
        msg = (f"  {fmt_bytes(self.done)} / {fmt_bytes(self.total)} "
               f"({100 * self.done / self.total:.0f}%), {rate / 1e6:.0f} MB/s, ETA {eta:.0f} s")
        sys.stderr.write(("\r" + msg + "   ") if self.tty else (msg + "\n"))
        sys.stderr.flush()


def pad_to(n: int, align: int) -> int:
    return (n + align - 1) // align * align


# ---------------------------------------------------------------------------------------------
# GGUF


def add_tokenizer(w: gguf.GGUFWriter) -> None:
    import sentencepiece as spm

    model = TOKENIZER_DIR / "tokenizer.model"
    if not model.exists():
        raise SystemExit(f"{model} is missing (Mixtral's tokenizer, committed with the default model)")
    sp = spm.SentencePieceProcessor(model_file=str(model))
    if sp.get_piece_size() != VOCAB:
        raise SystemExit(f"{model}: {sp.get_piece_size()} pieces, expected {VOCAB}")
    tokens, scores, types = [], [], []
    for t in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(t).encode("utf-8"))
        scores.append(sp.get_score(t))
        types.append(gguf.TokenType.UNKNOWN if sp.is_unknown(t) else gguf.TokenType.CONTROL
                     if sp.is_control(t) else gguf.TokenType.BYTE if sp.is_byte(t) else
                     gguf.TokenType.UNUSED if sp.is_unused(t) else gguf.TokenType.NORMAL)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def gguf_metadata(w: gguf.GGUFWriter, arch_name: str, a: dict, layers: int, fmt: str) -> None:
    H = a["hidden"]
    w.add_name(f"moekit-real-shape-{arch_name}-{layers}L")
    w.add_description(f"random weights (std {STD}) at {arch_name}'s real layer shapes, made by "
                      f"scripts/make_real_shape_model.py; not a trained model; vocabulary: "
                      f"Mixtral's {VOCAB} SentencePiece pieces (real model: {a['real_vocab']})")
    w.add_file_type(FILE_TYPE[fmt])
    if fmt != "gguf-f16":
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(a["ctx"])
    w.add_embedding_length(H)
    w.add_block_count(layers)
    if a["gguf_arch"] == "qwen2moe":
        # convert_hf_to_gguf.py: feed_forward_length = intermediate_size (the shared expert's
        # size in Qwen1.5-MoE's config), plus the routed and shared expert sizes.
        w.add_feed_forward_length(a["shared_ffn"])
        w.add_expert_feed_forward_length(a["ffn"])
        w.add_expert_shared_feed_forward_length(a["shared_ffn"])
    else:
        w.add_feed_forward_length(a["ffn"])
    w.add_head_count(a["heads"])
    w.add_head_count_kv(a["kv_heads"])
    if a["gguf_arch"] == "llama":
        w.add_rope_dimension_count(H // a["heads"])
    w.add_rope_freq_base(float(a["theta"]))
    w.add_layer_norm_rms_eps(a["eps"])
    w.add_expert_count(a["n_expert"])
    w.add_expert_used_count(a["top_k"])
    w.add_vocab_size(VOCAB)
    add_tokenizer(w)


def write_gguf(path: Path, arch_name: str, a: dict, layers: int, fmt: str, plan: list[Tensor],
               gen: Gen) -> float:
    w = gguf.GGUFWriter(None, a["gguf_arch"])
    gguf_metadata(w, arch_name, a, layers, fmt)
    for t in plan:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.dtype)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()  # offsets: cumulative pad(nbytes, alignment), in plan order
    assert w.fout is not None and len(w.fout) == 1
    f = w.fout[0]
    align = w.data_alignment
    f.write(b"\0" * (pad_to(f.tell(), align) - f.tell()))
    data_start = f.tell()
    expect = data_start + sum(pad_to(t.nbytes, align) for t in plan)
    writer = Writer(sum(t.nbytes for t in plan))
    try:
        for t in plan:
            for c in gen.chunks(t):
                writer.put(f, c)
            if pad := pad_to(t.nbytes, align) - t.nbytes:
                writer.put(f, np.zeros(pad, np.uint8))
        writer.sync(f)
    finally:
        dt = writer.finish()
    if f.tell() != expect:
        raise SystemExit(f"{path}: wrote {f.tell()} bytes, the tensor infos describe {expect}")
    w.close()
    return dt


# ---------------------------------------------------------------------------------------------
# safetensors


def shard_plan(plan: list[Tensor], shard_bytes: int) -> list[list[Tensor]]:
    shards: list[list[Tensor]] = [[]]
    size = 0
    for t in plan:
        if shards[-1] and size + t.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def safetensors_header(tensors: list[Tensor]) -> bytes:
    h: dict = {"__metadata__": {"format": "pt"}}
    off = 0
    for t in tensors:
        h[t.name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    raw = json.dumps(h, separators=(",", ":")).encode()
    raw += b" " * (pad_to(len(raw), 8) - len(raw))
    return struct.pack("<Q", len(raw)) + raw


def shard_names(n: int) -> list[str]:
    return ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def write_safetensors(d: Path, a: dict, layers: int, shards: list[list[Tensor]], gen: Gen) -> float:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(hf_config(a, layers), indent=2) + "\n")
    shutil.copyfile(TOKENIZER_DIR / "tokenizer.model", d / "tokenizer.model")
    lic = TOKENIZER_DIR / "LICENCE-mistral-common"
    if lic.exists():
        shutil.copyfile(lic, d / lic.name)
    names = shard_names(len(shards))
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.nbytes for s in shards for t in s)},
                 "weight_map": {t.name: n for n, s in zip(names, shards) for t in s}}
        (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    writer = Writer(sum(t.nbytes for s in shards for t in s))
    try:
        for name, tensors in zip(names, shards):
            with open(d / name, "wb") as f:
                f.write(safetensors_header(tensors))
                for t in tensors:
                    for c in gen.chunks(t):
                        writer.put(f, c)
                writer.sync(f)
    finally:
        dt = writer.finish()
    return dt


# ---------------------------------------------------------------------------------------------
# Read-back check


def check_gguf(path: Path, plan: list[Tensor], layers: int, a: dict) -> None:
    r = gguf.GGUFReader(str(path))
    got = {t.name: t for t in r.tensors}
    if [t.name for t in r.tensors] != [t.name for t in plan]:
        raise SystemExit(f"{path}: tensor list differs from the plan")
    for t in plan:
        x = got[t.name]
        if tuple(int(v) for v in reversed(x.shape)) != t.shape or x.tensor_type != t.dtype:
            raise SystemExit(f"{path}: {t.name} is {list(reversed(x.shape))} {x.tensor_type.name}, "
                             f"expected {list(t.shape)} {Q(t.dtype).name}")
    kv = {f.name: f for f in r.fields.values()}
    arch = a["gguf_arch"]
    for key in ("block_count", "embedding_length", "expert_count", "expert_used_count", "vocab_size"):
        f = kv[f"{arch}.{key}"]
        print(f"  {arch}.{key} = {int(f.parts[f.data[0]][0])}")
    if int(kv[f"{arch}.block_count"].parts[kv[f"{arch}.block_count"].data[0]][0]) != layers:
        raise SystemExit(f"{path}: block_count differs")
    # Dequantized statistics of a sample of every kind of matrix.
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_gate_exps.weight",
                 f"blk.{layers - 1}.ffn_down_exps.weight", "blk.0.ffn_gate_inp.weight",
                 "blk.0.attn_norm.weight", "output.weight"):
        x = got[name]
        data = np.asarray(x.data)
        rows = data.reshape(-1, data.shape[-1])[:2048]
        v = gguf.quants.dequantize(rows, x.tensor_type).astype(np.float64) \
            if x.tensor_type not in (Q.F32, Q.F16) else rows.astype(np.float64)
        print(f"  {name}: {Q(x.tensor_type).name} {list(reversed([int(s) for s in x.shape]))}, "
              f"sample of {v.size} values: mean {v.mean():+.2e} std {v.std():.5f} "
              f"min {v.min():+.4f} max {v.max():+.4f}, finite {bool(np.isfinite(v).all())}")
        if "norm" in name:
            ok = bool((v == 1).all())
        else:  # mean 0, std STD (3% tolerance: the router is a small f32 sample)
            ok = bool(np.isfinite(v).all()) and abs(v.std() - STD) < 0.03 * STD and abs(v.mean()) < 0.03 * STD
        if not ok:
            raise SystemExit(f"{path}: {name} does not have the intended distribution")


def check_safetensors(d: Path, shards: list[list[Tensor]]) -> None:
    names = shard_names(len(shards))
    for name, tensors in zip(names, shards):
        p = d / name
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            h = json.loads(f.read(n))
            base = 8 + n
            for t in tensors:
                e = h[t.name]
                if e["shape"] != list(t.shape) or e["dtype"] != "BF16":
                    raise SystemExit(f"{p}: {t.name} header differs")
            end = max(e["data_offsets"][1] for k, e in h.items() if k != "__metadata__")
            if p.stat().st_size != base + end:
                raise SystemExit(f"{p}: size {p.stat().st_size}, header says {base + end}")
            for t in tensors[:1] + [t for t in tensors if t.kind == "matrix"][-1:]:
                lo, hi = h[t.name]["data_offsets"]
                f.seek(base + lo)
                raw = np.frombuffer(f.read(min(hi - lo, 8 << 20)), np.uint16)
                v = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
                print(f"  {name}: {t.name} {list(t.shape)} sample of {v.size}: mean {v.mean():+.2e} "
                      f"std {v.std():.5f}, finite {bool(np.isfinite(v).all())}")
                if t.kind == "matrix":
                    ok = bool(np.isfinite(v).all()) and abs(v.std() - STD) < 0.03 * STD and abs(v.mean()) < 0.03 * STD
                else:
                    ok = bool((v == (1 if t.kind == "norm" else 0)).all()) if t.kind != "gate" else bool(np.isfinite(v).all())
                if not ok:
                    raise SystemExit(f"{p}: {t.name} does not have the intended distribution")
    print(f"  config.json, {len(shards)} shard(s)"
          + (", model.safetensors.index.json" if len(shards) > 1 else "") + ": ok")


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=sorted(ARCHS), required=True)
    ap.add_argument("--layers", type=int, help="decoder layers (default: the real model's)")
    ap.add_argument("--format", choices=FORMATS, default="gguf-q4_0")
    ap.add_argument("--out", type=Path, help="output file (GGUF) or directory (safetensors); "
                    "default build/real-shape-models/<arch>-<layers>L-<type>[.gguf]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-gb", type=float, default=4.0, help="safetensors shard size (GB, 1e9 bytes)")
    ap.add_argument("--force", action="store_true", help="replace an existing output")
    ap.add_argument("--check", action="store_true",
                    help="read the output back: tensor names / shapes / types and sampled weight statistics")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and size, write nothing")
    args = ap.parse_args()

    a = ARCHS[args.arch]
    layers = args.layers if args.layers is not None else a["layers"]
    if layers < 1:
        ap.error("--layers must be >= 1")
    kind = args.format.split("-", 1)[1]
    gguf_out = args.format.startswith("gguf")
    out = args.out or ROOT / "build" / "real-shape-models" / (
        f"{args.arch}-{layers}L-{kind}" + (".gguf" if gguf_out else ""))
    out = out.absolute()
    partial = out.with_name(out.name + ".partial")

    plan = gguf_plan(a, layers, args.format) if gguf_out else hf_plan(a, layers)
    shards = None if gguf_out else shard_plan(plan, int(args.shard_gb * 1e9))
    data_bytes = sum(t.nbytes for t in plan)
    total = data_bytes + (2 << 20) + len(plan) * 256  # + header, tokenizer, padding
    experts = sum(t.nbytes for t in plan if "exps" in t.name or ".experts." in t.name)
    print(f"{out}: {args.arch} ({a['gguf_arch'] if gguf_out else a['model_type']}), {layers} layers, "
          f"{args.format}, {len(plan)} tensors, {fmt_bytes(total)} ({fmt_bytes(experts)} routed experts"
          + (f", {len(shards)} shard(s)" if shards else "") + ")", file=sys.stderr)
    if args.dry_run:
        return

    if out.exists() and not args.force:
        raise SystemExit(f"{out} exists; pass --force to replace it")
    if partial.exists():
        print(f"removing {partial} (left by an interrupted run)", file=sys.stderr)
        shutil.rmtree(partial) if partial.is_dir() else partial.unlink()
    out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out.parent).free
    if free < total + MARGIN:
        raise SystemExit(f"not enough disk space on {out.parent}: {fmt_bytes(free)} free, the output "
                         f"needs {fmt_bytes(total)} + a {fmt_bytes(MARGIN)} margin (try fewer --layers, "
                         f"a smaller --format or another --out)")

    gen = Gen(args.seed)
    try:
        if gguf_out:
            dt = write_gguf(partial, args.arch, a, layers, args.format, plan, gen)
        else:
            dt = write_safetensors(partial, a, layers, shards, gen)
    except BaseException as e:
        if partial.exists():
            shutil.rmtree(partial) if partial.is_dir() else partial.unlink()
            print(f"\nremoved {partial}", file=sys.stderr)
        if isinstance(e, KeyboardInterrupt):
            raise SystemExit(130)
        raise
    if out.exists():  # --force
        shutil.rmtree(out) if out.is_dir() and not out.is_symlink() else out.unlink()
    os.replace(partial, out)
    print(f"wrote {out}: {fmt_bytes(data_bytes)} of tensor data in {dt:.1f} s "
          f"({data_bytes / dt / 1e6:.0f} MB/s)", file=sys.stderr)
    if args.check:
        print(f"checking {out}:")
        if gguf_out:
            check_gguf(out, plan, layers, a)
        else:
            check_safetensors(out, shards)
        print("  ok")


if __name__ == "__main__":
    main()
