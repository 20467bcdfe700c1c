#!/usr/bin/env bash
# The quality harness (issue 10 point 3): perplexity and KL divergence against the f32 model for
# precision mixes and presets, on the built-in tiny model's held-out text
# (bench/quality/heldout.txt = WikiText-2 test lines 2652-2892, CC BY-SA 3.0).
#
#   scripts/quality.sh [--quick]
#
# Builds moe-run and moekit_bench_edgemoe_search in build/quality (override: MOEKIT_QUALITY_BUILD),
# then runs moe-run --perplexity for every configuration, prints a table and writes
# bench/quality/results.csv, bench/quality/results.md, bench/quality/quality.svg and
# quality-mobile.svg (moe-plot; a PNG beside each when rsvg-convert or ImageMagick is installed) and the EdgeMoE
# tables (bench/quality/edgemoe-P*.table, edgemoe.json).
#
# Protocol (docs/engine.md, "Perplexity and KL divergence"): chunks of 512 tokens, each scored after
# a BOS; KL against an f32 all-resident run's top-64 log-probs (+ a rest bucket).
#  * prefill runs: 4 chunks (2048 tokens) as one forward each;
#  * decode runs (--ppl-decode: token by token, where HOBBIT's per-token precision and MoBiLE's
#    fallback act): 2 chunks (1024 tokens);
#  * presets whose precision depends on residency (HOBBIT, Fate) run at the minimum expert budget,
#    so every demand is a miss and every expert runs at the precision the scorer picks (the worst
#    case for quality; larger budgets keep more experts at the high precision); Fate also at half
#    the budget;
#  * EdgeMoE's bit widths come from tools/bitwidth_search.hpp with the engine as evaluator
#    (loss P in % = next-token top-1 disagreement with the f32 model, EdgeMoE's "accuracy drop";
#    the perplexity of this small model moves by fractions of a percent either way under
#    quantization, which would put every expert at q2) on the first chunk only (512 tokens), to
#    stay within the time box; the tables are then scored on the full 2048 tokens.
# --quick: 1 prefill chunk, 1 decode chunk of 256 tokens, fewer gammas (a smoke test).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${MOEKIT_QUALITY_BUILD:-$root/build/quality}"
out="$root/bench/quality"
text="$out/heldout.txt"
model="$root/models/moekit-tiny-moe"
ctx=512 pchunks=4 dchunks=2 search_chunks=1
gammas="0 0.1 0.2 0.3 0.5 0.7"
if [ "${1:-}" = "--quick" ]; then ctx=256 pchunks=1 dchunks=1 gammas="0 0.5 0.9"; fi

[ -f "$model/model.safetensors" ] || { echo "quality.sh: no model at $model" >&2; exit 2; }
start=$SECONDS
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=OFF \
  -DMOEKIT_BUILD_EXAMPLES=ON -DMOEKIT_BUILD_BENCHMARKS=ON > /dev/null
cmake --build "$build" --target moe-run moe-plot moekit_bench_edgemoe_search -j2 > /dev/null
R="$build/examples/moe-run/moe-run"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(-m "$model" --in-memory --perplexity "$text" -c "$ctx" -t 2 --json)

# The smallest budget moe-run accepts at precision $1 (it names it when refusing a 1-byte budget).
min_budget() {
  { "$R" -m "$model" --in-memory --precision "$1" --expert-budget 1 -n 0 2>&1 || true; } |
    sed -n 's/.*the minimum at [a-z0-9]* is \([0-9]*\) bytes.*/\1/p'
}

# run NAME FAMILY MODE(prefill|decode) ARGS... : one moe-run --perplexity, JSON kept in $work.
run() {
  local name=$1 family=$2 mode=$3
  shift 3
  local chunks=$pchunks ref=$work/ref-prefill.mklogp decode=()
  if [ "$mode" = decode ]; then chunks=$dchunks ref=$work/ref-decode.mklogp decode=(--ppl-decode); fi
  "$R" "${common[@]}" --chunks "$chunks" "${decode[@]}" --kl-reference "$ref" "$@" \
    > "$work/run-$name.json" 2> "$work/run-$name.err" ||
    { echo "quality.sh: '$name' failed:" >&2; cat "$work/run-$name.err" >&2; exit 1; }
  printf '%s\t%s\t%s\t%s\n' "$name" "$family" "$*" "$work/run-$name.json" >> "$work/index.tsv"
  echo "  $name done ($((SECONDS - start)) s)" >&2
}

