// Stdio transport: JSON-RPC over a pair of streams (stdin/stdout in the real server).
//
// Framing is detected per message: a message whose first non-blank line starts with
// "Content-" is LSP-style (`Content-Length: N\r\n` headers, a blank line, then N bytes);
// anything else is one JSON text on one line (newline-delimited JSON; pretty-printed JSON
// spanning several lines is not supported there). Responses and the notifications of a call use
// the framing of the request. Logs go to stderr only; `out` carries nothing but messages.
#pragma once

#include <cstddef>
#include <functional>
#include <istream>
#include <memory>
#include <ostream>

#include "server/jsonrpc.h"

namespace specrpc::rpc {

struct StdioOptions {
    int         n_workers = 4;    // calls running at once (each on its own worker thread)
    std::size_t max_queue = 256;  // messages waiting for a worker; beyond: -32005 overloaded
    // True while a model loads: calls other than `health`/`poll_system_status` wait until it
    // returns false (ready or failed) instead of being answered -32001. Empty: never waits.
    std::function<bool()> loading;
};

// Serves one client until EOF. Messages are read on the calling thread and run on worker
// threads, so `$/cancelRequest` (handled inline by the reader) reaches a running call. Writes
// are serialised. Not thread-safe itself: call run() once, from one thread.
class StdioServer {
  public:
    StdioServer(Dispatcher & dispatcher, std::istream & in, std::ostream & out, StdioOptions options = {});
    ~StdioServer();
    StdioServer(const StdioServer &) = delete;
    StdioServer & operator=(const StdioServer &) = delete;

    // Reads until EOF, then waits for the calls in flight and returns 0 (1 if `out` failed).
    int run();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace specrpc::rpc
