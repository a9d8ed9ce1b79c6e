// The HTTP transport over real sockets on 127.0.0.1 (ephemeral ports): /rpc, REST mapping and
// status codes, SSE framing, cancellation by a dropped connection, API keys, CORS, body limits,
// many clients at once.
// httplib.h is configured by CMake to match the Debian build (TLS, zlib, brotli).
#include <httplib.h>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "server/http_transport.h"
#include "test_util.h"

using namespace specrpc::rpc;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

using specrpc::test::wait_until;

// Methods registered for the tests.
struct TestMethods {
    std::atomic<bool> stream_cancelled{false};  // slow_stream saw its cancelled flag
    std::atomic<int>  stream_started{0};

    void add_to(Dispatcher & d) {
        d.add_method("echo", [](const json & p, CallContext &) -> MethodResult { return p; });
        d.add_method("add", [](const json & p, CallContext &) -> MethodResult {
            if (!p.is_object() || !p.contains("a") || !p["a"].is_number()) return invalid_params("a: not a number", "a");
            return p["a"].get<int>() + p.value("b", 0);
        });
        d.add_method("health", [](const json &, CallContext &) -> MethodResult { return json{{"status", "ok"}}; });
        d.add_method("metrics", [](const json &, CallContext & ctx) -> MethodResult {
            ctx.raw_body = RawBody{"llamacpp:spec_decode_draft_n 3\n", "text/plain; version=0.0.4", {}};
            return json::object();
        });
        // Fails with the JSON-RPC code given in params.code.
        d.add_method("fail", [](const json & p, CallContext &) -> MethodResult {
            const int code = p.value("code", -32603);
            json data = p.contains("data") ? p["data"] : json(nullptr);
            return make_error(code, "failed on purpose", data);
        });
        // Emits params.n chunks (notifications), then {"done": n}; params.fail_after: error then.
        d.add_method("chunks", [](const json & p, CallContext & ctx) -> MethodResult {
            const int n = p.value("n", 3);
            for (int i = 0; i < n; i++) ctx.send("completion.chunk", json{{"id", ctx.id}, {"data", {{"i", i}}}});
            if (p.contains("fail_after")) return make_error(ERR_CONTEXT_EXCEEDED, "context full", json{{"n_ctx", 8}});
            return json{{"done", n}};
        });
        // Sends nothing; waits until cancelled (at most 5 s).
        d.add_method("silent", [this](const json &, CallContext & ctx) -> MethodResult {
            stream_started++;
            const auto deadline = std::chrono::steady_clock::now() + 5s;
            while (!ctx.is_cancelled() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(2ms);
            stream_cancelled = ctx.is_cancelled();
            return nullptr;
        });
        // Emits a chunk every 10 ms until cancelled (at most 5 s).
        d.add_method("slow_stream", [this](const json &, CallContext & ctx) -> MethodResult {
            stream_started++;
            for (int i = 0; i < 500; i++) {
                if (ctx.is_cancelled()) {
                    stream_cancelled = true;
                    return make_error(ERR_CANCELLED, "Request cancelled", json{{"partial", i}});
                }
                ctx.send("completion.chunk", json{{"id", ctx.id}, {"data", {{"i", i}}}});
                std::this_thread::sleep_for(10ms);
            }
            return json{{"done", true}};
        });
    }
};

std::vector<RestRoute> test_routes() {
    std::vector<RestRoute> routes = default_rest_routes();
    routes.push_back({"POST", "/add", "add", false, false});
    routes.push_back({"POST", "/fail", "fail", false, false});
    routes.push_back({"POST", "/chunks", "chunks", false, false});
    routes.push_back({"POST", "/v1/chunks", "chunks", false, true});
    routes.push_back({"POST", "/slow", "slow_stream", false, false});
    routes.push_back({"POST", "/missing", "no_such_method", false, false});
    return routes;
}

struct HttpTest : ::testing::Test {
    Dispatcher                  d;
    TestMethods                 methods;
    std::unique_ptr<HttpServer> server;

