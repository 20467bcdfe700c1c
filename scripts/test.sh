#!/usr/bin/env bash
# Installs what the build needs, builds moekit (tests, examples, benchmarks, and the CUDA kernels
# when nvcc is present) and runs every test with ctest.
#   scripts/test.sh                      # release preset, all tests
#   scripts/test.sh --preset sanitize    # ASan+UBSan build, all tests
#   scripts/test.sh --preset tsan --target moekit_io_tests -R '^io/'
#                                        # build one target; extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
preset=release
targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --preset) preset="$2"; shift 2 ;;
    --target) targets+=(--target "$2"); shift 2 ;;
    *) break ;;
  esac
done
scripts/install-deps.sh
jobs=$(nproc)
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs" "${targets[@]}"
ctest --preset "$preset" -j "$jobs" "$@"
