#!/usr/bin/env bash
# moekit's dequant-GEMV against ggml's CPU mul_mat (q8_0, q4_0, q2_K) on the Mixtral expert shapes
# (14336x4096, 4096x14336), n = 1, 1 and 2 threads, cold weights, and against a streaming read of
# the same bytes: all timed rep by rep in ONE process (bench/kernels/ggml/gemv_vs_ggml.cpp), so the
# ratios hold on a loaded machine.
#
#   bench/kernels/ggml_peer.sh [--avx2] [--reps N | --quick] [--float | --kquant]
#   bench/kernels/ggml_peer.sh [--avx2] --gemm [--reps N] [--threads N]
#
# --float: f16 and bf16 rows (Hugging Face checkpoints' experts) against ggml's F16 and BF16
# mul_mat instead: moekit's float-activation GEMV and, for bf16 on AVX512_BF16, its vdpbf16ps path.
#
# The K-quant cells (q4_K, q5_K, q6_K, q2_K, q3_K) follow the others; --kquant runs them alone: ggml
# quantizes the matrix and moekit runs its bytes as they lie (Precision::q4_k .. q3_k, no transcode),
# moekit's int8-activation kernels against ggml's mul_mat of the same type (issue 23 point 1;
# `--isa avx2` runs moekit's AVX2 kernels on an AVX-512 CPU, ggml unchanged). `--only q2_K` selects
# both the K-quant q2_K cell and the other cells' q2 line (moekit's q2 against ggml's Q2_K).
#
# --gemm: the prefill GEMM instead (bench/kernels/ggml/gemm_vs_ggml.cpp): moekit's int8 GEMM
# against ggml's mul_mat with n = 8, 32, 128, 512 tokens, q8_0 and q4_0, warm weights, on the
# expert shapes and the attention projections (4096x4096, 1024x4096), beside the int8 VNNI peak.
# --gemm --kquant: the K-quant cells instead (q4_K, q5_K, q6_K, q2_K, q3_K on the expert shapes; ggml quantizes,
# moekit runs those bytes in place through kquant_int8_gemm.hpp).
#
# --avx2: both sides on their AVX2 paths, as on a CPU without AVX-512: ggml built with AVX-512 off
# (its own venv, build/ggml-peer-avx2-venv) and moekit's kernels forced to AVX2 (--isa avx2).
#
# Installs ggml-python (which builds ggml from source) into a virtual environment
# ($GGML_PEER_VENV, default build/ggml-peer-venv; reused when present), compiles the harness with
# its headers and libraries into $GGML_PEER_OUT (default build/ggml-peer), and runs it.
# ggml was built with OpenMP: OMP_WAIT_POLICY defaults to passive here, so its idle threads sleep
# between calls as moekit's ThreadPool does instead of spinning on the cores the next
# measurement uses.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
variant="" harness_args=() cmake_args="" harness=gemv_vs_ggml
if [[ "${1:-}" == "--avx2" ]]; then
  shift
  variant="-avx2" harness_args=(--isa avx2)
  cmake_args="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX_VNNI=OFF -DGGML_AVX2=ON -DGGML_AVX=ON -DGGML_FMA=ON -DGGML_F16C=ON"
fi
if [[ "${1:-}" == "--gemm" ]]; then
  shift
  harness=gemm_vs_ggml
fi
venv="${GGML_PEER_VENV:-$here/build/ggml-peer$variant-venv}"
out="${GGML_PEER_OUT:-$here/build/ggml-peer$variant}"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import ggml" 2>/dev/null; then
  python3 -m venv "$venv"
  CMAKE_ARGS="$cmake_args" MAKEFLAGS="${MAKEFLAGS:--j2}" nice -n 10 "$venv/bin/pip" install --quiet --no-cache-dir "ggml-python==0.0.45" numpy
fi
site="$("$venv/bin/python" -c 'import ggml, os; print(os.path.dirname(os.path.dirname(ggml.__file__)))')"
inc="$site/include"
lib="$site/ggml/lib"
[[ -f "$inc/ggml-cpu.h" && -f "$lib/libggml-cpu.so" ]] || { echo "ggml headers/libraries not found under $site" >&2; exit 1; }

mkdir -p "$out"
bin="$out/$harness"
src="$here/bench/kernels/ggml/$harness.cpp"
if [[ ! -x "$bin" || "$src" -nt "$bin" || "$here/bench/kernels/cold_read.hpp" -nt "$bin" || "$here/bench/kernels/int8_peak.hpp" -nt "$bin" || -n "$(find "$here/include/moekit/precision" -newer "$bin" -print -quit)" ]]; then
  nice -n 10 g++ -std=c++20 -O3 -DNDEBUG -Wall -Wextra -I"$here/include" -I"$inc" "$src" -o "$bin" \
    -L"$lib" -lggml-cpu -lggml-base -lggml -Wl,-rpath,"$lib" -pthread
fi
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
echo "ggml: ggml-python $("$venv/bin/pip" show ggml-python 2>/dev/null | awk '/^Version/{print $2}') ($lib), OMP_WAIT_POLICY=$OMP_WAIT_POLICY"
"$bin" "${harness_args[@]}" "$@"
