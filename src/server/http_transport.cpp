// httplib.h is configured by CMake to match the Debian build (TLS, zlib, brotli).
#include <httplib.h>

#include "server/http_transport.h"
#include "server/conn_watch.h"
#include "server/http_conn.h"
#include "server/sse_stream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include <sys/resource.h>
#include <sys/socket.h>

#include "common/heap.h"
#include "common/log.h"
#include "common/strings.h"

namespace specrpc::rpc {

using nlohmann::json;

namespace {

const char * const JSON_TYPE = "application/json; charset=utf-8";

// Equal strings in time independent of where they differ.
bool constant_time_equal(std::string_view a, std::string_view b) {
    const std::size_t n = std::max(a.size(), b.size());
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    for (std::size_t i = 0; i < n; i++) {
        const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
        diff |= static_cast<unsigned char>(x ^ y);
    }
    return diff == 0;
}


// http(s)://localhost, 127.0.0.1 or [::1], with or without a port, and nothing after it.
bool origin_is_local(const std::string & origin) {
    std::string_view o = origin;
    if (o.substr(0, 7) == "http://") o.remove_prefix(7);
    else if (o.substr(0, 8) == "https://") o.remove_prefix(8);
    else return false;
    for (std::string_view h : {"localhost", "127.0.0.1", "[::1]"}) {
        if (o.size() < h.size() || !std::equal(h.begin(), h.end(), o.begin(), [](char a, char b) {
                return a == std::tolower(static_cast<unsigned char>(b));
            }))
            continue;
        std::string_view rest = o.substr(h.size());
        if (rest.empty()) return true;
        if (rest[0] != ':' || rest.size() < 2) return false;
        rest.remove_prefix(1);
        return std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; });
    }
    return false;
}

// Regex matching exactly the literal path (httplib routes are regexes).
std::string literal_pattern(const std::string & path) {
    std::string out;
    for (char c : path) {
        if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
        out += c;
    }
    return out;
}

// A route path may end in a ":name" segment (/slots/:id_slot): it matches any one non-empty
// segment there, which the method receives as params[name] (a string).
bool route_matches(const std::string & route, const std::string & path, std::string * name = nullptr,
                   std::string * value = nullptr) {
    const size_t k = route.find("/:");
    if (k == std::string::npos) return route == path;
    const std::string prefix = route.substr(0, k + 1);
    if (path.size() <= prefix.size() || path.compare(0, prefix.size(), prefix) != 0) return false;
    const std::string seg = path.substr(prefix.size());
    if (seg.find('/') != std::string::npos) return false;
    if (name) *name = route.substr(k + 2);
    if (value) *value = seg;
    return true;
}

const char * error_type_for(int http_status, int rpc_code) {
    if (rpc_code == ERR_CONTEXT_EXCEEDED) return "exceed_context_size_error";
    switch (http_status) {
        case 400: case 413: return "invalid_request_error";
        case 401:           return "authentication_error";
        case 403:           return "permission_error";
        case 404:           return "not_found_error";
        case 499:           return "cancelled_error";
        case 501:           return "not_supported_error";
        case 503:           return "unavailable_error";
        default:            return "server_error";
    }
}

// llama-server's error body: {"error":{"code":<http status>,"message","type", ...data fields}}.
json rest_error_body(const RpcError & err, int http_status, bool openai) {
    json e = {{"code", http_status}, {"message", err.message}, {"type", error_type_for(http_status, err.code)}};
    if (err.data.is_object()) {
        for (auto it = err.data.begin(); it != err.data.end(); ++it) {
            if (!e.contains(it.key())) e[it.key()] = it.value();
        }
    }
    if (openai && !e.contains("param")) e["param"] = nullptr;
    e["rpc_code"] = err.code;
    return json{{"error", std::move(e)}};
}

void set_retry_after(httplib::Response & res, const RpcError & err) {
    double s = 1.0;
    if (err.data.is_object() && err.data.contains("retry_after") && err.data["retry_after"].is_number()) {
        s = err.data["retry_after"].get<double>();
    }
    res.set_header("Retry-After", std::to_string(std::max(1L, static_cast<long>(std::ceil(s)))));
}

void send_rest_error(httplib::Response & res, const RpcError & err, bool openai) {
    const int status = http_status_for(err.code);
    res.status = status;
    if (err.code == ERR_OVERLOADED || err.code == ERR_LOADING) set_retry_after(res, err);
    res.set_content(dump_json(rest_error_body(err, status, openai)), JSON_TYPE);
}

void send_rpc_error(httplib::Response & res, int http_status, const RpcError & err) {
    res.status = http_status;
    res.set_content(make_error_response(nullptr, err), JSON_TYPE);
}


