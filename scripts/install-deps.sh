#!/usr/bin/env bash
# Installs moekit's build and test dependencies from Debian's packages.
# Idempotent: runs `apt-get update` at most once, and installs only what is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  catch2                  # tests (Catch2 2.13)
  librange-v3-dev         # ranges
  libboost-dev            # Boost.Lockfree (header-only)
  nlohmann-json3-dev      # safetensors headers, manifests, --json output
  libcpp-httplib-dev      # moe-server (HTTP, loopback)
  curl                    # moe-server tests (a real HTTP client)
  python3 python3-venv    # moe-server tests (server_test.py; the openai client in a venv)
  libcli11-dev            # command-line parsing of the tools
  libfmt-dev              # formatting
  liburing-dev            # io_uring loader
  libsentencepiece-dev    # Mixtral tokenizer
  libpcre2-dev            # byte-level BPE pre-tokenizer regexes (Qwen2-MoE, OLMoE tokenizers)
  libutf8proc-dev         # byte-level BPE's NFC normalizer (tokenizer.json normalizer NFC)
  clang                   # libFuzzer targets
  libclang-rt-14-dev      # fuzzer and sanitizer runtimes for clang
  clang-format-14         # scripts/check-format.sh (the version pinned: formatting differs between versions)
  librsvg2-bin            # rsvg-convert: a PNG beside each SVG plot (tools/svg_plot.hpp; without it, SVG only)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-deps: all Debian packages present"
fi
