#!/usr/bin/env python3
"""EdgeMoE's codec on the default model (issue 22): experts quantized per output channel (EdgeMoE's
default, --group-size 0) against groups of 32 (--group-size 32), both measured in this run.

    bench/quality/edgemoe_codec.py [MOE_RUN] [--rounds R] [--chunks C] [--tokens N]

Quality: moe-run --perplexity on bench/quality/heldout.txt (C chunks of 512 tokens, prefill),
--preset edgemoe with every expert at q4 and with the searched tables edgemoe-P1/P5.table, KL and
top-1 agreement against an f32 all-resident run of the same chunks. Speed: R rounds alternating
the two codecs, each a greedy decode of N tokens with every expert resident (--preset edgemoe,
--precision q4); the median decode tokens/s of each and their ratio (per channel / groups of 32).
Prints markdown tables.
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

root = Path(__file__).resolve().parents[2]


def moe_run(exe, args):
    r = subprocess.run([exe, *args, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"moe-run {' '.join(args)} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("moe_run", nargs="?", default=str(root / "build/release/examples/moe-run/moe-run"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    model = str(root / "models/moekit-tiny-moe")
    text = str(root / "bench/quality/heldout.txt")
    common = ["-m", model, "--in-memory", "-t", str(a.threads)]
    ppl = [*common, "--perplexity", text, "-c", "512", "--chunks", str(a.chunks)]
    with tempfile.TemporaryDirectory() as tmp:
        ref = f"{tmp}/ref.mklogp"
        f32 = moe_run(a.moe_run, [*ppl, "--precision", "f32", "--save-logits", ref,
                                  "--logits-top-k", "64"])
        print(f"f32 reference perplexity {f32['perplexity']:.3f} over {f32.get('tokens', '?')} tokens\n")
        print("| EdgeMoE bit widths | codec | perplexity | Δppl % | KL mean | top-1 agree | calibration |")
        print("|---|---|---|---|---|---|---|")
        tables = [("uniform q4", ["--precision", "q4"])]
        for P in (1, 5):
            tables.append((f"searched, P = {P} %", ["--precision", "f16", "--bitwidth-table",
                                                    str(root / f"bench/quality/edgemoe-P{P}.table")]))
        for name, args in tables:
            for g in ("0", "32"):
                j = moe_run(a.moe_run, [*ppl, "--preset", "edgemoe", *args, "--group-size", g,
                                        "--kl-reference", ref])
                codec = "per channel" if g == "0" else "groups of 32"
                print(f"| {name} | {codec} | {j['perplexity']:.3f} | "
                      f"{100 * (j['perplexity'] / f32['perplexity'] - 1):+.3f} | {j['kl_mean']:.2e} | "
                      f"{100 * j['top1_agreement']:.2f} % | {j.get('calibration', '-')} |")
    speed = {"0": [], "32": []}
    gen = [*common, "--preset", "edgemoe", "--precision", "q4", "-p", "The", "-n", str(a.tokens),
           "--temp", "0"]
    for _ in range(a.rounds):
        for g in ("0", "32"):
            speed[g].append(moe_run(a.moe_run, [*gen, "--group-size", g])["decode_tokens_per_s"])
    m0, m32 = statistics.median(speed["0"]), statistics.median(speed["32"])
    print(f"\n| codec | decode tokens/s (median of {a.rounds}) | all rounds |")
    print("|---|---|---|")
    for g, m in (("0", m0), ("32", m32)):
        print(f"| {'per channel' if g == '0' else 'groups of 32'} | {m:.1f} | "
              f"{', '.join(f'{v:.1f}' for v in speed[g])} |")
    print(f"\nper channel / groups of 32: {m0 / m32:.3f}")


if __name__ == "__main__":
    main()
