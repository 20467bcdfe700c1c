#!/usr/bin/env python3
"""Writes a Hugging Face Mixtral checkpoint (models/moekit-tiny-moe) as a llama.cpp GGUF file.

    llama_cpp_gguf.py MODEL_DIR OUT.gguf {f32,f16,f16_experts,q8_0}

f16_experts narrows only the experts (ffn_*_exps) and keeps the rest f32: moe-run's own layout at
--precision f16 (its dense part is always f32), so a speed comparison reads the same bytes.

After writing, the file is read back with gguf's reader and run through a small numpy forward pass
in llama.cpp's conventions (adjacent-pair RoPE on the permuted Q/K, stacked experts, tied output)
over MODEL_DIR/reference.json's sequence; its logits must match transformers' top-5 logits there,
so a wrong permutation or layout fails here, before llama.cpp ever sees the file.

Run by bench/engine/llama_cpp_peer.sh in its venv (gguf, numpy, sentencepiece). The layout is the one
llama.cpp's convert_hf_to_gguf.py writes for Mixtral: architecture "llama", experts stacked into
ffn_{gate,up,down}_exps, the router as ffn_gate_inp (kept f32), Q/K rows permuted from HF's
rotate-half RoPE to llama.cpp's adjacent-pair RoPE, no output.weight when the embeddings are tied
(llama.cpp then uses token_embd). The safetensors file is read with numpy only, so this needs no
torch; bf16 weights widen to f32 exactly, and f16 keeps every bf16 value of this model exactly
unless it underflows f16 (counted and printed).
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf
import sentencepiece as spm


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        lo, hi = meta["data_offsets"]
        buf = np.frombuffer(raw, dtype=np.uint8, count=hi - lo, offset=base + lo)
        dt = meta["dtype"]
        if dt == "BF16":
            arr = (buf.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            arr = buf.view(np.float16).astype(np.float32)
        elif dt == "F32":
            arr = buf.view(np.float32).copy()
        else:
            raise SystemExit(f"{path}: tensor {name} has dtype {dt}, expected BF16/F16/F32")
        out[name] = arr.reshape(meta["shape"])
    return out


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF stores each head's rotary pairs as (i, i + d/2); llama.cpp rotates (2i, 2i + 1)."""
    d = w.shape[0] // n_head
    return w.reshape(n_head, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main() -> None:
    if len(sys.argv) != 4 or sys.argv[3] not in ("f32", "f16", "f16_experts", "q8_0"):
        raise SystemExit("usage: llama_cpp_gguf.py MODEL_DIR OUT.gguf {f32,f16,f16_experts,q8_0}")
    model_dir, out_path, kind = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") != "mixtral":
        raise SystemExit(f"{model_dir}/config.json: model_type {cfg.get('model_type')!r}, expected 'mixtral'")
    sd = read_safetensors(model_dir / "model.safetensors")
    n_layer, n_head, n_kv = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    n_embd, n_expert = cfg["hidden_size"], cfg["num_local_experts"]
    head_dim = cfg.get("head_dim") or n_embd // n_head
    if head_dim * n_head != n_embd:
        raise SystemExit("llama.cpp's llama architecture needs head_dim * heads == hidden_size")
    theta = cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)

    tensors: list[tuple[str, np.ndarray, bool]] = []  # (name, f32 array, may be narrowed)
    tensors.append(("token_embd.weight", sd["model.embed_tokens.weight"], True))
    tensors.append(("output_norm.weight", sd["model.norm.weight"], False))
    if not cfg.get("tie_word_embeddings", False):
        tensors.append(("output.weight", sd["lm_head.weight"], True))
    for i in range(n_layer):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        tensors += [
            (b + "attn_norm.weight", sd[p + "input_layernorm.weight"], False),
            (b + "attn_q.weight", permute_rows(sd[p + "self_attn.q_proj.weight"], n_head), True),
            (b + "attn_k.weight", permute_rows(sd[p + "self_attn.k_proj.weight"], n_kv), True),
            (b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"], True),
            (b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"], True),
            (b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"], False),
            (b + "ffn_gate_inp.weight", sd[p + "block_sparse_moe.gate.weight"], False),
        ]
        for ours, hf in (("gate", "w1"), ("down", "w2"), ("up", "w3")):
            stacked = np.stack([sd[f"{p}block_sparse_moe.experts.{e}.{hf}.weight"] for e in range(n_expert)])
            tensors.append((f"{b}ffn_{ours}_exps.weight", stacked, True))

    w = gguf.GGUFWriter(str(out_path), "llama")
    w.add_name(model_dir.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(n_expert)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "f16_experts": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[kind])

    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "tokenizer.model"))
    if sp.get_piece_size() != cfg["vocab_size"]:
        raise SystemExit(f"tokenizer has {sp.get_piece_size()} pieces, config.json says {cfg['vocab_size']}")
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
    w.add_bos_token_id(cfg.get("bos_token_id", sp.bos_id()))
    w.add_eos_token_id(cfg.get("eos_token_id", sp.eos_id()))
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    underflow = 0
    for name, arr, narrow in tensors:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if narrow and (kind == "f16" or kind == "f16_experts" and "_exps." in name):
            h = arr.astype(np.float16)
            underflow += int(np.count_nonzero((h.astype(np.float32) != arr)))
            w.add_tensor(name, h)
        elif narrow and kind == "q8_0":
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{out_path}: {kind}, {len(tensors)} tensors"
          + (f", {underflow} weights not exact in f16" if kind.startswith("f16") else ""))
    if (model_dir / "reference.json").exists():
        # f32 holds the bf16 weights exactly; f16 only rounds weights below its normal range;
        # q8_0 rounds every weight (measured on moekit-tiny-moe: f32, f16 and f16_experts 5.9e-7,
        # q8_0 4.4e-3).
        tol = {"f32": 1e-4, "f16": 1e-4, "f16_experts": 1e-4, "q8_0": 2e-2}[kind]
        worst = check(out_path, model_dir)
        print(f"  read back + numpy forward in llama.cpp's conventions vs transformers' top-5 logits: "
              f"worst relative error {worst:.2e} (tolerance {tol:g})")
        if not worst <= tol:
            raise SystemExit(f"{out_path}: the GGUF does not reproduce the model (error {worst:.2e})")


