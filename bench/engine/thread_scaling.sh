#!/usr/bin/env bash
# Thread scaling under load (issue 28, point 2): moe-run and llama.cpp decode at 1 and 2 threads,
# quiet and beside a `nice -n 19` busy loop, alternating the conditions round by round; prints
# two threads / one thread per engine and condition, and moe-run / llama.cpp.
#
#   bench/engine/thread_scaling.sh [MOE_RUN] [-n N] [--rounds R] [-p PROMPT] [--sampling greedy,default] [--budgets resident,50%]
#
# llama.cpp comes from the llama_cpp_peer.sh venv ($LLAMA_CPP_VENV, default build/llama-cpp-venv;
# `bench/engine/llama_cpp_peer.sh install` makes it), on the all-f16 GGUF of the default model
# (written into $LLAMA_CPP_OUT, default build/llama-cpp-peer, when missing).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${LLAMA_CPP_VENV:-$here/build/llama-cpp-venv}"
out="${LLAMA_CPP_OUT:-$here/build/llama-cpp-peer}"
model="$here/models/moekit-tiny-moe"
moe_run="${1:-$here/build/release/examples/moe-run/moe-run}"
shift || true
[[ -x "$moe_run" ]] || { echo "moe-run not found at $moe_run (pass its path)" >&2; exit 1; }
[[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import llama_cpp, gguf" 2>/dev/null ||
  { echo "no llama-cpp-python venv at $venv (run bench/engine/llama_cpp_peer.sh install, or set LLAMA_CPP_VENV)" >&2; exit 1; }
gguf="$out/moekit-tiny-moe-f16.gguf"
if [[ ! -f "$gguf" || "$model/model.safetensors" -nt "$gguf" ]]; then
  mkdir -p "$out"
  "$venv/bin/python" "$here/bench/engine/llama_cpp_gguf.py" "$model" "$gguf" f16
fi
exec "$venv/bin/python" "$here/bench/engine/thread_scaling.py" "$moe_run" "$model" "$gguf" "$@"
