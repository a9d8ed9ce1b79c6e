#include "server/http_conn.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/strings.h"

namespace specrpc::rpc {

using clock_type = std::chrono::steady_clock;

struct ConnManager::Conn {
    int                    fd = -1;
    std::string            buf;             // bytes received and not yet consumed
    std::size_t            scan       = 0;  // where the head scan resumes
    std::size_t            line_start = 0;
    int                    lines      = -1;  // header lines so far (-1: no request line yet)
    std::size_t            head_len   = 0;   // > 0: buf starts with a complete head
    std::vector<std::size_t> encoding_at;   // offsets of Content-Encoding header names
    long long              content_length = 0;
    bool                   chunked  = false;
    bool                   started  = false;  // a byte of the current head arrived
    bool                   fresh    = true;   // no request served yet: the deadline runs from accept
    bool                   peer_eof = false;  // the peer shut down its sending side
    bool                   closing  = false;  // answered; draining until the peer closes
    clock_type::time_point since;             // entered the room (eviction order)
    clock_type::time_point deadline;

    void reset_head() {
        scan = line_start = 0;
        lines = -1;
        head_len = 0;
        encoding_at.clear();
        content_length = 0;
        chunked = started = fresh = false;
    }
};

namespace {

thread_local ConnInfo *          t_conn = nullptr;
thread_local const std::string * t_buf  = nullptr;  // the current stream's buffer
thread_local const std::size_t * t_pos  = nullptr;

long long ms_until(clock_type::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t - clock_type::now()).count();
}

// Waits for `events` on fd until `deadline`; true when ready (or in error, for the caller to see).
bool wait_fd(int fd, short events, clock_type::time_point deadline) {
    for (;;) {
        const long long left = ms_until(deadline);
        if (left < 0) return false;
        pollfd p{fd, events, 0};
        const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
        if (r > 0) return true;
        if (r == 0) return false;
        if (errno != EINTR) return false;
    }
}

void close_fd(int fd) {
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
}

const char * reason(int status) {
    switch (status) {
        case 408: return "Request Timeout";
        case 431: return "Request Header Fields Too Large";
        case 503: return "Service Unavailable";
        default:  return "Error";
    }
}

// A short answer written without blocking (the room thread must not wait on a client).
void send_status(int fd, int status, const std::string & message) {
    const char * type = status == 503 ? "unavailable_error" : "invalid_request_error";
    const std::string body = "{\"error\":{\"code\":" + std::to_string(status) + ",\"message\":\"" + message +
                             "\",\"type\":\"" + type + "\"}}";
    std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) +
                      "\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\nConnection: close\r\n";
    if (status == 503) out += "Retry-After: 1\r\n";
    out += "\r\n" + body;
    [[maybe_unused]] const ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

bool numeric_name(int fd, bool peer, std::string & ip, int & port) {
    sockaddr_storage a{};
    socklen_t        len = sizeof a;
    const int r = peer ? ::getpeername(fd, reinterpret_cast<sockaddr *>(&a), &len)
                       : ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
    if (r != 0) return false;
    char h[NI_MAXHOST], p[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<const sockaddr *>(&a), len, h, sizeof h, p, sizeof p,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return false;
    ip   = h;
    port = std::atoi(p);
    return true;
}

std::string trim(std::string_view s) {
    std::size_t b = 0, e = s.size();
    while (b < e && (s[b] == ' ' || s[b] == '\t')) b++;
    while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) e--;
    return std::string(s.substr(b, e - b));
}

enum class Scan { MORE, DONE, TOO_LARGE };

// Advances the head scan over the new bytes of c.buf.
Scan scan_head(ConnManager::Conn & c, const ConnLimits & lim) {
    for (; c.scan < c.buf.size(); c.scan++) {
        if (c.buf[c.scan] != '\n') continue;
        const std::string_view line(c.buf.data() + c.line_start, c.scan - c.line_start);
        const std::size_t at = c.line_start;
        c.line_start = c.scan + 1;
        if (line.empty() || line == "\r") {
            c.head_len = c.scan + 1;
            c.scan++;
            return Scan::DONE;
        }
        if (++c.lines > lim.max_header_lines) return Scan::TOO_LARGE;
        if (c.lines == 0) continue;  // the request line
        const std::size_t colon = line.find(':');
        if (colon == std::string_view::npos) continue;
        const std::string_view name = line.substr(0, colon);
        const std::string      value = trim(line.substr(colon + 1));
        if (equals_nocase(name, "Content-Length")) {
            c.content_length = std::strtoll(value.c_str(), nullptr, 10);
        } else if (equals_nocase(name, "Transfer-Encoding")) {
            c.chunked = value.find("chunked") != std::string::npos;
        } else if (equals_nocase(name, "Content-Encoding")) {
            c.encoding_at.push_back(at);
        }
    }
    if (c.buf.size() > lim.max_head_bytes) return Scan::TOO_LARGE;
    return Scan::MORE;
}

// Renames Content-Encoding headers so that httplib does not inflate the body (see the header).
void defer_encoding(ConnManager::Conn & c) {
    static const std::size_t name_len = std::strlen("Content-Encoding");
    for (auto it = c.encoding_at.rbegin(); it != c.encoding_at.rend(); ++it) {
        c.buf.replace(*it, name_len, DEFERRED_ENCODING_HEADER);
        c.head_len += std::strlen(DEFERRED_ENCODING_HEADER) - name_len;
    }
    c.encoding_at.clear();
}

// One request over a connection whose head is buffered: httplib reads the head from the buffer,
// the body from the socket (bounded by `deadline`) and writes with a per-write timeout.
class ConnStream : public httplib::Stream {
  public:
    ConnStream(ConnManager::Conn & c, clock_type::time_point deadline, int write_timeout_ms)
        : c_(c), deadline_(deadline), write_timeout_(write_timeout_ms) {}

