// A local relay in front of every llama.cpp rpc-server worker a model is split over, so that a
// worker that dies is an error the engine can report instead of the end of the process.
//
// Why: llama.cpp's RPC client (v0.5.0) does its socket I/O on a dispatcher thread per worker and
// calls GGML_ABORT on any failed send or receive; the engine thread meanwhile waits inside
// llama_decode for that thread. Nothing on the engine thread could catch the failure. So
// llama.cpp talks to 127.0.0.1:<link> instead, and the link forwards its RPC messages to the
// worker. When the worker's connection fails, the link marks its group lost, closes the group's
// connections to the other workers too (their state belongs to the same model, and an rpc-server
// serves one client at a time), and from then on answers every RPC command itself with
// well-formed placeholder replies (zeros), so llama.cpp's calls return instead of aborting. The link sets the
// group's lost flag before it sends the first placeholder: results of a pass that ended with
// status() ok came from the workers.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "specrpc/status.h"

namespace specrpc {

class RpcLinks {
  public:
    // Opens one link per worker ("host:port"): a listening socket on loopback and a thread
    // accepting llama.cpp's connections. Each connection gets its own connection to the worker.
    static Result<std::shared_ptr<RpcLinks>> open(const std::vector<std::string> & workers);
    ~RpcLinks();  // stops accepting; connections end when llama.cpp closes them

    RpcLinks(const RpcLinks &) = delete;
    RpcLinks & operator=(const RpcLinks &) = delete;

    // What to hand llama.cpp instead of workers()[i]: "127.0.0.1:<port>".
    const std::vector<std::string> & local_endpoints() const { return local_; }
    const std::vector<std::string> & workers() const { return workers_; }
    // ok while no worker was lost; else UNAVAILABLE naming the worker and why. Thread-safe.
    Status status() const;

    struct Group;  // rpc_link.cpp

  private:
    RpcLinks() = default;
    std::vector<std::string> workers_, local_;
    std::vector<int>         listen_fds_;
    std::vector<std::thread> threads_;  // accept loops
    std::shared_ptr<Group>   group_;
};

// An RPC handshake (HELLO) with llama.cpp's rpc-server at "host:port" within about timeout_ms:
// empty when it answers with a protocol version this llama.cpp speaks, else why not. Stronger
// than a TCP connect: a port can accept (a proxy, a half-started worker) with no worker behind it.
std::string rpc_hello(const std::string & endpoint, int timeout_ms);

// "host:port" split as llama.cpp's RPC client does (at the first ':'), port in [1, 65535].
bool rpc_split_endpoint(const std::string & ep, std::string & host, std::string & port);

}  // namespace specrpc
