/* specrpc legacy C ABI: the functions existing callers (Python ctypes, Dart FFI) already use,
 * with unchanged signatures. New code should prefer specrpc.h (JSON-RPC 2.0 entry point).
 *
 * Ownership: every `const char *` returned is a NUL-terminated UTF-8 JSON text owned by the
 * library. It stays valid until the *same thread* calls any function of this header again (or
 * exits); callers that never free anything therefore do not leak. To release one earlier, or to
 * keep it across calls, copy it, or pass it to specrpc_free() (declared in specrpc.h; after that
 * the library does not touch it again). Never pass these strings to free().
 *
 * Errors: no function throws, aborts or returns NULL on bad input. Failures come back as JSON:
 *   {"success": false, "error": {"code": <JSON-RPC code>, "message": "...", "data": {...}}}
 * with the JSON-RPC 2.0 codes of specrpc.h (-32602 invalid params with data.param naming the
 * field, -32001 not initialised / loading, -32002 context exceeded, ...). Successful answers
 * carry "success": true. init() returns 1 or 0; why it failed is poll_system_status()'s "error".
 *
 * Threading: every function may be called from any thread, concurrently. One engine per process:
 * init() replaces a loaded one; deinit() frees it (in-flight completions are cancelled first) and
 * init() may be called again afterwards.
 *
 * Arguments: `cmd` of init/init_async is a command line with llama-server flags
 * ("-m PATH -md PATH -c 512 -np 2 -t 2 --spec-type draft ...") or a JSON object with the same keys
 * ({"model": PATH, "model_draft": PATH, "ctx_size": 512, "parallel": 2, "threads": 2,
 * "spec_type": "draft", ...}). Requests are JSON objects; NULL is treated as an empty request.
 */
#ifndef SPECRPC_RPCSERVER_H
#define SPECRPC_RPCSERVER_H

#if defined(_WIN32)
#define SPECRPC_API __declspec(dllexport)
#else
#define SPECRPC_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Loads the model(s) synchronously. Returns 1 on success, 0 on failure. */
SPECRPC_API int init(const char * cmd);

/* Starts loading on a background thread and returns at once; watch poll_system_status(). */
SPECRPC_API void init_async(const char * cmd);

/* {"success": true, "init_success": bool, "state": "unloaded"|"loading"|"ok"|"error",
 *  "loading_progress": 0..1, "model": PATH, "model_alias": NAME, "error": "..." (when failed)} */
SPECRPC_API const char * poll_system_status(void);

/* {"text": "...", "add_special": bool?, "parse_special": bool?}
 *   -> {"success": true, "tokens": [ids], "length": N} */
SPECRPC_API const char * tokenize(const char * req);

/* A completion request (llama-server's /completion fields) -> its result plus "success": true.
 * Blocks until the completion ends. */
SPECRPC_API const char * get_completion(const char * req);

/* Starts a streamed completion; returns {"success": true, "request_id": N} at once, or an error
 * (invalid request, not initialised, context exceeded) without starting anything. */
SPECRPC_API const char * async_completion_init(const char * req);

/* {"request_id": N} (optional: default the most recent) ->
 * {"success": true, "request_id": N, "completion_updates": [chunk, ...], "finished": bool,
 *  "result": {...} (when finished)}: the chunks queued since the last poll. A finished request is
 * forgotten after the poll that reports it. A request that ended in an error (or was cancelled)
 * is reported once as {"success": false, "finished": true, "error": {...}, "completion_updates"}
 * (cancelled: code -32800 with the partial result in error.data). */
SPECRPC_API const char * async_completion_poll(const char * cmd);

/* {"request_id": N} (optional: default the most recent) -> {"success": true, "request_id": N}.
 * The next poll reports the end. */
SPECRPC_API const char * async_completion_cancel(const char * req);

/* Cancels everything, frees the engine (saving a dynamic n-gram cache if configured). */
SPECRPC_API void deinit(void);

#ifdef __cplusplus
}
#endif

#endif /* SPECRPC_RPCSERVER_H */
