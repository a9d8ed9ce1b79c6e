#!/usr/bin/env bash
# Runs every test: stage 1 a Release build, stage 2 the same suite under AddressSanitizer +
# UndefinedBehaviorSanitizer (separate build dir; leaks and UB fail). Both through ctest.
#   scripts/test.sh          both stages
#   scripts/test.sh fast     stage 1 only
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
bash scripts/setup.sh

echo "== stage 1: Release build + tests" >&2
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSPECRPC_BUILD_BENCH=ON >/dev/null
cmake --build build -j"$JOBS"
(cd build && ctest --output-on-failure -j"$JOBS" --timeout 900)

if [ "${1:-}" = fast ]; then exit 0; fi

echo "== stage 2: ASan + UBSan build + tests" >&2
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPECRPC_SANITIZE=ON -DSPECRPC_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$JOBS"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp}
(cd build-asan && ctest --output-on-failure -j"$JOBS" --timeout 1500)
