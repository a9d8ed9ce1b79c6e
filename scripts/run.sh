#!/usr/bin/env bash
# Sets up everything (Debian packages, llama.cpp v0.5.0 from npm), builds, and runs the main job
# on the default models in ../shared/models:
#   scripts/run.sh            the JSON-RPC server (HTTP on 127.0.0.1:8080) with speculative decoding:
#                             target stories260K-x100M-near, draft stories260K-F32. Ctrl-C stops it.
#   scripts/run.sh generate   one speculative generation, coloured by draft acceptance, with stats
#   scripts/run.sh bench      the benchmarks (bench/run.sh)
# Extra arguments are passed to the specrpc command.
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=${SPECRPC_MODELS_DIR:-$(cd .. && pwd)/shared/models}
JOBS=${JOBS:-2}
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$JOBS" --target specrpc_cli specrpc >&2
mode=${1:-serve}; [ $# -gt 0 ] && shift
TARGET="$MODELS/stories260K-x100M-near-Q8_0.gguf"
DRAFT="$MODELS/stories260K-F32.gguf"
case "$mode" in
  serve)
    exec ./build/specrpc serve -m "$TARGET" -md "$DRAFT" -t 2 "$@" ;;
  generate)
    exec ./build/specrpc generate -m "$TARGET" -md "$DRAFT" -t 2 -p "Once upon a time" -n 256 --temp 0 --color "$@" ;;
  bench)
    exec bash bench/run.sh "$@" ;;
  *) echo "usage: scripts/run.sh [serve|generate|bench] [specrpc flags]" >&2; exit 2 ;;
esac
