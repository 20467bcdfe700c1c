#!/usr/bin/env python3
"""Train moekit's small default model: a Mixtral-architecture MoE on WikiText-2 (issue 10, points 1-2).

Run (installs scripts/requirements.txt with pip if a dependency is missing):
    nohup nice -n 5 python3 scripts/train_tiny_moe.py --steps 540 --minutes 85 > /tmp/train.log 2>&1 &

Data: ../shared/data/wikitext-2/wiki.test.raw (CC BY-SA 3.0), CR stripped. The held-out slice is every
line from the first article heading (" = Title = ") at or after 90 % of the lines to the end; the rest
trains. Tokenizer: Mixtral-8x7B v0.1 SentencePiece (Apache-2.0), the whole text encoded at once, no BOS.

Runs on --threads (default 2) intra-op threads with OMP_WAIT_POLICY=PASSIVE: on a shared 2-core machine
spinning OpenMP workers that lose their core make 2 threads slower than 1 (measured: 21 s/step spinning,
9.9 s/step 1 thread, 8.2 s/step 2 passive threads, under a load average of 11). The learning rate follows
a cosine schedule over --steps, and the held-out check runs every --eval-every steps, so a run is a
function of the seed, the flags and the thread count, not of the machine's speed; --minutes is only a
safety stop (the card says so if it cut the schedule short). Every check saves the resumable training
state to --state-dir and, if validation improved, the best weights (--state-dir/best_model.pt). --out is
written only when training ends (other people's tests read it). At the end the best model is evaluated
on the whole held-out slice and on a train sample, and the model card and reference.json are written.

Profile of one step (batch 8 x 256, 1 thread, torch profiler): ~55 % matrix products (the tied
32000-piece LM head is ~45 % of the FLOPs, the experts ~50 %), ~14 % the f32 log-softmax of the
32000-wide logits and its backward, the rest element-wise ops and the optimizer; HF Mixtral's
per-expert loop (8 experts x 6 layers of gather/index_add) is a few percent, so the training model is
transformers' MixtralForCausalLM itself and the exported checkpoint is that model's own weights.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

import subprocess

# Must be set before torch (libgomp) is first imported; see the docstring.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _ensure_deps() -> None:
    """Install scripts/requirements.txt with pip if a dependency is missing."""
    try:
        import numpy, safetensors, sentencepiece, torch, transformers  # noqa: F401
    except ImportError:
        req = Path(__file__).resolve().parent / "requirements.txt"
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-r", str(req)])


_ensure_deps()

import numpy as np  # noqa: E402
import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
from transformers import MixtralConfig, MixtralForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_export import save_hub_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=540, help="optimizer steps; the LR schedule spans them (default 540)")
    p.add_argument("--minutes", type=float, default=85.0,
                   help="safety stop: end early after this much training wall time (default 85)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--data", type=Path, default=SHARED / "wikitext-2" / "wiki.test.raw")
    p.add_argument("--tokenizer", type=Path, default=SHARED / "tokenizers" / "mixtral-8x7b-v0.1.tokenizer.model")
    p.add_argument("--tokenizer-licence", type=Path, default=SHARED / "tokenizers" / "LICENCE-mistral-common")
    p.add_argument("--out", type=Path, default=REPO / "models" / "moekit-tiny-moe")
    p.add_argument("--state-dir", type=Path, default=REPO / "build" / "tiny-moe-train")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50, help="warm-up steps")
    p.add_argument("--schedule-start", type=int, default=0,
                   help="step at which the warm-up + cosine schedule starts (a warm restart when resuming a "
                        "state trained with another schedule; default 0)")
    p.add_argument("--phase-note", default="", help="model card text describing earlier training phases")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--aux-coef", type=float, default=0.02, help="Mixtral router load-balancing loss coefficient")
    p.add_argument("--eval-every", type=int, default=60, help="held-out check + resumable state every N steps")
    p.add_argument("--eval-tokens", type=int, default=8192, help="held-out tokens used for periodic evaluation")
    p.add_argument("--resume", action="store_true", help="resume from --state-dir/state.pt")
    p.add_argument("--no-export", action="store_true", help="smoke test: do not write --out")
    return p.parse_args()


def load_split(path: Path):
    lines = path.read_text(encoding="utf-8").replace("\r", "").split("\n")
    start = int(len(lines) * 0.9)
    heading = re.compile(r"^ = [^=].* = $")
    while start < len(lines) and not heading.match(lines[start]):
        start += 1
    if start >= len(lines):
        raise SystemExit(f"{path}: no article heading after 90% of the lines; cannot place the held-out split")
    train = "\n".join(lines[:start]) + "\n"
    val = "\n".join(lines[start:])
    return train, val, start, len(lines)


@torch.no_grad()
def evaluate(model, ids: torch.Tensor, seq: int, max_tokens: int | None = None) -> tuple[float, int]:
    """Mean next-token cross-entropy over non-overlapping windows of `seq` tokens (no BOS, as in training)."""
    model.eval()
    n = ids.numel() if max_tokens is None else min(ids.numel(), max_tokens + 1)
    total, count = 0.0, 0
    for s in range(0, n - 1, seq):
        chunk = ids[s:min(s + seq + 1, n)]
        if chunk.numel() < 2:
            break
        out = model(input_ids=chunk[:-1].unsqueeze(0), output_router_logits=False)
        logp = torch.log_softmax(out.logits[0].float(), dim=-1)
        nll = -logp.gather(1, chunk[1:].unsqueeze(1)).sum().item()
        total += nll
        count += chunk.numel() - 1
    model.train()
    return total / count, count


def lr_at(args, step: int) -> float:
    step -= args.schedule_start
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    span = args.steps - args.schedule_start - args.warmup
    frac = min(max((step - args.warmup) / max(span, 1), 0.0), 1.0)
    return args.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    sp = spm.SentencePieceProcessor(model_file=str(args.tokenizer))
    train_text, val_text, val_line, n_lines = load_split(args.data)
    train_ids = torch.tensor(sp.encode(train_text), dtype=torch.long)
    val_ids = torch.tensor(sp.encode(val_text), dtype=torch.long)
    args.split_line, args.n_lines = val_line + 1, n_lines
    args.train_tokens, args.val_tokens = train_ids.numel(), val_ids.numel()
    print(f"data: {n_lines} lines; train = lines 1..{val_line} ({train_ids.numel()} tokens), "
          f"held-out = lines {val_line + 1}..{n_lines} ({val_ids.numel()} tokens)", flush=True)

    config = MixtralConfig(
        vocab_size=sp.get_piece_size(), hidden_size=args.hidden, intermediate_size=args.ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads, num_local_experts=args.experts, num_experts_per_tok=args.top_k,
        max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=None,
        tie_word_embeddings=True, router_aux_loss_coef=args.aux_coef, output_router_logits=False,
        bos_token_id=sp.bos_id(), eos_token_id=sp.eos_id(), pad_token_id=None, initializer_range=0.02,
    )
    model = MixtralForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    per_expert = 3 * args.hidden * args.ffn
    n_active = n_params - args.layers * (args.experts - args.top_k) * per_expert
    print(f"model: {n_params / 1e6:.2f}M parameters ({n_active / 1e6:.2f}M active per token), "
          f"bf16 size {2 * n_params / 1e6:.1f} MB", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                            fused=True)

    args.state_dir.mkdir(parents=True, exist_ok=True)
    state_path = args.state_dir / "state.pt"
    step, elapsed_before, best_val, history = 0, 0.0, float("inf"), []
    gen = torch.Generator().manual_seed(args.seed)
    if args.resume and state_path.exists():
        st = torch.load(state_path, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        for g in opt.param_groups:  # load_state_dict restores the saved groups' flags
            g["fused"], g["foreach"] = True, None
        step, elapsed_before, best_val, history = st["step"], st["elapsed"], st["best_val"], st["history"]
        gen.set_state(st["gen"])
        print(f"resumed at step {step}, {elapsed_before / 60:.1f} min done", flush=True)

    budget = args.minutes * 60.0
    t0 = time.time() - elapsed_before
    recent: list[float] = []
    tokens_seen = step * args.batch * args.seq
    best_step = next((h["step"] for h in history if h.get("best")), 0)
    model.train()

    def checkpoint(final: bool = False):
        nonlocal best_val, best_step
        val_loss, _ = evaluate(model, val_ids, args.seq, args.eval_tokens)
        train_loss = float(np.mean(recent)) if recent else float("nan")
        improved = val_loss < best_val
        entry = {"step": step, "minutes": (time.time() - t0) / 60, "lr": opt.param_groups[0]["lr"], "train_loss": train_loss,
                 "val_loss_sample": val_loss, "tokens": tokens_seen, "best": improved}
        history.append(entry)
        print(f"[ckpt] step {step} {entry['minutes']:.1f} min train {train_loss:.4f} "
              f"val(sample) {val_loss:.4f} ppl {math.exp(val_loss):.1f}{' *best*' if improved else ''}", flush=True)
        if improved:
            best_val, best_step = val_loss, step
            torch.save(model.state_dict(), args.state_dir / "best_model.pt")
        tmp = args.state_dir / "state.pt.tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "elapsed": time.time() - t0, "best_val": best_val, "history": history,
                    "gen": gen.get_state()}, tmp)
        os.replace(tmp, state_path)

    n_train = train_ids.numel()
    while True:
        elapsed = time.time() - t0
        if step >= args.steps:
            break
        if elapsed >= budget:
            print(f"safety stop: {elapsed / 60:.1f} min >= --minutes {args.minutes:g} at step {step} of "
                  f"{args.steps}", flush=True)
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(args, step)
        starts = torch.randint(0, n_train - args.seq - 1, (args.batch,), generator=gen)
        batch = torch.stack([train_ids[s:s + args.seq + 1] for s in starts.tolist()])
        out = model(input_ids=batch[:, :-1], labels=batch[:, :-1].clone(), output_router_logits=True)
        # transformers shifts labels itself: labels == input_ids predicts token t+1 from t.
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += args.batch * args.seq
        lm_loss = (loss - args.aux_coef * out.aux_loss).item() if out.aux_loss is not None else loss.item()
        recent.append(lm_loss)
        recent = recent[-50:]
        if step % 10 == 0:
            print(f"step {step} {elapsed / 60:.1f} min lm_loss {lm_loss:.4f} aux {out.aux_loss.item():.3f} "
                  f"lr {opt.param_groups[0]['lr']:.2e} tok/s {tokens_seen / max(elapsed, 1e-9):.0f}", flush=True)
        if step % args.eval_every == 0 and step < args.steps:
            checkpoint()

    checkpoint(final=True)
    wall = time.time() - t0
    # Final numbers: the best model, rounded to bfloat16 as shipped, on the whole held-out slice and a
    # same-sized train sample.
    model.load_state_dict(torch.load(args.state_dir / "best_model.pt"))
    with torch.no_grad():
        for prm in model.parameters():
            prm.copy_(prm.to(torch.bfloat16).float())
    val_loss, val_tokens = evaluate(model, val_ids, args.seq)
    train_loss, train_tokens = evaluate(model, train_ids[: val_ids.numel()], args.seq)
    final = {"step": step, "best_step": best_step, "wall_minutes": wall / 60, "tokens_seen": tokens_seen,
             "val_loss": val_loss, "val_ppl": math.exp(val_loss), "val_tokens": val_tokens,
             "train_loss": train_loss, "train_ppl": math.exp(train_loss), "train_eval_tokens": train_tokens,
             "val_first_line": val_line + 1, "n_lines": n_lines, "train_tokens": n_train,
             "n_params": n_params, "n_active": n_active, "steps_planned": args.steps,
             "threads": args.threads, "nice": os.nice(0)}
    print("final:", json.dumps(final), flush=True)
    if not args.no_export:
        export(args, model, history, final=final)
        write_reference(args, sp, val_ids)
    print("done", flush=True)


REFERENCE_PROMPT = "The history of the"


@torch.no_grad()
def write_reference(args, sp, val_ids: torch.Tensor) -> None:
    """reference.json for the engine's tests: what transformers (float32, eager attention) computes from the
    exported bf16 checkpoint: 32 greedy tokens after a fixed prompt, top-5 logits and per-layer router
    logits at every position, and the held-out loss of the first 1024 tokens."""
    m = MixtralForCausalLM.from_pretrained(str(args.out), dtype=torch.float32, attn_implementation="eager").eval()
    prompt = [sp.bos_id()] + sp.encode(REFERENCE_PROMPT)
    seq, gaps = list(prompt), []
    for _ in range(32):
        lg = m(torch.tensor([seq]), use_cache=False).logits[0, -1]
        top2 = torch.topk(lg, 2).values
        gaps.append(float(top2[0] - top2[1]))
        seq.append(int(lg.argmax()))
    full = seq[:-1]
    out = m(torch.tensor([full]), use_cache=False, output_router_logits=True)
    top = torch.topk(out.logits[0], 5, dim=-1)
    router = [r.reshape(len(full), -1).tolist() for r in out.router_logits]
    nll, n = evaluate(m, val_ids, args.seq, 1024)
    ref = {
        "prompt_text": REFERENCE_PROMPT, "prompt_ids": prompt, "generated_ids": seq[len(prompt):],
        "generated_text": sp.decode(seq[len(prompt):]), "sequence_ids": full,
        "min_greedy_gap": min(gaps), "greedy_gaps": gaps,
        "top5_ids": top.indices.tolist(), "top5_logits": top.values.tolist(), "router_logits": router,
        "heldout_first_1024": {"mean_nll": nll, "tokens": n, "protocol": (
            f"held-out ids h (the held-out text encoded as one string, no BOS); for s = 0, {args.seq}, "
            f"{2 * args.seq}, ...: the model sees h[s..s+{args.seq - 1}] (fresh context, no BOS) and predicts "
            f"h[s+1..s+{args.seq}]; mean negative log-likelihood (nats) over the {n} predicted tokens "
            f"h[1..{n}]")},
        "notes": ("transformers float32 eager run of model.safetensors (bf16 weights upcast). Greedy = argmax "
                  "by full re-evaluation; top5_*[t] and router_logits[layer][t] are for sequence_ids[0..t]; "
                  "bf16 weights make near-ties possible: compare tokens only while the greedy gap is "
                  "comfortably above the engine's error."),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
    }
    (args.out / "reference.json").write_text(json.dumps(ref) + "\n")
    print("reference:", repr(ref["generated_text"]), "min gap", min(gaps), flush=True)


def export(args, model, history, partial: bool = False, final: dict | None = None):
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    m = MixtralForCausalLM(model.config)
    m.load_state_dict(model.state_dict())
    m.config.output_router_logits = False
    save_hub_checkpoint(m, out, dtype=torch.bfloat16)
    shutil.copyfile(args.tokenizer, out / "tokenizer.model")
    shutil.copyfile(args.tokenizer_licence, out / "LICENCE-mistral-common")
    (out / "training_log.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                       "history": history, "final": final}, indent=1) + "\n")
    (out / "README.md").write_text(model_card(args, model, history, partial, final))
    print(f"exported to {out}", flush=True)


def model_card(args, model, history, partial, final) -> str:
    c = model.config
    n_params = sum(p.numel() for p in model.parameters())
    last = history[-1] if history else {}
    if final is None:
        status = (f"**PARTIAL CHECKPOINT** (training still running or interrupted): best periodic checkpoint at "
                  f"step {last.get('step')}, {last.get('minutes', 0):.1f} min; held-out loss on the first "
                  f"{args.eval_tokens} held-out tokens {last.get('val_loss_sample', float('nan')):.4f}.")
        results = status
    else:
        cut = ("" if final["step"] >= args.steps else
               f" **The --minutes safety stop ended the run at step {final['step']} of {args.steps}: the "
               f"learning rate had not finished its decay.**")
        losses = "\n".join(f"| {h['step']} | {h['minutes']:.1f} | "
                           f"{format(h['lr'], '.2e') if 'lr' in h else '(phase 1)'} | {h['train_loss']:.4f} | "
                           f"{h['val_loss_sample']:.4f} | {math.exp(h['val_loss_sample']):.1f} |"
                           for h in history)
        results = (f"| | loss (nats/token) | perplexity | tokens |\n|---|---|---|---|\n"
                   f"| held-out (whole slice) | {final['val_loss']:.4f} | {final['val_ppl']:.2f} | {final['val_tokens']} |\n"
                   f"| train (first {final['train_eval_tokens']} tokens) | {final['train_loss']:.4f} | "
                   f"{final['train_ppl']:.2f} | {final['train_eval_tokens']} |\n\n"
                   f"Steps run: {final['step']} of {args.steps} (kept: step {final['best_step']}, the best "
                   f"held-out check); tokens seen: {final['tokens_seen']:,} "
                   f"({final['tokens_seen'] / final['train_tokens']:.1f} passes over the training text); wall "
                   f"time: {final['wall_minutes']:.1f} min on {final['threads']} CPU threads (nice "
                   f"{final['nice']}, a 2-core machine shared with several compiler jobs).{cut}\n\n"
                   f"Perplexity here is per SentencePiece token over non-overlapping {args.seq}-token windows "
                   f"without BOS, not per word.\n\nLoss history (train = mean LM loss of the last 50 steps; "
                   f"held-out = first {args.eval_tokens} held-out tokens, f32 weights):\n\n"
                   f"| step | minutes | LR | train loss | held-out loss | held-out ppl |\n"
                   f"|---|---|---|---|---|---|\n{losses}")
    return f"""# moekit-tiny-moe