// httplib with its connections handed to a ConnManager (http_conn.h): httplib's listener
// accepts, the manager owns the socket until a request head has arrived, and a worker then lets
// httplib parse and route that one request (process_request).
class GuardedServer : public httplib::Server {
  public:
    // httplib listens with a backlog of 5: a burst of clients overflows it (dropped SYNs, reset
    // connections). Listening again on the bound socket raises it (Linux).
    bool set_backlog(int n) { return ::listen(svr_sock_, n) == 0; }
    void set_manager(ConnManager * m) { mgr_ = m; }
    bool serve(httplib::Stream & strm, bool last, bool & closed) {
        return process_request(strm, last, closed, nullptr);
    }

  private:
    bool process_and_close_socket(socket_t sock) override {
        mgr_->adopt(sock);
        return true;
    }
    ConnManager * mgr_ = nullptr;
};

// Runs the listener's task (handing the accepted socket to the manager) on the listener thread.
class InlineQueue : public httplib::TaskQueue {
  public:
    void enqueue(std::function<void()> fn) override { fn(); }
    void shutdown() override {}
};

// The host part of a Host header value ("localhost:8080" -> "localhost", "[::1]:80" -> "[::1]").
std::string host_name(const std::string & value) {
    std::string h = value;
    if (!h.empty() && h[0] == '[') {
        const std::size_t e = h.find(']');
        h = e == std::string::npos ? h : h.substr(0, e + 1);
    } else if (const std::size_t c = h.rfind(':'); c != std::string::npos) {
        h = h.substr(0, c);
    }
    for (char & c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!h.empty() && h.back() == '.') h.pop_back();  // "localhost." is localhost
    return h;
}

// A listen address as a Host header names it: a bare IPv6 address in brackets ("::1" -> "[::1]").
std::string listen_name(const std::string & addr) {
    if (std::count(addr.begin(), addr.end(), ':') > 1 && (addr.empty() || addr[0] != '[')) {
        std::string h = "[" + addr + "]";
        for (char & c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return h;
    }
    return host_name(addr);
}

bool has_body(const httplib::Request & req) {
    return std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) > 0 ||
           req.has_header("Transfer-Encoding");
}

}  // namespace

bool origin_allowed(const std::vector<std::string> & allowed, const std::string & origin) {
    for (const std::string & a : allowed) {
        if (a == "*" || a == origin) return true;
        if (a == "localhost") {
            if (origin_is_local(origin)) return true;
            continue;
        }
        // "scheme://host" (no port) also matches "scheme://host:digits".
        if (origin.size() > a.size() + 1 && origin.compare(0, a.size(), a) == 0 && origin[a.size()] == ':') {
            const std::string rest = origin.substr(a.size() + 1);
            if (std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; })) return true;
        }
    }
    return false;
}

std::string predict_format_name(const std::string & path) {
    std::string_view s = path;
    if (s.substr(0, 3) == "/v1") s.remove_prefix(3);
    if (!s.empty() && s[0] == '/') s.remove_prefix(1);
    std::string out;
    bool        cap = false;
    for (char c : s) {
        if (c == '/' || c == '-' || c == '_') {
            cap = true;
            continue;
        }
        out += cap ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
        cap = false;
    }
    return out;
}

int http_status_for(int rpc_code) {
    switch (rpc_code) {
        case ERR_PARSE:
        case ERR_INVALID_REQUEST:
        case ERR_INVALID_PARAMS:
        case ERR_CONTEXT_EXCEEDED: return 400;
        case ERR_UNAUTHORIZED:     return 401;
        case ERR_METHOD_NOT_FOUND:
        case ERR_NOT_FOUND:        return 404;
        case ERR_CANCELLED:        return 499;
        case ERR_UNSUPPORTED:      return 501;
        case ERR_LOADING:
        case ERR_OVERLOADED:       return 503;
        default:                   return 500;
    }
}

