#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 machine: Debian -dev packages, then llama.cpp release
# v0.5.0 built from its pinned source (the git bundle in the npm package node-llama-cpp) into a
# cache outside the checkout (scripts/build_llama.sh; deps/llama-build and deps/llama-tools link to it). Nothing of
# llama.cpp is committed. Re-running is cheap: every step checks first. A fresh machine spends
# most of its setup compiling llama.cpp once (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEPS=$ROOT/deps
NODE_LLAMA_CPP_VERSION=3.22.1
LLAMA_RELEASE=v0.5.0
LLAMA_COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6

log() { echo "[setup] $*" >&2; }

# 1. Debian packages ---------------------------------------------------------------------
PKGS=(build-essential cmake git nodejs npm python3 nlohmann-json3-dev libcpp-httplib-dev
      libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
      python3-pytest python3-filelock python3-requests  # tests/compat: llama-server's own test suite
      haproxy)                                          # tests/test_replicas.py, deploy/haproxy.cfg
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  # npm may come from elsewhere (e.g. nodesource): do not insist on Debian's.
  if command -v npm >/dev/null; then missing=("${missing[@]/npm}"); missing=("${missing[@]/nodejs}"); fi
  read -r -a missing <<<"${missing[*]}"
fi
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
else
  log "Debian packages present"
fi

# 2. llama.cpp from its pinned source ---------------------------------------------------------
# The release's git bundle ships inside the npm package node-llama-cpp; its sha512 integrity is the
# one the registry publishes (npm view node-llama-cpp@3.22.1 dist.integrity).
INTEGRITY="sha512-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw=="
TGZ=$DEPS/npm/node-llama-cpp-$NODE_LLAMA_CPP_VERSION.tgz
mkdir -p "$DEPS/npm"
if [ ! -f "$TGZ" ]; then
  log "npm pack node-llama-cpp@$NODE_LLAMA_CPP_VERSION"
  (cd "$DEPS/npm" && npm pack --silent "node-llama-cpp@$NODE_LLAMA_CPP_VERSION" >/dev/null 2>&1)
fi
got="sha512-$(openssl dgst -sha512 -binary "$TGZ" | base64 -w0)"
if [ "$got" != "$INTEGRITY" ]; then
  log "integrity mismatch for node-llama-cpp: got $got"; rm -f "$TGZ"; exit 1
fi
# Built once per commit and options into ~/.cache/specrpc (scripts/build_llama.sh); deps/llama-build
# points at the libraries specrpc links. GPU back-ends: SPECRPC_LLAMA_CMAKE_ARGS (see scripts/build_llama.sh).
LLAMA_DIR=$(bash scripts/build_llama.sh)
ln -sfn "$LLAMA_DIR" "$DEPS/llama-build"
log "llama.cpp $LLAMA_RELEASE from source: $LLAMA_DIR"
# llama.cpp's own tools (llama-server, llama-lookup, ggml-rpc-server) in its default configuration,
# for the tests and benchmarks that run them; deps/llama-tools points there.
TOOLS_DIR=$(bash scripts/build_llama.sh tools)
ln -sfn "$TOOLS_DIR" "$DEPS/llama-tools"
log "llama.cpp $LLAMA_RELEASE tools: $TOOLS_DIR"
