#!/usr/bin/env bash
# The main job: installs what it needs, builds, and runs the best demonstration the repository
# can give today. As the engine and the trained model land, this runs `moe-run` on the default
# model with two presets and then the policy comparison in the simulator.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
jobs=$(nproc)
targets=(custom_policy)
[[ -f examples/moe-run/CMakeLists.txt ]] && targets+=(moe-run)
[[ -f examples/moe-sim/CMakeLists.txt ]] && targets+=(moe-sim)
cmake --build --preset release -j "$jobs" --target "${targets[@]}"
bin=build/release/examples

if [[ -x $bin/moe-run/moe-run && -f models/moekit-tiny-moe/model.safetensors ]]; then
  for preset in baseline hobbit; do
    echo "== moe-run, default model, preset $preset, expert budget forcing offloading"
    $bin/moe-run/moe-run --preset "$preset" --expert-budget 50% -n 48 \
      -p "The history of the city began" || exit 1
  done
fi
if [[ -x $bin/moe-sim/moe-sim ]]; then
  echo "== moe-sim: every preset on the recorded traces, against Belady"
  $bin/moe-sim/moe-sim --compare || exit 1
fi
echo "== custom_policy: a user-defined policy and predictor composed with library parts"
$bin/custom_policy/custom_policy