std::vector<RestRoute> default_rest_routes() {
    return {
        {"GET", "/health", "health", true, false},
        {"GET", "/v1/health", "health", true, false},
        {"GET", "/props", "props", false, false},
        {"GET", "/slots", "slots", false, false},
        {"GET", "/metrics", "metrics", false, false},
        {"GET", "/v1/models", "v1/models", false, true},
        {"GET", "/models", "v1/models", false, true},
        {"POST", "/completion", "completion", false, false},
        {"POST", "/completions", "completion", false, false},
        {"POST", "/v1/completions", "v1/completions", false, true},
        {"POST", "/chat/completions", "v1/chat/completions", false, true},
        {"POST", "/v1/chat/completions", "v1/chat/completions", false, true},
        {"POST", "/chat/completions/input_tokens", "v1/chat/completions/input_tokens", false, true},
        {"POST", "/v1/chat/completions/input_tokens", "v1/chat/completions/input_tokens", false, true},
        // Anthropic's and OpenAI's Responses streams end without `data: [DONE]`, as llama-server's
        {"POST", "/v1/messages", "v1/messages", false, false},
        {"POST", "/v1/messages/count_tokens", "v1/messages/count_tokens", false, false},
        {"POST", "/v1/responses", "v1/responses", false, false},
        {"POST", "/responses", "v1/responses", false, false},
        {"POST", "/v1/responses/input_tokens", "v1/responses/input_tokens", false, true},
        {"POST", "/responses/input_tokens", "v1/responses/input_tokens", false, true},
        {"POST", "/infill", "infill", false, false},
        {"POST", "/embedding", "embeddings", false, false},
        {"POST", "/embeddings", "embeddings", false, false},
        {"POST", "/v1/embeddings", "v1/embeddings", false, true},
        {"POST", "/rerank", "rerank", false, false},
        {"POST", "/reranking", "rerank", false, false},
        {"POST", "/v1/rerank", "rerank", false, false},
        {"POST", "/v1/reranking", "rerank", false, false},
        {"POST", "/tokenize", "tokenize", false, false},
        {"POST", "/detokenize", "detokenize", false, false},
        {"POST", "/apply-template", "apply_template", false, false},
        // llama-server's built-in agent tools (--tools): not provided here, answered 501
        {"GET", "/tools", "tools", false, false},
        {"POST", "/tools", "tools", false, false},
        {"POST", "/slots/:id_slot", "slot_action", false, false},  // ?action=save|restore|erase
    };
}

// ---- the server ------------------------------------------------------------------------------

struct HttpServer::Impl {
    Dispatcher &                      dispatcher;
    HttpOptions                       opts;
    std::unique_ptr<GuardedServer>    svr;
    std::unique_ptr<ConnManager>      conns;
    std::thread                       listener;
    // Listeners on opts.extra_hosts: they only accept, handing their sockets to `conns`, which
    // serves every connection through `svr` (the one with the routes).
    std::vector<std::unique_ptr<GuardedServer>> extra;
    std::vector<std::thread>          extra_listeners;
    int                               bound_port = -1;
    std::atomic<std::uint64_t>        next_id{1};

    ConnRegistry                      active;  // connection flags of requests in progress
    std::atomic<bool>                 draining{false};
    std::atomic<int>                  serving{0};  // requests inside ConnManager's serve (drain())
    ConnWatcher                       watcher;  // hang-ups during non-streamed generation calls

    Impl(Dispatcher & d, HttpOptions o) : dispatcher(d), opts(std::move(o)), watcher(d) {}

    // A client that hangs up during a non-streamed generation call cancels it (streams notice a
    // failed write instead). Only generation calls are watched: the rest answer at once.
    // Methods that generate text: only they run long enough to be worth watching for a hangup.
    static bool generates(const std::string & method) { return method.find("completion") != std::string::npos; }

    std::unique_ptr<ConnWatcher::Watch> watch_hangup(const httplib::Request & req, bool generates,
                                                     const std::shared_ptr<std::atomic<bool>> & conn) {
        if (!generates) return nullptr;
        // A client that shut down its sending side right after the request waits for the answer.
        if (current_peer_half_closed()) return nullptr;
        if (ConnInfo * ci = current_conn()) return watcher.watch_fd(ci->fd, conn);
        return watcher.watch(req.remote_addr, req.remote_port, bound_port, conn);
    }

    bool authorized(const httplib::Request & req) const {
        if (opts.api_keys.empty()) return true;
        std::string key;
        const std::string auth = req.get_header_value("Authorization");
        if (starts_with_nocase(auth, "Bearer ")) key = auth.substr(7);
        else key = req.get_header_value("X-Api-Key");
        bool ok = false;
        for (const std::string & k : opts.api_keys) ok |= constant_time_equal(k, key);  // no early exit
        return ok && !key.empty();
    }

    bool host_allowed(const httplib::Request & req) const {
        if (!req.has_header("Host")) return true;
        const std::string h = host_name(req.get_header_value("Host"));
        if (h == "localhost" || h == "127.0.0.1" || h == "[::1]") return true;
        if (h == listen_name(opts.host)) return true;
        for (const std::string & x : opts.extra_hosts)
            if (h == listen_name(x)) return true;
        for (const std::string & a : opts.allowed_hosts) {
            if (a == "*" || host_name(a) == h) return true;
        }
        return false;
    }

