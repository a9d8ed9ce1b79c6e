#!/usr/bin/env bash
# Plain vs speculative tokens/s with the target behind llama.cpp RPC workers at 0, 1, 5 and 20 ms
# of added round trip (a delaying relay on loopback), next to local, with the cost model's
# prediction (bench/rpc_bench.py prints the table).
#   bash bench/rpc_bench.sh [build/specrpc] [--delays 0,1,5,20] [--n 128] [--target M] [--draft M]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$here/../build/specrpc"
if [[ $# -gt 0 && "$1" != --* ]]; then bin="$1"; shift; fi
rpc_server="${SPECRPC_LLAMA_BIN_DIR:-$here/../deps/llama-tools/build/bin}/ggml-rpc-server"
exec python3 "$here/rpc_bench.py" --bin "$bin" --rpc-server "$rpc_server" "$@"
