#!/usr/bin/env bash
# Runs llama-server's own test suite (tools/server/tests of the pinned llama.cpp release) against
# `specrpc serve`, with no translation of its flags; only its model presets point at local models.
#
#   tests/compat/run.sh            the CI subset (tests that pass, < 4 min)
#   tests/compat/run.sh --full     every test file (long; prints pass/fail counts)
#   tests/compat/run.sh unit/test_tokenize.py -k detokenize    any pytest arguments
#
# Needs: SPECRPC_BIN (the specrpc binary; default build/specrpc), SPECRPC_MODELS_DIR (default
# ../shared/models beside the checkout), pytest + filelock + requests for /usr/bin/python3 (Debian
# packages python3-pytest python3-filelock python3-requests, installed by scripts/setup.sh), and
# the release's git bundle inside deps/npm/node-llama-cpp-3.22.1.tgz (fetched by scripts/setup.sh).
# Exit 77 means "cannot run here" (a prerequisite is missing), for ctest to report as skipped.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6
TGZ="$ROOT/deps/npm/node-llama-cpp-3.22.1.tgz"
CACHE=${SPECRPC_COMPAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specrpc/llama-server-tests-${COMMIT:0:12}}
export SPECRPC_BIN=${SPECRPC_BIN:-$ROOT/build/specrpc}
export SPECRPC_MODELS_DIR=${SPECRPC_MODELS_DIR:-$(cd "$ROOT/.." && pwd)/shared/models}

skip() { echo "compat: SKIPPED: $*" >&2; exit 77; }

# The subset CI runs: files that pass entirely (or nearly) today; grow it as causes are fixed.
SUBSET=(unit/test_tokenize.py unit/test_basic.py unit/test_template.py unit/test_metrics.py unit/test_ignore_eos.py
        unit/test_rerank.py::test_invalid_rerank_req unit/test_rerank.py::test_rerank_top_n
        unit/test_embedding.py::test_embedding_multiple unit/test_embedding.py::test_embedding_pooling_none_oai
        unit/test_embedding.py::test_embedding_error_prompt_too_long
        unit/test_compat_anthropic.py::test_anthropic_messages_basic unit/test_compat_anthropic.py::test_anthropic_messages_streaming
        unit/test_compat_anthropic.py::test_anthropic_count_tokens unit/test_compat_anthropic.py::test_anthropic_tool_result_with_image
        unit/test_compat_anthropic.py::test_anthropic_empty_messages
        unit/test_chat_completion.py::test_chat_completion_with_timings_per_token unit/test_chat_completion.py::test_logprobs_stream
        unit/test_chat_completion.py::test_chat_completions_multiple_choices
        unit/test_completion.py::test_completion_with_tokens_input unit/test_completion.py::test_completion_response_fields
        unit/test_chat_completion.py::test_chat_template unit/test_chat_completion.py::test_verbose_debug
        unit/test_chat_completion.py::test_chat_template_assistant_prefill unit/test_chat_completion.py::test_chat_template_continue_final_message_vllm_compat
        unit/test_chat_completion.py::test_chat_template_continue_final_message_mutual_exclusion unit/test_chat_completion.py::test_completion_with_grammar
        unit/test_chat_completion.py::test_invalid_chat_completion_req unit/test_chat_completion.py::test_return_progress
        unit/test_completion.py::test_consistent_result_different_batch_size unit/test_completion.py::test_n_probs_post_backend_sampling
        unit/test_infill.py::test_invalid_input_extra_req
        unit/test_router.py::test_router_props "unit/test_router.py::test_router_chat_completion_stream[non-existent/model-False]"
        unit/test_security.py::test_cors_origins_localhost_reflects unit/test_security.py::test_cors_origins_localhost_rejects
        unit/test_security.py::test_cors_origins_defaults_to_localhost_with_tools_enabled
        unit/test_compat_gcp.py
        unit/test_slot_save.py::test_slot_save_restore unit/test_slot_save.py::test_slot_restore_legacy_token_list
        unit/test_slot_save.py::test_slot_erase unit/test_sleep.py
        -k "not split_model and not no_ui and not embedding_prompt_is_counted")

PY=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null && "$p" -c "import pytest, filelock, requests" 2>/dev/null; then PY=$p; break; fi
done
[ -n "$PY" ] || skip "pytest, filelock or requests missing (apt-get install python3-pytest python3-filelock python3-requests)"
[ -x "$SPECRPC_BIN" ] || skip "no specrpc binary at $SPECRPC_BIN (build specrpc_cli or set SPECRPC_BIN)"
[ -f "$SPECRPC_MODELS_DIR/stories260K-F32.gguf" ] || skip "no stories260K-F32.gguf in $SPECRPC_MODELS_DIR"

# Extract tools/server/tests (and the chat templates it refers to) from the release bundle, once.
if [ ! -f "$CACHE/.done" ]; then
  [ -f "$TGZ" ] || skip "no $TGZ (scripts/setup.sh fetches it)"
  command -v git >/dev/null || skip "git missing"
  echo "compat: extracting llama.cpp ${COMMIT:0:12} tools/server/tests into $CACHE" >&2
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  tar xzf "$TGZ" -C "$tmp" package/llama/gitRelease.bundle
  git clone -q --bare "$tmp/package/llama/gitRelease.bundle" "$tmp/git" 2>/dev/null
  rm -rf "$CACHE"; mkdir -p "$CACHE"
  git -C "$tmp/git" archive "$COMMIT" tools/server/tests models/templates | tar x -C "$CACHE"
  touch "$CACHE/.done"
fi
TESTS="$CACHE/tools/server/tests"

args=()
if [ "${1:-}" = "--full" ]; then shift; args=(unit)
elif [ $# -eq 0 ]; then args=("${SUBSET[@]}")
fi

export LLAMA_SERVER_BIN_PATH="$HERE/llama-server"
export PYTHONPATH="$HERE/stubs:$HERE${PYTHONPATH:+:$PYTHONPATH}"
export PORT=${PORT:-$((20000 + RANDOM % 20000))}
cd "$TESTS"
exec "$PY" -m pytest -p specrpc_compat -p no:cacheprovider -q -rfE --rootdir "$TESTS" "${args[@]}" "$@"