    bool is_readable() const override { return pos_ < c_.buf.size() || wait_fd(c_.fd, POLLIN, deadline_); }
    bool is_writable() const override {
        // no liveness probe: a peer that half-closed still reads its answer
        return wait_fd(c_.fd, POLLOUT, clock_type::now() + std::chrono::milliseconds(write_timeout_));
    }

    ssize_t read(char * ptr, std::size_t size) override {
        if (pos_ < c_.buf.size()) {
            const std::size_t n = std::min(size, c_.buf.size() - pos_);
            std::memcpy(ptr, c_.buf.data() + pos_, n);
            pos_ += n;
            return static_cast<ssize_t>(n);
        }
        for (;;) {
            const ssize_t n = ::recv(c_.fd, ptr, size, MSG_DONTWAIT);
            if (n >= 0) {
                if (n == 0) c_.peer_eof = true;
                return n;
            }
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
            if (!wait_fd(c_.fd, POLLIN, deadline_)) {
                failed_ = true;  // the body is late: the connection is dropped
                SPR_LOG_DEBUG("http: fd %d: the body did not arrive by its deadline", c_.fd);
                return -1;
            }
        }
    }

    ssize_t write(const char * ptr, std::size_t size) override {
        std::size_t off = 0;
        while (off < size) {
            const ssize_t n = ::send(c_.fd, ptr + off, size - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                off += static_cast<std::size_t>(n);
                continue;
            }
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
                wait_fd(c_.fd, POLLOUT, clock_type::now() + std::chrono::milliseconds(write_timeout_)))
                continue;
            failed_ = true;
            SPR_LOG_DEBUG("http: fd %d: write failed after %zu of %zu bytes: %s", c_.fd, off, size,
                          n < 0 && errno != EAGAIN && errno != EWOULDBLOCK ? std::strerror(errno) : "timed out");
            return -1;
        }
        return static_cast<ssize_t>(size);
    }

