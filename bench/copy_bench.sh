#!/usr/bin/env bash
# The copy-heavy benchmark (docs/benchmarks.md, "Copy-heavy text"): writes the prompts, runs the
# warm in-process table (bench/copy_bench), then the whole-process, llama-lookup and server tables
# (bench/copy_bench.py) on the same prompts.
#   bash bench/copy_bench.sh [--build build] [--llama BINDIR] [--reps 3] [--n 128] [--threads 2] [--temps 0,0.8]
#                            [--sections warm,cold,lookup,server (and again)] [--bin-b OLD/specrpc]
#                            [--server-seeds 7,8]
# --llama defaults to llama.cpp's tools as scripts/setup.sh builds them (deps/llama-tools/build/bin).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$here/../build"; llama=""; reps=3; n=128; threads=2; temps="0,0.8"; sections="warm,cold,lookup,server"; binb=""; seeds="7,8"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --llama) llama="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --n) n="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --temps) temps="$2"; shift 2 ;;
    --sections) sections="$2"; shift 2 ;;
    --bin-b) binb="$2"; shift 2 ;;
    --server-seeds) seeds="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
models="${SPECRPC_MODELS_DIR:-$here/../../shared/models}"
[[ -z "$llama" && -x "$here/../deps/llama-tools/build/bin/llama-server" ]] && llama="$here/../deps/llama-tools/build/bin"
prompts="$(mktemp -d /tmp/copy-bench-prompts-XXXXXX)"
trap 'rm -rf "$prompts"' EXIT
"$build/bench/copy_bench" --models "$models" --threads "$threads" --dump-prompts "$prompts"
if [[ ",$sections," == *",warm,"* ]]; then
  "$build/bench/copy_bench" --models "$models" --threads "$threads" --reps "$reps" --tokens "$n" --temps "$temps"
fi
rest="$(echo "$sections" | tr ',' '\n' | grep -v '^warm$' | paste -sd, || true)"
if [[ -n "$rest" ]]; then
  args=(--bin "$build/specrpc" --prompts "$prompts" --models "$models" --reps "$reps" --n "$n" --threads "$threads"
        --temps "$temps" --sections "$rest" --server-seeds "$seeds")
  [[ -n "$llama" ]] && args+=(--llama "$llama")
  [[ -n "$binb" ]] && args+=(--bin-b "$binb")
  python3 "$here/copy_bench.py" "${args[@]}"
fi