def check(path: Path, model_dir: Path) -> float:
    """Worst |numpy − transformers| / max|top-5 logit| over reference.json's positions."""
    ref = json.loads((model_dir / "reference.json").read_text())
    r = gguf.GGUFReader(str(path))
    t = {}
    for x in r.tensors:
        a = np.asarray(x.data)
        if x.tensor_type == gguf.GGMLQuantizationType.Q8_0:
            a = gguf.quants.dequantize(a, x.tensor_type)
        t[x.name] = a.astype(np.float32).reshape([int(d) for d in reversed(x.shape)])
    kv = {f.name: f for f in r.fields.values()}
    val = lambda k: kv[k].parts[kv[k].data[0]][0]
    n_layer, n_head, n_kv = int(val("llama.block_count")), int(val("llama.attention.head_count")), \
        int(val("llama.attention.head_count_kv"))
    eps, theta, k_used = float(val("llama.attention.layer_norm_rms_epsilon")), \
        float(val("llama.rope.freq_base")), int(val("llama.expert_used_count"))
    ids = ref["sequence_ids"]
    T = len(ids)
    x = t["token_embd.weight"][ids]
    hd = x.shape[1] // n_head
    pos = np.arange(T)[:, None]
    ang = pos * theta ** (-np.arange(0, hd, 2) / hd)  # [T, hd/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    def rope(v):  # [T, heads, hd], pairs (2i, 2i+1)
        a, b = v[..., 0::2], v[..., 1::2]
        out = np.empty_like(v)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out

    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    for i in range(n_layer):
        b = f"blk.{i}."
        h = rms(x, t[b + "attn_norm.weight"])
        q = rope((h @ t[b + "attn_q.weight"].T).reshape(T, n_head, hd))
        k = rope((h @ t[b + "attn_k.weight"].T).reshape(T, n_kv, hd))
        v = (h @ t[b + "attn_v.weight"].T).reshape(T, n_kv, hd)
        k, v = np.repeat(k, n_head // n_kv, axis=1), np.repeat(v, n_head // n_kv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", p, v).reshape(T, -1) @ t[b + "attn_output.weight"].T
        h = rms(x, t[b + "ffn_norm.weight"])
        g = h @ t[b + "ffn_gate_inp.weight"].T
        g = np.exp(g - g.max(-1, keepdims=True))
        g /= g.sum(-1, keepdims=True)
        out = np.zeros_like(x)
        for tok in range(T):
            top = np.argsort(-g[tok])[:k_used]
            wts = g[tok, top] / g[tok, top].sum()
            for e, wt in zip(top, wts):
                a1 = t[b + "ffn_gate_exps.weight"][e] @ h[tok]
                a3 = t[b + "ffn_up_exps.weight"][e] @ h[tok]
                out[tok] += wt * (t[b + "ffn_down_exps.weight"][e] @ (a1 / (1 + np.exp(-a1)) * a3))
        x = x + out
    head = t["output.weight"] if "output.weight" in t else t["token_embd.weight"]
    logits = rms(x, t["output_norm.weight"]) @ head.T
    worst = 0.0
    for pos_i, (tid, tl) in enumerate(zip(ref["top5_ids"], ref["top5_logits"])):
        scale = max(abs(v) for v in tl)
        worst = max(worst, max(abs(logits[pos_i, j] - v) for j, v in zip(tid, tl)) / scale)
    return worst


if __name__ == "__main__":
    main()