    void get_remote_ip_and_port(std::string & ip, int & port) const override { numeric_name(c_.fd, true, ip, port); }
    void get_local_ip_and_port(std::string & ip, int & port) const override { numeric_name(c_.fd, false, ip, port); }
    socket_t socket() const override { return c_.fd; }

    bool        failed() const { return failed_; }
    std::string leftover() const { return c_.buf.substr(std::min(pos_, c_.buf.size())); }
    const std::size_t & pos() const { return pos_; }

  private:
    ConnManager::Conn &    c_;
    clock_type::time_point deadline_;
    int                    write_timeout_;
    std::size_t            pos_    = 0;
    bool                   failed_ = false;
};

}  // namespace

ConnInfo * current_conn() { return t_conn; }

bool current_peer_half_closed() {
    if (!t_conn || t_conn->fd < 0) return false;
    if (t_buf && t_pos && *t_pos < t_buf->size()) return false;  // a next request is buffered
    char c;
    return ::recv(t_conn->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

bool inflate_body(const std::string & encoding, const std::string & body, std::size_t max, std::string & out,
                  bool & too_large, bool & unsupported) {
    too_large = unsupported = false;
    out.clear();
    std::unique_ptr<httplib::detail::decompressor> d;
    const std::string enc = trim(encoding);
    if (enc.empty() || equals_nocase(enc, "identity")) {
        if (body.size() > max) return too_large = true, false;
        out = body;
        return true;
    }
    if (equals_nocase(enc, "gzip") || equals_nocase(enc, "deflate") || equals_nocase(enc, "x-gzip")) {
        d = std::make_unique<httplib::detail::gzip_decompressor>();
    } else if (equals_nocase(enc, "br")) {
        d = std::make_unique<httplib::detail::brotli_decompressor>();
    } else {
        unsupported = true;
        return false;
    }
    if (!d->is_valid()) return false;
    const bool ok = d->decompress(body.data(), body.size(), [&](const char * data, std::size_t n) {
        if (out.size() + n > max) {
            too_large = true;
            return false;
        }
        out.append(data, n);
        return true;
    });
    if (too_large) out.clear();
    return ok && !too_large;
}

ConnManager::ConnManager(ConnLimits limits, ServeFn serve) : limits_(limits), serve_(std::move(serve)) {
    if (::pipe2(wake_fd_, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("http: pipe failed");
    room_ = std::thread([this] { room_loop(); });
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < limits_.min_threads; i++) workers_.emplace_back([this] { worker_loop(); });
}

ConnManager::~ConnManager() {
    stop();
    for (int fd : wake_fd_)
        if (fd >= 0) ::close(fd);
}

void ConnManager::wake() {
    const char c = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_[1], &c, 1);
}

void ConnManager::adopt(int fd) {
    const int fl = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    auto c      = std::make_unique<Conn>();
    c->fd       = fd;
    c->since    = clock_type::now();
    c->deadline = c->since + std::chrono::milliseconds(limits_.head_timeout_ms);
    to_room(std::move(c));
}

void ConnManager::to_room(std::unique_ptr<Conn> c) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) {
            close_fd(c->fd);
            return;
        }
        incoming_.push_back(std::move(c));
    }
    wake();
}

void ConnManager::dispatch(std::unique_ptr<Conn> c) {
    defer_encoding(*c);
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) {
        lock.unlock();
        close_fd(c->fd);
        return;
    }
    if (static_cast<std::size_t>(n_idle_) > ready_.size()) {
        ready_.push_back(std::move(c));
        cv_.notify_one();
        return;
    }
    if (static_cast<int>(workers_.size()) < limits_.max_threads) {
        ready_.push_back(std::move(c));
        try {
            workers_.emplace_back([this] { worker_loop(); });
        } catch (const std::exception &) {
            SPR_LOG_WARN("http: cannot start a connection thread");
        }
        return;
    }
    SPR_LOG_DEBUG("http: every connection thread is busy, answering 503");
    send_status(c->fd, 503, "server busy: every connection thread is in use");
    // drained by the room like any answered connection (closing at once could reset the answer)
    ::shutdown(c->fd, SHUT_WR);
    c->closing  = true;
    c->buf.clear();
    c->deadline = clock_type::now() + std::chrono::seconds(1);
    incoming_.push_back(std::move(c));
}

