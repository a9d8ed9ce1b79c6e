// The local RPC links (see rpc_link.h). The wire format is llama.cpp's RPC protocol as of v0.5.0
// (ggml/src/ggml-rpc/ggml-rpc.cpp of the pinned source): a request is | cmd (1 byte) | size (8) |
// payload |, and the commands that have a reply get | size (8) | payload | back.
#include "engine/rpc_link.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "ggml-rpc.h"

namespace specrpc {

namespace {

// enum rpc_cmd of the pinned llama.cpp (RPC_PROTO_MAJOR_VERSION 7)
enum Cmd : uint8_t {
    ALLOC_BUFFER = 0, GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, FREE_BUFFER, BUFFER_CLEAR, SET_TENSOR,
    SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR, GRAPH_COMPUTE, GET_DEVICE_MEMORY, INIT_TENSOR, GET_ALLOC_SIZE,
    HELLO, DEVICE_COUNT, GRAPH_RECOMPUTE, MEMSET_TENSOR,
};
static_assert(RPC_PROTO_MAJOR_VERSION == 7, "the RPC links speak protocol 7: check the commands and replies");

constexpr size_t kHelloReq   = 24;        // conn_caps
constexpr size_t kHelloRsp   = 4 + 24;    // major, minor, patch, padding, conn_caps
constexpr size_t kSmall      = 64 << 10;  // requests up to this size are read whole (all but tensor data, graphs)
constexpr size_t kChunk      = 256 << 10;
constexpr int    kConnectMs  = 3000;

bool has_reply(uint8_t c) {
    switch (c) {
        case HELLO: case DEVICE_COUNT: case ALLOC_BUFFER: case GET_ALLOC_SIZE: case GET_ALIGNMENT: case GET_MAX_SIZE:
        case BUFFER_GET_BASE: case SET_TENSOR_HASH: case GET_TENSOR: case COPY_TENSOR: case GET_DEVICE_MEMORY:
            return true;
        default:
            return false;
    }
}

// Replies that depend only on the request and the worker: remembered, and replayed while it is lost.
bool memoizable(uint8_t c) { return c == DEVICE_COUNT || c == GET_ALIGNMENT || c == GET_MAX_SIZE || c == GET_DEVICE_MEMORY; }

bool read_full(int fd, void * p, size_t n) {
    auto * b = static_cast<uint8_t *>(p);
    while (n > 0) {
        const ssize_t r = ::recv(fd, b, n, 0);
        if (r > 0) { b += r; n -= static_cast<size_t>(r); continue; }
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) errno = ECONNRESET;
        return false;
    }
    return true;
}

bool write_full(int fd, const void * p, size_t n) {
    auto * b = static_cast<const uint8_t *>(p);
    while (n > 0) {
        const ssize_t r = ::send(fd, b, n, MSG_NOSIGNAL);
        if (r > 0) { b += r; n -= static_cast<size_t>(r); continue; }
        if (r < 0 && errno == EINTR) continue;
        return false;
    }
    return true;
}

void set_opt(int fd, int level, int name, int v) { (void) ::setsockopt(fd, level, name, &v, sizeof v); }

// A blocking TCP connection to host:port within timeout_ms, or -1 and why.
int connect_to(const std::string & endpoint, int timeout_ms, std::string & why) {
    std::string host, port;
    if (!rpc_split_endpoint(endpoint, host, port)) { why = "not HOST:PORT"; return -1; }
    addrinfo hints{};
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * res    = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) { why = gai_strerror(rc); return -1; }
    why = "no address";
    int fd = -1;
    for (addrinfo * a = res; a && fd < 0; a = a->ai_next) {
        fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) { why = std::strerror(errno); continue; }
        int err = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
        if (err == EINPROGRESS) {
            pollfd p{fd, POLLOUT, 0};
            const int n = ::poll(&p, 1, timeout_ms);
            socklen_t len = sizeof err;
            if (n == 0) err = ETIMEDOUT;
            else if (n < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
        if (err != 0) { why = std::strerror(err); ::close(fd); fd = -1; }
    }
    ::freeaddrinfo(res);
    if (fd < 0) return -1;
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    set_opt(fd, IPPROTO_TCP, TCP_NODELAY, 1);  // as llama.cpp's own client: one round trip per message
    return fd;
}

uint64_t get_u64(const uint8_t * p) { uint64_t v; std::memcpy(&v, p, 8); return v; }
void     put_u64(std::vector<uint8_t> & out, uint64_t v) {
    const size_t n = out.size();
    out.resize(n + 8);
    std::memcpy(out.data() + n, &v, 8);
}

}  // namespace

