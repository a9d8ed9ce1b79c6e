/* specrpc legacy C ABI: the functions of the existing rpcserver library (Python ctypes, Dart FFI
 * and C callers use them), with its signatures, return codes and JSON shapes, in a library of its
 * name (librpcserver; link with -lrpcserver): an application written against that library works
 * unchanged. Each function is one call into libspecrpc (specrpc.h: specrpc_init, ...). specrpc
 * adds fields (request ids, statistics, error objects) and never removes or retypes one. New
 * code should prefer specrpc.h.
 *
 * Ownership: every `const char *` returned is a malloc'd, NUL-terminated UTF-8 JSON text that
 * belongs to the caller, as the existing library's strdup copies did: release it with free() (or
 * specrpc_free(), which is the same). Each call returns a new string; nothing the library returned
 * is touched by it again. A caller that never frees leaks them, as with the existing library.
 * Only if even a short error cannot be allocated is NULL returned.
 *
 * Return codes: init() returns 0 on success and 1 on failure (why: poll_system_status()'s
 * "error"). JSON answers carry "success": true, or on failure
 *   {"success": false, "error": {"code": <JSON-RPC code>, "message": "...", "data": {...}}}
 * with the codes of specrpc.h (-32602 invalid params with data.param naming the field, -32001 not
 * initialised / loading, -32004 unknown request_id, ...). No function throws or aborts on bad input.
 *
 * Threading: every function may be called from any thread, concurrently (completions run in
 * parallel up to the slots, -np). One engine per process: init() replaces a loaded one and
 * deinit() frees it; both first cancel the async completions and wait for their threads. Called
 * from inside a specrpc_rpc_stream callback, init()/init_async() are refused (init returns 1) and
 * deinit() cancels everything at once and frees the engine when that specrpc_rpc_stream returns.
 *
 * Arguments: `cmd` of init/init_async is a command line with llama-server flags, the first word
 * the program name as in the existing library ("server -m PATH -md PATH -c 512 -np 2 -t 2
 * --spec-type draft ..."; quotes as in a POSIX shell; the existing library's flags without a use
 * here, such as -tb, --memory-f32, --embedding, -n, --rope-freq-base, are ignored), or a JSON object with the same keys
 * ({"model": PATH, "model_draft": PATH, "ctx_size": 512, "parallel": 2, "threads": 2, ...}; the
 * existing library's hostname, port, public_path, read_timeout, write_timeout are ignored). A
 * context (-c) below 8 tokens is refused. Requests are JSON objects; NULL is an empty request.
 */
#ifndef SPECRPC_RPCSERVER_H
#define SPECRPC_RPCSERVER_H

/* Exports when building librpcserver (RPCSERVER_BUILDING), imports otherwise. */
#if defined(_WIN32)
#if defined(RPCSERVER_BUILDING)
#define RPCSERVER_API __declspec(dllexport)
#else
#define RPCSERVER_API __declspec(dllimport)
#endif
#else
#define RPCSERVER_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Loads the model(s) synchronously. Returns 0 on success, 1 on failure. */
RPCSERVER_API int init(const char * cmd);

/* Starts loading on a background thread and returns at once; poll poll_system_status() until
 * "init_success" is 1 (loaded) or -1 (failed). */
RPCSERVER_API void init_async(const char * cmd);

/* {"success": true, "init_success": 1 (loaded) | 0 (not yet: unloaded or loading) | -1 (failed),
 *  "model": PATH, "model_alias": NAME, "state": "unloaded"|"loading"|"ok"|"error",
 *  "loading_progress": 0..1, "error": "..." (when failed)} */
RPCSERVER_API const char * poll_system_status(void);

/* {"text": "...", "add_special": bool? (default true: BOS added), "parse_special": bool? (default
 * false: special-token text is plain text)}
 *   -> {"success": true, "tokens": ["<piece>", ...], "length": N, "ids": [id, ...]}
 * The tokens are the pieces as strings, BOS included (its piece is ""). */
RPCSERVER_API const char * tokenize(const char * req);

/* A completion request (llama-server's /completion fields) -> its final response: content, stop,
 * model, prompt (as sent), tokens_predicted, tokens_evaluated, tokens_cached, truncated,
 * stopped_eos, stopped_word, stopped_limit, stopping_word, generation_settings, timings,
 * status (200), prompt_stats {n_ctx, total_prompt_tokens, truncated, n_past, cached, to_eval},
 * completion_probabilities (n_probs > 0), plus specrpc's fields and "success": true.
 * Any n_predict is a cap (the context bounds it). A prompt longer than the context is truncated
 * (n_keep + the tail) as the existing library did, unless "truncate": false. Blocks until done. */
RPCSERVER_API const char * get_completion(const char * req);

/* Starts a streamed completion; returns at once
 *   {"success": true, "request_id": N, "prompt_stats": {...}}
 * (prompt_stats.n_past is 0: the slot and its cached prefix are chosen when the job runs), or an
 * error (invalid request, not initialised) without starting anything. Several may run at once. */
RPCSERVER_API const char * async_completion_init(const char * req);

/* {"request_id": N} (optional: default the most recent) ->
 * {"success": true, "request_id": N, "completion_updates": [chunk, ...], "finished": bool}: the
 * chunks ({"content": "...", "stop": false, ...}) queued since the last poll. The last chunk of a
 * finished stream is the final response with "content": "" and "stop": true, as the existing
 * library sent it; the poll that reports "finished": true also carries "result" (the whole final
 * response) and, if the job was cancelled, "cancelled": true. Exactly one poll reports the end;
 * the request is then forgotten: polling it again answers -32004 (unknown request_id), with
 * "completion_updates": [] and "finished": true so that a polling loop ends. A job that failed is reported once as
 * {"success": false, "finished": true, "error": {...}, "completion_updates": [...]}. Finished jobs
 * nobody polls keep their result for 10 minutes (at most 256 of them); their threads end with them. */
RPCSERVER_API const char * async_completion_poll(const char * cmd);

/* {"request_id": N} (optional: default the most recent) -> {"success": true, "request_id": N}.
 * The next poll reports the end. Without a request_id and no job running: {"success": true}
 * (nothing to cancel, as the existing library answered); an unknown request_id: -32004. */
RPCSERVER_API const char * async_completion_cancel(const char * req);

/* Cancels everything, frees the engine (saving a dynamic n-gram cache if configured). */
RPCSERVER_API void deinit(void);

#ifdef __cplusplus
}
#endif

#endif /* SPECRPC_RPCSERVER_H */
