#include "server/stdio_transport.h"

#include <cctype>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/heap.h"
#include "common/log.h"
#include "common/strings.h"

namespace specrpc::rpc {

using nlohmann::json;

namespace {

enum class Framing { LINE, HEADERS };

struct Message {
    Framing     framing = Framing::LINE;
    std::string body;
    bool        too_large = false;  // body was discarded: it exceeded the limit
    bool        bad_header = false; // header block without a usable Content-Length
    // set while the call waits (queue, model loading): its id, and the flag a cancel sets
    json                               id;
    std::shared_ptr<std::atomic<bool>> cancelled;
};


bool is_blank(std::string_view s) {
    for (char c : s) {
        if (c != ' ' && c != '\t' && c != '\r') return false;
    }
    return true;
}

// Reads one line ('\n' consumed, a trailing '\r' removed). Keeps at most `cap` bytes and sets
// `too_long` beyond. Returns false at EOF before any byte.
bool read_line(std::streambuf & sb, std::string & line, std::size_t cap, bool & too_long) {
    line.clear();
    too_long = false;
    bool any = false;
    for (;;) {
        const int c = sb.sbumpc();
        if (c == std::char_traits<char>::eof()) break;
        any = true;
        if (c == '\n') break;
        if (line.size() < cap) line.push_back(static_cast<char>(c));
        else too_long = true;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return any;
}

// Reads the next message, skipping blank lines. Returns false at EOF.
bool read_message(std::streambuf & sb, std::size_t max_body, Message & msg) {
    msg = Message{};
    std::string line;
    bool        too_long = false;
    do {
        if (!read_line(sb, line, max_body, too_long)) return false;
    } while (!too_long && is_blank(line));

    if (!starts_with_nocase(line, "Content-")) {
        msg.framing   = Framing::LINE;
        msg.too_large = too_long;
        if (!too_long) msg.body = std::move(line);
        return true;
    }
    msg.framing = Framing::HEADERS;
    long long length = -1;
    for (;;) {  // header lines until the blank one
        if (starts_with_nocase(line, "Content-Length:")) {
            try {
                std::size_t pos = 0;
                const std::string v = line.substr(15);
                length = std::stoll(v, &pos);
                if (v.find_first_not_of(" \t", pos) != std::string::npos || length < 0) length = -1;
            } catch (...) {
                length = -1;
            }
        }
        if (!read_line(sb, line, 4096, too_long)) return false;
        if (line.empty()) break;
    }
    if (length < 0) {
        msg.bad_header = true;
        return true;
    }
    const std::size_t n = static_cast<std::size_t>(length);
    if (n > max_body) {  // skip the body without keeping it
        msg.too_large = true;
        char        buf[4096];
        std::size_t left = n;
        while (left > 0) {
            const std::streamsize got = sb.sgetn(buf, static_cast<std::streamsize>(std::min(left, sizeof buf)));
            if (got <= 0) return false;
            left -= static_cast<std::size_t>(got);
        }
        return true;
    }
    msg.body.resize(n);
    std::size_t off = 0;
    while (off < n) {
        const std::streamsize got = sb.sgetn(msg.body.data() + off, static_cast<std::streamsize>(n - off));
        if (got <= 0) return false;  // EOF inside the body
        off += static_cast<std::size_t>(got);
    }
    return true;
}

// Finds the top-level "id" of a single request without building the document: the reader looks
// at every call before queueing it, and a call's body can be megabytes of prompt. Parsing stops
// at the id (clients write it before the params), or at the first thing that rules it out.
class IdScanner : public nlohmann::json_sax<json> {
  public:
    json id;                      // the id's value (string or number), null if none
    bool has_id        = false;
    bool has_method    = false;
    bool not_an_object = false;   // a batch or a scalar: no id to peek
    bool bad           = false;   // not JSON (up to where it was read)

    bool null() override { return value(nullptr); }
    bool boolean(bool v) override { return value(v); }
    bool number_integer(number_integer_t v) override { return value(v); }
    bool number_unsigned(number_unsigned_t v) override { return value(v); }
    bool number_float(number_float_t v, const string_t &) override { return value(v); }
    bool string(string_t & v) override { return value(v); }
    bool binary(binary_t &) override { return value(nullptr); }
    bool start_object(std::size_t) override { return open(false); }
    bool end_object() override { return close(); }
    bool start_array(std::size_t) override { return open(true); }
    bool end_array() override { return close(); }
    bool key(string_t & k) override {
        if (depth_ == 1) {
            in_id_ = k == "id";
            if (k == "method") has_method = true;
        }
        return true;
    }
    bool parse_error(std::size_t, const std::string &, const nlohmann::detail::exception &) override {
        bad = true;
        return false;
    }

  private:
    bool open(bool array) {
        if (array && depth_ == 0) {
            not_an_object = true;
            return false;
        }
        // An object or array given as the id: the call has an id, an invalid one (answered with
        // id null by the dispatcher), so it is no notification.
        if (depth_ == 1 && in_id_) {
            has_id = true;
            return false;
        }
        depth_++;
        return true;
    }
    bool close() {
        depth_--;
        return true;
    }
    bool value(json v) {
        if (depth_ == 0) {
            not_an_object = true;
            return false;
        }
        if (depth_ == 1 && in_id_) {
            has_id = true;
            if (v.is_string() || v.is_number()) id = std::move(v);
            return false;  // found: the rest of the body need not be read here
        }
        return true;
    }
    int  depth_ = 0;
    bool in_id_ = false;
};

// The id of a single request, for answering or cancelling it without running it (null if none or
// batch); `is_notification` is set for a single message with a method and no id. A body that
// turns out not to be JSON keeps whatever was seen before the error: the dispatcher answers it.
json peek_id(const std::string & body, bool & is_notification) {
    IdScanner scan;
    json::sax_parse(body, &scan, nlohmann::detail::input_format_t::json, false);
    is_notification = !scan.has_id && scan.has_method && !scan.not_an_object && !scan.bad;
    return scan.has_id ? scan.id : json(nullptr);
}

// True for a single $/cancelRequest message (small: a cancellation carries only an id), whose
// params.id is stored in `id`.
bool is_cancel(const std::string & body, json & id) {
    if (body.size() >= 4096 || body.find("$/cancelRequest") == std::string::npos) return false;
    const json j = json::parse(body, nullptr, false);
    if (!j.is_object()) return false;
    const auto m = j.find("method");
    if (m == j.end() || !m->is_string() || m->get<std::string>() != "$/cancelRequest") return false;
    const auto p = j.find("params");
    if (p != j.end() && p->is_object() && p->contains("id")) id = (*p)["id"];
    return true;
}

// The method of a single request ("" for batches and unparsable messages).
std::string method_of(const std::string & body) {
    const json j = json::parse(body, nullptr, false);
    if (!j.is_object()) return {};
    const auto m = j.find("method");
    return m != j.end() && m->is_string() ? m->get<std::string>() : std::string();
}

}  // namespace

struct StdioServer::Impl {
    Dispatcher &       dispatcher;
    std::istream &     in;
    std::ostream &     out;
    const StdioOptions opts;

