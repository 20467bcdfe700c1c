#!/usr/bin/env bash
# Fails when a GEMV-family CUDA kernel (gemv_kernel, up_gate_kernel) uses local memory, a stack
# frame or register spills, for any architecture in the built library.
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
pattern='gemv_kernel|up_gate_kernel'
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
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
  result="$(awk -v pat="$pattern" '
    /arch = /      { arch = $3 }
    /Function /    { fn = $2; sub(/:$/, "", fn); next }
    /REG:/ && fn ~ pat {
      n++; stack = 0; local = 0
      for (i = 1; i <= NF; i++) {
        if ($i ~ /^STACK:/) { split($i, a, ":"); stack = a[2] + 0 }
        if ($i ~ /^LOCAL:/) { split($i, a, ":"); local = a[2] + 0 }
      }
      if (stack > 0 || local > 0) { bad++; printf "  FAIL %s %s: STACK:%d LOCAL:%d\n", arch, fn, stack, local }
      fn = ""
    }
    END { printf "checked %d\nbad %d\n", n, bad }' <<<"$report")"
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
  # "Compiling entry function '<fn>' for 'sm_80'" then
  # "    N bytes stack frame, N bytes spill stores, N bytes spill loads".
  result="$(awk -v pat="$pattern" '
    /Compiling entry function/ { fn = $0; sub(/.*function .\047?/, "", fn); sub(/\047.*/, "", fn);
                                 arch = $0; sub(/.*for .\047?/, "", arch); sub(/\047.*/, "", arch); next }
    /bytes stack frame/ && fn ~ pat {
      n++; frame = $1 + 0; stores = $5 + 0; loads = $9 + 0
      if (frame > 0 || stores > 0 || loads > 0) { bad++; printf "  FAIL %s %s: stack %d, spill stores %d, spill loads %d\n", arch, fn, frame, stores, loads }
      fn = ""
    }
    END { printf "checked %d\nbad %d\n", n, bad }' <<<"$report")"
fi

echo "$result" | grep '^  FAIL' || true
checked="$(echo "$result" | awk '/^checked/ { print $2 }')"
bad="$(echo "$result" | awk '/^bad/ { print $2 + 0 }')"
if [[ "${checked:-0}" -eq 0 ]]; then
  echo "check-cuda-resources: no GEMV kernels found in the report (pattern '$pattern')" >&2
  exit 1
fi
if [[ "$bad" -gt 0 ]]; then
  echo "check-cuda-resources: $bad of $checked GEMV kernels use local memory or spill" >&2
  exit 1
fi
echo "check-cuda-resources: OK, $checked GEMV kernel builds without local memory or spills"