    // Host, CORS and API key checks, before httplib reads (and inflates) the body. Fills `res`
    // with an error and returns false when rejected.
    bool admit(const httplib::Request & req, httplib::Response & res, bool is_public, bool rpc_shape,
               bool openai) const {
        if (!host_allowed(req)) {
            RpcError err = make_error(ERR_UNAUTHORIZED, "Host not allowed (see --allowed-hosts)");
            if (rpc_shape) send_rpc_error(res, 403, err);
            else {
                res.status = 403;
                res.set_content(dump_json(rest_error_body(err, 403, openai)), JSON_TYPE);
            }
            return false;
        }
        // A preflight is answered 200 whatever its origin (handle_preflight): without the
        // Access-Control-* headers the browser refuses the call itself.
        if (req.has_header("Origin") && req.method != "OPTIONS") {
            const std::string origin = req.get_header_value("Origin");
            if (!origin_allowed(opts.cors_origins, origin)) {
                RpcError err = make_error(ERR_UNAUTHORIZED, "origin not allowed (see --cors-origins)");
                if (rpc_shape) send_rpc_error(res, 403, err);
                else {
                    res.status = 403;
                    res.set_content(dump_json(rest_error_body(err, 403, openai)), JSON_TYPE);
                }
                return false;
            }
            res.set_header("Access-Control-Allow-Origin", origin);
            res.set_header("Access-Control-Allow-Credentials", "true");
            res.set_header("Vary", "Origin");
        }
        if (!is_public && !authorized(req)) {
            RpcError err = make_error(ERR_UNAUTHORIZED, "Invalid API Key");
            res.set_header("WWW-Authenticate", "Bearer");
            if (rpc_shape) send_rpc_error(res, 401, err);
            else send_rest_error(res, err, openai);
            return false;
        }
        return true;
    }

    // llama-server's preflight answer (200, credentials allowed, its methods), for allowed
    // origins only. Allow-Headers repeats the headers the browser asked for: a bare "*" never
    // covers Authorization (Fetch standard), so a page sending an API key would be refused.
    void handle_preflight(const httplib::Request & req, httplib::Response & res) const {
        res.set_header("Allow", "GET, POST, OPTIONS");  // the methods routed here
        if (req.has_header("Origin")) {
            const std::string origin = req.get_header_value("Origin");
            res.set_header("Vary", "Origin");
            if (origin_allowed(opts.cors_origins, origin)) {
                const std::string asked = req.get_header_value("Access-Control-Request-Headers");
                res.set_header("Access-Control-Allow-Origin", origin);
                res.set_header("Access-Control-Allow-Credentials", "true");
                res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
                res.set_header("Access-Control-Allow-Headers", asked.empty() ? "*" : asked);
                res.set_header("Access-Control-Max-Age", "600");
            } else {
                SPR_LOG_DEBUG("http: CORS preflight from origin %s: not allowed (see --cors-origins)", origin.c_str());
            }
        }
        res.status = 200;
        res.set_content("", "text/plain");
    }

    // After drain(): every request, health checks included, gets 503; the body has been read, so
    // closing the connection loses no part of the answer.
    bool refuse_draining(httplib::Response & res, bool rpc_shape, bool openai) const {
        if (!draining.load()) return false;
        RpcError err = make_error(ERR_LOADING, "server is shutting down (draining); retry on another replica");
        res.set_header("Connection", "close");
        if (rpc_shape) {
            send_rpc_error(res, 503, err);
            set_retry_after(res, err);
        } else {
            send_rest_error(res, err, openai);
        }
        return true;
    }

    void handle_rpc(const httplib::Request & req, httplib::Response & res) {
        if (refuse_draining(res, true, false)) return;
        std::string body;
        if (!request_body(req, res, true, false, body)) return;
        if (body.size() > opts.max_body) {
            send_rpc_error(res, 413, make_error(ERR_INVALID_REQUEST, "Invalid Request: body too large"));
            return;
        }
        auto  conn = std::make_shared<std::atomic<bool>>(false);
        CallContext base;
        base.transport = Transport::HTTP;
        base.cancelled = conn;
        if (req.get_header_value("Accept").find("text/event-stream") != std::string::npos) {
            auto st = std::make_shared<SseStream>(dispatcher, active, conn, opts.sse_keepalive_ms);
            base.notify = [s = st.get()](const std::string & m, const json & p) {
                s->push("data: " + make_notification(m, p) + "\n\n");
            };
            st->start([this, s = st.get(), body = std::move(body), base]() {
                std::optional<std::string> out = dispatcher.handle(body, base);
                std::vector<std::string> tail;
                if (out) tail.push_back("data: " + *out + "\n\n");
                s->finish(std::move(tail));
            });
            st->attach(res);
            return;
        }
        ConnGuard guard(active, conn);
        std::unique_ptr<ConnWatcher::Watch> watch;
        base.on_start = [&](const std::string & method) {
            if (!watch) watch = watch_hangup(req, generates(method), conn);
        };
        std::optional<std::string> out = dispatcher.handle(body, base);
        if (!out) {
            res.status = 204;
            return;
        }
        res.status = 200;
        res.set_content(*out, JSON_TYPE);
    }

