#!/usr/bin/env bash
# Offloaded decode at real size (issue 21, point 1): moe-run against llama.cpp on the same
# random-weight GGUF, same prompt, greedy, inside the same memory cgroup, at limits of a share of
# the file size and unlimited. Prints one table row per (model, limit, engine) and appends the raw
# JSON lines to build/scale/results.jsonl.
#
#   bench/scale/run.sh [--models mixtral-4L,mixtral-32L] [--limits 25,50,75,100] [-n 16]
#                      [--prompt-chars 600] [--engines moe-run,llama-repack,llama-norepack]
#                      [--threads 2] [--timeout 300] [--delete-models]
#
# Models are written by scripts/make_real_shape_model.sh into build/real-shape-models/ when
# missing (mixtral-32L: 26.3 GB; the disk is checked first); --delete-models removes them at the
# end. 100 = no limit. llama.cpp comes from bench/engine/llama_cpp_peer.sh's venv (built from the
# llama-cpp-python sdist: about 24 min the first time). The page cache is dropped before every
# run (root), so every run starts cold; the limit is scripts/run-in-memory-limit.sh's cgroup, in
# which page cache is charged. Both engines get the same prompt ids (moe-run's tokenisation) and
# generate -n tokens greedily; "same tokens" compares them. A run still going after --timeout
# seconds is stopped and reported with rc 124 (llama.cpp repacking under a limit thrashes).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
models=mixtral-4L limits=25,50,75,100 n=16 prompt_chars=600 threads=2 delete=0 timeout=300
engines=moe-run,llama-repack,llama-norepack
while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --limits) limits="$2"; shift 2 ;;
    -n) n="$2"; shift 2 ;;
    --prompt-chars) prompt_chars="$2"; shift 2 ;;
    --engines) engines="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --delete-models) delete=1; shift ;;
    *) echo "run.sh: unknown flag $1 (see the header)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "run.sh: needs root (cgroups, dropping the page cache)" >&2; exit 2; }
moe_run="$here/build/release/examples/moe-run/moe-run"
[[ -x "$moe_run" ]] || { cmake --preset release >/dev/null && cmake --build --preset release --target moe-run; }
venv="${LLAMA_CPP_VENV:-$here/build/llama-cpp-venv}"
if [[ "$engines" == *llama* ]]; then "$here/bench/engine/llama_cpp_peer.sh" install; fi
out="$here/build/scale"
mkdir -p "$out"
prompt="$(head -c "$prompt_chars" "$here/bench/quality/heldout.txt" | tr '\n' ' ')"

# raw_read FILE -> bytes/s at which moe-run's own loader reads the file's experts in place
# (bench/io/checkpoint_read.cpp: 16 experts, O_DIRECT, cold), the best of its readers: the disk
# as the engine sees it, which is what bounds an offloaded decode.
raw_read() {
  local bench="$here/build/release/bench/moekit_bench_checkpoint_read"
  [[ -x "$bench" ]] || cmake --build --preset release --target moekit_bench_checkpoint_read >&2
  sync && echo 3 > /proc/sys/vm/drop_caches
  "$bench" --gguf "$1" --reps 1 --experts 16 --io-threads 4 |
    awk '/^in place/ { if ($(NF-1) > best) best = $(NF-1) } END { printf "%.0f", best * 1e9 }'
}

model_file() {  # mixtral-4L -> the GGUF path, written when missing
  local arch="${1%-*}" layers="${1##*-}"
  layers="${layers%L}"
  local f="$here/build/real-shape-models/$arch-${layers}L-q4_0.gguf"
  [[ -f "$f" ]] || "$here/scripts/make_real_shape_model.sh" --arch "$arch" --layers "$layers" \
    --format gguf-q4_0 --out "$f" >&2
  echo "$f"
}

