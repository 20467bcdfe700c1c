#!/usr/bin/env python3
"""Turns scripts/quality.sh's moe-run --perplexity --json outputs into bench/quality/results.csv,
results.md (the table) and quality.svg (the plot). Called by scripts/quality.sh; plotting only
needs matplotlib."""
import csv
import json
import sys
from pathlib import Path


def load(path):
    text = Path(path).read_text()
    return json.loads(text[text.index("{"):])


def main():
    index, ref_prefill, ref_decode, out, sha = sys.argv[1:6]
    out = Path(out)
    refs = {"prefill": load(ref_prefill), "decode": load(ref_decode)}
    rows = []
    for line in Path(index).read_text().splitlines():
        name, family, args, path = line.split("\t")
        j = load(path)
        ref = refs[j["mode"]]
        misses = j.get("misses_by_precision", {})
        total = sum(misses.values()) or 1
        rows.append({
            "config": name,
            "family": family,
            "mode": j["mode"],
            "tokens": j["tokens"],
            "perplexity": j["perplexity"],
            "ref_perplexity": ref["perplexity"],
            "ppl_increase_pct": 100 * (j["perplexity"] / ref["perplexity"] - 1),
            "kl_mean": j["kl_mean"],
            "kl_max": j["kl_max"],
            "top1_agreement": j["top1_agreement"],
            "fallback_ratio": j["fallback_ratio"],
            "loads_by_precision": " ".join(f"{k}:{100 * v / total:.0f}%" for k, v in misses.items()),
            "skipped": j["skipped"],
            "hit_rate": j["hit_rate"],
            "seconds": j["seconds"],
            "moe_run_args": args,
        })
    fields = list(rows[0].keys())
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})

    md = [f"Model `models/moekit-tiny-moe` (model.safetensors sha256 {sha[:16]}…); "
          f"f32 reference perplexity {refs['prefill']['perplexity']:.3f} (prefill, "
          f"{refs['prefill']['tokens']} tokens), {refs['decode']['perplexity']:.3f} (decode, "
          f"{refs['decode']['tokens']} tokens).", "",
          "| config | mode | tokens | perplexity | Δppl % | KL mean | KL max | top-1 agree | fallback ratio | expert loads by precision | skipped |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['config']} | {r['mode']} | {r['tokens']} | {r['perplexity']:.3f} | "
                  f"{r['ppl_increase_pct']:+.3f} | {r['kl_mean']:.2e} | {r['kl_max']:.3f} | "
                  f"{100 * r['top1_agreement']:.2f} % | {r['fallback_ratio']:.3f} | "
                  f"{r['loads_by_precision']} | {r['skipped']} |")
    (out / "results.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))

    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "moekit"  # reproducible SVG ids
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
    mix = [r for r in rows if r["family"] != "mobile"]
    colors = {"uniform": "tab:blue", "hobbit": "tab:orange", "fate": "tab:green",
              "edgemoe": "tab:purple"}
    a.barh([f"{r['config']} ({r['mode']})" for r in mix], [max(r["kl_mean"], 1e-9) for r in mix],
           color=[colors.get(r["family"], "gray") for r in mix])
    a.set_xscale("log")
    a.invert_yaxis()
    a.set_xlabel("mean KL divergence vs f32 (nats / token, log scale)")
    a.set_title("Precision mixes")
    mob = sorted((r for r in rows if r["family"] == "mobile"), key=lambda r: r["fallback_ratio"])
    if mob:
        b.plot([r["fallback_ratio"] for r in mob], [r["kl_mean"] for r in mob], "o-", color="tab:red")
        for r in mob:
            b.annotate("γ=" + r["config"].split("-")[-1], (r["fallback_ratio"], r["kl_mean"]),
                       textcoords="offset points", xytext=(4, 4), fontsize=8)
        b.set_xlabel("fallback ratio (tokens recomputed with the full top-k)")
        b.set_ylabel("mean KL divergence vs f32")
        b.set_title("MoBiLE γ sweep (decode)")
        b.grid(alpha=0.3)
    fig.suptitle("moekit-tiny-moe on its held-out WikiText-2 text")
    fig.tight_layout()
    fig.savefig(out / "quality.svg", metadata={"Date": None})
    if len(sys.argv) > 6:  # a PNG preview, e.g. for a quick look
        fig.savefig(sys.argv[6], dpi=80)


if __name__ == "__main__":
    main()