    void handle_rest(const RestRoute & route, const httplib::Request & req, httplib::Response & res) {
        if (refuse_draining(res, false, route.openai)) return;
        std::string body;
        if (!request_body(req, res, false, route.openai, body)) return;
        if (body.size() > opts.max_body) {
            RpcError err = make_error(ERR_INVALID_REQUEST, "request body too large");
            res.status = 413;
            res.set_content(dump_json(rest_error_body(err, 413, route.openai)), JSON_TYPE);
            return;
        }
        json params = json::object();
        if (!body.empty()) {
            MethodResult parsed = dispatcher.parse_body(body);
            if (auto * err = std::get_if<RpcError>(&parsed)) {
                if (err->code == ERR_PARSE) err->message = "Invalid JSON in request body";
                send_rest_error(res, *err, route.openai);
                return;
            }
            params = std::move(std::get<json>(parsed));
            if (!params.is_object()) {
                send_rest_error(res, make_error(ERR_INVALID_REQUEST, "request body must be a JSON object"),
                                route.openai);
                return;
            }
        }
        for (const auto & [k, v] : req.params) {
            if (!params.contains(k)) params[k] = v;  // query string fields, as strings
        }
        if (std::string name, value; route_matches(route.path, req.path, &name, &value) && !name.empty())
            params[name] = value;  // the path's segment wins over a body field of the same name
        auto conn = std::make_shared<std::atomic<bool>>(false);
        CallContext ctx;
        ctx.id        = "http-" + std::to_string(next_id.fetch_add(1));
        ctx.transport = Transport::HTTP_REST;  // a REST route: results in llama-server's REST shapes
        ctx.cancelled = conn;
        const bool stream = params.contains("stream") && params["stream"].is_boolean() && params["stream"].get<bool>();
        if (stream) return stream_rest(route, std::move(params), std::move(ctx), conn, res);

        ConnGuard guard(active, conn);
        auto watch = watch_hangup(req, generates(route.rpc_method), conn);
        MethodResult r = dispatcher.call(route.rpc_method, params, ctx);
        if (auto * err = std::get_if<RpcError>(&r)) return send_rest_error(res, *err, route.openai);
        const json & result = std::get<json>(r);
        res.status = 200;
        if (ctx.raw_body) {
            for (const auto & [k, v] : ctx.raw_body->headers) res.set_header(k, v);
            res.set_content(ctx.raw_body->body, ctx.raw_body->content_type.c_str());
            return;
        }
        res.set_content(dump_json(result), JSON_TYPE);
    }

    void stream_rest(const RestRoute & route, json params, CallContext ctx,
                     std::shared_ptr<std::atomic<bool>> conn, httplib::Response & res) {
        auto st = std::make_shared<SseStream>(dispatcher, active, conn, opts.sse_keepalive_ms);
        ctx.notify = [s = st.get()](const std::string &, const json & p) {
            const json & data = p.is_object() && p.contains("data") ? p["data"] : p;
            // named events (Anthropic, Responses): `event: NAME` before the data line
            const bool named = p.is_object() && p.contains("event") && p["event"].is_string();
            s->push((named ? "event: " + p["event"].get<std::string>() + "\n" : std::string()) + "data: " +
                    dump_json(data) + "\n\n");
        };
        const bool openai = route.openai;
        st->start([this, s = st.get(), method = route.rpc_method, params = std::move(params), ctx, openai]() mutable {
            MethodResult r = dispatcher.call(method, params, ctx);
            std::vector<std::string> tail;
            if (auto * err = std::get_if<RpcError>(&r)) {
                if (s->fail_early(*err)) return;  // nothing sent yet: a plain HTTP error
                tail.push_back("data: " + dump_json(rest_error_body(*err, http_status_for(err->code), openai)) +
                               "\n\n");
            } else {
                const json & result = std::get<json>(r);
                if (!result.is_null()) tail.push_back("data: " + dump_json(result) + "\n\n");
                if (openai) tail.push_back("data: [DONE]\n\n");
            }
            s->finish(std::move(tail));
        });
        // Wait for the first chunk (or the end) so that errors found before any output get a
        // proper HTTP status instead of a 200 stream.
        if (std::optional<RpcError> err = st->wait_first_event()) return send_rest_error(res, *err, openai);
        st->attach(res);
    }