void ConnManager::room_loop() {
    std::vector<std::unique_ptr<Conn>> conns;
    std::vector<pollfd>                pfds;
    char                               scratch[16384];
    auto start_closing = [&](Conn & c, int status, const char * msg) {
        send_status(c.fd, status, msg);
        ::shutdown(c.fd, SHUT_WR);
        c.closing  = true;
        c.buf.clear();
        c.deadline = clock_type::now() + std::chrono::seconds(1);
    };
    for (;;) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (stopping_) break;
            while (!incoming_.empty()) {
                conns.push_back(std::move(incoming_.front()));
                incoming_.pop_front();
            }
        }
        // A full room drops the connection that has waited longest for a head.
        while (conns.size() > static_cast<std::size_t>(std::max(1, limits_.max_connections))) {
            auto oldest = std::min_element(conns.begin(), conns.end(),
                                           [](const auto & a, const auto & b) { return a->since < b->since; });
            SPR_LOG_DEBUG("http: too many waiting connections, closing the oldest");
            close_fd((*oldest)->fd);
            conns.erase(oldest);
        }
        // Returning keep-alive connections may already hold a complete next request.
        for (auto & c : conns) {
            if (c && !c->closing && !c->buf.empty() && c->head_len == 0 && scan_head(*c, limits_) == Scan::DONE) {
                dispatch(std::move(c));
            }
        }
        conns.erase(std::remove(conns.begin(), conns.end(), nullptr), conns.end());

        pfds.assign(1, pollfd{wake_fd_[0], POLLIN, 0});
        long long timeout = 1000;
        for (const auto & c : conns) {
            pfds.push_back(pollfd{c->fd, POLLIN, 0});
            timeout = std::min(timeout, std::max(0LL, ms_until(c->deadline)));
        }
        const int r = ::poll(pfds.data(), pfds.size(), static_cast<int>(timeout));
        if (r < 0 && errno != EINTR) SPR_LOG_WARN("http: poll failed: %s", std::strerror(errno));
        if (pfds[0].revents) {
            while (::read(wake_fd_[0], scratch, sizeof scratch) > 0) {}
        }
        const auto now = clock_type::now();
        for (std::size_t i = 0; i < conns.size(); i++) {
            Conn & c = *conns[i];
            const short ev = pfds[i + 1].revents;
            bool drop = false;
            if (ev != 0 && c.closing) {
                const ssize_t n = ::recv(c.fd, scratch, sizeof scratch, MSG_DONTWAIT);
                drop = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
            } else if (ev != 0) {
                for (;;) {
                    const std::size_t room = limits_.max_head_bytes + 1 - std::min(c.buf.size(), limits_.max_head_bytes);
                    const ssize_t n = ::recv(c.fd, scratch, std::min(room, sizeof scratch), MSG_DONTWAIT);
                    if (n > 0) {
                        if (!c.started) {
                            c.started  = true;
                            if (!c.fresh) c.deadline = now + std::chrono::milliseconds(limits_.head_timeout_ms);
                        }
                        c.buf.append(scratch, static_cast<std::size_t>(n));
                        const Scan s = scan_head(c, limits_);
                        if (s != Scan::MORE) {
                            if (s == Scan::TOO_LARGE) start_closing(c, 431, "request head too large");
                            break;
                        }
                        continue;
                    }
                    if (n == 0) c.peer_eof = true;
                    else if (errno == EINTR) continue;
                    else if (errno != EAGAIN && errno != EWOULDBLOCK) drop = true;
                    break;
                }
                if (c.head_len == 0 && !c.closing && c.peer_eof) drop = true;  // ended without a request
            }
            if (!drop && !c.closing && c.head_len > 0) {
                dispatch(std::move(conns[i]));
                continue;
            }
            if (!drop && now >= c.deadline) {
                if (c.closing || !c.started) drop = true;  // drained, or a silent (keep-alive) client
                else start_closing(c, 408, "request head not received in time");
            }
            if (drop) {
                close_fd(c.fd);
                conns[i].reset();
            }
        }
        conns.erase(std::remove(conns.begin(), conns.end(), nullptr), conns.end());
    }
    for (auto & c : conns) close_fd(c->fd);
}

