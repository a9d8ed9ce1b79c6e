// The JSON-RPC 2.0 dispatcher: the examples of the specification (section 7), id and request
// edge cases, errors, limits, cancellation and concurrent use.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "server/jsonrpc.h"
#include "test_util.h"

using namespace specrpc::rpc;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// The methods of the specification's examples.
void add_spec_methods(Dispatcher & d) {
    d.add_method("subtract", [](const json & p, CallContext &) -> MethodResult {
        if (p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number()) {
            return p[0].get<int>() - p[1].get<int>();
        }
        if (p.is_object() && p.contains("minuend") && p.contains("subtrahend")) {
            return p["minuend"].get<int>() - p["subtrahend"].get<int>();
        }
        return invalid_params("expected two numbers", "minuend");
    });
    d.add_method("sum", [](const json & p, CallContext &) -> MethodResult {
        int s = 0;
        for (const auto & v : p) s += v.get<int>();
        return s;
    });
    d.add_method("update", [](const json &, CallContext &) -> MethodResult { return nullptr; });
    d.add_method("notify_hello", [](const json &, CallContext &) -> MethodResult { return nullptr; });
    d.add_method("notify_sum", [](const json &, CallContext &) -> MethodResult { return nullptr; });
    d.add_method("get_data", [](const json &, CallContext &) -> MethodResult { return json::array({"hello", 5}); });
    d.add_method("echo", [](const json & p, CallContext &) -> MethodResult { return p; });
    d.add_method("throws", [](const json &, CallContext &) -> MethodResult { throw std::runtime_error("boom"); });
    d.add_method("throws_json", [](const json & p, CallContext &) -> MethodResult {
        return p.at("missing").get<int>();  // nlohmann exception escapes the handler
    });
}

struct DispatcherTest : ::testing::Test {
    Dispatcher  d;
    CallContext base;
    DispatcherTest() {
        add_spec_methods(d);
        base.transport = Transport::STDIO;
    }
    // The reply parsed, or a discarded value when there is none.
    json call(const std::string & body) {
        auto out = d.handle(body, base);
        if (!out) return json(json::value_t::discarded);
        return json::parse(*out);
    }
    bool silent(const std::string & body) { return !d.handle(body, base).has_value(); }
};

json err(int code, const char * msg, json id) {
    return json{{"jsonrpc", "2.0"}, {"error", {{"code", code}, {"message", msg}}}, {"id", id}};
}
json res(json result, json id) { return json{{"jsonrpc", "2.0"}, {"result", result}, {"id", id}}; }

}  // namespace

TEST_F(DispatcherTest, SpecPositionalParams) {
    EXPECT_EQ(call(R"({"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1})"), res(19, 1));
    EXPECT_EQ(call(R"({"jsonrpc": "2.0", "method": "subtract", "params": [23, 42], "id": 2})"), res(-19, 2));
}

TEST_F(DispatcherTest, SpecNamedParams) {
    EXPECT_EQ(call(R"({"jsonrpc": "2.0", "method": "subtract", "params": {"subtrahend": 23, "minuend": 42}, "id": 3})"),
              res(19, 3));
    EXPECT_EQ(call(R"({"jsonrpc": "2.0", "method": "subtract", "params": {"minuend": 42, "subtrahend": 23}, "id": 4})"),
              res(19, 4));
}

TEST_F(DispatcherTest, ExactWireFormat) {
    EXPECT_EQ(*d.handle(R"({"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1})", base),
              R"({"jsonrpc":"2.0","id":1,"result":19})");
    EXPECT_EQ(*d.handle(R"({"jsonrpc":"2.0","method":"foobar","id":"1"})", base),
              R"({"jsonrpc":"2.0","id":"1","error":{"code":-32601,"message":"Method not found"}})");
    EXPECT_EQ(*d.handle("[]", base), R"({"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request"}})");
}