A small **Mixtral-architecture** mixture-of-experts language model trained from scratch by
`scripts/train_tiny_moe.py`, shipped as moekit's default model so that examples produce real text and real
routing without a 90 GB download. It is a toy: its training text is ~300k tokens of Wikipedia and it writes
WikiText-flavoured near-sentences. Do not use it for anything but testing and demonstrating offloading.

## Architecture (Hugging Face `MixtralForCausalLM`, `config.json`)

| | |
|---|---|
| layers | {c.num_hidden_layers} |
| hidden size | {c.hidden_size} |
| attention | {c.num_attention_heads} heads, {c.num_key_value_heads} KV heads (GQA), head dim {c.head_dim}, RoPE theta {c.rope_parameters['rope_theta']:g}, no sliding window |
| MoE | {c.num_local_experts} experts per layer, top-{c.num_experts_per_tok} softmax router (weights renormalised), SwiGLU experts with intermediate size {c.intermediate_size} |
| vocabulary | {c.vocab_size} (Mixtral-8x7B v0.1 SentencePiece tokenizer, `tokenizer.model`) |
| embeddings | input embedding and LM head tied (`tie_word_embeddings: true`, no `lm_head.weight` tensor) |
| parameters | {n_params:,} ({n_params - c.num_hidden_layers * (c.num_local_experts - c.num_experts_per_tok) * 3 * c.hidden_size * c.intermediate_size:,} active per token) |
| storage | `model.safetensors`, bfloat16, Hugging Face Hub tensor names (one tensor per expert: `model.layers.N.block_sparse_moe.experts.E.w1/w2/w3.weight`) |