bool rpc_split_endpoint(const std::string & ep, std::string & host, std::string & port) {
    const size_t colon = ep.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 >= ep.size()) return false;
    host = ep.substr(0, colon);
    port = ep.substr(colon + 1);
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return false;
    const long n = std::strtol(port.c_str(), nullptr, 10);
    return n >= 1 && n <= 65535;
}

std::string rpc_hello(const std::string & endpoint, int timeout_ms) {
    std::string why;
    const int fd = connect_to(endpoint, timeout_ms, why);
    if (fd < 0) return why;
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    (void) ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void) ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    std::vector<uint8_t> req{HELLO};
    put_u64(req, kHelloReq);
    req.resize(req.size() + kHelloReq, 0);
    uint8_t rsp[8 + kHelloRsp];
    const bool ok = write_full(fd, req.data(), req.size()) && read_full(fd, rsp, sizeof rsp);
    const int  err = errno;
    ::close(fd);
    if (!ok) return std::string("no answer to the RPC handshake (") + std::strerror(err) + ")";
    if (get_u64(rsp) != kHelloRsp) return "not an RPC server of this llama.cpp (unexpected handshake reply)";
    if (rsp[8] != RPC_PROTO_MAJOR_VERSION || rsp[9] > RPC_PROTO_MINOR_VERSION)
        return "RPC protocol " + std::to_string(rsp[8]) + "." + std::to_string(rsp[9]) + " differs from this llama.cpp's " +
               std::to_string(RPC_PROTO_MAJOR_VERSION) + "." + std::to_string(RPC_PROTO_MINOR_VERSION);
    return "";
}

// What the links of one open() share: the lost state (and an eventfd that turns readable with
// it, to wake sessions waiting for llama.cpp's next command) and the replies remembered for replay.
struct RpcLinks::Group {
    std::vector<std::string> workers;
    std::atomic<bool>        lost{false};
    std::atomic<uint64_t>    fake_buffers{0};
    int                      wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    mutable std::mutex       mu;
    std::string              why;   // guarded by mu
    std::map<std::string, std::vector<uint8_t>> memo;  // guarded by mu

    ~Group() {
        if (wake >= 0) ::close(wake);
    }

    // The other workers hold this model's other layers, useless now, and serve one client at a
    // time: their sessions close their connections at the next message boundary, so that a
    // reload can reach them. Not at once: rpc-server dies of SIGPIPE when its client goes away
    // while it is sending a reply.
    void lose(size_t i, const std::string & reason) {
        std::lock_guard<std::mutex> lock(mu);
        if (lost.load()) return;
        why = "RPC worker " + workers[i] + " is unreachable (" + reason + ")";
        lost.store(true);
        const uint64_t one = 1;
        if (wake >= 0) (void) !::write(wake, &one, sizeof one);
        SPR_LOG_WARN("%s: requests fail until it is back", why.c_str());
    }
};