    // Vertex AI's prediction route (HttpOptions::predict_route): each instance runs through the
    // REST route its @requestFormat names, at the same time as the others (llama-server's way).
    void handle_predict(const httplib::Request & req, httplib::Response & res) {
        if (refuse_draining(res, false, false)) return;
        std::string body;
        if (!request_body(req, res, false, false, body)) return;
        auto fail = [&res](const std::string & msg) {
            send_rest_error(res, make_error(ERR_INVALID_REQUEST, msg), false);
        };
        if (body.size() > opts.max_body) return fail("request body too large");
        MethodResult parsed = dispatcher.parse_body(body);
        if (auto * err = std::get_if<RpcError>(&parsed)) {
            if (err->code == ERR_PARSE) err->message = "Invalid JSON in request body";
            return send_rest_error(res, *err, false);
        }
        const json & data = std::get<json>(parsed);
        if (!data.is_object()) return fail("request body must be a JSON object");
        if (!data.contains("instances") || !data["instances"].is_array())
            return fail("request body must include an array field named instances");
        constexpr std::size_t kMaxInstances = 128;  // llama-server's cap: one thread per instance
        const json & instances = data["instances"];
        if (instances.size() > kMaxInstances)
            return fail("instances array exceeds maximum size of " + std::to_string(kMaxInstances));

        auto conn = std::make_shared<std::atomic<bool>>(false);
        ConnGuard guard(active, conn);
        auto error_of = [](const RpcError & e) {
            return json{{"error", rest_error_body(e, http_status_for(e.code), false)["error"]}};
        };
        auto run = [this, conn, error_of](const json & instance) -> json {
            if (!instance.is_object())
                return error_of(make_error(ERR_INVALID_REQUEST, "each instance must be a JSON object"));
            if (!instance.contains("@requestFormat") || !instance["@requestFormat"].is_string())
                return error_of(make_error(ERR_INVALID_REQUEST, "each instance must include a string @requestFormat"));
            const std::string format = instance["@requestFormat"].get<std::string>();
            const RestRoute * route = nullptr;
            for (const RestRoute & r : opts.routes)  // the camelCase name first, then a literal path
                if (predict_format_name(r.path) == format) { route = &r; break; }
            if (!route)
                for (const RestRoute & r : opts.routes)
                    if (r.path == format) { route = &r; break; }
            if (!route)
                return error_of(make_error(ERR_INVALID_REQUEST, "no handler registered for @requestFormat: " + format));
            json payload = instance;
            payload.erase("@requestFormat");
            if (payload.contains("stream")) payload["stream"] = false;  // predictions are never streamed
            CallContext ctx;
            ctx.id        = "http-" + std::to_string(next_id.fetch_add(1));
            ctx.transport = Transport::HTTP_REST;
            ctx.cancelled = conn;
            MethodResult r = dispatcher.call(route->rpc_method, payload, ctx);
            if (auto * err = std::get_if<RpcError>(&r)) return error_of(*err);
            if (ctx.raw_body) return ctx.raw_body->body;
            return std::get<json>(std::move(r));
        };
        std::vector<std::future<json>> futures;
        futures.reserve(instances.size());
        for (const json & instance : instances) futures.push_back(std::async(std::launch::async, run, instance));
        json predictions = json::array();
        for (auto & f : futures) predictions.push_back(f.get());
        res.status = 200;
        res.set_content(dump_json(json{{"predictions", std::move(predictions)}}), JSON_TYPE);
    }

    bool handle_error_page(const httplib::Request & req, httplib::Response & res) const {
        if (!res.body.empty() || res.status == 204) return false;
        const int status = res.status;
        const int code   = status == 401 ? ERR_UNAUTHORIZED
                         : status == 404 ? ERR_METHOD_NOT_FOUND
                         : status < 500  ? ERR_INVALID_REQUEST
                                         : ERR_INTERNAL;
        std::string msg = status == 404   ? "File Not Found"
                        : status == 413   ? "Invalid Request: body of more than " + std::to_string(opts.max_body) +
                                              " bytes"
                        : status == 403   ? "Forbidden"
                        : status == 400   ? "Bad Request"
                                          : "HTTP error " + std::to_string(status);
        RpcError err = make_error(code, msg);
        if (req.path == "/rpc") res.set_content(make_error_response(nullptr, err), JSON_TYPE);
        else res.set_content(dump_json(rest_error_body(err, status, false)), JSON_TYPE);
        return true;
    }

    // Runs admit() before the body is read: a rejected request costs no body reading or inflation.
    httplib::Server::HandlerResponse pre_route(const httplib::Request & req, httplib::Response & res) const {
        bool is_public = false, rpc_shape = false, openai = false, known = false;
        if (req.path == "/rpc") {
            rpc_shape = known = true;
        } else if (!opts.predict_route.empty() && req.path == opts.predict_route) {
            known = true;
        } else {
            for (const RestRoute & r : opts.routes) {
                if (route_matches(r.path, req.path)) {
                    is_public = r.public_route;
                    openai    = r.openai;
                    known     = true;
                    break;
                }
            }
        }
        if (req.method == "OPTIONS" || !known) is_public = true;  // preflight; 404 pages
        if (admit(req, res, is_public, rpc_shape, openai)) return httplib::Server::HandlerResponse::Unhandled;
        if (has_body(req))
            if (ConnInfo * ci = current_conn()) ci->close_after = true;  // the unread body ends the connection
        return httplib::Server::HandlerResponse::Handled;
    }