## Training

- Data: WikiText-2 raw, *test* split (`wikitext-2-raw-v1`, as shipped in moekit's shared data: empty rows
  removed, CR stripped, split into lines). Lines 1..{args.split_line - 1} ({args.train_tokens:,} tokens) are the training
  text; the held-out slice is lines {args.split_line}..{args.n_lines} ({args.val_tokens:,} tokens), starting at the first
  article heading at or after 90 % of the lines. Each part is tokenized as one string, no BOS.
- Objective: next-token cross-entropy + {args.aux_coef} x Mixtral's router load-balancing loss.
- AdamW (betas 0.9/0.95, weight decay {args.weight_decay} on matrices), peak LR {args.lr}, {args.warmup} warm-up steps,
  cosine decay to 10 % from step {args.schedule_start} to step {args.steps}; batch {args.batch} x {args.seq} tokens
  sampled at random offsets; gradient clipping 1.0; float32 training, bfloat16 export.
- Seed: {args.seed}. {args.threads} CPU threads (`torch.set_num_threads({args.threads})`, `OMP_WAIT_POLICY=PASSIVE`);
  the schedule and the checks are by step, so a re-run with the same flags and thread count repeats the run
  (bitwise only on the same CPU and library versions; `--minutes` is a safety stop).{(chr(10) + '- ' + args.phase_note) if args.phase_note else ''}
