#!/usr/bin/env bash
# Cold-start and whole-process figures of `specrpc generate`, plain vs speculative, idle and with a
# competing CPU-bound process (bench/cold_bench.py prints the table). Optional: an older binary as
# B, compared in the same run.
#   bash bench/cold_bench.sh [build/specrpc] [OLD/specrpc] [--reps 3] [--n 256] [--no-load | --busy-only]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-$here/../build/specrpc}"; shift || true
args=()
if [[ $# -gt 0 && "$1" != --* ]]; then args+=(--bin-b "$1"); shift; fi
exec python3 "$here/cold_bench.py" --bin "$bin" --models "${SPECRPC_MODELS_DIR:-$here/../../shared/models}" "${args[@]}" "$@"
