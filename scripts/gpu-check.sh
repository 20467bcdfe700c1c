#!/usr/bin/env bash
# One-command check of moekit's CUDA kernels on a machine with an NVIDIA GPU (issue #27):
# configures a CUDA build for the detected architecture, builds only the device tests and the
# device benchmark, runs the `gpu` tests (ctest -L gpu), then the benchmark, and prints one
# summary table.
#
#   scripts/gpu-check.sh [--quick]      (--quick: the benchmark takes 5 instead of 20 runs)
#
# Budget: 5 minutes on one H100 host (estimated, not measured: the development machines have no
# GPU): configure + build of 5 nvcc translation units for one architecture and the host tests at
# -j$(nproc) ~2-3 min, the device tests ~1 min (most of it the float64 host references on
# Mixtral shapes, on every core), the benchmark ~30 s. Each step's time is printed.
#
# Installs nothing and needs no network: it uses the CUDA toolkit found (CUDA_HOME, default
# /usr/local/cuda, or nvcc on PATH) and the build dependencies of scripts/install-deps.sh (cmake,
# a C++20 compiler, Catch2 2, Boost, nlohmann-json, range-v3), and says which is missing.
# Without a CUDA device it goes as far as building and asking the runtime, reports
# "no CUDA device", lists what it would have run, and exits 0.
# Exit status: 0 all gpu tests passed (or no device), 1 a test failed or a step broke, 2 setup.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build/gpu-check"
bench_args=()
for a in "$@"; do
  case "$a" in
    --quick) bench_args+=(--quick) ;;
    *) echo "gpu-check: unknown argument '$a' (usage: scripts/gpu-check.sh [--quick])" >&2; exit 2 ;;
  esac
done
t_start=$SECONDS
step() { echo; echo "== gpu-check: $* ($((SECONDS - t_start)) s elapsed)"; }

# ---- what the machine has (nothing is installed) ------------------------------------------------
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
nvcc="$(command -v nvcc || true)"
[[ -z "$nvcc" && -x "$CUDA_HOME/bin/nvcc" ]] && nvcc="$CUDA_HOME/bin/nvcc"
[[ -n "$nvcc" ]] || { echo "gpu-check: nvcc not found (set CUDA_HOME or put nvcc on PATH)" >&2; exit 2; }
for tool in cmake c++; do
  command -v "$tool" >/dev/null || { echo "gpu-check: '$tool' not found (see scripts/install-deps.sh)" >&2; exit 2; }
done
generator=(-G Ninja)
command -v ninja >/dev/null || generator=(-G "Unix Makefiles")

step "architecture"
arch=""
if command -v nvidia-smi >/dev/null; then
  # "9.0" per GPU -> "90"; several kinds of GPU -> "80;90".
  arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' |
          sort -u | paste -sd';' || true)"
fi
if [[ -n "$arch" ]]; then
  echo "nvidia-smi: compute capability $arch"
else
  arch="80;90"
  echo "nvidia-smi found no GPU (or is missing): building for sm_80 and sm_90"
fi
echo "nvcc: $nvcc ($("$nvcc" --version | grep -o 'release [0-9.]*' || echo 'version unknown'))"

step "configure ($build, CUDA architectures $arch)"
cmake -S "$here" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DMOEKIT_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch" -DMOEKIT_BUILD_TESTS=ON -DMOEKIT_BUILD_BENCHMARKS=ON \
  -DMOEKIT_BUILD_EXAMPLES=OFF -DMOEKIT_HEADER_CHECK=OFF -DMOEKIT_CONSUMER_TEST=OFF >"$build.configure.log" 2>&1 ||
  { tail -n 30 "$build.configure.log" >&2; echo "gpu-check: configure failed (log: $build.configure.log)" >&2; exit 2; }

step "build moekit_gpu_tests moekit_bench_gpu"
cmake --build "$build" -j "$(nproc)" --target moekit_gpu_tests moekit_bench_gpu

tests_bin="$build/tests/gpu/moekit_gpu_tests"
bench_bin="$build/bench/gpu/moekit_bench_gpu"
would_run() {
  local names
  names="$("$tests_bin" --list-test-names-only | grep . || true)"  # Catch2 exits with the count listed
  echo "with a CUDA device it would have run:"
  echo "  ctest --test-dir $build -L gpu --output-on-failure   ($(grep -c . <<<"$names") device tests:"
  sed 's/^/    - /' <<<"$names"
  echo "  )"
  echo "  $bench_bin ${bench_args[*]}   (GEMV vs read kernel and cuBLAS, fused FFN vs three GEMVs,"
  echo "    PrefillGemm vs cuBLASLt f16, staging vs pinned copy; one ratio per line)"
}

step "gpu tests (ctest -L gpu)"
set +e
ctest --test-dir "$build" -L gpu --output-on-failure 2>&1 | tee "$build/gpu-tests.log"
ctest_status=${PIPESTATUS[0]}
set -e
t_tests=$SECONDS
# "  1/7 Test  #1: gpu/<name> ....   Passed   12.34 sec" (or "***Failed", "***Skipped")
results="$(grep -E 'Test +#[0-9]+: gpu/' "$build/gpu-tests.log" || true)"
n_all=$(grep -c . <<<"$results" || true)
n_pass=$(grep -c ' Passed ' <<<"$results" || true)
n_skip=$(grep -c 'Skipped' <<<"$results" || true)
n_fail=$((n_all - n_pass - n_skip))

if [[ "$n_all" -gt 0 && "$n_skip" -eq "$n_all" ]]; then
  set +e
  reason="$("$tests_bin" 2>&1 | grep -m1 'SKIPPED' | sed 's/^SKIPPED: //')"
  set -e
  step "benchmark"
  "$bench_bin" "${bench_args[@]}"
  echo
  echo "gpu-check: ${reason:-no CUDA device}"
  would_run
  echo
  printf '| %-10s | %-44s |\n' step result ---------- -------------------------------------------- \
    "gpu tests" "$n_skip of $n_all skipped: no CUDA device" \
    benchmark "not measured: no CUDA device" \
    time "$((SECONDS - t_start)) s (budget 300 s on one H100)"
  exit 0
fi

step "benchmark"
set +e
"$bench_bin" "${bench_args[@]}" | tee "$build/gpu-bench.log"
bench_status=${PIPESTATUS[0]}
set -e

echo
echo "== gpu-check summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || true), CUDA architectures $arch)"
echo
echo "| device test | result | time |"
echo "|-------------|--------|------|"
sed -E 's/.*Test +#[0-9]+: gpu\/(.*[^ .]) *\.+ *(\*\*\*)?([A-Za-z]+).* ([0-9.]+ sec).*/| \1 | \3 | \4 |/' <<<"$results"
echo
grep -E '^\|' "$build/gpu-bench.log" || echo "(benchmark printed no table: status $bench_status)"
echo
echo "tests: $n_pass passed, $n_fail failed, $n_skip skipped (ctest status $ctest_status); benchmark status $bench_status"
echo "time: $((t_tests - t_start)) s to the end of the tests, $((SECONDS - t_start)) s in all (budget 300 s on one H100)"
[[ "$ctest_status" -eq 0 && "$n_fail" -eq 0 && "$bench_status" -eq 0 ]] || exit 1
