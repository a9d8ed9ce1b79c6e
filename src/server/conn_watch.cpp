#include "server/conn_watch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "server/jsonrpc.h"

namespace specrpc::rpc {

namespace {

// Numeric host and port of a socket address ("127.0.0.1", 43210).
bool numeric_address(const sockaddr_storage & a, socklen_t len, std::string * host, int * port) {
    char h[NI_MAXHOST], p[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<const sockaddr *>(&a), len, h, sizeof h, p, sizeof p,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return false;
    *host = h;
    *port = std::atoi(p);
    return true;
}

}  // namespace

int find_server_socket(const std::string & peer_addr, int peer_port, int local_port) {
    if (peer_addr.empty() || peer_port <= 0) return -1;
    DIR * dir = opendir("/proc/self/fd");
    if (!dir) return -1;
    const int own = dirfd(dir);
    int found = -1;
    while (dirent * e = readdir(dir)) {
        char * end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == own) continue;
        sockaddr_storage a{};
        socklen_t len = sizeof a;
        if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr *>(&a), &len) != 0) continue;
        std::string host;
        int port = 0;
        if (!numeric_address(a, len, &host, &port) || port != peer_port || host != peer_addr) continue;
        len = sizeof a;
        if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr *>(&a), &len) != 0) continue;
        if (!numeric_address(a, len, &host, &port) || port != local_port) continue;
        found = static_cast<int>(fd);
        break;
    }
    closedir(dir);
    return found;
}

ConnWatcher::ConnWatcher(Dispatcher & d, int interval_ms) : d_(d), interval_ms_(interval_ms) {
    thread_ = std::thread([this] { run(); });
}

ConnWatcher::~ConnWatcher() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

ConnWatcher::Watch::~Watch() { w_.unwatch(fd_); }

std::unique_ptr<ConnWatcher::Watch> ConnWatcher::watch(const std::string & peer_addr, int peer_port,
                                                       int local_port, std::shared_ptr<std::atomic<bool>> conn) {
    return watch_fd(find_server_socket(peer_addr, peer_port, local_port), std::move(conn));
}

std::unique_ptr<ConnWatcher::Watch> ConnWatcher::watch_fd(int fd, std::shared_ptr<std::atomic<bool>> conn) {
    if (fd < 0) return nullptr;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (watched_.count(fd)) return nullptr;  // cannot happen: one request per connection at a time
        watched_[fd] = std::move(conn);
    }
    cv_.notify_all();
    return std::unique_ptr<Watch>(new Watch(*this, fd));
}

void ConnWatcher::unwatch(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    watched_.erase(fd);
}

void ConnWatcher::run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
        if (watched_.empty()) {
            cv_.wait(lock, [this] { return stopping_ || !watched_.empty(); });
            continue;
        }
        cv_.wait_for(lock, std::chrono::milliseconds(interval_ms_), [this] { return stopping_; });
        std::vector<std::shared_ptr<std::atomic<bool>>> hung_up;
        for (auto it = watched_.begin(); it != watched_.end();) {
            char c;
            // the fd is open: its Watch (held by the handler) outlives httplib's close
            const ssize_t n = recv(it->first, &c, 1, MSG_PEEK | MSG_DONTWAIT);
            const bool closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
            if (closed) {
                hung_up.push_back(it->second);
                it = watched_.erase(it);
            } else {
                ++it;
            }
        }
        if (hung_up.empty()) continue;
        lock.unlock();
        for (const auto & conn : hung_up) d_.cancel_connection(conn);
        lock.lock();
    }
}

}  // namespace specrpc::rpc