TEST_F(DispatcherTest, SpecNotifications) {
    EXPECT_TRUE(silent(R"({"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]})"));
    EXPECT_TRUE(silent(R"({"jsonrpc": "2.0", "method": "foobar"})"));
}

TEST_F(DispatcherTest, SpecMethodNotFound) {
    EXPECT_EQ(call(R"({"jsonrpc": "2.0", "method": "foobar", "id": "1"})"), err(-32601, "Method not found", "1"));
}

TEST_F(DispatcherTest, SpecInvalidJson) {
    EXPECT_EQ(call(R"({"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz])"), err(-32700, "Parse error", nullptr));
    EXPECT_EQ(call(""), err(-32700, "Parse error", nullptr));
    EXPECT_EQ(call("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"id\":1} trailing"), err(-32700, "Parse error", nullptr));
}

TEST_F(DispatcherTest, SpecInvalidRequestObject) {
    EXPECT_EQ(call(R"({"jsonrpc": "2.0", "method": 1, "params": "bar"})"), err(-32600, "Invalid Request", nullptr));
}

TEST_F(DispatcherTest, SpecBatchInvalidJson) {
    EXPECT_EQ(call(R"([
  {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
  {"jsonrpc": "2.0", "method"
])"),
              err(-32700, "Parse error", nullptr));
}

TEST_F(DispatcherTest, SpecEmptyArray) { EXPECT_EQ(call("[]"), err(-32600, "Invalid Request", nullptr)); }

TEST_F(DispatcherTest, SpecInvalidBatchNotEmpty) {
    EXPECT_EQ(call("[1]"), json::array({err(-32600, "Invalid Request", nullptr)}));
}

TEST_F(DispatcherTest, SpecInvalidBatch) {
    const json e = err(-32600, "Invalid Request", nullptr);
    EXPECT_EQ(call("[1,2,3]"), json::array({e, e, e}));
}

TEST_F(DispatcherTest, SpecBatch) {
    const json got = call(R"([
        {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
        {"jsonrpc": "2.0", "method": "subtract", "params": [42,23], "id": "2"},
        {"foo": "boo"},
        {"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},
        {"jsonrpc": "2.0", "method": "get_data", "id": "9"}
    ])");
    const json want = json::array({res(7, "1"), res(19, "2"), err(-32600, "Invalid Request", nullptr),
                                   err(-32601, "Method not found", "5"), res(json::array({"hello", 5}), "9")});
    EXPECT_EQ(got, want);
}

TEST_F(DispatcherTest, SpecBatchAllNotifications) {
    EXPECT_TRUE(silent(R"([
        {"jsonrpc": "2.0", "method": "notify_sum", "params": [1,2,4]},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]}
    ])"));
}

TEST_F(DispatcherTest, IdsEchoedExactly) {
    EXPECT_EQ(*d.handle(R"({"jsonrpc":"2.0","method":"get_data","id":"abc"})", base),
              R"({"jsonrpc":"2.0","id":"abc","result":["hello",5]})");
    EXPECT_EQ(*d.handle(R"({"jsonrpc":"2.0","method":"get_data","id":-7})", base),
              R"({"jsonrpc":"2.0","id":-7,"result":["hello",5]})");
    EXPECT_EQ(*d.handle(R"({"jsonrpc":"2.0","method":"get_data","id":18446744073709551615})", base),
              R"({"jsonrpc":"2.0","id":18446744073709551615,"result":["hello",5]})");
    EXPECT_EQ(*d.handle(R"({"jsonrpc":"2.0","method":"get_data","id":1.5})", base),
              R"({"jsonrpc":"2.0","id":1.5,"result":["hello",5]})");
    // id null is a request (answered), not a notification.
    EXPECT_EQ(*d.handle(R"({"jsonrpc":"2.0","method":"get_data","id":null})", base),
              R"({"jsonrpc":"2.0","id":null,"result":["hello",5]})");
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"get_data","id":"\u00e9\"x"})")["id"], "\u00e9\"x");
}

