#!/usr/bin/env bash
# Fails on any C++/CUDA file that .clang-format would change; with --fix, formats them in place.
# Pinned to clang-format 14 (Debian bookworm's): other versions format some constructs differently.
set -euo pipefail
cd "$(dirname "$0")/.."
fix=0
[[ "${1:-}" == "--fix" ]] && fix=1
tool=$(command -v clang-format-14 || true)
if [[ -z "$tool" ]]; then
  scripts/install-deps.sh >/dev/null
  tool=$(command -v clang-format-14 || true)
fi
[[ -n "$tool" ]] || { echo "check-format: clang-format-14 not found (scripts/install-deps.sh installs it)" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.h' '*.cu' '*.cuh' '*.cc')
if ((fix)); then
  "$tool" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$tool" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  printf 'check-format: %d file(s) differ from .clang-format (fix: scripts/check-format.sh --fix):\n' "${#bad[@]}" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
