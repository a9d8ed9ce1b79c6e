/* specrpc C ABI (libspecrpc; every export is specrpc_*): one JSON-RPC 2.0 entry point into the
 * same dispatcher and methods the HTTP and stdio transports serve (completion, tokenize,
 * detokenize, health, props, metrics, slots, v1/completions, v1/chat/completions, init, deinit,
 * poll_system_status, $/cancelRequest, ...).
 *
 * The existing rpcserver library's functions are here as specrpc_init, specrpc_tokenize, ... and,
 * under their old names (rpcserver.h), in librpcserver, a thin layer over this library.
 *
 * Ownership: every string this library (or librpcserver) returns is malloc'd and NUL-terminated
 * and belongs to the caller, who releases it with specrpc_free() or free() (the same thing:
 * specrpc_free() also gives a large answer's memory back to the OS at once). Except
 * specrpc_version(), which returns a static string: do not free it.
 *
 * Errors: nothing throws or aborts across this boundary. Protocol and method errors are JSON-RPC
 * error responses (-32700 parse error, -32600 invalid request, -32601 method not found, -32602
 * invalid params with data.param, -32603 internal, -32001 not initialised/loading, -32002
 * context exceeded with data {n_prompt_tokens, n_ctx}, -32005 overloaded with data.retry_after,
 * -32006 unsupported, -32800 cancelled with the partial result in data). NULL is returned only
 * for notifications and all-notification batches (nothing to answer).
 *
 * Threading: all functions are thread-safe. A call blocks its thread until the method finishes;
 * cancel it from another thread with {"method": "$/cancelRequest", "params": {"id": <its id>}}.
 * Request ids are shared by all callers of the process.
 *
 * Memory: on glibc the first call fixes malloc's mmap threshold at 4 MiB (mallopt), and calls
 * that move 1 MiB or more end with malloc_trim, so that the memory a large call used goes back to
 * the OS instead of staying in the calling thread's arena for good. A process that wants its
 * own setting calls mallopt after that.
 */
#ifndef SPECRPC_SPECRPC_H
#define SPECRPC_SPECRPC_H

/* Exports when building the library (SPECRPC_BUILDING), imports otherwise. */
#if defined(_WIN32)
#if defined(SPECRPC_BUILDING)
#define SPECRPC_API __declspec(dllexport)
#else
#define SPECRPC_API __declspec(dllimport)
#endif
#else
#define SPECRPC_API __attribute__((visibility("default")))
#endif

/* The error codes of JSON-RPC error objects (error.code), in both ABIs. */
#define SPECRPC_ERR_PARSE            (-32700) /* invalid JSON */
#define SPECRPC_ERR_INVALID_REQUEST  (-32600) /* not a request object, body too large */
#define SPECRPC_ERR_METHOD_NOT_FOUND (-32601)
#define SPECRPC_ERR_INVALID_PARAMS   (-32602) /* error.data.param names the field */
#define SPECRPC_ERR_INTERNAL         (-32603)
#define SPECRPC_ERR_SERVER           (-32000)
#define SPECRPC_ERR_LOADING          (-32001) /* not initialised, loading, or the load failed */
#define SPECRPC_ERR_CONTEXT_EXCEEDED (-32002) /* data: n_prompt_tokens, n_ctx */
#define SPECRPC_ERR_UNAUTHORIZED     (-32003)
#define SPECRPC_ERR_NOT_FOUND        (-32004) /* unknown request_id, slot or file */
#define SPECRPC_ERR_OVERLOADED       (-32005) /* data: retry_after (seconds) */
#define SPECRPC_ERR_UNSUPPORTED      (-32006)
#define SPECRPC_ERR_CANCELLED        (-32800) /* data: the partial result */

#ifdef __cplusplus
extern "C" {
#endif

/* Handles one JSON-RPC 2.0 request or batch. Returns the response (free with specrpc_free), or
 * NULL for notifications. A NULL request is answered with -32600. */
SPECRPC_API char * specrpc_rpc(const char * request);

/* As specrpc_rpc, and calls on_notification(json, user) for every notification the call sends
 * (e.g. {"jsonrpc":"2.0","method":"completion.chunk","params":{"id":...,"data":{...}}} when the
 * request has "stream": true). The callback runs on the calling thread before this function
 * returns; `json` is valid only during the callback. on_notification may be NULL. */
SPECRPC_API char * specrpc_rpc_stream(const char * request,
                                      void (*on_notification)(const char * json, void * user), void * user);

/* Releases a string returned by this library (either header): free(), then, after a large one,
 * the heap's free pages go back to the OS (see Memory). NULL is a no-op. */
SPECRPC_API void specrpc_free(void * p);

/* "MAJOR.MINOR.PATCH" (static). */
SPECRPC_API const char * specrpc_version(void);

/* The existing rpcserver library's functions under specrpc_ names, with its exact conventions
 * (rpcserver.h documents them): librpcserver exports them under their old names. */
SPECRPC_API int    specrpc_init(const char * cmd);                    /* 0 success, 1 failure */
SPECRPC_API void   specrpc_init_async(const char * cmd);
SPECRPC_API char * specrpc_poll_system_status(void);
SPECRPC_API char * specrpc_tokenize(const char * req);
SPECRPC_API char * specrpc_get_completion(const char * req);
SPECRPC_API char * specrpc_async_completion_init(const char * req);
SPECRPC_API char * specrpc_async_completion_poll(const char * cmd);
SPECRPC_API char * specrpc_async_completion_cancel(const char * req);
SPECRPC_API void   specrpc_deinit(void);

#ifdef __cplusplus
}
#endif

#endif /* SPECRPC_SPECRPC_H */
