"""Export a transformers MoE model's weights under the Hugging Face Hub tensor names.

transformers >= 5 keeps the experts of Mixtral / Qwen2-MoE / OLMoE fused in memory
(`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]) and converts the
per-expert tensors of Hub checkpoints on load. Real checkpoints (and therefore moekit's loaders)
use one tensor per expert, so the fixtures and the trained model are written in that layout:

  mixtral:   model.layers.N.block_sparse_moe.gate.weight
             model.layers.N.block_sparse_moe.experts.E.{w1,w2,w3}.weight   (w1 = gate, w3 = up, w2 = down)
  qwen2_moe: model.layers.N.mlp.gate.weight, model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight,
             model.layers.N.mlp.shared_expert.{gate,up,down}_proj.weight, model.layers.N.mlp.shared_expert_gate.weight
  olmoe:     model.layers.N.mlp.gate.weight, model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight

Every export is checked by the callers by reloading it with `from_pretrained` and comparing outputs.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

_EXPERT_NAMES = {
    "mixtral": ("w1", "w3", "w2"),
    "qwen2_moe": ("gate_proj", "up_proj", "down_proj"),
    "olmoe": ("gate_proj", "up_proj", "down_proj"),
}


def hub_state_dict(model, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Model weights under Hub names, per-expert tensors, contiguous, in `dtype`."""
    arch = model.config.model_type
    gate_name, up_name, down_name = _EXPERT_NAMES[arch]
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if tied and key == "lm_head.weight":
            continue  # tied to model.embed_tokens.weight; Hub checkpoints omit it
        value = value.detach().to(dtype)
        m = re.fullmatch(r"(model\.layers\.\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", key)
        prefix = None
        if m:
            prefix = m.group(1) + (".block_sparse_moe" if arch == "mixtral" else ".mlp") + ".experts"
            if m.group(2) == "gate_up_proj":
                inter = value.shape[1] // 2
                for e in range(value.shape[0]):
                    out[f"{prefix}.{e}.{gate_name}.weight"] = value[e, :inter].contiguous().clone()
                    out[f"{prefix}.{e}.{up_name}.weight"] = value[e, inter:].contiguous().clone()
            else:
                for e in range(value.shape[0]):
                    out[f"{prefix}.{e}.{down_name}.weight"] = value[e].contiguous().clone()
            continue
        if key.endswith(("gate_up_proj", "down_proj")) and ".experts." in key and not key.endswith(".weight"):
            raise RuntimeError(f"unexpected fused expert tensor {key}")
        if arch == "mixtral":
            key = key.replace(".mlp.", ".block_sparse_moe.")
        out[key] = value.contiguous().clone()
    return out


def save_hub_checkpoint(model, out_dir: Path, dtype: torch.dtype = torch.float32,
                        shard_bytes: int | None = None) -> list[str]:
    """Write config.json + model.safetensors (or shards + model.safetensors.index.json). Returns file names."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sd = hub_state_dict(model, dtype)
    cfg = model.config.to_dict()
    cfg["torch_dtype"] = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    cfg["dtype"] = cfg["torch_dtype"]
    # Hub checkpoints name their class; transformers 5 leaves it null for a model built from a config.
    cfg["architectures"] = [type(model).__name__]
    # transformers 5 writes RoPE as rope_parameters {rope_theta, rope_type}; checkpoints made with
    # transformers 4 (all of today's Hub MoE models) have a top-level rope_theta. Write both (same value).
    rp = cfg.get("rope_parameters") or {}
    if "rope_theta" in rp and rp.get("rope_type", "default") == "default":
        cfg["rope_theta"] = rp["rope_theta"]
    cfg.pop("_name_or_path", None)
    cfg.pop("transformers_version", None)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    meta = {"format": "pt"}
    if shard_bytes is None:
        save_file(sd, str(out_dir / "model.safetensors"), metadata=meta)
        return ["config.json", "model.safetensors"]
    # Greedy sharding in key order, as transformers does; at least two shards.
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k in sorted(sd):
        nbytes = sd[k].numel() * sd[k].element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = sd[k]
        size += nbytes
    n = len(shards)
    weight_map = {}
    names = ["config.json"]
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(shard, str(out_dir / name), metadata=meta)
        names.append(name)
        for k in shard:
            weight_map[k] = name
    total = sum(t.numel() * t.element_size() for t in sd.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    names.append("model.safetensors.index.json")
    return names