namespace {

using Group = RpcLinks::Group;

// The placeholder reply to `cmd` while the group is lost: well-formed, so that llama.cpp's client
// goes on; its values are never used (the pass fails). Replies llama.cpp checks (alignment,
// buffer bases) are plausible.
std::vector<uint8_t> placeholder(Group & g, const std::string & memo_key, uint8_t cmd, const std::vector<uint8_t> & req) {
    std::vector<uint8_t> out;
    if (memoizable(cmd)) {
        std::lock_guard<std::mutex> lock(g.mu);
        if (auto it = g.memo.find(memo_key); it != g.memo.end()) return it->second;
    }
    switch (cmd) {
        case HELLO:
            out = {RPC_PROTO_MAJOR_VERSION, RPC_PROTO_MINOR_VERSION, RPC_PROTO_PATCH_VERSION, 0};
            out.resize(kHelloRsp, 0);
            break;
        case DEVICE_COUNT: out = {1, 0, 0, 0}; break;
        case GET_ALIGNMENT: put_u64(out, 64); break;
        case GET_MAX_SIZE: put_u64(out, UINT64_MAX); break;
        case GET_DEVICE_MEMORY: put_u64(out, 0); put_u64(out, 0); break;
        case ALLOC_BUFFER:  // | device (4) | size (8) | → | remote_ptr | remote_size |
            put_u64(out, (++g.fake_buffers) << 12);
            put_u64(out, req.size() >= 12 ? get_u64(req.data() + 4) : 0);
            break;
        case BUFFER_GET_BASE: put_u64(out, uint64_t(1) << 40); break;
        case SET_TENSOR_HASH: out = {1}; break;  // "cached": the data need not be sent
        case COPY_TENSOR: out = {0}; break;      // "not copied": llama.cpp copies through the host
        case GET_ALLOC_SIZE: {  // | device (4) | rpc_tensor: id (8), type (4), buffer (8), ne (4 x 4) ... |
            uint64_t n = 8;     // 8 bytes per element: no type is larger
            for (int d = 0; d < 4; ++d) {
                uint32_t ne = 1;
                if (req.size() >= 24 + 16) std::memcpy(&ne, req.data() + 24 + 4 * d, 4);
                if (__builtin_mul_overflow(n, uint64_t(ne), &n)) n = uint64_t(1) << 40;
            }
            put_u64(out, n + 64);
            break;
        }
        default: break;  // GET_TENSOR is answered by the caller (its size is in the request)
    }
    return out;
}

// One connection of llama.cpp's RPC client, relayed to worker i over its own connection, which
// it keeps while that works and the group is not lost; without it, it answers with placeholders.
void session(std::shared_ptr<Group> g, size_t i, int down) {
    set_opt(down, IPPROTO_TCP, TCP_NODELAY, 1);
    int up = -1;
    if (!g->lost.load()) {
        std::string why;
        up = connect_to(g->workers[i], kConnectMs, why);
        if (up < 0) {
            g->lose(i, "cannot connect: " + why);
        } else {
            // A host that vanishes (power, network) sends no reset: keepalive probes and a bound on
            // unacknowledged data end the connection within about half a minute instead of never.
            set_opt(up, SOL_SOCKET, SO_KEEPALIVE, 1);
            set_opt(up, IPPROTO_TCP, TCP_KEEPIDLE, 10);
            set_opt(up, IPPROTO_TCP, TCP_KEEPINTVL, 5);
            set_opt(up, IPPROTO_TCP, TCP_KEEPCNT, 3);
            set_opt(up, IPPROTO_TCP, TCP_USER_TIMEOUT, 30000);
        }
    }
    auto drop = [&] {
        if (up >= 0) ::close(up);
        up = -1;
    };
    auto fail = [&](const char * what) {
        const int err = errno;
        g->lose(i, std::string(err == ECONNRESET || err == EPIPE ? "connection closed" : std::strerror(err)) + " " + what);
        drop();
    };
    std::vector<uint8_t> req, msg, chunk;
    for (;;) {
        // a message boundary: the worker waits for a command, so closing now ends it cleanly
        if (up >= 0 && g->lost.load()) drop();
        // Between commands the worker says nothing: anything readable from it then is its end, seen
        // at once (so /health tells before the next request finds out).
        if (up >= 0) {
            pollfd p[3] = {{down, POLLIN, 0}, {up, POLLIN, 0}, {g->wake, POLLIN, 0}};
            while (::poll(p, g->wake >= 0 ? 3 : 2, -1) < 0 && errno == EINTR) {}
            if (p[1].revents != 0) {
                errno = ECONNRESET;
                fail("while idle");
            } else if (p[2].revents != 0) {
                drop();
            }
        }
        uint8_t hdr[9];
        if (!read_full(down, hdr, sizeof hdr)) break;
        const uint8_t  cmd  = hdr[0];
        const uint64_t size = get_u64(hdr + 1);
        const bool     small = size <= kSmall;
        if (small) {
            req.resize(size);
            if (!read_full(down, req.data(), size)) break;
            if (cmd == HELLO && size == kHelloReq) std::fill(req.begin(), req.end(), 0);  // no transport upgrade: plain TCP
            if (up >= 0) {
                msg.assign(hdr, hdr + sizeof hdr);
                msg.insert(msg.end(), req.begin(), req.end());
                if (!write_full(up, msg.data(), msg.size())) fail("while sending");
            }
        } else {  // tensor data or a graph: streamed, never inspected
            req.clear();
            chunk.resize(kChunk);
            if (up >= 0 && !write_full(up, hdr, sizeof hdr)) fail("while sending");
            bool ok = true;
            for (uint64_t left = size; left > 0 && ok;) {
                const size_t n = static_cast<size_t>(std::min<uint64_t>(left, kChunk));
                ok = read_full(down, chunk.data(), n);
                left -= n;
                if (ok && up >= 0 && !write_full(up, chunk.data(), n)) fail("while sending");
            }
            if (!ok) break;
        }
        if (!has_reply(cmd)) continue;

        std::string key(1, char(cmd));
        key.append(reinterpret_cast<const char *>(req.data()), req.size());
        uint64_t rsize = 0;
        if (up >= 0 && !read_full(up, &rsize, 8)) fail("while waiting for a reply");
        if (up >= 0) {  // the worker's reply, to its end even if the group is lost meanwhile
            if (!write_full(down, &rsize, 8)) break;
            msg.clear();
            chunk.resize(kChunk);
            bool down_ok = true;
            for (uint64_t left = rsize, off = 0; left > 0 && down_ok;) {
                const size_t n = static_cast<size_t>(std::min<uint64_t>(left, kChunk));
                if (up >= 0 && !read_full(up, chunk.data(), n)) fail("while receiving a reply");
                if (up < 0) std::memset(chunk.data(), 0, n);  // the rest of the reply: zeros (the pass fails)
                if (cmd == HELLO && off == 0 && n >= kHelloRsp) std::memset(chunk.data() + 4, 0, kHelloRsp - 4);
                if (memoizable(cmd) && rsize <= 64) msg.insert(msg.end(), chunk.data(), chunk.data() + n);
                down_ok = write_full(down, chunk.data(), n);
                left -= n;
                off += n;
            }
            if (!down_ok) break;
            if (up >= 0 && memoizable(cmd) && rsize <= 64) {
                std::lock_guard<std::mutex> lock(g->mu);
                g->memo[key] = msg;
            }
            continue;
        }
        // no connection to the worker: the placeholder reply
        if (cmd == GET_TENSOR) {  // | rpc_tensor | offset (8) | size (8) |: zeros of the size asked for
            const uint64_t n = req.size() >= 8 ? get_u64(req.data() + req.size() - 8) : 0;
            chunk.assign(kChunk, 0);
            bool ok = write_full(down, &n, 8);
            for (uint64_t left = n; left > 0 && ok;) {
                const size_t k = static_cast<size_t>(std::min<uint64_t>(left, kChunk));
                ok = write_full(down, chunk.data(), k);
                left -= k;
            }
            if (!ok) break;
            continue;
        }
        const std::vector<uint8_t> rsp = placeholder(*g, key, cmd, req);
        const uint64_t n = rsp.size();
        if (!write_full(down, &n, 8) || !write_full(down, rsp.data(), rsp.size())) break;
    }
    ::close(down);
    drop();
}

void accept_loop(std::shared_ptr<Group> g, size_t i, int lfd) {
    for (;;) {
        const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return;  // shut down by ~RpcLinks
        }
        // detached: a session lives as long as llama.cpp's connection, which may outlive the links
        std::thread(session, g, i, fd).detach();
    }
}

}  // namespace

