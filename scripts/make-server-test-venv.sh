#!/usr/bin/env bash
# Creates build/server-test-venv with the `openai` client package (PyPI), which the moe-server
# tests use as a real client (examples/moe-server/server_test.py). Reused once made.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="$here/build/server-test-venv"
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
"$venv/bin/python" -c "import openai" 2>/dev/null ||
  "$venv/bin/pip" install --quiet "openai==3.57.0"
