#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and runs each for SECONDS (default 30) from its
# seed corpus in tests/fuzz/corpus/<name>. New inputs go to a scratch copy, never into the repo.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
scripts/install-deps.sh
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for bin in build/fuzz/tests/fuzz/moekit_fuzz_*; do
  name=${bin##*/moekit_fuzz_}
  mkdir -p "$work/$name"
  [[ -d tests/fuzz/corpus/$name ]] && cp -r tests/fuzz/corpus/$name/. "$work/$name/"
  echo "== fuzzing $name for ${seconds}s"
  "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 "$work/$name" 2>&1 | tail -4
done
echo "fuzz: no crash in any target"