    std::mutex out_mu;
    bool       out_failed = false;  // guarded by out_mu

    std::mutex              q_mu;
    std::condition_variable q_cv;
    std::deque<Message>     queue;          // guarded by q_mu
    bool                    eof = false;    // guarded by q_mu
    std::vector<std::thread> workers;
    // Calls read and not yet finished, by id, with the flag a $/cancelRequest sets: one cancelled
    // while it waits (queued, held while the model loads) is answered "cancelled" when its turn
    // comes; one cancelled as it starts is stopped by the dispatcher, which reads the flag.
    std::multimap<std::string, std::shared_ptr<std::atomic<bool>>> waiting;  // guarded by q_mu

    Impl(Dispatcher & d, std::istream & i, std::ostream & o, StdioOptions op)
        : dispatcher(d), in(i), out(o), opts(op) {}

    // Writes one message in `framing`. Thread-safe.
    void write(Framing framing, const std::string & text) {
        std::lock_guard<std::mutex> lock(out_mu);
        if (framing == Framing::HEADERS) out << "Content-Length: " << text.size() << "\r\n\r\n" << text;
        else out << text << '\n';
        out.flush();
        if (!out && !out_failed) {
            out_failed = true;
            SPR_LOG_ERROR("stdio: writing the output failed; further replies are lost");
        }
    }

    // Runs one call and writes its answer; returns the bytes it moved (body + answer).
    std::size_t process(const Message & msg) {
        CallContext base;
        base.transport = rpc::Transport::STDIO;
        base.cancelled = msg.cancelled;  // set by a cancel read before the dispatcher knows the call
        const Framing framing = msg.framing;
        base.notify = [this, framing](const std::string & method, const json & params) {
            write(framing, make_notification(method, params));
        };
        std::optional<std::string> reply = dispatcher.handle(msg.body, base);
        if (reply) write(framing, *reply);
        return msg.body.size() + (reply ? reply->size() : 0);
    }

