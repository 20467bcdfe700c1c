#!/usr/bin/env python3
"""Generate moekit's model reference fixtures in tests/data/ (issue 9, point 5).

    python3 scripts/make_fixtures.py            # installs scripts/requirements.txt with pip if needed
    python3 scripts/make_fixtures.py --gguf-only   # only the qwen2_moe / olmoe GGUFs, from the committed
                                                   # safetensors (numpy + safetensors + sentencepiece + gguf)

Builds tiny random-weight checkpoints with transformers' own model classes (MixtralForCausalLM,
Qwen2MoeForCausalLM, OlmoeForCausalLM), float32, eager attention, fixed seeds, and records what
transformers computes for a fixed prompt: logits at every position, per-layer router logits, per-layer
hidden states, and 32 greedy tokens. Also writes a 320-piece SentencePiece tokenizer (trained on
WikiText-2 text) with reference encodings, reference encodings of Mixtral's real tokenizer, a GGUF copy
of the Mixtral fixture (llama architecture, f32 and Q8_0) and a sharded safetensors copy.
tests/data/README.md (written by this script) says exactly what every file is.

Deterministic: running it twice gives byte-identical files (checked by --check).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path


# --gguf-only needs neither torch nor transformers: it reads the committed safetensors with numpy.
GGUF_ONLY = "--gguf-only" in sys.argv[1:]


def _ensure_deps() -> None:
    """Install scripts/requirements.txt with pip if a dependency is missing."""
    try:
        import gguf, numpy, safetensors, sentencepiece  # noqa: F401
        if not GGUF_ONLY:
            import torch, transformers  # noqa: F401
    except ImportError:
        req = Path(__file__).resolve().parent / "requirements.txt"
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-r", str(req)])


_ensure_deps()

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import sentencepiece as spm  # noqa: E402

if GGUF_ONLY:
    torch = transformers = None
    MixtralConfig = MixtralForCausalLM = OlmoeConfig = OlmoeForCausalLM = None
    Qwen2MoeConfig = Qwen2MoeForCausalLM = None
else:
    import torch  # noqa: E402
    import transformers  # noqa: E402
    from transformers import (MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM,  # noqa: E402
                              Qwen2MoeConfig, Qwen2MoeForCausalLM)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hf_export import save_hub_checkpoint  # noqa: E402


def _no_grad():
    """torch.no_grad() as a decorator; a no-op without torch (--gguf-only never calls these functions)."""
    return torch.no_grad() if torch is not None else (lambda f: f)

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
WIKITEXT = SHARED / "wikitext-2" / "wiki.test.raw"
MIXTRAL_TOKENIZER = SHARED / "tokenizers" / "mixtral-8x7b-v0.1.tokenizer.model"

VOCAB = 320
PROMPT_TEXT = "The quick brown fox"
DECODE_STEPS = 32
# A fixture is rejected (next seed tried) if a routing decision or a greedy token is closer to a tie than
# this, so that an f32 implementation with a different summation order cannot legitimately differ.
MIN_ROUTER_GAP = 1e-3   # between the k-th and (k+1)-th router logit
MIN_GREEDY_GAP = 1e-3   # between the best and second-best logit at each greedy step

COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=128, rms_norm_eps=1e-5,
              bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, attn_implementation="eager")

FIXTURES = {
    # Mixtral: 4 experts top-2, GQA 4/2, rope_theta 50000, no window. Also written as GGUF (f32 + Q8_0).
    "mixtral": (MixtralForCausalLM, MixtralConfig, dict(
        intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, rope_theta=50000.0,
        sliding_window=None, router_jitter_noise=0.0), 11),
    # Mixtral with a sliding window of 8 (the prompt alone is longer, so the window changes the logits
    # from the first prompt position past 8 on); stored sharded (3 files + model.safetensors.index.json).
    "mixtral_swa": (MixtralForCausalLM, MixtralConfig, dict(
        intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, rope_theta=50000.0,
        sliding_window=8, router_jitter_noise=0.0), 21),
    # Qwen2-MoE: 8 experts top-4, norm_topk_prob=false, shared expert (intermediate 64) with its sigmoid
    # gate, q/k/v biases, rope_theta 20000, no window.
    "qwen2_moe": (Qwen2MoeForCausalLM, Qwen2MoeConfig, dict(
        intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=64,
        num_experts=8, num_experts_per_tok=4, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[], qkv_bias=True, use_sliding_window=False, rope_theta=20000.0), 31),
    # OLMoE: 8 experts top-3, norm_topk_prob=false, QK-norm (RMSNorm over the whole q projection,
    # 32 wide, and the whole k projection, 16 wide, before RoPE), rope_theta 30000, no clip_qkv.
    "olmoe": (OlmoeForCausalLM, OlmoeConfig, dict(
        intermediate_size=32, num_experts=8, num_experts_per_tok=3, norm_topk_prob=False,
        rope_theta=30000.0, clip_qkv=None), 41),
}


# ----------------------------------------------------------------------------------------------- tokenizer
def train_tiny_tokenizer() -> bytes:
    """A 320-piece BPE SentencePiece model with byte fallback, options as Mixtral's (Llama's) tokenizer."""
    text = WIKITEXT.read_text(encoding="utf-8").replace("\r", "")
    lines = [ln for ln in text.split("\n")[:2000] if ln.strip()]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=out, vocab_size=VOCAB, model_type="bpe",
        byte_fallback=True, character_coverage=0.98, split_digits=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1, add_dummy_prefix=True, num_threads=1, minloglevel=2, max_sentencepiece_length=16)
    return out.getvalue()


TOKENIZER_CASES = [
    "The quick brown fox",
    "Hello world",
    " leading space and  double  spaces",
    "trailing space ",
    "Numbers 1234567 and 3.14",
    "Line one\nLine two\n\nEnd",
    "Tabs\tand\ttabs",
    "Unicode: café, naïve, Ελληνικά, 日本語, emoji 🙂",
    "= = Valkyria Chronicles III = =",
    "@-@ hyphen @,@ comma",
    "",
    " ",
]


def tokenizer_reference(sp: spm.SentencePieceProcessor) -> dict:
    cases = []
    for text in TOKENIZER_CASES:
        ids = sp.encode(text)
        cases.append({"text": text, "ids": ids, "pieces": [sp.id_to_piece(i) for i in ids],
                      "decoded": sp.decode(ids)})
    return {"note": "sentencepiece.SentencePieceProcessor.encode(text) with default options: no BOS/EOS added, "
                    "dummy-prefix space added by the model's normaliser; 'decoded' = decode(ids)",
            "sentencepiece_version": spm.__version__, "vocab_size": sp.get_piece_size(),
            "bos_id": sp.bos_id(), "eos_id": sp.eos_id(), "unk_id": sp.unk_id(), "cases": cases}


# ----------------------------------------------------------------------------------------------- models
def randomize(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter: matrices ~ N(0, 1/fan_in) (activations stay O(1), so routing and greedy
    choices are decisive), embeddings ~ N(0, 1), biases ~ N(0, 0.1), norm weights ~ 1 + N(0, 0.2) (not the
    default all-ones/zeros, so a missing bias or norm weight shows up in the logits)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)


def build(name: str, seed: int):
    cls, cfg_cls, extra, _ = FIXTURES[name]
    kw = dict(COMMON)
    kw.update(extra)
    attn = kw.pop("attn_implementation")
    config = cfg_cls(**kw)
    config._attn_implementation = attn
    torch.manual_seed(seed)
    model = cls(config).float().eval()
    randomize(model, seed)
    return model


@_no_grad()
def reference(model, prompt: list[int]) -> dict:
    """Greedy decoding by full re-evaluation (no KV cache: the definition), checked against generate()
    with the KV cache; then one forward pass over prompt + generated[:-1] for logits/router/hidden states."""
    seq = list(prompt)
    gaps = []
    for _ in range(DECODE_STEPS):
        logits = model(torch.tensor([seq]), use_cache=False).logits[0, -1]
        top2 = torch.topk(logits, 2).values
        gaps.append(float(top2[0] - top2[1]))
        seq.append(int(torch.argmax(logits)))
    generated = seq[len(prompt):]
    if model.config.eos_token_id in generated:
        return {"generated": generated, "router_gap": 0.0, "greedy_gap": 0.0}  # rejected by the caller
    gen = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=DECODE_STEPS, do_sample=False, min_new_tokens=DECODE_STEPS,
                         pad_token_id=0)[0, len(prompt):].tolist()
    if gen != generated:
        raise RuntimeError(f"generate() with KV cache disagrees with full re-evaluation: {gen} vs {generated}")
    full = seq[:-1]  # every position whose logits chose a token
    out = model(torch.tensor([full]), use_cache=False, output_router_logits=True, output_hidden_states=True)
    logits = out.logits[0].float().numpy()
    router = np.stack([r.reshape(len(full), -1).float().numpy() for r in out.router_logits])
    hidden = np.stack([h[0].float().numpy() for h in out.hidden_states])
    k = model.config.num_experts_per_tok
    srt = -np.sort(-router, axis=-1)
    router_gap = float(np.min(srt[..., k - 1] - srt[..., k]))
    # argmax of the full pass must reproduce the greedy tokens
    if [int(i) for i in logits[len(prompt) - 1:].argmax(-1)] != generated:
        raise RuntimeError("argmax of the full forward pass differs from the greedy tokens")
    return {"generated": generated, "full": full, "logits": logits, "router": router, "hidden": hidden,
            "greedy_gap": min(gaps), "router_gap": router_gap}


def write_bin(path: Path, arr: np.ndarray) -> dict:
    a = np.ascontiguousarray(arr, dtype="<f4")
    path.write_bytes(a.tobytes())
    return {"file": path.name, "dtype": "f32le", "shape": list(a.shape),
            "sha256": hashlib.sha256(a.tobytes()).hexdigest()}


def verify_reload(model_cls, out_dir: Path, prompt_full: list[int], expect: np.ndarray) -> float:
    """Load the written checkpoint back through from_pretrained (Hub-name conversion included)."""
    m = model_cls.from_pretrained(str(out_dir), dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        got = m(torch.tensor([prompt_full]), use_cache=False).logits[0].numpy()
    err = float(np.max(np.abs(got - expect)))
    if err != 0.0:
        raise RuntimeError(f"{out_dir}: reloaded checkpoint differs from the reference (max abs {err})")
    return err


def make_model_fixture(name: str, out_root: Path, prompt: list[int], tokenizer_proto: bytes) -> dict:
    cls = FIXTURES[name][0]
    seed = FIXTURES[name][3]
    for attempt in range(50):
        model = build(name, seed + 1000 * attempt)
        ref = reference(model, prompt)
        # EOS in the greedy tokens would make "stop at EOS" and "always 32 steps" disagree: avoid it.
        eos = model.config.eos_token_id
        if (ref["router_gap"] >= MIN_ROUTER_GAP and ref["greedy_gap"] >= MIN_GREEDY_GAP
                and eos not in ref["generated"]):
            seed = seed + 1000 * attempt
            break
    else:
        raise RuntimeError(f"{name}: no seed gave decisive routing and greedy choices without EOS")
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    shard = 80_000 if name == "mixtral_swa" else None
    files = save_hub_checkpoint(model, out, torch.float32, shard_bytes=shard)
    # The tiny tokenizer next to the weights, as in a Hub model folder, so an engine can run from text.
    (out / "tokenizer.model").write_bytes(tokenizer_proto)
    files.append("tokenizer.model")
    verify_reload(cls, out, ref["full"], ref["logits"])
    n_prompt = len(prompt)
    meta = {
        "architecture": model.config.model_type,
        "model_class": cls.__name__,
        "checkpoint_files": files,
        "seed": seed,
        "dtype": "float32",
        "attn_implementation": "eager",
        "prompt_text": PROMPT_TEXT,
        "prompt_ids": prompt,
        "generated_ids": ref["generated"],
        "decode_steps": DECODE_STEPS,
        "sequence_ids": ref["full"],
        "n_prompt": n_prompt,
        "n_positions": len(ref["full"]),
        "logits": write_bin(out / "logits.f32.bin", ref["logits"]),
        "router_logits": write_bin(out / "router_logits.f32.bin", ref["router"]),
        "hidden_states": write_bin(out / "hidden_states.f32.bin", ref["hidden"]),
        "min_router_gap": ref["router_gap"],
        "min_greedy_gap": ref["greedy_gap"],
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "notes": (
            "sequence_ids = prompt_ids + generated_ids[:-1]; logits[t] are the next-token logits after "
            "sequence_ids[0..t], so logits[n_prompt-1+i].argmax() == generated_ids[i]. One forward pass over "
            "the whole sequence, no KV cache (generate() with the KV cache gave the same tokens). "
            "router_logits[l][t] = the layer-l router's raw logits (before softmax) for position t. "
            "hidden_states[0] = token embeddings, hidden_states[l] = input of layer l (residual stream), "
            "hidden_states[n_layers] = output of the final norm (what the LM head multiplies). "
            "Greedy decoding: argmax; no sampling, no repetition penalty."),
    }
    (out / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")
    return {"name": name, "model": model, "ref": ref, "meta": meta}


# ----------------------------------------------------------------------------------------------- GGUF
def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py reorders Q/K rows for the llama architecture: HF's rotate_half
    RoPE pairs dimension i with i + d/2 inside a head, GGML's "normal" RoPE pairs 2i with 2i+1; so rows
    (head, half, i) become (head, i, half)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


Q8_TYPES = gguf.GGMLQuantizationType


def gguf_tensors(model) -> list[tuple[str, np.ndarray, bool]]:
    """(gguf name, f32 array in numpy (row-major, HF orientation), quantizable-in-Q8_0) for a Mixtral model."""
    c = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    t = [("token_embd.weight", sd["model.embed_tokens.weight"], True)]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        t += [
            (b + "attn_norm.weight", sd[p + "input_layernorm.weight"], False),
            (b + "attn_q.weight", permute_qk(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads), True),
            (b + "attn_k.weight", permute_qk(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads), True),
            (b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"], True),
            (b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"], True),
            (b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"], False),
            # llama.cpp keeps the router in f32 in quantized files
            (b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"], False),
        ]
        gate_up = sd[p + "mlp.experts.gate_up_proj"]  # [E, 2I, H]
        inter = gate_up.shape[1] // 2
        t += [
            (b + "ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, :inter]), True),   # [E, I, H]
            (b + "ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, inter:]), True),     # [E, I, H]
            (b + "ffn_down_exps.weight", sd[p + "mlp.experts.down_proj"], True),             # [E, H, I]
        ]
    t += [("output_norm.weight", sd["model.norm.weight"], False), ("output.weight", sd["lm_head.weight"], True)]
    return t


def add_spm_vocab(w: gguf.GGUFWriter, sp: spm.SentencePieceProcessor) -> None:
    """A SentencePiece model as a GGUF "llama" vocabulary: pieces, scores, types, BOS/EOS/UNK, add BOS."""
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i).encode("utf-8"))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        elif sp.is_unused(i):
            types.append(gguf.TokenType.UNUSED)
        else:
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def write_gguf(path: Path, model, sp: spm.SentencePieceProcessor, q8: bool) -> list[dict]:
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("moekit-fixture-mixtral" + ("-q8_0" if q8 else "-f32"))
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_rope_dimension_count(c.head_dim)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
    add_spm_vocab(w, sp)
    return write_tensors_and_close(
        w, ((name, arr, q8 and quantizable) for name, arr, quantizable in gguf_tensors(model)))


def write_tensors_and_close(w, tensors) -> list[dict]:
    """Adds (gguf name, array, as Q8_0?) tensors to writer `w` (f32 otherwise), writes and closes the file;
    returns the listing recorded in gguf_reference.json."""
    listing = []
    for name, arr, as_q8 in tensors:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if as_q8:
            w.add_tensor(name, gguf.quants.quantize(arr, Q8_TYPES.Q8_0), raw_dtype=Q8_TYPES.Q8_0)
            listing.append({"name": name, "type": "Q8_0", "shape": list(arr.shape)})
        else:
            w.add_tensor(name, arr)
            listing.append({"name": name, "type": "F32", "shape": list(arr.shape)})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return listing


def gguf_numpy_forward(path: Path, ids: list[int]) -> np.ndarray:
    """An independent float64 numpy forward pass of a llama-architecture MoE GGUF (F32 tensors only),
    written from llama.cpp's conventions: GGML "normal" RoPE rotates ADJACENT pairs (2i, 2i+1) of each
    head, which is why Q/K rows are permuted at conversion. If the permutation were wrong, these logits
    would not match transformers'. Returns logits [T, vocab]."""
    r = gguf.GGUFReader(str(path))
    kv = {f.name: f.contents() for f in r.fields.values()}
    t = {x.name: np.array(x.data, dtype=np.float64) for x in r.tensors}
    n_layer, n_head = kv["llama.block_count"], kv["llama.attention.head_count"]
    n_kv, eps = kv["llama.attention.head_count_kv"], kv["llama.attention.layer_norm_rms_epsilon"]
    base, k_used = kv["llama.rope.freq_base"], kv["llama.expert_used_count"]
    n_embd = kv["llama.embedding_length"]
    hd = n_embd // n_head
    T = len(ids)

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x):  # x [T, heads, hd], adjacent pairs
        inv = base ** (-np.arange(0, hd, 2) / hd)
        ang = np.arange(T)[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def silu(x):
        return x / (1.0 + np.exp(-x))

    h = t["token_embd.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(n_layer):
        b = f"blk.{i}."
        x = rms(h, t[b + "attn_norm.weight"])
        q = rope((x @ t[b + "attn_q.weight"].T).reshape(T, n_head, hd))
        k = rope((x @ t[b + "attn_k.weight"].T).reshape(T, n_kv, hd))
        v = (x @ t[b + "attn_v.weight"].T).reshape(T, n_kv, hd)
        rep = n_head // n_kv
        att = np.empty((T, n_head, hd))
        for hh in range(n_head):
            sc = q[:, hh] @ k[:, hh // rep].T / np.sqrt(hd) + mask
            p = np.exp(sc - sc.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            att[:, hh] = p @ v[:, hh // rep]
        h = h + att.reshape(T, -1) @ t[b + "attn_output.weight"].T
        x = rms(h, t[b + "ffn_norm.weight"])
        logits = x @ t[b + "ffn_gate_inp.weight"].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        moe = np.zeros_like(h)
        for tok in range(T):
            top = np.argsort(-probs[tok])[:k_used]
            wts = probs[tok, top] / probs[tok, top].sum()
            for e, wt in zip(top, wts):
                g = t[b + "ffn_gate_exps.weight"][e] @ x[tok]
                u = t[b + "ffn_up_exps.weight"][e] @ x[tok]
                moe[tok] += wt * (t[b + "ffn_down_exps.weight"][e] @ (silu(g) * u))
        h = h + moe
    return rms(h, t["output_norm.weight"]) @ t["output.weight"].T


def q8_roundtrip_model(model):
    """A copy of the model whose Q8_0-quantized tensors hold their dequantized values (rows are quantized
    independently in blocks of 32, so the Q/K row permutation commutes with quantization)."""
    quantized = {"model.embed_tokens.weight", "lm_head.weight"}
    m = type(model)(model.config).float().eval()
    m.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name, p in m.named_parameters():
            q = (name in quantized or any(s in name for s in ("q_proj", "k_proj", "v_proj", "o_proj"))
                 or name.endswith(("experts.gate_up_proj", "experts.down_proj")))
            if q:
                a = p.detach().numpy().astype(np.float32)
                rt = gguf.quants.dequantize(gguf.quants.quantize(a, Q8_TYPES.Q8_0), Q8_TYPES.Q8_0)
                p.copy_(torch.from_numpy(np.ascontiguousarray(rt.reshape(a.shape))))
    return m


def make_gguf(fx: dict, out_root: Path, sp: spm.SentencePieceProcessor, prompt: list[int]) -> dict:
    out = out_root / "mixtral"
    model = fx["model"]
    f32_list = write_gguf(out / "model-f32.gguf", model, sp, q8=False)
    q8_list = write_gguf(out / "model-q8_0.gguf", model, sp, q8=True)
    # Read back with gguf's reader and check the f32 file reproduces the weights (after un-permuting).
    r = gguf.GGUFReader(str(out / "model-f32.gguf"))
    by_name = {t.name: np.array(t.data) for t in r.tensors}
    for name, arr, _ in gguf_tensors(model):
        if not np.array_equal(by_name[name].reshape(arr.shape), arr):
            raise RuntimeError(f"GGUF readback mismatch for {name}")
    np_logits = gguf_numpy_forward(out / "model-f32.gguf", fx["ref"]["full"])
    np_err = float(np.max(np.abs(np_logits - fx["ref"]["logits"])) / np.max(np.abs(fx["ref"]["logits"])))
    if np_err > 1e-5:
        raise RuntimeError(f"numpy GGML-convention forward of model-f32.gguf differs from transformers: {np_err}")
    print(f"model-f32.gguf: independent numpy forward (adjacent-pair RoPE) matches transformers, "
          f"max error / max |logit| = {np_err:.2e}")
    qm = q8_roundtrip_model(model)
    qref = reference(qm, prompt)
    meta = {
        "files": {"model-f32.gguf": f32_list, "model-q8_0.gguf": q8_list},
        "q8_0": {
            "prompt_ids": prompt, "generated_ids": qref["generated"], "sequence_ids": qref["full"],
            "n_prompt": len(prompt),
            "logits": write_bin(out / "logits_q8_0.f32.bin", qref["logits"]),
            "router_logits": write_bin(out / "router_logits_q8_0.f32.bin", qref["router"]),
            "min_router_gap": qref["router_gap"], "min_greedy_gap": qref["greedy_gap"],
            "notes": ("transformers float32 run of the same model with every tensor stored as Q8_0 in "
                      "model-q8_0.gguf replaced by its dequantized value (gguf.quants Q8_0 round trip); "
                      "activations stay f32 (llama.cpp's own CPU path also quantizes activations to Q8, so "
                      "llama.cpp itself is not bit-comparable to this)."),
        },
        "notes": ("llama architecture GGUF of tests/data/mixtral. Q and K rows permuted as llama.cpp's "
                  "convert_hf_to_gguf.py does (permute_qk in scripts/make_fixtures.py); experts stacked into "
                  "ffn_{gate,up,down}_exps ([E, I, H], [E, I, H], [E, H, I] in numpy order; GGUF dims are "
                  "the reverse); router blk.N.ffn_gate_inp.weight [E, H] kept F32 in the Q8_0 file; norms "
                  "F32. The f32 file must reproduce reference.json's logits/tokens exactly as the "
                  "safetensors checkpoint does. Vocabulary: tests/data/tokenizer/tiny-spm-320.model's "
                  "pieces, scores and types (tokenizer.ggml.model = llama)."),
    }
    (out / "gguf_reference.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


# ------------------------------------------------------------------------------- GGUF: qwen2moe, olmoe
# tests/data/{qwen2_moe,olmoe}/model-f32.gguf: written from the committed config.json + model.safetensors
# (Hub tensor names, one tensor per expert) as llama.cpp's convert_hf_to_gguf.py writes these
# architectures (Qwen2MoeModel, OlmoeModel): per-expert tensors stacked into ffn_{gate,up,down}_exps,
# NO Q/K row permutation (llama.cpp runs both with NEOX RoPE, which is transformers' rotate_half).
HUB_GGUF = {"qwen2_moe": "qwen2moe", "olmoe": "olmoe"}  # fixture -> general.architecture


def hub_gguf_tensors(arch: str, sd: dict[str, np.ndarray], cfg: dict) -> list[tuple[str, np.ndarray]]:
    """(gguf name, f32 array in HF orientation) from a Hub-named state dict, in llama.cpp's names."""
    n_exp = cfg["num_experts"]
    t = [("token_embd.weight", sd["model.embed_tokens.weight"])]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        t.append((b + "attn_norm.weight", sd[p + "input_layernorm.weight"]))
        for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")):
            t.append((b + gg + ".weight", sd[p + f"self_attn.{hf}.weight"]))
            if arch == "qwen2moe":
                t.append((b + gg + ".bias", sd[p + f"self_attn.{hf}.bias"]))
        t.append((b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"]))
        if arch == "olmoe":
            # HF OLMoE: q_norm over the whole q projection (hidden_size wide), k_norm over the whole k
            # projection (kv heads x head_dim wide); convert_hf_to_gguf.py keeps these 1-D tensors as they are.
            t.append((b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"]))
            t.append((b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"]))
        t.append((b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"]))
        t.append((b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"]))  # [E, H]
        for hf, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            t.append((b + gg + ".weight",  # [E, I, H] (gate, up), [E, H, I] (down)
                      np.stack([sd[p + f"mlp.experts.{e}.{hf}.weight"] for e in range(n_exp)])))
        if arch == "qwen2moe":
            for hf, gg in (("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"),
                           ("down_proj", "ffn_down_shexp")):
                t.append((b + gg + ".weight", sd[p + f"mlp.shared_expert.{hf}.weight"]))
            # [1, H] as in the checkpoint (GGUF ne = [H, 1]; llama.cpp loads it as {n_embd})
            t.append((b + "ffn_gate_inp_shexp.weight", sd[p + "mlp.shared_expert_gate.weight"]))
    t += [("output_norm.weight", sd["model.norm.weight"]), ("output.weight", sd["lm_head.weight"])]
    return t


def write_hub_gguf(path: Path, arch: str, cfg: dict, sd: dict[str, np.ndarray],
                   sp: spm.SentencePieceProcessor) -> list[dict]:
    """An f32 GGUF with the metadata convert_hf_to_gguf.py writes for `arch` (TextModel's common keys,
    then Qwen2MoeModel's / OlmoeModel's own)."""
    rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"moekit-fixture-{path.parent.name}-f32")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(rope_theta)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("head_dim") is not None:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if arch == "qwen2moe":
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    # olmoe: convert_hf_to_gguf.py writes no expert_feed_forward_length; llama.cpp sizes OLMoE's experts
    # with feed_forward_length (= intermediate_size, the expert size in OLMoE's config).
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_spm_vocab(w, sp)
    return write_tensors_and_close(w, ((name, arr, False) for name, arr in hub_gguf_tensors(arch, sd, cfg)))


def gguf_numpy_forward_neox(path: Path, ids: list[int]) -> np.ndarray:
    """An independent float64 numpy forward pass of a qwen2moe / olmoe F32 GGUF, from llama.cpp's graphs
    (llm_build_qwen2moe, llm_build_olmoe): NEOX RoPE (dimension i paired with i + head_dim/2); olmoe:
    RMSNorm of the whole q and k projections before RoPE; qwen2moe: q/k/v biases and the shared expert
    times sigmoid(ffn_gate_inp_shexp . x); top-k of the softmax over all experts, NOT renormalised
    (llama.cpp's default for both). Returns logits [T, vocab]."""
    r = gguf.GGUFReader(str(path))
    kv = {f.name: f.contents() for f in r.fields.values()}
    arch = kv["general.architecture"]
    t = {x.name: np.array(x.data, dtype=np.float64) for x in r.tensors}
    a = lambda k: kv[f"{arch}.{k}"]  # noqa: E731
    n_layer, n_head, n_kv = a("block_count"), a("attention.head_count"), a("attention.head_count_kv")
    eps, base, k_used = a("attention.layer_norm_rms_epsilon"), a("rope.freq_base"), a("expert_used_count")
    hd = a("embedding_length") // n_head
    T = len(ids)

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x):  # x [T, heads, hd], NEOX: pairs (i, i + hd/2)
        inv = base ** (-np.arange(0, hd, 2) / hd)
        ang = np.arange(T)[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)

    def silu(x):
        return x / (1.0 + np.exp(-x))

    def lin(x, name):
        y = x @ t[name + ".weight"].T
        return y + t[name + ".bias"] if name + ".bias" in t else y

    h = t["token_embd.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(n_layer):
        b = f"blk.{i}."
        x = rms(h, t[b + "attn_norm.weight"])
        q, k, v = lin(x, b + "attn_q"), lin(x, b + "attn_k"), lin(x, b + "attn_v")
        if arch == "olmoe":
            q, k = rms(q, t[b + "attn_q_norm.weight"]), rms(k, t[b + "attn_k_norm.weight"])
        q, k = rope(q.reshape(T, n_head, hd)), rope(k.reshape(T, n_kv, hd))
        v = v.reshape(T, n_kv, hd)
        rep = n_head // n_kv
        att = np.empty((T, n_head, hd))
        for hh in range(n_head):
            sc = q[:, hh] @ k[:, hh // rep].T / np.sqrt(hd) + mask
            pr = np.exp(sc - sc.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            att[:, hh] = pr @ v[:, hh // rep]
        h = h + lin(att.reshape(T, -1), b + "attn_output")
        x = rms(h, t[b + "ffn_norm.weight"])
        logits = x @ t[b + "ffn_gate_inp.weight"].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        moe = np.zeros_like(h)
        for tok in range(T):
            for e in np.argsort(-probs[tok])[:k_used]:
                g = t[b + "ffn_gate_exps.weight"][e] @ x[tok]
                u = t[b + "ffn_up_exps.weight"][e] @ x[tok]
                moe[tok] += probs[tok, e] * (t[b + "ffn_down_exps.weight"][e] @ (silu(g) * u))
        if b + "ffn_gate_shexp.weight" in t:
            sh = lin(silu(lin(x, b + "ffn_gate_shexp")) * lin(x, b + "ffn_up_shexp"), b + "ffn_down_shexp")
            gate = x @ t[b + "ffn_gate_inp_shexp.weight"].reshape(-1)
            moe += sh / (1.0 + np.exp(-gate))[:, None]
        h = h + moe
    return rms(h, t["output_norm.weight"]) @ t["output.weight"].T


def make_hub_ggufs(out_root: Path) -> dict:
    """tests/data/{qwen2_moe,olmoe}/model-f32.gguf + gguf_reference.json from the committed config.json,
    model.safetensors and tokenizer.model (torch-free: `--gguf-only`)."""
    from safetensors.numpy import load_file
    results = {}
    for name, arch in HUB_GGUF.items():
        d = out_root / name
        cfg = json.loads((d / "config.json").read_text())
        sd = load_file(str(d / "model.safetensors"))
        sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
        if sp.get_piece_size() != cfg["vocab_size"]:
            raise RuntimeError(f"{name}: tokenizer.model has {sp.get_piece_size()} pieces, config {cfg['vocab_size']}")
        listing = write_hub_gguf(d / "model-f32.gguf", arch, cfg, sd, sp)
        # Read back: every tensor bit-identical to the checkpoint's.
        r = gguf.GGUFReader(str(d / "model-f32.gguf"))
        by_name = {x.name: np.array(x.data) for x in r.tensors}
        expect = hub_gguf_tensors(arch, sd, cfg)
        if sorted(by_name) != sorted(n for n, _ in expect):
            raise RuntimeError(f"{name}: GGUF tensor names differ from the ones written")
        for tname, arr in expect:
            if not np.array_equal(by_name[tname].reshape(arr.shape), arr):
                raise RuntimeError(f"{name}: GGUF readback mismatch for {tname}")
        ref = json.loads((d / "reference.json").read_text())
        lshape = ref["logits"]["shape"]
        want = np.fromfile(d / ref["logits"]["file"], dtype="<f4").reshape(lshape)
        got = gguf_numpy_forward_neox(d / "model-f32.gguf", ref["sequence_ids"])
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        if err > 1e-5:
            raise RuntimeError(f"{name}: numpy llama.cpp-convention forward of model-f32.gguf differs from "
                               f"transformers: {err}")
        if [int(i) for i in got[ref["n_prompt"] - 1:].argmax(-1)] != ref["generated_ids"]:
            raise RuntimeError(f"{name}: numpy forward of model-f32.gguf gives other greedy tokens")
        print(f"{name}/model-f32.gguf ({arch}): independent numpy forward (NEOX RoPE) matches transformers, "
              f"max error / max |logit| = {err:.2e}")
        meta = {
            "files": {"model-f32.gguf": listing},
            "architecture": arch,
            "numpy_forward_max_rel_error": float(f"{err:.3e}"),
            "notes": (f"{arch} architecture GGUF of tests/data/{name}, written by scripts/make_fixtures.py "
                      "--gguf-only from the committed config.json + model.safetensors, as llama.cpp's "
                      "convert_hf_to_gguf.py writes this architecture: no Q/K row permutation (NEOX RoPE); "
                      "experts stacked into ffn_{gate,up,down}_exps ([E, I, H], [E, I, H], [E, H, I] in numpy "
                      "order; GGUF dims are the reverse); all tensors F32. "
                      + ("q/k/v biases; shared expert ffn_{gate,up,down}_shexp and its gate ffn_gate_inp_shexp "
                         "[1, H]; expert_feed_forward_length = moe_intermediate_size, "
                         "expert_shared_feed_forward_length = shared_expert_intermediate_size. "
                         if arch == "qwen2moe" else
                         "attn_q_norm [hidden] / attn_k_norm [kv heads x head_dim] over the whole q and k "
                         "projections; no expert_feed_forward_length (feed_forward_length = the expert size). ")
                      + "The file must reproduce reference.json's logits/tokens as the safetensors checkpoint "
                      "does. Vocabulary: tokenizer.model's pieces, scores and types (tokenizer.ggml.model = llama)."),
        }
        (d / "gguf_reference.json").write_text(json.dumps(meta, indent=1) + "\n")
        results[name] = meta
    return results


# ----------------------------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "data")
    ap.add_argument("--gguf-only", action="store_true",
                    help="only write qwen2_moe/olmoe model-f32.gguf + gguf_reference.json from the committed "
                         "safetensors (no torch, no transformers; nothing else is rewritten)")
    args = ap.parse_args()
    if args.gguf_only:
        make_hub_ggufs(args.out)
        return
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out_root: Path = args.out
    out_root.mkdir(parents=True, exist_ok=True)

    tok_dir = out_root / "tokenizer"
    tok_dir.mkdir(exist_ok=True)
    proto = train_tiny_tokenizer()
    (tok_dir / "tiny-spm-320.model").write_bytes(proto)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    (tok_dir / "tiny-spm-320.encodings.json").write_text(
        json.dumps(tokenizer_reference(sp), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if MIXTRAL_TOKENIZER.exists():
        msp = spm.SentencePieceProcessor(model_file=str(MIXTRAL_TOKENIZER))
        (tok_dir / "mixtral.encodings.json").write_text(
            json.dumps(tokenizer_reference(msp), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    prompt = [sp.bos_id()] + sp.encode(PROMPT_TEXT)
    summary = {}
    fixtures = {}
    for name in FIXTURES:
        fx = make_model_fixture(name, out_root, prompt, proto)
        fixtures[name] = fx
        summary[name] = {k: fx["meta"][k] for k in ("seed", "min_router_gap", "min_greedy_gap", "generated_ids")}
        print(f"{name}: seed {fx['meta']['seed']} router gap {fx['ref']['router_gap']:.4g} "
              f"greedy gap {fx['ref']['greedy_gap']:.4g} tokens {fx['ref']['generated']}", flush=True)
    gmeta = make_gguf(fixtures["mixtral"], out_root, sp, prompt)
    print("gguf q8_0 tokens", gmeta["q8_0"]["generated_ids"],
          "same as f32:", gmeta["q8_0"]["generated_ids"] == fixtures["mixtral"]["ref"]["generated"])

    # The window must matter in mixtral_swa: compare with the same weights and no window.
    swa = fixtures["mixtral_swa"]["model"]
    nowin = MixtralForCausalLM(MixtralConfig(**{**swa.config.to_dict(), "sliding_window": None})).float().eval()
    nowin.config._attn_implementation = "eager"
    nowin.load_state_dict(swa.state_dict())
    with torch.no_grad():
        lw = nowin(torch.tensor([fixtures["mixtral_swa"]["ref"]["full"]]), use_cache=False).logits[0].numpy()
    diff = np.abs(lw - fixtures["mixtral_swa"]["ref"]["logits"]).max(axis=-1)
    first = int(np.argmax(diff > 1e-6)) if (diff > 1e-6).any() else -1
    if first < 0:
        raise RuntimeError("mixtral_swa: the sliding window does not change any logits")
    print(f"mixtral_swa: window changes logits from position {first} on (max abs diff {diff.max():.3g})")
    summary["mixtral_swa"]["window_first_affected_position"] = first
    (out_root / "fixtures_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    make_hub_ggufs(out_root)


if __name__ == "__main__":
    main()