echo "quality.sh: model $(sha256sum "$model/model.safetensors" | cut -c1-16), $(git -C "$root" log -1 --format=%h -- models/moekit-tiny-moe 2> /dev/null || echo '?')" >&2
# f32 references (all experts resident): top-64 log-probs of every scored position.
"$R" "${common[@]}" --chunks "$pchunks" --precision f32 --save-logits "$work/ref-prefill.mklogp" \
  --logits-top-k 64 > "$work/ref-prefill.json"
"$R" "${common[@]}" --chunks "$dchunks" --precision f32 --save-logits "$work/ref-decode.mklogp" \
  --logits-top-k 64 > "$work/ref-decode.json"
: > "$work/index.tsv"

# Uniform precision, every expert resident.
for p in f16 q8 q4 q2; do run "all-$p" uniform prefill --precision "$p"; done
run "all-f16-decode" uniform decode --precision f16
# Quantized experts in decode with f32 and int8 activations (--activations: int8 applies to
# decode only and needs AVX-512 VNNI).
for p in q8 q4; do
  run "all-$p-decode" uniform decode --precision "$p" --activations f32
  if grep -qw avx512_vnni /proc/cpuinfo; then
    run "all-$p-int8-decode" uniform decode --precision "$p" --activations int8
  fi
done

# HOBBIT: T1/T2 cumulative-gate rule (f16 / q4 / skip), every demand a miss, decode.
b16=$(min_budget f16)
run "hobbit-t1-0.6-t2-0.9" hobbit decode --preset hobbit --precision f16 --low-precision q4 \
  --t1 0.6 --t2 0.9 --expert-budget "$b16"
run "hobbit-t1-0.6-t2-0.9-q2" hobbit decode --preset hobbit --precision f16 --low-precision q2 \
  --t1 0.6 --t2 0.9 --expert-budget "$b16"

# Fate: prefetches at q4 for the popular prefill experts, q2 for the least popular 25 %, and every
# miss at q2 in prefill as in decode (Fate §5.3; upgraded to q4 when the link is idle). At the
# minimum budget the staging area holds one expert, so nearly every expert is a q2 miss (the worst
# case); at half the budget most of a layer is prefetched into staging and the misses are few.
b4=$(min_budget q4)
run "fate-prefill-q4-q2" fate prefill --preset fate --precision q4 --low-precision q2 \
  --fate-low-fraction 0.25 --expert-budget "$b4"
run "fate-prefill-q4-q2-half" fate prefill --preset fate --precision q4 --low-precision q2 \
  --fate-low-fraction 0.25 --expert-budget 50%

# EdgeMoE: searched bit widths at P = 1 % and 5 % (search on the first chunk).
(cd "$root" && "$build/bench/moekit_bench_edgemoe_search" --moe-run "$R" --model "$model" \
  --text bench/quality/heldout.txt --ctx "$ctx" --chunks "$search_chunks" --loss top1 \
  --budget 1 --budget 5 --out-prefix bench/quality/edgemoe >&2)
for P in 1 5; do
  run "edgemoe-P$P" edgemoe prefill --preset edgemoe --precision f16 \
    --bitwidth-table "$out/edgemoe-P$P.table"
done

# MoBiLE: big-little (K/2 experts, full K on fallback), gamma sweep, decode; the fallback's big
# pass re-routed exactly (recompute), as the table in bench/RESULTS.md was measured; the paper's
# big pass on the little pass's plan (moe-run's default) is compared there too.
for g in $gammas; do
  run "mobile-gamma-$g" mobile decode --preset mobile --precision f16 --gamma "$g" --big-pass recompute
done

python3 "$out/report.py" "$work/index.tsv" "$work/ref-prefill.json" "$work/ref-decode.json" \
  "$out" "$(sha256sum "$model/model.safetensors" | cut -d' ' -f1)" "$build/examples/moe-plot/moe-plot"

# Cross-layer predictors on the recorded traces (bench/traces, bench/traces/record.sh).
if ls "$root"/bench/traces/*.mktrace > /dev/null 2>&1; then
  cmake --build "$build" --target moekit_bench_predictor_accuracy -j2 > /dev/null
  "$build/bench/moekit_bench_predictor_accuracy" --model "$model" --csv "$out/predictors.csv" \
    "$root"/bench/traces/*.mktrace | tee "$out/predictors.md"
fi
echo "quality.sh: done in $((SECONDS - start)) s" >&2
