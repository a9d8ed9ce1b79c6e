#!/usr/bin/env bash
# Builds the benchmarks (Release) and runs them: plain-decoding overhead (plain_bench), the
# speculative benchmark (spec_bench) and concurrent sequences (concurrent_bench). The Markdown
# tables go to bench/results.md and to stdout; progress goes to stderr.
#
#   bench/run.sh [--quick] [--models DIR] [--threads N] [--cases a,b,...] [--reps N] [--plain-reps N]
#                [--no-build] [--no-concurrent] [--build-dir DIR] [--out FILE]
#
# --quick: fewer prompts, 128 tokens (a smoke pass); --threads: ggml threads (default 2);
# --cases: spec_bench cases (default all); --reps: spec_bench runs each configuration N times per
# prompt and keeps the fastest; --plain-reps: plain_bench A/B repetitions; --no-concurrent: skip
# concurrent_bench (~2 min).
# The machine has 2 cores: the build uses -j2, and the numbers are only meaningful on an
# otherwise idle machine (the load average at start and end is written next to the tables).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build-bench"
out="$here/results.md"
build_it=1
concurrent=1
common=()
spec_only=()
plain_only=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick)     common+=(--quick); shift ;;
    --models)    common+=(--models "$2"); shift 2 ;;
    --threads)   common+=(--threads "$2"); shift 2 ;;
    --cases)     spec_only+=(--cases "$2"); shift 2 ;;
    --reps)      spec_only+=(--reps "$2"); shift 2 ;;
    --plain-reps) plain_only+=(--reps "$2"); shift 2 ;;
    --no-build)  build_it=0; shift ;;
    --no-concurrent) concurrent=0; shift ;;
    --build-dir) build="$2"; shift 2 ;;
    --out)       out="$2"; shift 2 ;;
    -h|--help)   sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done

if [[ $build_it == 1 ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSPECRPC_BUILD_TESTS=OFF >&2
  cmake --build "$build" --target plain_bench spec_bench concurrent_bench -j2 >&2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)"
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
load_start="$(load)"

rc=0
echo "[run] plain_bench ${common[*]:-} ${plain_only[*]:-}" >&2
"$build/bench/plain_bench" "${common[@]}" "${plain_only[@]}" > "$tmp/plain.md" || rc=$?
echo "[run] spec_bench ${common[*]:-} ${spec_only[*]:-}" >&2
"$build/bench/spec_bench" "${common[@]}" "${spec_only[@]}" > "$tmp/spec.md" || rc=$?
: > "$tmp/concurrent.md"
if [[ $concurrent == 1 ]]; then
  echo "[run] concurrent_bench ${common[*]:-}" >&2
  "$build/bench/concurrent_bench" "${common[@]}" > "$tmp/concurrent.md" || rc=$?
fi

{
  echo "# specrpc benchmark results"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit (plus uncommitted changes, if any)"
  echo "- machine: $(nproc) cores, ${cpu:-unknown CPU}; load average (1/5/15 min) at start: $load_start, at end: $(load)"
  echo "- options: ${common[*]:-} ${plain_only[*]:-} ${spec_only[*]:-}"
  echo
  cat "$tmp/plain.md"
  echo
  cat "$tmp/spec.md"
  if [[ -s "$tmp/concurrent.md" ]]; then echo; cat "$tmp/concurrent.md"; fi
} > "$out"
cat "$out"
echo "[run] wrote $out" >&2
exit $rc
