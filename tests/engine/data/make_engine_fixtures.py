#!/usr/bin/env python3
"""Extra engine fixtures for tests/engine (beside the shared ones in tests/data, same file layout):

  qwen2_moe_dense/  Qwen2-MoE with dense MLP layers (mlp_only_layers=[2], decoder_sparse_step=2 makes
                    layers 0 and 2 dense, 1 and 3 MoE) and sliding-window attention on layer 0
                    (use_sliding_window, window 6, max_window_layers 2), norm_topk_prob=true.

Each directory: config.json, model.safetensors (transformers' save_pretrained, float32), reference.json
(prompt_ids, generated_ids = 32 greedy tokens, sequence_ids, logits {file, shape}) and logits.f32.bin
(next-token logits at every position of sequence_ids, one forward without KV cache, eager attention).
Run from anywhere: python3 tests/engine/data/make_engine_fixtures.py (torch + transformers 5 needed).
"""
import json
from pathlib import Path

import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

HERE = Path(__file__).resolve().parent
PROMPT = [1, 271, 299, 260, 271, 116, 284, 277, 283, 295, 271, 291, 278]


@torch.no_grad()
def make(name, model_cls, config, seed):
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    # Random init has tiny weights; widen them so routing and logits are far from ties.
    for p in model.parameters():
        p.mul_(4.0)
    out = HERE / name
    out.mkdir(exist_ok=True)
    model.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)  # not read by moe-run
    seq = list(PROMPT)
    for _ in range(32):
        seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    full = seq[:-1]
    logits = model(torch.tensor([full])).logits[0].contiguous()
    (out / "logits.f32.bin").write_bytes(logits.numpy().astype("<f4").tobytes())
    ref = {"prompt_ids": PROMPT, "generated_ids": seq[len(PROMPT):], "sequence_ids": full,
           "logits": {"file": "logits.f32.bin", "dtype": "f32le", "shape": list(logits.shape)},
           "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__}}
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(name, "greedy:", seq[len(PROMPT):])


make("qwen2_moe_dense", Qwen2MoeForCausalLM, Qwen2MoeConfig(
    vocab_size=320, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
    num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[2],
    use_sliding_window=True, sliding_window=6, max_window_layers=2, max_position_embeddings=128,
    rope_theta=10000.0, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
    attn_implementation="eager"), 5)