    // The body as sent, inflated (up to max_body) when it came with a Content-Encoding. False
    // with `res` filled when it cannot be used.
    bool request_body(const httplib::Request & req, httplib::Response & res, bool rpc_shape, bool openai,
                      std::string & body) const {
        if (!req.has_header(DEFERRED_ENCODING_HEADER)) {
            body = req.body;
            return true;
        }
        bool too_large = false, unsupported = false;
        if (inflate_body(req.get_header_value(DEFERRED_ENCODING_HEADER), req.body, opts.max_body, body, too_large,
                         unsupported))
            return true;
        const int status = too_large ? 413 : unsupported ? 415 : 400;
        RpcError err = make_error(ERR_INVALID_REQUEST,
                                  too_large     ? "request body too large once decompressed (more than " +
                                                      std::to_string(opts.max_body) + " bytes)"
                                  : unsupported ? "unsupported Content-Encoding (gzip, deflate, br)"
                                                : "corrupt compressed request body");
        if (rpc_shape) send_rpc_error(res, status, err);
        else {
            res.status = status;
            res.set_content(dump_json(rest_error_body(err, status, openai)), JSON_TYPE);
        }
        return false;
    }

    void register_routes() {
        svr->set_pre_routing_handler([this](const httplib::Request & req, httplib::Response & res) {
            return pre_route(req, res);
        });
        svr->Options(".*", [this](const httplib::Request & req, httplib::Response & res) {
            handle_preflight(req, res);
        });
        svr->Post("/rpc", [this](const httplib::Request & req, httplib::Response & res) { handle_rpc(req, res); });
        if (!opts.predict_route.empty())
            svr->Post(literal_pattern(opts.predict_route),
                      [this](const httplib::Request & req, httplib::Response & res) { handle_predict(req, res); });
        for (const RestRoute & route : opts.routes) {
            auto h = [this, route](const httplib::Request & req, httplib::Response & res) {
                handle_rest(route, req, res);
            };
            const size_t k = route.path.find("/:");
            const std::string pattern = k == std::string::npos ? literal_pattern(route.path)
                                                                : literal_pattern(route.path.substr(0, k + 1)) + "[^/]+";
            if (route.method_http == "GET") svr->Get(pattern, h);
            else if (route.method_http == "POST") svr->Post(pattern, h);
            else SPR_LOG_WARN("http: route %s: unsupported method %s", route.path.c_str(), route.method_http.c_str());
        }
        httplib::Server::HandlerWithResponse on_error = [this](const httplib::Request & req, httplib::Response & res) {
            return handle_error_page(req, res) ? httplib::Server::HandlerResponse::Handled
                                               : httplib::Server::HandlerResponse::Unhandled;
        };
        svr->set_error_handler(on_error);
        svr->set_exception_handler([](const httplib::Request & req, httplib::Response & res, std::exception_ptr ep) {
            std::string what = "unknown exception";
            try {
                if (ep) std::rethrow_exception(ep);
            } catch (const std::exception & e) {
                what = e.what();
            } catch (...) {
            }
            SPR_LOG_ERROR("http: %s %s: %s", req.method.c_str(), req.path.c_str(), what.c_str());
            res.status = 500;
            res.set_content(dump_json(rest_error_body(make_error(ERR_INTERNAL, "Internal error"), 500, false)),
                            JSON_TYPE);
        });
        // Called once the answer is written: the request's own buffers are all freed but these two.
        svr->set_logger([](const httplib::Request & req, const httplib::Response & res) {
            SPR_LOG_DEBUG("http: %s %s -> %d", req.method.c_str(), req.path.c_str(), res.status);
            heap_release_after(req.body.size() + res.body.size());
        });
    }
};

HttpServer::HttpServer(Dispatcher & dispatcher, HttpOptions options)
    : impl_(std::make_unique<Impl>(dispatcher, std::move(options))) {}

HttpServer::~HttpServer() { stop(); }

int HttpServer::port() const { return impl_->bound_port >= 0 ? impl_->bound_port : impl_->opts.port; }