    void start(HttpOptions opts = {}) {
        opts.port = 0;
        if (opts.routes.empty()) opts.routes = test_routes();
        methods.add_to(d);
        server = std::make_unique<HttpServer>(d, opts);
        ASSERT_TRUE(server->start().is_ok());
        ASSERT_GT(server->port(), 0);
    }
    void TearDown() override {
        if (server) server->stop();
    }
    std::unique_ptr<httplib::Client> client() {
        auto c = std::make_unique<httplib::Client>("127.0.0.1", server->port());
        c->set_read_timeout(5, 0);
        c->set_connection_timeout(2, 0);
        return c;
    }
    httplib::Result post(const std::string & path, const std::string & body, httplib::Headers h = {}) {
        return client()->Post(path, h, body, "application/json");
    }
};

json body_of(const httplib::Result & r) { return json::parse(r->body); }

}  // namespace

TEST_F(HttpTest, RpcSingleBatchNotificationParseError) {
    start();
    auto r = post("/rpc", R"({"jsonrpc":"2.0","method":"add","params":{"a":2,"b":3},"id":1})");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json; charset=utf-8");
    EXPECT_EQ(r->body, R"({"jsonrpc":"2.0","id":1,"result":5})");

    r = post("/rpc", R"({"jsonrpc":"2.0","method":"add","params":{"a":2}})");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 204);
    EXPECT_EQ(r->body, "");

    r = post("/rpc", R"([{"jsonrpc":"2.0","method":"echo","params":[1],"id":"a"},{"jsonrpc":"2.0","method":"x"},1])");
    ASSERT_TRUE(r);
    EXPECT_EQ(body_of(r), json::parse(R"([{"jsonrpc":"2.0","id":"a","result":[1]},
        {"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request"}}])"));

    r = post("/rpc", "{oops");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(body_of(r)["error"]["code"], -32700);
}

TEST_F(HttpTest, RestRoutesAndRawBody) {
    start();
    auto c = client();
    auto r = c->Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(body_of(r), json({{"status", "ok"}}));

    r = post("/add", R"({"a":40,"b":2})");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "42");

    r = c->Get("/props?verbose=1");  // GET: query fields become string params
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);  // no "props" method registered here
    d.add_method("props", [](const json & p, CallContext &) -> MethodResult { return p; });
    r = c->Get("/props?verbose=1");
    ASSERT_TRUE(r);
    EXPECT_EQ(body_of(r), json({{"verbose", "1"}}));

    r = c->Get("/metrics");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4");
    EXPECT_EQ(r->body, "llamacpp:spec_decode_draft_n 3\n");
}

TEST_F(HttpTest, RestErrorMapping) {
    start();
    struct Case { int rpc_code; int http; const char * type; };
    for (Case c : {Case{-32602, 400, "invalid_request_error"}, Case{-32600, 400, "invalid_request_error"},
                   Case{-32700, 400, "invalid_request_error"}, Case{-32601, 404, "not_found_error"},
                   Case{-32003, 401, "authentication_error"}, Case{-32005, 503, "unavailable_error"},
                   Case{-32002, 400, "exceed_context_size_error"}, Case{-32001, 503, "unavailable_error"},
                   Case{-32800, 499, "cancelled_error"}, Case{-32603, 500, "server_error"},
                   Case{-32050, 500, "server_error"}}) {
        SCOPED_TRACE(c.rpc_code);
        json body = {{"code", c.rpc_code}};
        if (c.rpc_code == -32005) body["data"] = {{"retry_after", 2.5}};
        if (c.rpc_code == -32002) body["data"] = {{"n_prompt_tokens", 9000}, {"n_ctx", 4096}};
        auto r = post("/fail", body.dump());
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, c.http);
        json e = body_of(r)["error"];
        EXPECT_EQ(e["code"], c.http);
        EXPECT_EQ(e["message"], "failed on purpose");
        EXPECT_EQ(e["type"], c.type);
        EXPECT_EQ(e["rpc_code"], c.rpc_code);
        if (c.rpc_code == -32005) {
            EXPECT_EQ(r->get_header_value("Retry-After"), "3");
        }
        if (c.rpc_code == -32002) {
            EXPECT_EQ(e["n_ctx"], 4096);
        }
    }
    auto r = post("/add", R"({"b":1})");  // invalid params carries the param name
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(body_of(r)["error"]["param"], "a");

    r = post("/missing", "{}");  // route to an unregistered method
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);

    r = post("/add", "{not json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(body_of(r)["error"]["rpc_code"], -32700);

    r = post("/add", "[1,2]");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(body_of(r)["error"]["rpc_code"], -32600);

    r = post("/no/such/path", "{}");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
    EXPECT_EQ(body_of(r)["error"]["type"], "not_found_error");
}

