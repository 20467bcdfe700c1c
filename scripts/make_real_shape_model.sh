#!/usr/bin/env bash
# Random-weight MoE checkpoints at real layer shapes (Mixtral-8x7B, Qwen1.5-MoE-A2.7B, OLMoE-1B-7B)
# for out-of-memory / offloading experiments; see make_real_shape_model.py for the options.
#
#   scripts/make_real_shape_model.sh --arch mixtral --format gguf-q4_0 [--layers N] [--out PATH]
#
# Creates the venv $REAL_SHAPE_VENV (default build/real-shape-venv) with the same pins as
# bench/engine/llama_cpp_peer.sh's converter (gguf, numpy, sentencepiece) when it is missing or
# incomplete, then runs the script in it. Idempotent; outputs go under build/real-shape-models/
# unless --out says otherwise and are never committed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${REAL_SHAPE_VENV:-$here/build/real-shape-venv}"
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
"$venv/bin/python" -c "import gguf, numpy, sentencepiece" 2>/dev/null ||
  "$venv/bin/pip" install --quiet "gguf==0.19.0" "numpy==2.4.6" "sentencepiece==0.2.3"
exec "$venv/bin/python" "$here/scripts/make_real_shape_model.py" "$@"
