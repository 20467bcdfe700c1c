#!/usr/bin/env bash
# The loss moe-run measures when it converts GGUF K-quant experts into a store (issue 20, point 2;
# at --precision auto, K-quant experts (Q2_K..Q6_K) are read in place and nothing is converted;
# include/moekit/engine/conversion_loss.hpp): the default model written as GGUF by
# bench/engine/llama_cpp_gguf.py, quantized by llama.cpp's own quantizer (llama-cpp-python's
# llama_model_quantize, the mixes a downloaded Q4_K_M / Q6_K / Q2_K file holds), then run by
# moe-run at --precision auto and at each moekit format; prints KL(exact || converted), top-1
# agreement and perplexities as one Markdown table.
#
#   bench/quality/conversion_loss.sh [MOE_RUN] [TYPES...]   (default TYPES: Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K)
#
# The venv is bench/engine/llama_cpp_peer.sh's ($LLAMA_CPP_VENV, default build/llama-cpp-venv;
# `bench/engine/llama_cpp_peer.sh install` makes it). The GGUFs are rewritten on every run (so
# moe-run rebuilds its stores and measures again rather than printing its records) into
# $OUT (default build/conversion-loss).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${LLAMA_CPP_VENV:-$here/build/llama-cpp-venv}"
out="${OUT:-$here/build/conversion-loss}"
moe_run="${1:-$here/build/release/examples/moe-run/moe-run}"
shift || true
types=("$@")
[[ ${#types[@]} -gt 0 ]] || types=(Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K)
py="$venv/bin/python"
"$py" -c "import llama_cpp, gguf" 2>/dev/null ||
  { echo "$venv lacks llama_cpp or gguf: run bench/engine/llama_cpp_peer.sh install" >&2; exit 1; }
[[ -x "$moe_run" ]] || { echo "no moe-run at $moe_run (build the moe-run target)" >&2; exit 1; }
mkdir -p "$out"
# One table row from moe-run's --json: the converted precision the run used.
row=$(cat <<'PY'
import json, sys
j = json.load(sys.stdin)
c = j.get("conversion_loss")
if c is None:  # K-quants at their own types: read in place, nothing converted
    assert j["expert_source"].startswith("in place"), j["expert_source"]
    print(f"| {sys.argv[1]} | as in the file | {j['precision']} (auto) | none: read in place "
          f"| 0 | 0 | 100% | exact |")
    sys.exit(0)
assert c["measured"], c
if c["from_record"] and sys.argv[2] != "auto":
    sys.exit(0)  # the store auto chose, measured a moment ago: its row is printed
store = j["expert_source"].rsplit("/", 1)[-1]
auto = " (auto)" if sys.argv[2] == "auto" else ""
for e in c["precisions"]:
    if e["precision"] == j["precision"]:
        print(f"| {sys.argv[1]} | {c['source_types']} | {e['precision']}{auto} | {store} "
              f"| {e['kl_mean']:.6f} | {e['kl_max']:.4f} | {100 * e['top1_agreement']:.1f}% "
              f"| {e['perplexity']:.2f} / {c['reference_perplexity']:.2f} |")
PY
)
"$py" "$here/bench/engine/llama_cpp_gguf.py" "$here/models/moekit-tiny-moe" "$out/tiny-f32.gguf" f32 >&2

echo "| file type | experts in the file | moekit format | store | mean KL (nats/token) | max KL | top-1 agreement | perplexity converted / exact |"
echo "|---|---|---|---|---|---|---|---|"
for t in "${types[@]}"; do
  f="$out/tiny-$t.gguf"
  "$py" - "$out/tiny-f32.gguf" "$f" "$t" <<'PY'
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
p.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
PY
  for precision in auto q8 q4 q2; do
    "$moe_run" -m "$f" -p "The" -n 1 --json --precision "$precision" 2>/dev/null |
      python3 -c "$row" "$t" "$precision"
  done
done
echo
echo "KL over the first 256 tokens of bench/quality/heldout.txt in chunks of 128, reference = the file's experts at their exact (dequantized, f32) values; dense part shared."