TEST_F(HttpTest, RestSseFraming) {
    start();
    auto r = post("/v1/chunks", R"({"n":2,"stream":true})");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    EXPECT_EQ(r->body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"done\":2}\n\ndata: [DONE]\n\n");

    r = post("/chunks", R"({"n":1,"stream":true})");  // not an openai route: no [DONE]
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "data: {\"i\":0}\n\ndata: {\"done\":1}\n\n");

    // Error before any chunk: a plain HTTP error, not a stream.
    r = post("/v1/chunks", R"({"n":0,"fail_after":true,"stream":true})");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(body_of(r)["error"]["type"], "exceed_context_size_error");

    // Error after chunks: an error event ends the stream.
    r = post("/v1/chunks", R"({"n":1,"fail_after":true,"stream":true})");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    const std::string prefix = "data: {\"i\":0}\n\ndata: {\"error\":";
    ASSERT_EQ(r->body.compare(0, prefix.size(), prefix), 0) << r->body;
    EXPECT_EQ(r->body.substr(r->body.size() - 2), "\n\n");
    EXPECT_EQ(r->body.find("[DONE]"), std::string::npos);
}

TEST_F(HttpTest, RpcSse) {
    start();
    httplib::Headers h = {{"Accept", "text/event-stream"}};
    auto r = post("/rpc", R"({"jsonrpc":"2.0","method":"chunks","params":{"n":2},"id":7})", h);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    EXPECT_EQ(r->body,
              "data: {\"jsonrpc\":\"2.0\",\"method\":\"completion.chunk\",\"params\":{\"data\":{\"i\":0},\"id\":7}}\n\n"
              "data: {\"jsonrpc\":\"2.0\",\"method\":\"completion.chunk\",\"params\":{\"data\":{\"i\":1},\"id\":7}}\n\n"
              "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"done\":2}}\n\n");
}

// Sends a raw request, reads until `min_bytes` arrived, then closes the socket.
bool send_and_drop(int port, const std::string & request, std::size_t min_bytes) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port   = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    timeval tv{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    bool ok = ::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) == 0 &&
              ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size());
    std::size_t got = 0;
    char        buf[4096];
    while (ok && got < min_bytes) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) ok = false;
        else got += static_cast<std::size_t>(n);
    }
    ::close(fd);
    return ok;
}