TEST_F(DispatcherTest, WrongIdTypesAreInvalidRequests) {
    for (const char * id : {"true", "false", "{}", "{\"a\":1}", "[]", "[1]"}) {
        SCOPED_TRACE(id);
        EXPECT_EQ(call(std::string(R"({"jsonrpc":"2.0","method":"echo","id":)") + id + "}"),
                  err(-32600, "Invalid Request", nullptr));
    }
}

TEST_F(DispatcherTest, InvalidRequestShapes) {
    const json bad = err(-32600, "Invalid Request", nullptr);
    EXPECT_EQ(call(R"({"method":"echo","id":null})"), bad);                        // no jsonrpc
    EXPECT_EQ(call(R"({"jsonrpc":"1.0","method":"echo","id":7})"), err(-32600, "Invalid Request", 7));
    EXPECT_EQ(call(R"({"jsonrpc":2.0,"method":"echo","id":7})"), err(-32600, "Invalid Request", 7));
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","id":7})"), err(-32600, "Invalid Request", 7));  // no method
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":null,"id":7})"), err(-32600, "Invalid Request", 7));
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"echo","params":"x","id":7})"), err(-32600, "Invalid Request", 7));
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"echo","params":3,"id":7})"), err(-32600, "Invalid Request", 7));
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"echo","params":null,"id":7})"), err(-32600, "Invalid Request", 7));
    EXPECT_EQ(call(R"("just a string")"), bad);
    EXPECT_EQ(call("42"), bad);
    EXPECT_EQ(call("null"), bad);
    // An invalid request without id is still answered (it cannot be recognised as a notification).
    EXPECT_EQ(call(R"({"jsonrpc":"1.0","method":"echo"})"), bad);
    // Unknown extra members are ignored.
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"echo","params":[1],"id":1,"extra":true})"), res(json::array({1}), 1));
}

TEST_F(DispatcherTest, ParamsPassing) {
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"echo","id":1})"), res(json::object(), 1));  // absent -> {}
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"echo","params":[],"id":1})"), res(json::array(), 1));
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"echo","params":{"a":[1,{"b":null}]},"id":1})"),
              res(json{{"a", json::array({1, json{{"b", nullptr}}})}}, 1));
}

TEST_F(DispatcherTest, InvalidParamsCarriesParam) {
    json got = call(R"({"jsonrpc":"2.0","method":"subtract","params":{"x":1},"id":1})");
    EXPECT_EQ(got["error"]["code"], -32602);
    EXPECT_EQ(got["error"]["message"], "expected two numbers");
    EXPECT_EQ(got["error"]["data"]["param"], "minuend");
    // Errors of notifications are not answered.
    EXPECT_TRUE(silent(R"({"jsonrpc":"2.0","method":"subtract","params":{"x":1}})"));
}

TEST_F(DispatcherTest, ExceptionsBecomeInternalErrors) {
    json got = call(R"({"jsonrpc":"2.0","method":"throws","id":1})");
    EXPECT_EQ(got["error"]["code"], -32603);
    EXPECT_EQ(got["error"]["message"], "Internal error");
    EXPECT_EQ(got["error"]["data"]["detail"], "boom");
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"throws_json","params":{},"id":2})")["error"]["code"], -32603);
    EXPECT_TRUE(silent(R"({"jsonrpc":"2.0","method":"throws"})"));
}

TEST_F(DispatcherTest, InvalidUtf8InResultIsReplaced) {
    d.add_method("bad_utf8", [](const json &, CallContext &) -> MethodResult { return std::string("a\xff" "b"); });
    json got = call(R"({"jsonrpc":"2.0","method":"bad_utf8","id":1})");
    EXPECT_EQ(got["result"], "a\xEF\xBF\xBD" "b");
}

