// Notices HTTP clients that hang up while their non-streamed call runs.
//
// cpp-httplib 0.11.4 (Debian 12) neither tells a handler that its connection closed nor hands it
// the socket. The watcher finds the server-side socket by its peer address (the one httplib puts
// in Request::remote_addr/remote_port) and peeks at it every `interval_ms`: an orderly close
// (FIN) or a reset cancels the call through Dispatcher::cancel_connection, as a failed write
// does for an SSE stream. Peeking never consumes bytes, so a pipelined next request is left for
// httplib. The socket stays open while it is watched: httplib closes it only after the handler
// (which owns the Watch) returns.
//
// Thread-safety: watch() and Watch destruction from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace specrpc::rpc {

class Dispatcher;

// The fd of this process's TCP socket whose local port is `local_port` and whose peer is
// (`peer_addr`, `peer_port`) (numeric address as httplib prints it), or -1.
int find_server_socket(const std::string & peer_addr, int peer_port, int local_port);

class ConnWatcher {
  public:
    explicit ConnWatcher(Dispatcher & d, int interval_ms = 50);
    ~ConnWatcher();
    ConnWatcher(const ConnWatcher &) = delete;
    ConnWatcher & operator=(const ConnWatcher &) = delete;

    // Watching lasts as long as the returned object.
    class Watch {
      public:
        ~Watch();
        Watch(const Watch &) = delete;
        Watch & operator=(const Watch &) = delete;

      private:
        friend class ConnWatcher;
        Watch(ConnWatcher & w, int fd) : w_(w), fd_(fd) {}
        ConnWatcher & w_;
        int           fd_;
    };

    // Starts watching the server-side socket of a request; null when it cannot be found (the
    // call then simply runs to its end).
    std::unique_ptr<Watch> watch(const std::string & peer_addr, int peer_port, int local_port,
                                 std::shared_ptr<std::atomic<bool>> conn);

    // Watches a socket known by its descriptor (open for as long as the Watch lives).
    std::unique_ptr<Watch> watch_fd(int fd, std::shared_ptr<std::atomic<bool>> conn);

  private:
    void run();
    void unwatch(int fd);

    Dispatcher &                                           d_;
    const int                                              interval_ms_;
    std::mutex                                             mu_;
    std::condition_variable                                cv_;
    std::map<int, std::shared_ptr<std::atomic<bool>>>      watched_;  // fd -> the call's connection flag
    bool                                                   stopping_ = false;
    std::thread                                            thread_;
};

}  // namespace specrpc::rpc
