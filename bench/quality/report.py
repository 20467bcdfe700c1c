#!/usr/bin/env python3
"""Turns scripts/quality.sh's moe-run --perplexity --json outputs into bench/quality/results.csv,
results.md (the table), quality.svg (KL and perplexity of the precision mixes) and
quality-mobile.svg (MoBiLE's gamma sweep), each with a PNG beside it when an SVG converter is
installed; the plots are drawn by moe-plot (argv[6]). Called by scripts/quality.sh."""
import csv
import json
import sys
from pathlib import Path


def load(path):
    text = Path(path).read_text()
    return json.loads(text[text.index("{"):])


def shares(counts):
    """"q4:77% q8:23%" from {precision: count}."""
    total = sum(counts.values()) or 1
    return " ".join(f"{k}:{100 * v / total:.0f}%" for k, v in counts.items())


def table_counts(path):
    """Experts per precision in a moekit-precision-table (score/static_bitwidth.hpp)."""
    counts = {}
    lines = [l.split("#")[0].split() for l in Path(path).read_text().splitlines()]
    for words in [w for w in lines if w][2:]:  # after the header and the `layers L experts E` line
        for p in words:
            counts[p] = counts.get(p, 0) + 1
    return dict(sorted(counts.items()))


def misses_column(misses, args):
    """The misses' precisions; a run without misses (every expert resident from the start: the
    warm start, EdgeMoE's buffer initialisation) says so, with the widths it ran at when a
    --bitwidth-table or --precision fixes them."""
    if misses:
        return shares(misses)
    words = args.split()
    if "--bitwidth-table" in words:
        return "none (resident at the table's " + shares(table_counts(
            words[words.index("--bitwidth-table") + 1])) + ")"
    if "--precision" in words:
        return f"none (resident at {words[words.index('--precision') + 1]})"
    return "none"


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
            "misses_by_precision": misses_column(misses, args),
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
          "| config | mode | tokens | perplexity | Δppl % | KL mean | KL max | top-1 agree | fallback ratio | misses by precision | skipped |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['config']} | {r['mode']} | {r['tokens']} | {r['perplexity']:.3f} | "
                  f"{r['ppl_increase_pct']:+.3f} | {r['kl_mean']:.2e} | {r['kl_max']:.3f} | "
                  f"{100 * r['top1_agreement']:.2f} % | {r['fallback_ratio']:.3f} | "
                  f"{r['misses_by_precision']} | {r['skipped']} |")
    (out / "results.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))

    # The plots: moe-plot (tools/svg_plot.hpp, the same plots as moe-sim's), its path in argv[6].
    if len(sys.argv) <= 6:
        print("report.py: no moe-plot given: no plots", file=sys.stderr)
        return
    plots(rows, out, sys.argv[6])


def plots(rows, out, moe_plot):
    """quality.svg and quality-mobile.svg from the table's rows."""
    # One series per family and mode (prefill and decode runs score other tokens); a KL below
    # 1e-9 (f16 against f32: rounding) is left out, not drawn as a point decades below the rest.
    mixes = [r for r in rows if r["family"] != "mobile" and r["kl_mean"] > 1e-9]
    groups = []
    for r in mixes:
        if (r["family"], r["mode"]) not in groups:
            groups.append((r["family"], r["mode"]))
    series = []
    for f, mode in groups:
        pts = sorted((r for r in mixes if (r["family"], r["mode"]) == (f, mode)),
                     key=lambda r: r["ppl_increase_pct"])
        series.append({"name": f"{f}, {mode}", "family": f,
                       "x": [r["ppl_increase_pct"] for r in pts],
                       "y": [r["kl_mean"] for r in pts]})
    plot(moe_plot, out / "quality.svg", {
        "title": "precision mixes: quality loss against f32", "log_y": True,
        "x_label": "perplexity increase over f32 (%)",
        "y_label": "mean KL vs f32 (nats/token)", "series": series})
    mob = sorted((r for r in rows if r["family"] == "mobile"), key=lambda r: r["fallback_ratio"])
    if mob:
        plot(moe_plot, out / "quality-mobile.svg", {
            "title": "MoBiLE gamma sweep (decode)", "log_y": True,
            "x_label": "fallback ratio (tokens recomputed with the full top-k)",
            "y_label": "mean KL vs f32 (nats/token)",
            "series": [{"name": "mobile", "family": "mobile",
                        "x": [r["fallback_ratio"] for r in mob],
                        "y": [r["kl_mean"] if r["kl_mean"] > 1e-9 else None for r in mob]}]})


def plot(moe_plot, svg, spec):
    """One plot through moe-plot (an SVG, and a PNG beside it when a converter is installed)."""
    import subprocess
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        subprocess.run([moe_plot, "--spec", f.name, "--out", str(svg), "--force"], check=True,
                       stdout=sys.stderr)
    finally:
        Path(f.name).unlink()

if __name__ == "__main__":
    main()
