#!/usr/bin/env bash
# Offloaded decode at real size (issue 21, point 1): moe-run against llama.cpp on the same
# random-weight GGUF, same prompt, greedy, inside the same memory cgroup, at limits of a share of
# the file size and unlimited. Prints one table row per (model, limit, engine) and appends the raw
# JSON lines to build/scale/results.jsonl.
#
#   bench/scale/run.sh [--models mixtral-32L,olmoe-16L] [--limits 25,50,75,100]
#                      [-n 16] [--prompt-tokens 128] [--long-prompt 512]
#                      [--engines moe-run,llama-repack,llama-norepack]
#                      [--threads 2] [--timeout 300] [--no-check] [--delete-models]
#                      [--kv-type f16|f32] [--moe-run-args "FLAGS"]
#
# --moe-run-args "FLAGS": more flags for every moe-run run (split on spaces), e.g.
# "--expert-layout rows" to compare a choice against llama.cpp in the same grid.
# --kv-type T: both engines keep their KV cache at T (moe-run --kv-type, llama.cpp's
# --cache-type-k/-v; default f16, llama.cpp's own default), so a long-context decode reads the
# same bytes per cached position on both sides; the header line says which.
# --prompt-tokens N: the prompt is the first N-1 tokens of bench/quality/heldout.txt (+ BOS);
# --long-prompt N adds one more run per engine at no limit with an N-token prompt (prefill speed
# at 512 tokens; 0 = none). After the grid, unless --no-check, llama.cpp evaluates the prompt
# plus moe-run's greedy tokens in one batch (teacher forcing, no limit) and reports, per
# generated position, whether moe-run's token is llama.cpp's argmax too and, where not, how far
# below llama.cpp's best logit it lies in units of the logits' standard deviation: random
# weights give near ties, so equal greedy sequences are not expected past the first near tie.
#
# Models are written by scripts/make_real_shape_model.sh into build/real-shape-models/ when
# missing (mixtral-32L: 26.3 GB, olmoe-16L: 3.9 GB; the disk is checked first); --delete-models
# removes them at the end. Per model, build/scale/MODEL-decode.svg (and a PNG beside it when
# rsvg-convert or ImageMagick is installed) plots decode tok/s against the limit per engine. The
# default grid (both models) takes 36 minutes on 2 Zen 5 cores (each model's run time is in its
# bench/RESULTS.md section); mixtral-4L (3.4 GB) is the quick one. 100 = no limit. llama.cpp comes
# from bench/engine/llama_cpp_peer.sh's venv (built from the llama-cpp-python sdist once, the
# first time: tens of minutes). The page cache is dropped before every
# run (root), so every run starts cold; the limit is scripts/run-in-memory-limit.sh's cgroup, in
# which page cache is charged. Both engines get the same prompt ids (moe-run's tokenisation) and
# generate -n tokens greedily; "same tokens" compares them. A run still going after --timeout
# seconds is stopped and reported with rc 124 (llama.cpp repacking under a limit thrashes), with
# the prefill and decode speed it had reached when it was stopped, if any.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
models=mixtral-32L,olmoe-16L limits=25,50,75,100 n=16 prompt_tokens=128 long_prompt=512 threads=2
delete=0 timeout=300 check=1 kv_type=f16 moe_run_args=
engines=moe-run,llama-repack,llama-norepack
while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --limits) limits="$2"; shift 2 ;;
    -n) n="$2"; shift 2 ;;
    --prompt-tokens) prompt_tokens="$2"; shift 2 ;;
    --long-prompt) long_prompt="$2"; shift 2 ;;
    --no-check) check=0; shift ;;
    --engines) engines="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --delete-models) delete=1; shift ;;
    --kv-type) kv_type="$2"; shift 2 ;;
    --moe-run-args) moe_run_args="$2"; shift 2 ;;
    *) echo "run.sh: unknown flag $1 (see the header)" >&2; exit 2 ;;
  esac
done
[[ "$kv_type" == f16 || "$kv_type" == f32 ]] ||
  { echo "run.sh: --kv-type: '$kv_type' is not one of f16, f32" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "run.sh: needs root (cgroups, dropping the page cache)" >&2; exit 2; }
moe_run="$here/build/release/examples/moe-run/moe-run"
bound_bench="$here/build/release/bench/moekit_bench_decode_bound"
moe_plot="$here/build/release/examples/moe-plot/moe-plot"
[[ -x "$moe_run" && -x "$bound_bench" && -x "$moe_plot" ]] || { cmake --preset release >/dev/null &&
  cmake --build --preset release --target moe-run moekit_bench_decode_bound moe-plot; }
