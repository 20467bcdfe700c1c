#!/usr/bin/env bash
# Fails when a CUDA kernel the device tests exercise (gemv_kernel, up_gate_kernel, dequant_kernel:
# tests/gpu/) uses local memory, a stack frame or register spills, needs more than the 48 KiB of
# static shared memory a block gets without opt-in, or more registers than its block size allows
# (REG × threads per block <= 64 Ki registers: 128 threads for the warp-per-row kernels, 256 for
# dequantize), for any architecture in the built library; and when one of them is missing.
#
#   scripts/check-cuda-resources.sh [libmoekit_cuda.a | BUILD_DIR]
#
# Uses `cuobjdump --dump-resource-usage` on the library (spilled registers live in local memory,
# so LOCAL/STACK > 0 catches spills); a toolkit without it gets PyPI's nvidia-cuda-cuobjdump in
# build/cuda-tools-venv. Where neither is available (offline), it recompiles kernels/*.cu for sm_80 and sm_90 with `ptxas -v` and reads the spill
# and stack-frame counts from its report instead, saying so.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lib="${1:-}"
pattern='gemv_kernel|up_gate_kernel|dequant_kernel'
required='gemv_kernel up_gate_kernel dequant_kernel'
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
# The verdict on one kernel build, shared by the cuobjdump and the ptxas readers below.
judge_awk='
    function threads(fn) { return fn ~ /dequant_kernel/ ? 256 : 128 }
    function judge(arch, fn, reg, smem, frame, stores, loads,   t, k) {
      n++
      for (k in req) if (index(fn, k)) seen[k] = 1
      t = threads(fn)
      if (frame > 0 || stores > 0 || loads > 0) { bad++; printf "  FAIL %s %s: stack/local %d, spill stores %d, spill loads %d\n", arch, fn, frame, stores, loads }
      if (smem > 49152) { bad++; printf "  FAIL %s %s: %d bytes of static shared memory (> 48 KiB needs the dynamic opt-in)\n", arch, fn, smem }
      if (reg * t > 65536) { bad++; printf "  FAIL %s %s: %d registers x %d threads > 65536 per block\n", arch, fn, reg, t }
    }
    BEGIN { split(required, r, " "); for (i in r) req[r[i]] = 1 }
    END {
      for (k in req) if (!(k in seen)) { bad++; printf "  FAIL kernel %s not in the report\n", k }
      printf "checked %d\nbad %d\n", n, bad
    }
'
cuobjdump="$(command -v cuobjdump || true)"
[[ -z "$cuobjdump" && -x "$CUDA_HOME/bin/cuobjdump" ]] && cuobjdump="$CUDA_HOME/bin/cuobjdump"
# A toolkit without the cuobjdump component: NVIDIA publishes it on PyPI (nvidia-cuda-cuobjdump);
# install it into a venv in the build tree (reused), offline falls through to ptxas below.
if [[ -z "$cuobjdump" && "${MOEKIT_NO_PIP:-0}" != 1 ]]; then
  venv="$here/build/cuda-tools-venv"
  find_pip_cuobjdump() { find "$venv" -path '*/nvidia/*/bin/cuobjdump' -type f 2>/dev/null | head -n1; }
  if [[ -z "$(find_pip_cuobjdump)" ]]; then
    { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet nvidia-cuda-cuobjdump; } >&2 ||
      echo "check-cuda-resources: could not install nvidia-cuda-cuobjdump from PyPI" >&2
  fi
  cuobjdump="$(find_pip_cuobjdump)"
fi

if [[ -n "$cuobjdump" ]]; then
  [[ -d "$lib" ]] && lib="$lib/libmoekit_cuda.a"  # a build directory: its library
  if [[ -z "$lib" ]]; then
    lib="$(ls -t "$here"/build/*/libmoekit_cuda.a 2>/dev/null | head -n1 || true)"
  fi
  [[ -f "$lib" ]] || { echo "check-cuda-resources: library not found: '${lib}' (build moekit_cuda first)" >&2; exit 2; }
  echo "check-cuda-resources: $cuobjdump --dump-resource-usage $lib"
  report="$("$cuobjdump" --dump-resource-usage "$lib")"
  # Lines: "arch = sm_80" … " Function <mangled>:" then "  REG:32 STACK:0 SHARED:0 LOCAL:0 …".
  result="$(awk -v pat="$pattern" -v required="$required" "$judge_awk"'
    /arch = /      { arch = $3 }
    /Function /    { fn = $2; sub(/:$/, "", fn); next }
    /REG:/ && fn ~ pat {
      reg = 0; smem = 0; stack = 0; local = 0
      for (i = 1; i <= NF; i++) {
        split($i, a, ":")
        if (a[1] == "REG") reg = a[2] + 0
        if (a[1] == "SHARED") smem = a[2] + 0
        if (a[1] == "STACK") stack = a[2] + 0
        if (a[1] == "LOCAL") local = a[2] + 0
      }
      judge(arch, fn, reg, smem, stack + local, 0, 0)
      fn = ""
    }' <<<"$report")"
else
  nvcc="$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")"
  [[ -x "$nvcc" ]] || { echo "check-cuda-resources: neither cuobjdump nor nvcc found (set CUDA_HOME)" >&2; exit 2; }
  echo "check-cuda-resources: cuobjdump not found; falling back to ptxas -v on kernels/*.cu"
  report=""
  for cu in "$here"/kernels/*.cu; do
    for arch in 80 90; do
      report+="$("$nvcc" -std=c++20 --expt-relaxed-constexpr -I"$here/include" -I"$here/kernels" \
        --generate-code="arch=compute_${arch},code=sm_${arch}" -Xptxas=-v -c "$cu" -o /dev/null 2>&1)"$'\n'
    done
  done
  # "Compiling entry function '<fn>' for 'sm_80'", then
  # "    N bytes stack frame, N bytes spill stores, N bytes spill loads", then
  # "ptxas info    : Used N registers, used N barriers, N bytes smem, ...".
  result="$(awk -v pat="$pattern" -v required="$required" "$judge_awk"'
    /Compiling entry function/ { fn = $0; sub(/.*function .\047?/, "", fn); sub(/\047.*/, "", fn);
                                 arch = $0; sub(/.*for .\047?/, "", arch); sub(/\047.*/, "", arch); next }
    /bytes stack frame/ && fn ~ pat { frame = $1 + 0; stores = $5 + 0; loads = $9 + 0; next }
    /Used [0-9]+ registers/ && fn ~ pat {
      reg = 0; smem = 0
      for (i = 1; i <= NF; i++) {
        if ($(i + 1) ~ /^registers/) reg = $i + 0
        if ($(i + 1) ~ /^smem/) smem = $(i - 1) + 0
      }
      judge(arch, fn, reg, smem, frame, stores, loads)
      fn = ""; frame = stores = loads = 0
    }' <<<"$report")"
fi

echo "$result" | grep '^  FAIL' || true
checked="$(echo "$result" | awk '/^checked/ { print $2 }')"
bad="$(echo "$result" | awk '/^bad/ { print $2 + 0 }')"
if [[ "${checked:-0}" -eq 0 ]]; then
  echo "check-cuda-resources: no kernels found in the report (pattern '$pattern')" >&2
  exit 1
fi
if [[ "$bad" -gt 0 ]]; then
  echo "check-cuda-resources: $bad problems in $checked kernel builds (local memory, spills, shared memory, registers or a missing kernel)" >&2
  exit 1
fi
echo "check-cuda-resources: OK, $checked kernel builds ($required) without local memory or spills, within the shared-memory and register limits of their blocks"