- Evaluation: every {args.eval_every} steps on the first {args.eval_tokens} held-out tokens; the checkpoint with the best
  such loss is kept. `training_log.json` has the full history.

## Results

{results}

## Files

`config.json` (transformers 5 layout; RoPE base both as `rope_parameters.rope_theta` and top-level
`rope_theta`), `model.safetensors` (bf16), `tokenizer.model` + `LICENCE-mistral-common`, `training_log.json`
(arguments and the loss history), `reference.json` (written when training finishes: what transformers
computes from this checkpoint in float32 — 32 greedy tokens after `"{REFERENCE_PROMPT}"`, top-5 logits and
router logits at every position, the held-out loss of the first 1024 tokens — for the engine's tests).

## Licence

- **Weights** (`model.safetensors`): derived from WikiText-2, which is licensed under the Creative Commons
  Attribution-ShareAlike 3.0 Unported licence (CC BY-SA 3.0; WikiText by Merity et al., 2016, from Wikipedia
  articles). The weights are therefore distributed under **CC BY-SA 3.0**
  (https://creativecommons.org/licenses/by-sa/3.0/). Attribution: WikiText-2 (Stephen Merity, Caiming Xiong,
  James Bradbury, Richard Socher, "Pointer Sentinel Mixture Models", 2016) and the Wikipedia contributors.
- **Tokenizer** (`tokenizer.model`): Mixtral-8x7B v0.1 tokenizer from mistralai/mistral-common, Apache-2.0,
  licence text in `LICENCE-mistral-common`.
- The code that produced them (`scripts/train_tiny_moe.py`) is part of moekit and under moekit's licence.
"""


if __name__ == "__main__":
    main()