venv="${LLAMA_CPP_VENV:-$here/build/llama-cpp-venv}"
if [[ "$engines" == *llama* ]]; then "$here/bench/engine/llama_cpp_peer.sh" install; fi
out="$here/build/scale"
mkdir -p "$out"
# prompt_text N -> the first N-1 tokens of the held-out text (moe-run adds BOS), decoded from
# the tokenizer every generated model carries (Mixtral's, models/moekit-tiny-moe/).
prompt_text() {
  "$here/build/real-shape-venv/bin/python" - "$1" "$here/models/moekit-tiny-moe/tokenizer.model" \
    "$here/bench/quality/heldout.txt" <<'PY'
import sys, sentencepiece as spm
n, model, text = int(sys.argv[1]), sys.argv[2], open(sys.argv[3]).read().replace("\n", " ")
sp = spm.SentencePieceProcessor(model_file=model)
ids = sp.encode(text)
if len(ids) < n - 1: raise SystemExit(f"{sys.argv[3]} has only {len(ids)} tokens")
print(sp.decode(ids[: n - 1]))
PY
}

source "$here/bench/scale/models.sh"  # model_file, raw_read

# run_one FILE LIMIT_PCT ENGINE PROMPT -> prints the engine's JSON merged with the cgroup report
run_one() {
  local file="$1" pct="$2" engine="$3" prompt="$4" size report="$out/report.jsonl"
  size=$(stat -c %s "$file")
  rm -f "$report"
  sync && echo 3 > /proc/sys/vm/drop_caches
  local limit=$((size / 100 * pct))
  [[ "$pct" -ge 100 ]] && limit=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) * 1024 ))
  local cmd=()
  case "$engine" in
    moe-run) cmd=("$moe_run" -m "$file" -p "$prompt" -n "$n" --temp 0 -t "$threads" --json
                  --kv-type "$kv_type")
             # shellcheck disable=SC2206  # flags split on spaces, as documented
             [[ -n "$moe_run_args" ]] && cmd+=($moe_run_args) ;;
    llama-repack | llama-norepack)
      local ids repack=on
      [[ "$engine" == llama-norepack ]] && repack=off
      ids=$(jq -c .prompt_ids "$out/last-moe-run.json")
      cmd=("$venv/bin/python" "$here/bench/scale/llama_cpp_decode.py" "$file" --prompt-ids "$ids"
           -n "$n" --threads "$threads" --repack "$repack" --kv-type "$kv_type"
           --progress "$out/progress.json") ;;
  esac
  local json rc=0
  rm -f "$out/progress.json"
  json=$("$here/scripts/run-in-memory-limit.sh" --limit "$limit" --report "$report" -- timeout "$timeout" "${cmd[@]}" \
         2> "$out/last-$engine.err") || rc=$?
  [[ "$engine" == moe-run && $rc -eq 0 ]] && echo "$json" > "$out/last-moe-run.json"
  # SIGILL: llama.cpp's AMX kernels die so on the Xeon VMs seen here (bench/RESULTS.md,
  # "Everything resident on the OLMoE-1B-7B shape, Emerald Rapids": a build without AMX runs).
  [[ "$engine" == llama* && $rc -eq 132 ]] &&
    echo "run.sh: llama.cpp died of SIGILL (its AMX kernels?); see $out/last-$engine.err" >&2
  # A llama.cpp run stopped by the timeout reports what it measured before (partial: true).
  [[ $rc -eq 0 ]] || json=$(cat "$out/progress.json" 2> /dev/null || echo '{}')
  jq -c --argjson r "$(tail -1 "$report")" --arg e "$engine" --arg m "$(basename "$file")" \
     --argjson pct "$pct" --argjson rc "$rc" \
     '{model: $m, limit_pct: $pct, engine: $e, rc: $rc, cgroup: $r, partial: (.partial // false),
       prefill_tps: .prefill_tokens_per_s, decode_tps: .decode_tokens_per_s,
       prompt_tokens: .prompt_tokens, tokens: (.token_ids // .tokens),
       budget: .expert_budget_auto, hit_rate: .hit_rate,
       decode_bytes_per_token: (if .decode_bytes_loaded then .decode_bytes_loaded /
                                ((.generated_tokens // 2) - 1)
                                elif .decode_read_bytes then .decode_read_bytes / (.tokens | length - 1)
                                else null end)}' <<< "$json"
}

# common_prefix A B -> how many leading tokens two JSON arrays share, as "k/n"
common_prefix() {
  jq -rn --argjson a "$1" --argjson b "$2" \
    '[range([$a, $b] | map(length) | min)] | map(select($a[.] != $b[.])) | (first // ([$a, $b] | map(length) | min)) as $k | "\($k)/\($a | length)"'
}

print_row() {  # ROW_JSON SAME
  jq -r --arg same "$2" '"| \(.model) | \(if .limit_pct >= 100 then "none" else "\(.limit_pct)%" end) | \(.engine) | \(.rc) | \(.cgroup.peak_bytes / 1073741824 * 100 | round / 100) | \(.cgroup.oom_kills // 0) | \((.cgroup.read_bytes // 0) / 1073741824 * 10 | round / 10) | \(.prompt_tokens // "-") | \(.prefill_tps // 0 | . * 100 | round / 100) | \(.decode_tps // 0 | . * 100 | round / 100)\(if .partial then " (\(.tokens | length - 1) tokens before the timeout)" else "" end) | \($same) | \(if .decode_bytes_per_token then (.decode_bytes_per_token / 1e6 | round) else "-" end) | \(if (.decode_bytes_per_token // 0) > 1e6 then (.raw_read_bps / .decode_bytes_per_token * 100 | round / 100) else "-" end) |"' <<< "$1"
}

# grid_cell FILE PCT PROMPT -> runs every engine at one limit, prints their rows
grid_cell() {
  local file="$1" pct="$2" prompt="$3" ref_tokens="" row toks same e
  for e in "${engine_list[@]}"; do
    echo "run.sh: $(basename "$file") at ${pct}% with $e ($(date -u +%T)) ..." >&2
    row=$(run_one "$file" "$pct" "$e" "$prompt" | jq -c --argjson raw "$raw" '. + {raw_read_bps: $raw}')
    echo "$row" >> "$out/results.jsonl"
    rows+=("$row")
    toks=$(jq -c .tokens <<< "$row")
    [[ "$e" == moe-run ]] && ref_tokens="$toks"
    same="-"
    [[ "$e" != moe-run && -n "$ref_tokens" && "$ref_tokens" != null && "$toks" != null ]] &&
      same=$(common_prefix "$ref_tokens" "$toks")
    print_row "$row" "$same"
  done
}

# agreement FILE -> llama.cpp's teacher-forced view of moe-run's last greedy tokens
agreement() {
  local ids toks
  ids=$(jq -c .prompt_ids "$out/last-moe-run.json")
  toks=$(jq -c .token_ids "$out/last-moe-run.json")
  sync && echo 3 > /proc/sys/vm/drop_caches
  "$venv/bin/python" "$here/bench/scale/llama_cpp_decode.py" "$1" --prompt-ids "$ids" \
    --check-tokens "$toks" --threads "$threads" --repack off --kv-type "$kv_type" 2> "$out/last-check.err" |
    jq -r '"greedy agreement on \(.model): llama.cpp (teacher-forced on moe-run'"'"'s prompt and tokens) has moe-run'"'"'s token as its argmax at \(.argmax_agree)/\(.positions) positions; where not, it lies \(.worst_gap_in_std | . * 1000 | round / 1000) std of the logits below the best (largest gap)"' ||
    echo "greedy agreement on $(basename "$1"): the check failed (see $out/last-check.err)"
}

# plot_decode MODEL -> build/scale/MODEL-decode.svg (and .png): decode tok/s against the memory
# limit, one line per engine, at the grid's prompt length, by moe-plot (tools/svg_plot.hpp).
plot_decode() {
  [[ -x "$moe_plot" ]] || { echo "no plot: $moe_plot was not built" >&2; return 0; }
  printf '%s\n' "${rows[@]}" | jq -s --arg m "$1" --argjson pt "$prompt_tokens" '
    map(select(.prompt_tokens == $pt or .prompt_tokens == null)) as $r
    | {title: "decode vs memory limit: \($m)", x_label: "memory limit (% of the file; 100 = none)",
       y_label: "decode tokens/s", x_ticks: ($r | map(.limit_pct) | unique),
       series: ($r | map(.engine) | unique | map(. as $e | {name: $e, family: $e,
         x: ($r | map(select(.engine == $e)) | sort_by(.limit_pct) | map(.limit_pct)),
         y: ($r | map(select(.engine == $e)) | sort_by(.limit_pct) | map(.decode_tps))}))}' \
    > "$out/$1-decode-plot.json"
  "$moe_plot" --spec "$out/$1-decode-plot.json" --out "$out/$1-decode.svg" --force >&2
}

cpu=$(lscpu | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2; exit}')
prompt=$(prompt_text "$prompt_tokens")
long=""
[[ "$long_prompt" -gt 0 ]] && long=$(prompt_text "$long_prompt")
echo "# $(date -u +%F) | CPU: $cpu (family $(lscpu | awk -F: '/CPU family/ {gsub(/ /, "", $2); print $2}'), model $(lscpu | awk -F: '/^Model:/ {gsub(/ /, "", $2); print $2}')) | $threads threads | KV cache $kv_type on both engines (moe-run --kv-type, llama.cpp --cache-type-k/-v) | -n $n | prompt $prompt_tokens tokens (long: $long_prompt) | moe-run flags: ${moe_run_args:-none} | load average at start: $(cut -d" " -f1-3 /proc/loadavg)"
printf "| model | limit | engine | rc | peak GiB | OOM | read GiB | prompt | prefill tok/s | decode tok/s | same first tokens | MB read per decode token | I/O bound tok/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
IFS=, read -ra model_list <<< "$models"
IFS=, read -ra limit_list <<< "$limits"
IFS=, read -ra engine_list <<< "$engines"
for m in "${model_list[@]}"; do
  file=$(model_file "$m")
  raw=$(raw_read "$file")
  rows=()
  for pct in "${limit_list[@]}"; do grid_cell "$file" "$pct" "$prompt"; done
  [[ $check -eq 1 && "$engines" == *llama* && -f "$out/last-moe-run.json" ]] && agreement "$file"
  [[ -n "$long" ]] && grid_cell "$file" 100 "$long"
  # The serial bound 1/(1/compute + 1/I-O) of each limited moe-run row (I/O = the loader's read
  # rate ÷ bytes read per decode token), with compute = the unlimited run's decode when it read
  # nothing while decoding (every expert resident), at the grid's prompt length (not --long-prompt).
  printf '%s\n' "${rows[@]}" | jq -rs --argjson raw "$raw" '
    (map(select(.engine == "moe-run" and .limit_pct >= 100 and (.decode_bytes_per_token // 1) == 0))
     | min_by(.prompt_tokens) | .decode_tps) as $compute
    | "expert read rate of the moe-run loader on \(.[0].model): \($raw / 1e9 * 100 | round / 100) GB/s; compute bound (every expert resident): \(if $compute then ($compute * 100 | round / 100) else null end // "not measured (the unlimited run read experts while decoding)")",
      (.[] | select(.engine == "moe-run" and .limit_pct < 100 and $compute != null and (.decode_bytes_per_token // 0) > 0)
       | (1 / (1 / $compute + .decode_bytes_per_token / $raw)) as $bound
       | "  \(.limit_pct)%: serial bound \($bound * 100 | round / 100) tok/s, moe-run at \(.decode_tps / $bound * 100 | round)% of it")'

  # Everything resident: each engine's decode against the memory bound (decode_bound.cpp: the bytes
  # a token reads with every expert resident, over this machine's streaming read on the same
  # threads), for the rows at no limit that read (almost) nothing while decoding: < 1 MB a token,
  # what llama.cpp's /proc counters show once its mapping is in the page cache.
  if bound=$("$bound_bench" "$file" --threads "$threads" 2> "$out/last-bound.err"); then
    printf '%s\n' "${rows[@]}" | jq -rs --argjson b "$bound" '
      "memory bound with every expert resident on \(.[0].model): \($b.bytes_per_token / 1e6 | round) MB per token (\($b.expert_bytes_per_token / 1e6 | round) MB of experts) at \($b.read_bytes_per_s / 1e9 * 100 | round / 100) GB/s = \($b.bound_tokens_per_s * 100 | round / 100) tok/s",
      (.[] | select(.limit_pct >= 100 and .rc == 0 and (.decode_bytes_per_token // 0) < 1e6 and .decode_tps != null)
       | "  \(.engine) (prompt \(.prompt_tokens)): decode at \(.decode_tps / $b.bound_tokens_per_s * 100 | round)% of the memory bound")'
  else
    echo "memory bound: not measured (see $out/last-bound.err)"
  fi
  plot_decode "$m"
  [[ $delete -eq 1 ]] && rm -f "$file"
done