TEST_F(DispatcherTest, Aliases) {
    d.add_alias("minus", "subtract");
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"minus","params":[5,3],"id":1})"), res(2, 1));
    d.add_alias("dangling", "nothing");
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"dangling","id":1})"), err(-32601, "Method not found", 1));
    EXPECT_TRUE(d.has_method("minus"));
    EXPECT_FALSE(d.has_method("dangling"));
}

TEST_F(DispatcherTest, BodyTooLarge) {
    Dispatcher small(DispatcherOptions{64, 256});
    add_spec_methods(small);
    std::string body = R"({"jsonrpc":"2.0","method":"echo","params":[")" + std::string(100, 'x') + R"("],"id":1})";
    json got = json::parse(*small.handle(body, base));
    EXPECT_EQ(got["error"]["code"], -32600);
    EXPECT_EQ(got["id"], nullptr);
    EXPECT_NE(got["error"]["message"].get<std::string>().find("exceeds the limit of 64 bytes"), std::string::npos);
}

TEST_F(DispatcherTest, DeepNestingRejected) {
    std::string deep = R"({"jsonrpc":"2.0","method":"echo","id":1,"params":)" + std::string(100000, '[') +
                       std::string(100000, ']') + "}";
    json got = call(deep);
    EXPECT_EQ(got["error"]["code"], -32600);
    // Brackets inside strings do not count.
    std::string in_string = R"({"jsonrpc":"2.0","method":"echo","id":1,"params":[")" + std::string(1000, '[') + R"("]})";
    EXPECT_EQ(call(in_string)["result"][0].get<std::string>().size(), 1000u);
}

TEST_F(DispatcherTest, NotifyGoesThroughTheContext) {
    std::vector<std::pair<std::string, json>> sent;
    base.notify = [&](const std::string & m, const json & p) { sent.emplace_back(m, p); };
    d.add_method("chatty", [](const json &, CallContext & ctx) -> MethodResult {
        ctx.send("completion.chunk", json{{"id", ctx.id}, {"data", {{"content", "hi"}}}});
        return json{{"transport", transport_name(ctx.transport)}, {"notification", ctx.is_notification}};
    });
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"chatty","id":"q"})"),
              res(json{{"transport", "stdio"}, {"notification", false}}, "q"));
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0].first, "completion.chunk");
    EXPECT_EQ(sent[0].second["id"], "q");
    EXPECT_EQ(make_notification("m", json{{"a", 1}}), R"({"jsonrpc":"2.0","method":"m","params":{"a":1}})");
}

// A method that waits for its cancelled flag (bounded in time).
MethodResult wait_for_cancel(const json &, CallContext & ctx) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!ctx.is_cancelled() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    if (ctx.is_cancelled()) return make_error(ERR_CANCELLED, "Request cancelled", json{{"partial", "ab"}});
    return "not cancelled";
}

using specrpc::test::wait_until;

TEST_F(DispatcherTest, CancelRequest) {
    d.add_method("wait", wait_for_cancel);
    std::optional<std::string> out;
    std::thread t([&] { out = d.handle(R"({"jsonrpc":"2.0","method":"wait","id":"w1"})", base); });
    ASSERT_TRUE(wait_until([&] { return d.in_flight() == 1; }));
    // Cancelling an unknown id does nothing; the cancel is a notification (no reply).
    EXPECT_TRUE(silent(R"({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":"other"}})"));
    EXPECT_EQ(d.in_flight(), 1u);
    EXPECT_TRUE(silent(R"({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":"w1"}})"));
    t.join();
    ASSERT_TRUE(out.has_value());
    json got = json::parse(*out);
    EXPECT_EQ(got["id"], "w1");
    EXPECT_EQ(got["error"]["code"], ERR_CANCELLED);
    EXPECT_EQ(got["error"]["data"]["partial"], "ab");
    EXPECT_EQ(d.in_flight(), 0u);
    // Sent as a request it is answered with null; without an id it is invalid params.
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":5},"id":9})"), res(nullptr, 9));
    EXPECT_EQ(call(R"({"jsonrpc":"2.0","method":"$/cancelRequest","params":{},"id":9})")["error"]["code"], -32602);
}

