// HTTP transport on cpp-httplib: POST /rpc (JSON-RPC, SSE when the client accepts
// text/event-stream) and a table of llama-server compatible REST routes mapped onto RPC methods.
//
// Streaming over REST: when the JSON body has "stream": true the answer is SSE; every
// notification's params.data becomes `data: {...}\n\n`, the final result (unless null) the last
// data event, then `data: [DONE]\n\n` on openai routes; an error ends the stream with
// `data: {"error":{...}}\n\n`. A method that sets CallContext::raw_body (Prometheus /metrics) has
// that body sent as it is, with its content type and headers.
//
// Connections (slow clients, header limits, thread pool, compressed bodies): http_conn.h.
//
// Cancellation: a write failure while streaming (the client closed the connection) flags the
// call cancelled. A silent stream is only probed when sse_keepalive_ms > 0 (an SSE comment
// `: keepalive` is written). A non-streamed generation call is cancelled when its client closes
// the connection (conn_watch.h), unless the client had shut down its sending side by the time
// the call started: such a client waits for the answer.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "server/jsonrpc.h"

namespace specrpc::rpc {

struct RestRoute {
    std::string method_http;          // "GET" or "POST"
    std::string path;                 // literal path, e.g. "/v1/chat/completions"
    std::string rpc_method;           // dispatcher method called with the body (POST) or {} (GET)
    bool        public_route = false; // true: no API key needed (health)
    bool        openai       = false; // true: `data: [DONE]` ends SSE streams
};

struct HttpOptions {
    std::string              host = "127.0.0.1";
    // More addresses listened on, on the same port (llama-server's `--host A,B`); their
    // connections are served exactly as `host`'s.
    std::vector<std::string> extra_hosts;
    int                      port = 8080;   // 0 = ephemeral; HttpServer::port() reports the real one
    std::vector<std::string> api_keys;      // empty = no authentication
    // Allowed browser origins. An entry without a port also matches that origin with any port;
    // "localhost" matches http(s)://localhost, 127.0.0.1 and [::1] with any port; "*" allows all.
    // Requests carrying any other Origin get 403; a preflight (OPTIONS) from one gets 200 without
    // Access-Control-* headers, so the browser refuses the call.
    std::vector<std::string> cors_origins = {"localhost"};
    // Host header values accepted besides the loopback names (localhost, 127.0.0.1, [::1], any
    // port) and `host`; "*" accepts any. Others get 403: a page that rebinds its DNS name to this
    // address cannot read /props, /slots or /metrics. Requests without a Host header pass.
    std::vector<std::string> allowed_hosts;
    std::size_t              max_body  = DEFAULT_MAX_BODY;  // bigger bodies: 413 / -32600
    int                      n_threads = 8;                 // connection threads kept
    int                      max_threads = 256;             // connection threads at most; then 503
    int                      max_connections = 1024;        // connections waiting for a request head
    int                      backlog   = 512;               // pending connections (capped by somaxconn)
    std::vector<RestRoute>   routes;                        // REST routes besides POST /rpc
    int                      sse_keepalive_ms = 0;          // >0: comment event after this silence
    // Vertex AI's prediction route (AIP_PREDICT_ROUTE, e.g. "/predict"); empty = none. Its body
    // {"instances": [{"@requestFormat": "chatCompletions", ...}, ...]} runs each instance through
    // the REST route it names (a path, or the path in camelCase) and answers {"predictions": [...]}.
    std::string              predict_route;
    int                      head_timeout_ms  = 10000;      // the whole request head must arrive within
    int                      read_timeout_s   = 10;         // body deadline: this plus 1 s per 32 KiB
    int                      write_timeout_s  = 30;         // one write to a slow client
    std::size_t              max_head_bytes   = 64 << 10;   // request line + headers; more: 431
    int                      max_header_lines = 100;        // more: 431
};

// The llama-server compatible routes (health, props, metrics, completion, tokenize, ...).
std::vector<RestRoute> default_rest_routes();

// True when `origin` is an entry of `allowed` (see HttpOptions::cors_origins).
bool origin_allowed(const std::vector<std::string> & allowed, const std::string & origin);

// Vertex AI's @requestFormat name of a REST path: "/v1/chat/completions" -> "chatCompletions".
std::string predict_format_name(const std::string & path);

// Maps a JSON-RPC error code to an HTTP status (-32602 -> 400, -32003 -> 401, -32005 -> 503, ...).
int http_status_for(int rpc_code);

// An HTTP server running in background threads. start/stop/port are not meant to be called
// concurrently with each other; requests are served concurrently (dispatcher must be thread-safe
// and outlive the server).
class HttpServer {
  public:
    HttpServer(Dispatcher & dispatcher, HttpOptions options);
    ~HttpServer();  // stops
    HttpServer(const HttpServer &) = delete;
    HttpServer & operator=(const HttpServer &) = delete;

    Status start();       // binds and starts serving; fails if the address is taken
    int    port() const;  // the bound port (after start), else the configured one
    void   stop();        // stops accepting, cancels streams, joins all threads; idempotent

    // Draining, for a replica behind a load balancer (SIGTERM): from now on every request, /health
    // included, is answered 503 with Retry-After and Connection: close, so the balancer takes this
    // replica out and sends the request elsewhere, while the requests already being served run to
    // their end. The listener stays open: a refused connection would look like a crash. Idempotent.
    void drain();
    int  requests_in_progress() const;  // requests being read, run or answered now (all routes)

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace specrpc::rpc
