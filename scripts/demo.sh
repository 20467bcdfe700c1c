#!/usr/bin/env bash
# The main job: installs what it needs, builds, runs the example engine `moe-run` on the default
# model (models/moekit-tiny-moe) with two presets under a budget that forces offloading, then the
# policy comparison in the simulator (`moe-sim --compare`), then a user-defined policy example.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
jobs=$(nproc)
cmake --build --preset release -j "$jobs" --target moe-run moe-sim custom_policy
bin=build/release/examples

[[ -f models/moekit-tiny-moe/model.safetensors ]] ||
  { echo "demo: the default model models/moekit-tiny-moe is missing from this checkout" >&2; exit 1; }
for preset in baseline hobbit; do
  echo "== moe-run, default model, preset $preset, half of the experts in the budget (read with O_DIRECT)"
  $bin/moe-run/moe-run --preset "$preset" --expert-budget 50% -n 48 -p "The history of the city began"
done
echo "== moe-sim: every preset on the recorded traces, against Belady"
$bin/moe-sim/moe-sim --compare
echo "== custom_policy: a user-defined policy and predictor composed with library parts"
$bin/custom_policy/custom_policy