TEST_F(DispatcherTest, CancelNumericIdAndConnection) {
    d.add_method("wait", wait_for_cancel);
    std::optional<std::string> a, b;
    auto conn = std::make_shared<std::atomic<bool>>(false);
    CallContext with_conn = base;
    with_conn.cancelled = conn;
    std::thread ta([&] { a = d.handle(R"({"jsonrpc":"2.0","method":"wait","id":12})", base); });
    std::thread tb([&] { b = d.handle(R"({"jsonrpc":"2.0","method":"wait","id":13})", with_conn); });
    ASSERT_TRUE(wait_until([&] { return d.in_flight() == 2; }));
    EXPECT_EQ(d.cancel(json(12)), 1u);
    ta.join();
    EXPECT_EQ(json::parse(*a)["error"]["code"], ERR_CANCELLED);
    EXPECT_EQ(d.cancel_connection(conn), 1u);
    tb.join();
    EXPECT_EQ(json::parse(*b)["error"]["code"], ERR_CANCELLED);
    // A call started on an already dropped connection is cancelled from the start.
    EXPECT_EQ(json::parse(*d.handle(R"({"jsonrpc":"2.0","method":"wait","id":14})", with_conn))["error"]["code"],
              ERR_CANCELLED);
}

TEST_F(DispatcherTest, DirectCall) {
    CallContext ctx = base;
    ctx.id = "rest-1";
    MethodResult r = d.call("subtract", json::array({10, 4}), ctx);
    ASSERT_TRUE(std::holds_alternative<json>(r));
    EXPECT_EQ(std::get<json>(r), 6);
    r = d.call("nope", json::object(), ctx);
    ASSERT_TRUE(std::holds_alternative<RpcError>(r));
    EXPECT_EQ(std::get<RpcError>(r).code, ERR_METHOD_NOT_FOUND);
}

TEST_F(DispatcherTest, ErrorFromStatus) {
    using specrpc::ErrorCode;
    using specrpc::Status;
    RpcError e = error_from_status(specrpc::invalid_arg("bad temperature", "temperature"));
    EXPECT_EQ(e.code, ERR_INVALID_PARAMS);
    EXPECT_EQ(e.data["param"], "temperature");
    EXPECT_EQ(error_from_status(Status(ErrorCode::CONTEXT_EXCEEDED, "too long")).code, ERR_CONTEXT_EXCEEDED);
    EXPECT_EQ(error_from_status(Status(ErrorCode::OVERLOADED, "busy")).data["retry_after"], 1.0);
    EXPECT_EQ(error_from_status(Status(ErrorCode::CANCELLED, "x")).code, ERR_CANCELLED);
    EXPECT_EQ(error_from_status(Status(ErrorCode::UNAVAILABLE, "x")).code, ERR_LOADING);
}

TEST_F(DispatcherTest, ConcurrentHandles) {
    constexpr int n_threads = 8, n_calls = 300;
    std::atomic<int> ok{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < n_threads; t++) {
        threads.emplace_back([&, t] {
            for (int i = 0; i < n_calls; i++) {
                const int a = t * 1000 + i;
                const std::string body = "[{\"jsonrpc\":\"2.0\",\"method\":\"subtract\",\"params\":[" + std::to_string(a) +
                                         ",1],\"id\":" + std::to_string(a) +
                                         "},{\"jsonrpc\":\"2.0\",\"method\":\"update\"}]";
                json got = json::parse(*d.handle(body, base));
                if (got.size() == 1 && got[0]["id"] == a && got[0]["result"] == a - 1) ok++;
            }
        });
    }
    for (auto & t : threads) t.join();
    EXPECT_EQ(ok.load(), n_threads * n_calls);
    EXPECT_EQ(d.in_flight(), 0u);
}
