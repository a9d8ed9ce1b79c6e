#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 machine: Debian -dev packages, then llama.cpp
# release v0.5.0 from the npm registry (prebuilt libraries + public headers), into deps/.
# Nothing of llama.cpp is committed. Re-running is cheap: every step checks first.
#
#   SPECRPC_LLAMA_VARIANT=cpu   (default) @node-llama-cpp/linux-x64
#   SPECRPC_LLAMA_VARIANT=cuda  @node-llama-cpp/linux-x64-cuda (untested here: no GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEPS=$ROOT/deps
NODE_LLAMA_CPP_VERSION=3.22.1
LLAMA_RELEASE=v0.5.0
LLAMA_COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6
VARIANT=${SPECRPC_LLAMA_VARIANT:-cpu}

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

# 2. llama.cpp from npm ----------------------------------------------------------------------
# sha512 integrity of the pinned tarballs, as the registry publishes them (npm view NAME dist.integrity).
declare -A INTEGRITY=(
  ["node-llama-cpp"]="sha512-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw=="
  ["@node-llama-cpp/linux-x64"]="sha512-5uCCDNqWCNfaAm8aR/Uzxbo4HBpKgNF91kCHPepKhgMgV2OAmatoefbOlMihsqCiH2Od35E/eUHQCFbfRBJuOg=="
  ["@node-llama-cpp/linux-x64-cuda"]=""
)
BIN_PKG="@node-llama-cpp/linux-x64"; [ "$VARIANT" = cuda ] && BIN_PKG="@node-llama-cpp/linux-x64-cuda"

fetch() { # fetch NAME -> prints path of verified tarball
  local name=$1 dir=$DEPS/npm tgz
  mkdir -p "$dir"
  tgz="$dir/$(echo "${name#@}" | tr / -)-$NODE_LLAMA_CPP_VERSION.tgz"
  if [ ! -f "$tgz" ]; then
    log "npm pack $name@$NODE_LLAMA_CPP_VERSION"
    (cd "$dir" && npm pack --silent "$name@$NODE_LLAMA_CPP_VERSION" >/dev/null 2>&1)
  fi
  local want=${INTEGRITY[$name]:-} got
  got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
  if [ -n "$want" ] && [ "$got" != "$want" ]; then
    log "integrity mismatch for $name: got $got want $want"; rm -f "$tgz"; exit 1
  fi
  echo "$tgz"
}

STAMP=$DEPS/llama/.stamp-$LLAMA_RELEASE-$VARIANT
if [ ! -f "$STAMP" ]; then
  rm -rf "$DEPS/llama"; mkdir -p "$DEPS/llama/lib" "$DEPS/llama/include" "$DEPS/tmp"
  bin_tgz=$(fetch "$BIN_PKG")
  src_tgz=$(fetch node-llama-cpp)
  log "unpacking prebuilt libraries ($VARIANT)"
  rm -rf "$DEPS/tmp/bin"; mkdir -p "$DEPS/tmp/bin"
  tar xzf "$bin_tgz" -C "$DEPS/tmp/bin"
  bindir=$(dirname "$(find "$DEPS/tmp/bin" -name 'libllama*.so' | head -1)")
  grep -q "\"release\":\"$LLAMA_RELEASE\"" "$bindir/_nlcBuildMetadata.json" \
    || { log "prebuilt is not llama.cpp $LLAMA_RELEASE"; exit 1; }
  # libllama-common is llama.cpp's internal helper library: deliberately not copied.
  find "$bindir" -maxdepth 1 -name '*.so' ! -name 'libllama-common*' -exec cp {} "$DEPS/llama/lib/" \;
  cp "$bindir/_nlcBuildMetadata.json" "$DEPS/llama/lib/"
  log "extracting public headers from the release's git bundle"
  tar xzf "$src_tgz" -C "$DEPS/tmp" package/llama/gitRelease.bundle
  rm -rf "$DEPS/tmp/src"
  git clone -q --no-checkout "$DEPS/tmp/package/llama/gitRelease.bundle" "$DEPS/tmp/src" 2>/dev/null
  head=$(git -C "$DEPS/tmp/src" rev-parse HEAD)
  [ "$head" = "$LLAMA_COMMIT" ] || { log "bundle commit $head is not $LLAMA_COMMIT"; exit 1; }
  git -C "$DEPS/tmp/src" archive HEAD include ggml/include | tar x -C "$DEPS/tmp/src"
  cp "$DEPS/tmp/src"/include/*.h "$DEPS/tmp/src"/ggml/include/*.h "$DEPS/llama/include/"
  # Unversioned link names for the linker.
  ln -sf libllama.$LLAMA_RELEASE.so "$DEPS/llama/lib/libllama.so"
  ln -sf libggml.$LLAMA_RELEASE.so "$DEPS/llama/lib/libggml.so"
  rm -rf "$DEPS/tmp"
  touch "$STAMP"
  log "llama.cpp $LLAMA_RELEASE ($VARIANT) ready in deps/llama"
else
  log "llama.cpp $LLAMA_RELEASE ($VARIANT) present"
fi
