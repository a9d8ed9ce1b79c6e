// Server-Sent Events plumbing of the HTTP transport: the registry of live connections (so
// stop() can cancel them), and one SSE response fed by a worker thread. Private to src/server.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "common/log.h"
#include "server/jsonrpc.h"

namespace specrpc::rpc {

// Connection flags of the requests being served, so that stop() can cancel them.
class ConnRegistry {
  public:
    void add(const std::shared_ptr<std::atomic<bool>> & c) {
        std::lock_guard<std::mutex> lock(mu_);
        conns_.insert(c);
    }
    void remove(const std::shared_ptr<std::atomic<bool>> & c) {
        std::lock_guard<std::mutex> lock(mu_);
        conns_.erase(c);
    }
    void cancel_all(Dispatcher & d) {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto & c : conns_) d.cancel_connection(c);
    }

  private:
    std::mutex                                   mu_;
    std::set<std::shared_ptr<std::atomic<bool>>> conns_;  // guarded by mu_
};

// Keeps a connection flag registered for its lifetime.
class ConnGuard {
  public:
    ConnGuard(ConnRegistry & r, std::shared_ptr<std::atomic<bool>> c) : r_(r), c_(std::move(c)) { r_.add(c_); }
    ~ConnGuard() { r_.remove(c_); }
    ConnGuard(const ConnGuard &) = delete;
    ConnGuard & operator=(const ConnGuard &) = delete;

  private:
    ConnRegistry &                     r_;
    std::shared_ptr<std::atomic<bool>> c_;
};

// One SSE response: a worker thread runs the call and queues framed events; the httplib
// connection thread writes them from the chunked content provider. A failed write cancels the
// call (dispatcher.cancel_connection). Thread-safety: push/finish/fail_early from any thread;
// wait_first_event/attach from the handler thread only.
class SseStream : public std::enable_shared_from_this<SseStream> {
  public:
    SseStream(Dispatcher & d, ConnRegistry & reg, std::shared_ptr<std::atomic<bool>> conn, int keepalive_ms)
        : d_(d), conn_(conn), guard_(reg, conn), keepalive_ms_(keepalive_ms) {}
    ~SseStream() { close(); }
    SseStream(const SseStream &) = delete;
    SseStream & operator=(const SseStream &) = delete;

    // Runs `work` on the worker thread; work ends with finish() or fail_early().
    void start(std::function<void()> work) {
        worker_ = std::thread([this, work = std::move(work)] {
            try {
                work();
            } catch (...) {
                SPR_LOG_ERROR("http: stream worker threw");
            }
            finish({});  // no-op when work already finished
        });
    }

    // Queues one framed event; dropped once the client is gone.
    void push(std::string event) {
        std::lock_guard<std::mutex> lock(mu_);
        if (closed_ || finished_) return;
        events_.push_back(std::move(event));
        n_pushed_++;
        cv_.notify_all();
    }

    // Queues the last events and ends the stream. Idempotent.
    void finish(std::vector<std::string> tail) {
        std::lock_guard<std::mutex> lock(mu_);
        if (finished_) return;
        if (!closed_) {
            for (auto & e : tail) events_.push_back(std::move(e));
        }
        finished_ = true;
        cv_.notify_all();
    }

    // Ends the stream with `err` as a plain HTTP error if nothing was pushed yet.
    bool fail_early(const RpcError & err) {
        std::lock_guard<std::mutex> lock(mu_);
        if (n_pushed_ > 0 || finished_) return false;
        early_error_ = err;
        finished_    = true;
        cv_.notify_all();
        return true;
    }

    // Blocks until the first event or the end; returns the early error (worker joined) if any.
    std::optional<RpcError> wait_first_event() {
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return n_pushed_ > 0 || finished_; });
            if (!early_error_) return std::nullopt;
        }
        if (worker_.joinable()) worker_.join();
        return early_error_;
    }

    // Makes `res` an SSE response fed by this stream.
    void attach(httplib::Response & res) {
        auto self = shared_from_this();
        res.status = 200;
        res.set_header("Cache-Control", "no-cache");
        res.set_header("X-Accel-Buffering", "no");
        res.set_chunked_content_provider(
            "text/event-stream", [self](std::size_t, httplib::DataSink & sink) { return self->provide(sink); },
            [self](bool) { self->close(); });
    }

  private:
    using clock = std::chrono::steady_clock;

    bool provide(httplib::DataSink & sink) {
        std::deque<std::string> batch;
        bool                    done = false;
        {
            std::unique_lock<std::mutex> lock(mu_);
            const int wait_ms = keepalive_ms_ > 0 ? std::min(keepalive_ms_, 250) : 250;
            cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return !events_.empty() || finished_; });
            batch.swap(events_);
            done = finished_;
        }
        for (const std::string & ev : batch) {
            if (!sink.write(ev.data(), ev.size())) return drop();
        }
        if (!batch.empty()) last_write_ = clock::now();
        if (done) {
            sink.done();
            return true;
        }
        if (keepalive_ms_ > 0 && clock::now() - last_write_ >= std::chrono::milliseconds(keepalive_ms_)) {
            static const std::string ka = ": keepalive\n\n";
            if (!sink.write(ka.data(), ka.size())) return drop();
            last_write_ = clock::now();
        }
        return true;
    }

    bool drop() {
        SPR_LOG_DEBUG("http: client closed a stream, cancelling the call");
        d_.cancel_connection(conn_);
        std::lock_guard<std::mutex> lock(mu_);
        closed_ = true;
        events_.clear();
        return false;
    }

    // End of the response (or server stop): cancel an unfinished call and wait for it.
    void close() {
        bool finished;
        {
            std::lock_guard<std::mutex> lock(mu_);
            closed_  = true;
            finished = finished_;
        }
        if (!finished) d_.cancel_connection(conn_);
        if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
    }

    Dispatcher &                       d_;
    std::shared_ptr<std::atomic<bool>> conn_;
    ConnGuard                          guard_;
    const int                          keepalive_ms_;
    std::thread                        worker_;
    clock::time_point                  last_write_ = clock::now();  // provider thread only

    std::mutex                 mu_;
    std::condition_variable    cv_;
    std::deque<std::string>    events_;           // guarded by mu_
    std::size_t                n_pushed_ = 0;     // guarded by mu_
    bool                       finished_ = false; // guarded by mu_: no more events will come
    bool                       closed_   = false; // guarded by mu_: nobody reads events any more
    std::optional<RpcError>    early_error_;      // guarded by mu_
};

}  // namespace specrpc::rpc
