// The HTTP transport's connection layer: what cpp-httplib 0.11.4 (Debian 12) leaves unbounded.
//
// httplib gives every accepted connection a pool thread that reads the request head line by line
// with only a per-read timeout, keeps any number of header lines, and holds the thread through
// keep-alive waits. So a few clients sending a byte a second, or a few long generations, took
// every thread and /health stopped answering. Here httplib still parses and routes requests
// (Server::process_request), but:
//   - a "waiting room" thread (poll) owns every connection until its whole head has arrived:
//     within head_timeout_ms, at most max_head_bytes and max_header_lines, else 408 / 431; idle
//     keep-alive connections go back to it, so no thread waits on a silent client;
//   - a complete request runs on a worker of an elastic pool (min_threads .. max_threads); when
//     all are busy the request is answered 503 with Retry-After at once;
//   - the body must arrive by a deadline that grows with its announced length;
//   - a Content-Encoding is not inflated by httplib (which inflated without limit, before any
//     handler could check the API key): the header is renamed so the handler inflates after
//     admitting the request, stopping at the body limit (inflate_body);
//   - writes are never refused because the peer half-closed its side (httplib 0.11.4 did).
// When the room is full, the connection that has waited longest without sending a complete head
// is closed to make room (slow clients cannot lock new ones out).
//
// Thread-safety: adopt() from the listener thread; everything else is internal.
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

namespace specrpc::rpc {

struct ConnLimits {
    int         head_timeout_ms   = 10000;     // the whole request head, from its first byte
    int         idle_timeout_ms   = 5000;      // keep-alive: a new request must start within
    int         body_base_ms      = 10000;     // body deadline: this plus
    std::size_t body_min_rate     = 32 << 10;  // ... its length at this many bytes per second
    int         write_timeout_ms  = 30000;     // one write to a client that does not read
    std::size_t max_head_bytes    = 64 << 10;  // request line + headers
    int         max_header_lines  = 100;
    int         min_threads       = 8;         // workers kept
    int         max_threads       = 256;       // workers at most; beyond: 503 Retry-After
    int         max_connections   = 1024;      // connections waiting for a head (room size)
};

// Header name a Content-Encoding is renamed to (see above).
inline constexpr const char * DEFERRED_ENCODING_HEADER = "X-Specrpc-Content-Encoding";

// Inflates `body` as `encoding` (gzip, deflate, br; identity) into `out`, stopping with false
// and `too_large` when the result would exceed `max`. False without too_large: corrupt or an
// unknown encoding (`unsupported` set for the latter).
bool inflate_body(const std::string & encoding, const std::string & body, std::size_t max, std::string & out,
                  bool & too_large, bool & unsupported);

// What a handler may know of the connection it serves (the worker thread's current one).
struct ConnInfo {
    int  fd = -1;
    bool close_after = false;  // set by a handler that answered without reading the body
};
ConnInfo * current_conn();  // null outside a worker
// True when the peer of the current request has shut down its sending side (FIN) and sent
// nothing more: it waits for the answer (e.g. `nc -N`, shutdown(SHUT_WR)); not a hang-up.
bool current_peer_half_closed();

class ConnManager {
  public:
    // `serve` runs one request whose head is buffered in the stream; returns false or sets
    // `closed` when the connection must not be reused.
    using ServeFn = std::function<bool(httplib::Stream & strm, bool last, bool & closed)>;
    ConnManager(ConnLimits limits, ServeFn serve);
    ~ConnManager();  // stop()
    ConnManager(const ConnManager &) = delete;
    ConnManager & operator=(const ConnManager &) = delete;

    void adopt(int fd);  // takes ownership of an accepted socket
    void quiesce();      // no new requests; shuts down the sockets of those being served
    void stop();         // quiesce(), closes every connection, joins all threads; idempotent

    struct Conn;

  private:
    void room_loop();
    void worker_loop();
    void to_room(std::unique_ptr<Conn> c);
    void dispatch(std::unique_ptr<Conn> c);  // room thread
    void serve(std::unique_ptr<Conn> c);     // worker thread
    void wake();

    const ConnLimits limits_;
    const ServeFn    serve_;
    int              wake_fd_[2] = {-1, -1};

    std::mutex                         mu_;
    std::condition_variable            cv_;
    bool                               stopping_ = false;       // guarded by mu_
    std::deque<std::unique_ptr<Conn>>  incoming_;               // guarded: to the room
    std::deque<std::unique_ptr<Conn>>  ready_;                  // guarded: to the workers
    int                                n_idle_ = 0;             // guarded: workers waiting
    std::vector<std::thread>           workers_;                // guarded
    std::unordered_set<int>            busy_fds_;               // guarded: served now
    std::thread                        room_;
};

}  // namespace specrpc::rpc