void ConnManager::worker_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        n_idle_++;
        cv_.wait(lock, [this] { return stopping_ || !ready_.empty(); });
        n_idle_--;
        if (ready_.empty()) return;  // stopping
        std::unique_ptr<Conn> c = std::move(ready_.front());
        ready_.pop_front();
        busy_fds_.insert(c->fd);
        lock.unlock();
        serve(std::move(c));
        lock.lock();
    }
}

void ConnManager::serve(std::unique_ptr<Conn> c) {
    const long long body = c->content_length > 0 ? c->content_length : (c->chunked ? (8LL << 20) : 0);
    const auto deadline  = clock_type::now() + std::chrono::milliseconds(limits_.body_base_ms) +
                          std::chrono::milliseconds(body * 1000 / static_cast<long long>(std::max<std::size_t>(1, limits_.body_min_rate)));
    bool keep = false, info_close_after = false, stopping_now = false;
    {
        ConnStream strm(*c, deadline, limits_.write_timeout_ms);
        ConnInfo   info;
        info.fd = c->fd;
        t_conn  = &info;
        t_buf   = &c->buf;
        t_pos   = &strm.pos();
        bool stopping;
        {
            std::lock_guard<std::mutex> lock(mu_);
            stopping = stopping_;
        }
        bool closed = false;
        bool ok     = false;
        try {
            ok = serve_(strm, stopping, closed);
        } catch (const std::exception & e) {
            SPR_LOG_ERROR("http: request failed: %s", e.what());
        }
        t_conn = nullptr;
        t_buf  = nullptr;
        t_pos  = nullptr;
        if (!ok) SPR_LOG_DEBUG("http: fd %d: request not served (closed, unreadable or unwritable)", c->fd);
        keep   = ok && !closed && !info.close_after && !strm.failed() && !c->peer_eof && !stopping;
        info_close_after = info.close_after && !strm.failed();
        stopping_now     = stopping;
        if (keep) {
            c->buf = strm.leftover();
            c->reset_head();
        }
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        busy_fds_.erase(c->fd);
    }
    if (!keep && info_close_after && !stopping_now) {
        // The body was not read: closing now would reset the connection and could destroy the
        // answer before the client reads it. Drain (briefly) on the room thread instead.
        ::shutdown(c->fd, SHUT_WR);
        c->closing  = true;
        c->buf.clear();
        c->deadline = clock_type::now() + std::chrono::seconds(1);
        to_room(std::move(c));
        return;
    }
    if (!keep) {
        close_fd(c->fd);
        return;
    }
    c->since    = clock_type::now();
    c->deadline = c->since + std::chrono::milliseconds(limits_.idle_timeout_ms);
    to_room(std::move(c));
}

void ConnManager::quiesce() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
        // Blocked reads and writes end now; a generation whose client socket is shut down is
        // cancelled by its ConnWatcher (the peek sees end of file) or its failing stream.
        for (int fd : busy_fds_) ::shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    wake();
}

void ConnManager::stop() {
    quiesce();
    std::vector<std::thread> workers;
    {
        std::lock_guard<std::mutex> lock(mu_);
        workers.swap(workers_);
    }
    if (room_.joinable()) room_.join();
    for (auto & t : workers) t.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto & c : incoming_) close_fd(c->fd);
    for (auto & c : ready_) close_fd(c->fd);
    incoming_.clear();
    ready_.clear();
}

}  // namespace specrpc::rpc
