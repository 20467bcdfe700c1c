#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and runs each for SECONDS (default 30) from its
# seed corpus in tests/fuzz/corpus/<name>. New inputs go to a scratch copy, never into the repo;
# a crashing input is kept in build/fuzz/crashes/<name>/ and the script fails naming the target.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
scripts/install-deps.sh
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
for bin in build/fuzz/tests/fuzz/moekit_fuzz_*; do
  name=${bin##*/moekit_fuzz_}
  crashes=build/fuzz/crashes/$name
  mkdir -p "$work/$name" "$crashes"
  [[ -d tests/fuzz/corpus/$name ]] && cp -r tests/fuzz/corpus/$name/. "$work/$name/"
  echo "== fuzzing $name for ${seconds}s"
  log=$work/$name.log
  if "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$crashes/" "$work/$name" >"$log" 2>&1; then
    grep '^stat::' "$log" | head -2
  else
    # Show the sanitizer report, not just the stats, so a CI log is enough to reproduce.
    grep -E 'ERROR|runtime error|SUMMARY|#[0-9]+ |Test unit written' "$log" | head -30
    failed+=("$name")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: crash in ${failed[*]} (inputs under build/fuzz/crashes/)" >&2
  exit 1
fi
echo "fuzz: no crash in any target"
