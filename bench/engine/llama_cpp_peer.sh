#!/usr/bin/env bash
# llama.cpp as moe-run's peer (issue 9): decode tokens/s on the same weights, and a second logits
# reference for tests/engine/llama_cpp_reference_test.cpp.
#
#   bench/engine/llama_cpp_peer.sh install            # venv only (idempotent)
#   bench/engine/llama_cpp_peer.sh gguf               # + the default model as GGUF
#   bench/engine/llama_cpp_peer.sh reference [OUT]   # + llama.cpp's top-k logits for the test, by
#                                                     # default into the committed fixture
#                                                     # tests/engine/data/moekit_tiny_moe_llama_cpp.json
#   bench/engine/llama_cpp_peer.sh bench [MOE_RUN [-n N] [-t T[,T]] [--rounds R] [-p PROMPT] [--sampling S]]
#                                                     # + decode tok/s, llama.cpp vs moe-run
#
# The venv ($LLAMA_CPP_VENV, default build/llama-cpp-venv) gets llama-cpp-python, which builds
# llama.cpp from source for this CPU (CPU only), plus gguf/numpy/sentencepiece for the converter.
# It is reused when present. Outputs go to $LLAMA_CPP_OUT (default build/llama-cpp-peer).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${LLAMA_CPP_VENV:-$here/build/llama-cpp-venv}"
out="${LLAMA_CPP_OUT:-$here/build/llama-cpp-peer}"
model="$here/models/moekit-tiny-moe"
step="${1:-bench}"
shift || true
case "$step" in
  install | gguf | reference | bench) ;;
  *) echo "usage: $0 [install|gguf|reference [OUT]|bench [MOE_RUN [-n N] [-t T[,T]] [--rounds R] [-p PROMPT]]]" >&2; exit 2 ;;
esac

# The converter's packages, then llama-cpp-python (only for the steps that run llama.cpp).
install_base() {
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  "$venv/bin/python" -c "import gguf, numpy, sentencepiece" 2>/dev/null ||
    "$venv/bin/pip" install --quiet "gguf==0.19.0" "numpy==2.4.6" "sentencepiece==0.2.3"
}
install_llama() {
  "$venv/bin/python" -c "import llama_cpp" 2>/dev/null && return
  # Built from the sdist: native CPU flags, no GPU backends, no multimodal library, two compile
  # jobs at nice 19 (shared machine). Measured here: 24 min with the download, load average 4-5.
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF}" \
  MAKEFLAGS="${MAKEFLAGS:--j2}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    nice -n 19 "$venv/bin/pip" install -v --no-binary llama-cpp-python --no-cache-dir \
    "llama-cpp-python==0.3.36"
}

install_base
[[ "$step" == install || "$step" == reference || "$step" == bench ]] && install_llama
[[ "$step" == install ]] && exit 0

py="$venv/bin/python"
mkdir -p "$out"
# GGUF files of the default model (rewritten when the checkpoint is newer).
for kind in f32 f16 f16_experts; do
  f="$out/moekit-tiny-moe-$kind.gguf"
  if [[ ! -f "$f" || "$model/model.safetensors" -nt "$f" || "$here/bench/engine/llama_cpp_gguf.py" -nt "$f" ]]; then
    "$py" "$here/bench/engine/llama_cpp_gguf.py" "$model" "$f" "$kind"
  fi
done
[[ "$step" == gguf ]] && exit 0

if [[ "$step" == reference ]]; then
  # f32 GGUF: the bf16 checkpoint widened exactly, so only arithmetic separates the engines.
  "$py" "$here/bench/engine/llama_cpp_peer.py" reference "$out/moekit-tiny-moe-f32.gguf" "$model" \
    "${1:-$here/tests/engine/data/moekit_tiny_moe_llama_cpp.json}"
  exit 0
fi

moe_run="${1:-$here/build/release/examples/moe-run/moe-run}"
shift || true
[[ -x "$moe_run" ]] || { echo "moe-run not found at $moe_run (pass its path)" >&2; exit 1; }
# Same bytes on both sides: f16 experts + f32 rest, all f32, and llama.cpp's usual all-f16 file
# (attention and the tied 32000-row head in f16 too) against moe-run's dense part in f16. The
# fourth pair is moe-run's default (--dense-precision auto: the checkpoint's bf16) against that
# all-f16 file: the same bytes, bf16 instead of f16.
"$py" "$here/bench/engine/llama_cpp_peer.py" bench "$moe_run" "$model" \
  --pair "$out/moekit-tiny-moe-f16_experts.gguf:f16:f32" --pair "$out/moekit-tiny-moe-f32.gguf:f32:f32" \
  --pair "$out/moekit-tiny-moe-f16.gguf:f16:f16" --pair "$out/moekit-tiny-moe-f16.gguf:f16:auto" "$@"