std::string raw_post(const std::string & path, const std::string & body, const std::string & extra_headers = "") {
    return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra_headers +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

TEST_F(HttpTest, DroppedRestStreamCancels) {
    start();
    ASSERT_TRUE(send_and_drop(server->port(), raw_post("/slow", R"({"stream":true})"), 400));
    EXPECT_TRUE(wait_until([&] { return methods.stream_cancelled.load(); }, 2000ms));
    EXPECT_TRUE(wait_until([&] { return d.in_flight() == 0; }));
}

TEST_F(HttpTest, DroppedRpcStreamCancels) {
    start();
    const std::string body = R"({"jsonrpc":"2.0","method":"slow_stream","id":1})";
    ASSERT_TRUE(send_and_drop(server->port(), raw_post("/rpc", body, "Accept: text/event-stream\r\n"), 400));
    EXPECT_TRUE(wait_until([&] { return methods.stream_cancelled.load(); }, 2000ms));
}

TEST_F(HttpTest, KeepaliveDetectsDroppedSilentStream) {
    HttpOptions opts;
    opts.sse_keepalive_ms = 30;
    start(opts);
    const std::string body = R"({"jsonrpc":"2.0","method":"silent","id":1})";
    // Reads the headers and the first keepalive comment, then drops.
    ASSERT_TRUE(send_and_drop(server->port(), raw_post("/rpc", body, "Accept: text/event-stream\r\n"), 100));
    EXPECT_TRUE(wait_until([&] { return methods.stream_cancelled.load(); }, 2000ms));
}

TEST_F(HttpTest, StopCancelsStreams) {
    start();
    std::thread t([&] { post("/slow", R"({"stream":true})"); });
    ASSERT_TRUE(wait_until([&] { return methods.stream_started.load() == 1; }));
    const auto t0 = std::chrono::steady_clock::now();
    server->stop();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
    EXPECT_TRUE(methods.stream_cancelled.load());
    t.join();
}

TEST_F(HttpTest, ApiKeys) {
    HttpOptions opts;
    opts.api_keys = {"k-one", "secret-two"};
    start(opts);
    const std::string rpc = R"({"jsonrpc":"2.0","method":"echo","params":[1],"id":1})";
    auto r = post("/rpc", rpc);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    EXPECT_EQ(body_of(r)["error"]["code"], ERR_UNAUTHORIZED);
    r = post("/rpc", rpc, {{"Authorization", "Bearer secret-two"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    r = post("/rpc", rpc, {{"X-Api-Key", "k-one"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    r = post("/rpc", rpc, {{"Authorization", "Bearer secret-twO"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    r = post("/rpc", rpc, {{"X-Api-Key", "k-on"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);

    r = post("/add", R"({"a":1})");  // REST: the llama-server error shape
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    EXPECT_EQ(body_of(r)["error"]["type"], "authentication_error");
    r = post("/add", R"({"a":1})", {{"Authorization", "Bearer k-one"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);

    r = client()->Get("/health");  // public
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    r = client()->Get("/props");   // not public
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
}

TEST_F(HttpTest, Cors) {
    start();
    auto c = client();
    auto r = c->Options("/rpc", {{"Origin", "http://localhost:3000"}, {"Access-Control-Request-Method", "POST"},
                                 {"Access-Control-Request-Headers", "Authorization, Content-Type"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);  // llama-server's preflight status
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Credentials"), "true");
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Methods"), "GET, POST, DELETE, OPTIONS");
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Headers"), "Authorization, Content-Type");

    // another origin: 200 without Access-Control-* headers, so the browser refuses the call
    r = c->Options("/rpc", {{"Origin", "http://evil.example"}, {"Access-Control-Request-Method", "POST"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
    EXPECT_FALSE(r->has_header("Access-Control-Allow-Credentials"));

    r = post("/add", R"({"a":1})", {{"Origin", "http://127.0.0.1"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://127.0.0.1");

    r = post("/add", R"({"a":1})", {{"Origin", "http://localhost.evil.example"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403);
    EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));

    r = post("/add", R"({"a":1})");  // no Origin (not a browser): allowed, no CORS header
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
}

TEST(CorsOrigins, LocalhostEntryAndPorts) {
    const std::vector<std::string> local = {"localhost"};
    for (const char * o : {"http://localhost", "https://localhost", "http://localhost:8080", "http://127.0.0.1",
                           "http://127.0.0.1:3000", "http://[::1]", "https://[::1]:443", "http://LocalHost:1"})
        EXPECT_TRUE(origin_allowed(local, o)) << o;
    for (const char * o : {"http://localhost.evil.com", "http://notlocalhost", "http://127.0.0.1.evil.com",
                           "http://[::1].evil.com", "http://localhost:", "http://localhost:80x", "http://localhost/",
                           "http://localhost:80/a", "http://localhost@evil.com", "ftp://localhost", "localhost:80",
                           "null", "", "http://127.0.0.2", "http://[::2]", "http://[::1"})
        EXPECT_FALSE(origin_allowed(local, o)) << o;
    // an entry without a port matches any port of that origin, nothing longer
    const std::vector<std::string> app = {"https://app.example"};
    EXPECT_TRUE(origin_allowed(app, "https://app.example"));
    EXPECT_TRUE(origin_allowed(app, "https://app.example:8443"));
    EXPECT_FALSE(origin_allowed(app, "https://app.example.evil"));
    EXPECT_FALSE(origin_allowed(app, "https://app.example:8443x"));
    EXPECT_FALSE(origin_allowed(app, "http://app.example"));
    EXPECT_FALSE(origin_allowed(app, "http://localhost"));  // an explicit list replaces the local default
    EXPECT_TRUE(origin_allowed({"*"}, "https://anything.example"));
}

TEST(PredictFormat, CamelCaseOfRoutes) {
    EXPECT_EQ(predict_format_name("/v1/chat/completions"), "chatCompletions");
    EXPECT_EQ(predict_format_name("/chat/completions"), "chatCompletions");
    EXPECT_EQ(predict_format_name("/apply-template"), "applyTemplate");
    EXPECT_EQ(predict_format_name("/v1/messages/count_tokens"), "messagesCountTokens");
    EXPECT_EQ(predict_format_name("/completion"), "completion");
}

TEST_F(HttpTest, CorsConfiguredOrigin) {
    HttpOptions opts;
    opts.cors_origins = {"https://app.example:8443"};
    start(opts);
    auto r = post("/add", R"({"a":1})", {{"Origin", "https://app.example:8443"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "https://app.example:8443");
    r = post("/add", R"({"a":1})", {{"Origin", "http://localhost"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403);
}

TEST_F(HttpTest, OversizedBody) {
    HttpOptions opts;
    opts.max_body = 1024;
    start(opts);
    const std::string big = R"({"jsonrpc":"2.0","method":"echo","params":[")" + std::string(2000, 'x') + R"("],"id":1})";
    auto r = post("/rpc", big);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
    EXPECT_EQ(body_of(r)["error"]["code"], ERR_INVALID_REQUEST);
    EXPECT_EQ(body_of(r)["id"], nullptr);

    r = post("/add", R"({"a":1,"pad":")" + std::string(2000, 'x') + "\"}");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
    EXPECT_EQ(body_of(r)["error"]["type"], "invalid_request_error");

    r = post("/rpc", R"({"jsonrpc":"2.0","method":"echo","params":[1],"id":1})");  // still serving
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
}

TEST_F(HttpTest, ManyClientsInParallel) {
    start();
    constexpr int n_clients = 16, n_calls = 15;
    std::atomic<int> ok{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < n_clients; t++) {
        threads.emplace_back([&, t] {
            auto c = client();
            for (int i = 0; i < n_calls; i++) {
                const int a = t * 100 + i;
                if (i % 3 == 0) {
                    auto r = c->Post("/add", json{{"a", a}, {"b", 1}}.dump(), "application/json");
                    if (r && r->status == 200 && r->body == std::to_string(a + 1)) ok++;
                } else if (i % 3 == 1) {
                    json req = {{"jsonrpc", "2.0"}, {"method", "add"}, {"params", {{"a", a}}}, {"id", a}};
                    auto r = c->Post("/rpc", req.dump(), "application/json");
                    if (r && r->status == 200 && json::parse(r->body)["result"] == a) ok++;
                } else {
                    auto r = c->Post("/chunks", json{{"n", 3}, {"stream", true}}.dump(), "application/json");
                    if (r && r->status == 200 && r->body.find("{\"done\":3}") != std::string::npos) ok++;
                }
            }
        });
    }
    for (auto & t : threads) t.join();
    EXPECT_EQ(ok.load(), n_clients * n_calls);
}

TEST_F(HttpTest, PortInUse) {
    start();
    HttpOptions opts;
    opts.port = server->port();
    HttpServer second(d, opts);
    EXPECT_FALSE(second.start().is_ok());
}
