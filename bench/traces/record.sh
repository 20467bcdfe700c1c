#!/usr/bin/env bash
# Records the tiny model's routing traces in this folder with moe-run --trace-out: two prompts cut
# from the model's held-out text (bench/quality/heldout.txt: WikiText-2 test lines 2652-2892,
# CC BY-SA 3.0), ~64 prompt tokens each (one prefill) + 64 greedy decode tokens, with full router
# logits and gate-input hidden states. Usage: bench/traces/record.sh [path/to/moe-run]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
moe_run="${1:-$root/build/release/examples/moe-run/moe-run}"
[ -x "$moe_run" ] || { echo "record.sh: moe-run not found at $moe_run (pass its path)" >&2; exit 2; }
text="$root/bench/quality/heldout.txt"
model="$root/models/moekit-tiny-moe"

# The first 280 characters (cut at a word boundary) of a paragraph of the held-out text.
prompt() { sed -n "${1}p" "$text" | cut -c1-280 | sed 's/ [^ ]*$//; s/^ //'; }

record() {  # name line
  "$moe_run" -m "$model" --in-memory -p "$(prompt "$2")" -n 64 --temp 0 --precision f32 \
    --trace-out "$here/$1.mktrace" --force --json > "$here/$1.json"
  python3 - "$here/$1.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
import hashlib, os
keep = {k: j[k] for k in ("precision", "prompt_tokens", "generated_tokens", "trace_tokens", "text")}
weights = os.path.join(j["model"], "model.safetensors")
keep["model"] = "models/" + os.path.basename(os.path.normpath(j["model"]))
keep["model_safetensors_sha256"] = hashlib.sha256(open(weights, "rb").read()).hexdigest()
json.dump(keep, open(sys.argv[1], "w"), indent=1, ensure_ascii=False)
PY
  echo "recorded $here/$1.mktrace ($(stat -c %s "$here/$1.mktrace") bytes)"
}

record tiny-heldout-ub1 8      # " The Type UB I was a class of small coastal submarines ..."
record tiny-heldout-nerva 146  # " Nerva ( Latin : Marcus Cocceius Nerva Caesar Augustus ; ..."