Result<std::shared_ptr<RpcLinks>> RpcLinks::open(const std::vector<std::string> & workers) {
    auto links     = std::shared_ptr<RpcLinks>(new RpcLinks());
    links->workers_ = workers;
    links->group_   = std::make_shared<Group>();
    links->group_->workers = workers;
    for (size_t i = 0; i < workers.size(); ++i) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family      = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len     = sizeof a;
        if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || ::listen(fd, 16) != 0 ||
            ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
            const std::string why = std::strerror(errno);
            if (fd >= 0) ::close(fd);
            return Status(ErrorCode::LOAD_FAILED, "cannot open a local link to RPC worker " + workers[i] + ": " + why);
        }
        links->listen_fds_.push_back(fd);
        links->local_.push_back("127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
        links->threads_.emplace_back(accept_loop, links->group_, i, fd);
    }
    return links;
}

RpcLinks::~RpcLinks() {
    for (int fd : listen_fds_) ::shutdown(fd, SHUT_RDWR);  // wakes accept()
    for (auto & t : threads_) t.join();
    for (int fd : listen_fds_) ::close(fd);
}

Status RpcLinks::status() const {
    if (!group_->lost.load()) return Status::ok();
    std::lock_guard<std::mutex> lock(group_->mu);
    return Status(ErrorCode::UNAVAILABLE, group_->why);
}

}  // namespace specrpc