# run_one FILE LIMIT_PCT ENGINE -> prints the engine's JSON merged with the cgroup report
run_one() {
  local file="$1" pct="$2" engine="$3" size limit_args=() report="$out/report.jsonl"
  size=$(stat -c %s "$file")
  rm -f "$report"
  sync && echo 3 > /proc/sys/vm/drop_caches
  local limit=$((size / 100 * pct))
  [[ "$pct" -ge 100 ]] && limit=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) * 1024 ))
  local cmd=()
  case "$engine" in
    moe-run) cmd=("$moe_run" -m "$file" -p "$prompt" -n "$n" --temp 0 -t "$threads" --json) ;;
    llama-repack | llama-norepack)
      local ids repack=on
      [[ "$engine" == llama-norepack ]] && repack=off
      ids=$(jq -c .prompt_ids "$out/last-moe-run.json")
      cmd=("$venv/bin/python" "$here/bench/scale/llama_cpp_decode.py" "$file" --prompt-ids "$ids"
           -n "$n" --threads "$threads" --repack "$repack") ;;
  esac
  local json rc=0
  json=$("$here/scripts/run-in-memory-limit.sh" --limit "$limit" --report "$report" -- timeout "$timeout" "${cmd[@]}" \
         2> "$out/last-$engine.err") || rc=$?
  [[ "$engine" == moe-run && $rc -eq 0 ]] && echo "$json" > "$out/last-moe-run.json"
  [[ $rc -eq 0 ]] || json='{}'
  jq -c --argjson r "$(tail -1 "$report")" --arg e "$engine" --arg m "$(basename "$file")" \
     --argjson pct "$pct" --argjson rc "$rc" \
     '{model: $m, limit_pct: $pct, engine: $e, rc: $rc, cgroup: $r,
       prefill_tps: .prefill_tokens_per_s, decode_tps: .decode_tokens_per_s,
       prompt_tokens: .prompt_tokens, tokens: (.token_ids // .tokens),
       budget: .expert_budget_auto, hit_rate: .hit_rate,
       decode_bytes_per_token: (if .decode_bytes_loaded then .decode_bytes_loaded /
                                ((.generated_tokens // 2) - 1) else null end)}' <<< "$json"
}

cpu=$(lscpu | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2; exit}')
echo "# $(date -u +%F) | CPU: $cpu (family $(lscpu | awk -F: '/CPU family/ {gsub(/ /, "", $2); print $2}')) | $threads threads | -n $n | prompt ${prompt_chars} chars"
printf "| model | limit | engine | rc | peak GiB | OOM | read GiB | prompt | prefill tok/s | decode tok/s | same tokens | MB read per decode token | I/O bound tok/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
IFS=, read -ra model_list <<< "$models"
IFS=, read -ra limit_list <<< "$limits"
IFS=, read -ra engine_list <<< "$engines"
for m in "${model_list[@]}"; do
  file=$(model_file "$m")
  raw=$(raw_read "$file")
  rows=()
  for pct in "${limit_list[@]}"; do
    ref_tokens=""
    for e in "${engine_list[@]}"; do
      echo "run.sh: $m at ${pct}% with $e ..." >&2
      row=$(run_one "$file" "$pct" "$e" | jq -c --argjson raw "$raw" '. + {raw_read_bps: $raw}')
      echo "$row" >> "$out/results.jsonl"
      rows+=("$row")
      toks=$(jq -c .tokens <<< "$row")
      [[ "$e" == moe-run ]] && ref_tokens="$toks"
      same="-"
      [[ "$e" != moe-run && -n "$ref_tokens" && "$toks" != null ]] &&
        same=$([[ "$toks" == "$ref_tokens" ]] && echo yes || echo "no")
      jq -r --arg same "$same" '"| \(.model) | \(if .limit_pct >= 100 then "none" else "\(.limit_pct)%" end) | \(.engine) | \(.rc) | \(.cgroup.peak_bytes / 1073741824 * 100 | round / 100) | \(.cgroup.oom_kills // 0) | \((.cgroup.read_bytes // 0) / 1073741824 * 10 | round / 10) | \(.prompt_tokens // "-") | \(.prefill_tps // 0 | . * 100 | round / 100) | \(.decode_tps // 0 | . * 100 | round / 100) | \($same) | \(if .decode_bytes_per_token then (.decode_bytes_per_token / 1e6 | round) else "-" end) | \(if (.decode_bytes_per_token // 0) > 0 then (.raw_read_bps / .decode_bytes_per_token * 100 | round / 100) else "-" end) |"' <<< "$row"
    done
  done
  # The serial bound 1/(1/compute + 1/I-O) of each limited moe-run row (I/O = the loader's read
  # rate ÷ bytes read per decode token), with compute = the
  # unlimited run's decode when it read nothing while decoding (every expert resident).
  printf '%s\n' "${rows[@]}" | jq -rs --argjson raw "$raw" '
    (map(select(.engine == "moe-run" and .limit_pct >= 100 and (.decode_bytes_per_token // 1) == 0))
     | first | .decode_tps) as $compute
    | "expert read rate of the moe-run loader on \(.[0].model): \($raw / 1e9 * 100 | round / 100) GB/s; compute bound (every expert resident): \(if $compute then ($compute * 100 | round / 100) else null end // "not measured (the unlimited run read experts while decoding)")",
      (.[] | select(.engine == "moe-run" and .limit_pct < 100 and $compute != null and (.decode_bytes_per_token // 0) > 0)
       | (1 / (1 / $compute + .decode_bytes_per_token / $raw)) as $bound
       | "  \(.limit_pct)%: serial bound \($bound * 100 | round / 100) tok/s, moe-run at \(.decode_tps / $bound * 100 | round)% of it")'

  [[ $delete -eq 1 ]] && rm -f "$file"
done