Status HttpServer::start() {
    Impl & m = *impl_;
    if (m.svr) return Status(ErrorCode::INTERNAL, "http server already started");
    try {
        m.svr = std::make_unique<GuardedServer>();
        ConnLimits lim;
        lim.head_timeout_ms  = std::max(1, m.opts.head_timeout_ms);
        lim.body_base_ms     = std::max(1, m.opts.read_timeout_s) * 1000;
        lim.write_timeout_ms = std::max(1, m.opts.write_timeout_s) * 1000;
        lim.max_head_bytes   = m.opts.max_head_bytes;
        lim.max_header_lines = m.opts.max_header_lines;
        lim.min_threads      = std::max(1, m.opts.n_threads);
        lim.max_threads      = std::max(lim.min_threads, m.opts.max_threads);
        lim.max_connections  = std::max(1, m.opts.max_connections);
        // The room must evict before accept() runs out of descriptors (models, pipes, threads).
        if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
            lim.max_connections = std::max(
                16, std::min(lim.max_connections, static_cast<int>(std::min<rlim_t>(rl.rlim_cur / 2, 1 << 20)) - 64));
        GuardedServer * gs = m.svr.get();
        std::atomic<int> * serving = &m.serving;
        m.conns = std::make_unique<ConnManager>(lim, [gs, serving](httplib::Stream & strm, bool last, bool & closed) {
            struct Count {  // serve may throw
                std::atomic<int> * n;
                ~Count() { n->fetch_sub(1); }
            } count{serving};
            serving->fetch_add(1);
            return gs->serve(strm, last, closed);
        });
        // What every listening server needs: connections go to the manager, SO_REUSEADDR only
        // (httplib's default SO_REUSEPORT lets a second server share the port).
        auto configure = [&m](GuardedServer & g) {
            g.set_manager(m.conns.get());
            g.new_task_queue = [] { return new InlineQueue(); };
            g.set_payload_max_length(m.opts.max_body);
            g.set_socket_options([](int sock) {
                int yes = 1;
                ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
            });
            g.set_read_timeout(m.opts.read_timeout_s, 0);
            g.set_write_timeout(m.opts.write_timeout_s, 0);
        };
        configure(*m.svr);
        m.register_routes();
        const int port = m.opts.port == 0 ? m.svr->bind_to_any_port(m.opts.host)
                                          : (m.svr->bind_to_port(m.opts.host, m.opts.port) ? m.opts.port : -1);
        if (port < 0) {
            m.conns.reset();
            m.svr.reset();
            return Status(ErrorCode::UNAVAILABLE,
                          "cannot listen on " + m.opts.host + ":" + std::to_string(m.opts.port));
        }
        m.bound_port = port;
        for (const std::string & h : m.opts.extra_hosts) {
            auto g = std::make_unique<GuardedServer>();
            configure(*g);
            if (!g->bind_to_port(h, port)) {
                m.extra.clear();
                m.conns.reset();
                m.svr.reset();
                return Status(ErrorCode::UNAVAILABLE, "cannot listen on " + h + ":" + std::to_string(port));
            }
            if (!g->set_backlog(std::max(16, m.opts.backlog))) SPR_LOG_WARN("http: cannot raise the listen backlog");
            m.extra.push_back(std::move(g));
        }
        if (!m.svr->set_backlog(std::max(16, m.opts.backlog))) SPR_LOG_WARN("http: cannot raise the listen backlog");
        httplib::Server * svr = m.svr.get();
        m.listener = std::thread([svr] {
            if (!svr->listen_after_bind()) SPR_LOG_DEBUG("http: listener ended with an error");
        });
        for (auto & g : m.extra) {
            httplib::Server * x = g.get();
            m.extra_listeners.emplace_back([x] {
                if (!x->listen_after_bind()) SPR_LOG_DEBUG("http: listener ended with an error");
            });
        }
        // stop() only works once the accept loops run: wait for them (bounded).
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        auto running = [&m] {
            if (!m.svr->is_running()) return false;
            for (auto & g : m.extra)
                if (!g->is_running()) return false;
            return true;
        };
        while (!running() && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    } catch (const std::exception & e) {
        return Status(ErrorCode::INTERNAL, std::string("http server start failed: ") + e.what());
    }
    std::string hosts = m.opts.host;
    for (const std::string & h : m.opts.extra_hosts) hosts += "," + h;
    SPR_LOG_INFO("http: listening on %s port %d (%zu REST routes, %s)", hosts.c_str(), m.bound_port,
                 m.opts.routes.size(), m.opts.api_keys.empty() ? "no API key" : "API key required");
    return Status::ok();
}

void HttpServer::drain() {
    if (!impl_->draining.exchange(true)) SPR_LOG_INFO("http: draining: new requests get 503");
}

int HttpServer::requests_in_progress() const { return impl_->serving.load(); }

void HttpServer::stop() {
    Impl & m = *impl_;
    if (!m.svr) return;
    m.svr->stop();                      // no new connections
    for (auto & x : m.extra) x->stop();
    if (m.listener.joinable()) m.listener.join();
    for (auto & t : m.extra_listeners)
        if (t.joinable()) t.join();
    m.extra_listeners.clear();
    m.extra.clear();
    if (m.conns) m.conns->quiesce();    // no new requests
    m.active.cancel_all(m.dispatcher);  // running calls end early
    if (m.conns) m.conns->stop();       // closes idle connections, joins the threads
    m.conns.reset();
    m.svr.reset();
}

}  // namespace specrpc::rpc