    void worker_loop() {
        for (;;) {
            Message msg;
            {
                std::unique_lock<std::mutex> lock(q_mu);
                q_cv.wait(lock, [&] { return !queue.empty() || eof; });
                if (queue.empty()) return;  // eof and drained
                msg = std::move(queue.front());
                queue.pop_front();
            }
            hold_while_loading(msg);
            std::size_t moved = 0;
            if (msg.cancelled && msg.cancelled->load()) {
                write(msg.framing, make_error_response(msg.id, rpc::cancelled()));
            } else {
                moved = process(msg);
            }
            // Only now: until the dispatcher registered the call, its flag here was the only way
            // to reach it (process() hands the flag to the dispatcher, which checks it after
            // registering, so a cancel lands either here or in the registry).
            if (msg.cancelled) {
                std::lock_guard<std::mutex> lock(q_mu);
                auto range = waiting.equal_range(msg.id.dump());
                for (auto it = range.first; it != range.second; ++it)
                    if (it->second == msg.cancelled) { waiting.erase(it); break; }
            }
            msg = Message{};
            heap_release_after(moved);
        }
    }

    // A client spawns the server and writes at once: its calls wait for the model instead of
    // getting "loading" errors they could not avoid. `health` and the status calls answer now.
    void hold_while_loading(const Message & msg) {
        if (!opts.loading || !opts.loading()) return;
        const std::string m = method_of(msg.body);
        if (m == "health" || m == "poll_system_status") return;
        while (opts.loading() && !(msg.cancelled && msg.cancelled->load()))
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }

    // Answers what must not (or cannot) be queued; returns true if it did.
    bool answer_inline(const Message & msg) {
        if (msg.too_large) {
            write(msg.framing, make_error_response(nullptr, make_error(ERR_INVALID_REQUEST,
                                                                       "Invalid Request: message larger than " +
                                                                           std::to_string(dispatcher.options().max_body) +
                                                                           " bytes")));
            // a line is read up to the limit before it is known to be too long; a body is skipped
            if (msg.framing == Framing::LINE) heap_release_after(dispatcher.options().max_body);
            return true;
        }
        if (msg.bad_header) {
            write(msg.framing, make_error_response(nullptr, make_error(ERR_INVALID_REQUEST,
                                                                       "Invalid Request: missing or bad Content-Length")));
            return true;
        }
        // Cancellations run on the reader so that they overtake the calls they cancel. Only a
        // message whose parsed method is $/cancelRequest: any call may contain that text.
        json cancel_id;
        if (is_cancel(msg.body, cancel_id)) {
            if (!cancel_id.is_null()) {
                std::lock_guard<std::mutex> lock(q_mu);
                auto range = waiting.equal_range(cancel_id.dump());
                for (auto it = range.first; it != range.second; ++it) it->second->store(true);
            }
            process(msg);  // the calls already running
            return true;
        }
        return false;
    }

    void enqueue(Message msg) {
        std::unique_lock<std::mutex> lock(q_mu);
        if (queue.size() >= opts.max_queue) {
            lock.unlock();
            bool       notification = false;
            const json id           = peek_id(msg.body, notification);
            if (!notification) write(msg.framing, make_error_response(id, overloaded("Server overloaded", 1.0)));
            return;
        }
        // Every call with an id can be cancelled from the moment it is read: while it is queued,
        // held for the model, or between a worker taking it and the dispatcher registering it
        // (a cancel that came in that gap used to find nothing and was lost).
        bool notification = false;
        json id           = peek_id(msg.body, notification);
        if (!id.is_null()) {
            msg.id        = std::move(id);
            msg.cancelled = std::make_shared<std::atomic<bool>>(false);
            waiting.emplace(msg.id.dump(), msg.cancelled);
        }
        queue.push_back(std::move(msg));
        q_cv.notify_one();
    }

    int run() {
        const int n = std::max(1, opts.n_workers);
        for (int i = 0; i < n; i++) workers.emplace_back([this] { worker_loop(); });
        std::streambuf * sb = in.rdbuf();
        Message          msg;
        while (sb != nullptr && read_message(*sb, dispatcher.options().max_body, msg)) {
            if (!answer_inline(msg)) enqueue(std::move(msg));
        }
        SPR_LOG_DEBUG("stdio: end of input, waiting for calls in flight");
        {
            std::lock_guard<std::mutex> lock(q_mu);
            eof = true;
        }
        q_cv.notify_all();
        for (auto & t : workers) t.join();
        workers.clear();
        std::lock_guard<std::mutex> lock(out_mu);
        return out_failed ? 1 : 0;
    }
};

StdioServer::StdioServer(Dispatcher & dispatcher, std::istream & in, std::ostream & out, StdioOptions options)
    : impl_(std::make_unique<Impl>(dispatcher, in, out, options)) {}

StdioServer::~StdioServer() = default;

int StdioServer::run() {
    try {
        return impl_->run();
    } catch (const std::exception & e) {  // thread creation failure and the like
        SPR_LOG_ERROR("stdio: %s", e.what());
        {
            std::lock_guard<std::mutex> lock(impl_->q_mu);
            impl_->eof = true;
        }
        impl_->q_cv.notify_all();
        for (auto & t : impl_->workers) {
            if (t.joinable()) t.join();
        }
        return 1;
    }
}

}  // namespace specrpc::rpc
