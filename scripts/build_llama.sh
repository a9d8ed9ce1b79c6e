#!/usr/bin/env bash
# Build llama.cpp release v0.5.0 from its pinned source (the git bundle inside the npm package
# node-llama-cpp@3.22.1) with CMake, in one of two configurations:
#
#   build_llama.sh        the libraries specrpc links: ggml (CPU, GGML_NATIVE, GGML_RPC), llama and
#                         llama.cpp's `common`, with ggml's own thread pool (GGML_OPENMP=OFF);
#   build_llama.sh tools  the tools we test and benchmark against (ggml-rpc-server, llama-server,
#                         llama-lookup) in llama.cpp's default configuration (OpenMP), as its
#                         users build and run them.
#
# Why two: without OpenMP a ggml tool that attaches no pool of its own (ggml-rpc-server) starts
# threads for every graph, and an idle llama-server's workers poll for work for a while after
# each request, slowing whatever runs next (a server beside it in a side-by-side benchmark took
# 40-50% longer for a request that followed one of its); with OpenMP neither happens. specrpc
# itself needs the opposite (see ARGS below). ccache shares every object the two have in common.
#
# Built once into a cache outside the checkout, keyed by commit and options, so a second setup, a
# fresh clone and CI reuse it:
#
#   ${SPECRPC_LLAMA_CACHE:-~/.cache/specrpc}/llama-<commit12>-<options hash>/{src,build,.done}
#
# Prints the cache directory on stdout; progress goes to stderr.
#
# Options (environment):
#   SPECRPC_LLAMA_NATIVE=ON|OFF   GGML_NATIVE (default ON: tuned to this CPU; OFF for portable binaries)
#   SPECRPC_LLAMA_CMAKE_ARGS="..." extra CMake switches, e.g. for an accelerator (untested here, no GPU):
#       -DGGML_CUDA=ON   (NVIDIA, needs the CUDA toolkit)
#       -DGGML_VULKAN=ON (needs libvulkan-dev, glslc)
#       -DGGML_METAL=ON  (macOS; on by default there)
#   SPECRPC_LLAMA_JOBS=N          parallel compile jobs (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LLAMA_COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6
NODE_LLAMA_CPP_VERSION=3.22.1
CACHE=${SPECRPC_LLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specrpc}
NATIVE=${SPECRPC_LLAMA_NATIVE:-ON}
EXTRA=${SPECRPC_LLAMA_CMAKE_ARGS:-}
JOBS=${SPECRPC_LLAMA_JOBS:-$(nproc)}
log() { echo "[build_llama] $*" >&2; }

MODE=${1:-lib}
case "$MODE" in lib|tools) ;; *) log "usage: $0 [tools]"; exit 2;; esac
ARGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE="$NATIVE" -DGGML_RPC=ON
      -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
      -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_APP=OFF
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_LLGUIDANCE=OFF)
# specrpc's libraries use ggml's own thread pool, not OpenMP: under OpenMP every thread that
# computes a graph gets its own OpenMP team, so several engines in one process held more threads
# than cores and libgomp slept at the barriers (passes 1.7x slower); and the pool the engine
# creates, and parks while idle, was inert. One engine alone runs at the same speed either way
# (docs/benchmarks.md, "ggml's thread pool instead of OpenMP").
[ "$MODE" = lib ] && ARGS+=(-DGGML_OPENMP=OFF)
ARGS+=(
      # libllama-common links llama.cpp's vendored cpp-httplib and nlohmann::json statically; kept
      # out of its exported symbols, they cannot interpose on the Debian cpp-httplib specrpc links
      # (another version, another layout: a heap corruption at the first httplib::Server).
      "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL")
# shellcheck disable=SC2206
[ -n "$EXTRA" ] && ARGS+=($EXTRA)
# The key covers what changes the binaries: the commit, the switches, and (for a native build)
# the CPU's instruction set, so a cache copied to another machine is not silently reused.
CPUKEY=""
[ "$NATIVE" = ON ] && CPUKEY=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
KEY=$(printf '%s\n' "${ARGS[@]}" "$CPUKEY" "$(g++ -dumpfullversion 2>/dev/null)" | sha256sum | cut -c1-12)
DIR=$CACHE/llama-${LLAMA_COMMIT:0:12}-$KEY
if [ "$MODE" = lib ]; then TARGETS=(llama ggml llama-common)
else TARGETS=(ggml-rpc-server llama-server llama-lookup); fi

if [ -f "$DIR/.done" ]; then
  log "cached: $DIR"
  echo "$DIR"; exit 0
fi
mkdir -p "$CACHE"
# One builder at a time (CI and a developer's setup may race).
exec 9>"$CACHE/.llama-build.lock"
flock 9
if [ -f "$DIR/.done" ]; then echo "$DIR"; exit 0; fi

if [ ! -d "$DIR/src/.git" ]; then
  TGZ=$ROOT/deps/npm/node-llama-cpp-$NODE_LLAMA_CPP_VERSION.tgz
  [ -f "$TGZ" ] || { log "missing $TGZ: run scripts/setup.sh"; exit 1; }
  TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
  tar xzf "$TGZ" -C "$TMP" package/llama/gitRelease.bundle
  rm -rf "$DIR/src"; mkdir -p "$DIR"
  log "checking out llama.cpp ${LLAMA_COMMIT:0:12} from the release bundle"
  git -c advice.detachedHead=false clone -q "$TMP/package/llama/gitRelease.bundle" "$DIR/src"
  git -C "$DIR/src" -c advice.detachedHead=false checkout -q "$LLAMA_COMMIT"
fi
# Compiler caches (ccache, when GGML_CCACHE finds it) key on paths relative to the build's own
# directory, so a rebuild under another key reuses every unchanged object.
export CCACHE_BASEDIR=$DIR
log "configuring (${ARGS[*]})"
cmake -S "$DIR/src" -B "$DIR/build" "${ARGS[@]}" >"$DIR/configure.log" 2>&1 \
  || { tail -30 "$DIR/configure.log" >&2; exit 1; }
log "building ${TARGETS[*]} with $JOBS jobs (a first build takes 10-20 minutes on 2 cores; log: $DIR/build.log)"
start=$(date +%s)
if ! cmake --build "$DIR/build" -j "$JOBS" --target "${TARGETS[@]}" >"$DIR/build.log" 2>&1; then
  tail -40 "$DIR/build.log" >&2; exit 1
fi
log "built in $(( $(date +%s) - start )) s"
touch "$DIR/.done"
echo "$DIR"
