// The stdio transport driven through in-memory blocking streams: both framings, notifications,
// $/cancelRequest overtaking a running call, limits, concurrency and the end of input.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <istream>
#include <mutex>
#include <ostream>
#include <set>
#include <thread>

#include "server/stdio_transport.h"
#include "test_util.h"

using namespace specrpc::rpc;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// An input stream buffer fed by the test; reads block until data arrives or it is closed.
class PipeBuf : public std::streambuf {
  public:
    void feed(const std::string & s) {
        std::lock_guard<std::mutex> lock(mu_);
        data_ += s;
        cv_.notify_all();
    }
    void close() {
        std::lock_guard<std::mutex> lock(mu_);
        closed_ = true;
        cv_.notify_all();
    }

  protected:
    int_type underflow() override {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return pos_ < data_.size() || closed_; });
        if (pos_ >= data_.size()) return traits_type::eof();
        const std::size_t n = std::min(data_.size() - pos_, sizeof buf_);
        std::memcpy(buf_, data_.data() + pos_, n);
        pos_ += n;
        setg(buf_, buf_, buf_ + n);
        return traits_type::to_int_type(buf_[0]);
    }

  private:
    std::mutex              mu_;
    std::condition_variable cv_;
    std::string             data_;
    std::size_t             pos_   = 0;
    bool                    closed_ = false;
    char                    buf_[256];
};

// An output stream buffer collecting everything written.
class SinkBuf : public std::streambuf {
  public:
    std::string text() {
        std::lock_guard<std::mutex> lock(mu_);
        return data_;
    }

  protected:
    int_type overflow(int_type c) override {
        if (c != traits_type::eof()) {
            std::lock_guard<std::mutex> lock(mu_);
            data_.push_back(static_cast<char>(c));
        }
        return c;
    }
    std::streamsize xsputn(const char * s, std::streamsize n) override {
        std::lock_guard<std::mutex> lock(mu_);
        data_.append(s, static_cast<std::size_t>(n));
        return n;
    }

  private:
    std::mutex  mu_;
    std::string data_;
};

struct Msg {
    bool framed;
    json body;
};

// Splits the output into messages of either framing; fails the test on garbage. With `partial`
// (polling while the server writes) a last message not yet written whole is left out: a message
// and its line end, or its header and body, are written in more than one piece.
std::vector<Msg> parse_output(const std::string & out, bool partial = false) {
    std::vector<Msg> msgs;
    std::size_t      pos = 0;
    while (pos < out.size()) {
        if (out.compare(pos, 16, "Content-Length: ") == 0) {
            const std::size_t eol = out.find("\r\n\r\n", pos);
            if (!partial) {
                EXPECT_NE(eol, std::string::npos);
            }
            if (eol == std::string::npos) break;
            const std::size_t n = std::stoul(out.substr(pos + 16, eol - pos - 16));
            if (partial && out.size() < eol + 4 + n) break;
            msgs.push_back({true, json::parse(out.substr(eol + 4, n))});
            pos = eol + 4 + n;
        } else {
            const std::size_t eol = out.find('\n', pos);
            if (!partial) {
                EXPECT_NE(eol, std::string::npos);
            }
            if (eol == std::string::npos) break;
            msgs.push_back({false, json::parse(out.substr(pos, eol - pos))});
            pos = eol + 1;
        }
    }
    return msgs;
}

std::string framed(const std::string & body) {
    return "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

using specrpc::test::wait_until;

struct StdioTest : ::testing::Test {
    Dispatcher        d{DispatcherOptions{4096, 256}};
    PipeBuf           in_buf;
    SinkBuf           out_buf;
    std::istream      in{&in_buf};
    std::ostream      out{&out_buf};
    std::atomic<bool> release{false};
    std::atomic<bool> saw_cancel{false};
    std::thread       runner;
    int               rc = -1;

    StdioTest() {
        d.add_method("echo", [](const json & p, CallContext &) -> MethodResult { return p; });
        d.add_method("add", [](const json & p, CallContext &) -> MethodResult {
            std::this_thread::sleep_for(std::chrono::milliseconds(p.value("sleep_ms", 0)));
            return p.at("a").get<int>() + p.at("b").get<int>();
        });
        d.add_method("chunks", [](const json & p, CallContext & ctx) -> MethodResult {
            for (int i = 0; i < p.value("n", 2); i++) ctx.send("completion.chunk", json{{"id", ctx.id}, {"data", i}});
            return "done";
        });
        // Waits (at most 5 s) for its cancelled flag or the test's release flag.
        d.add_method("slow", [this](const json &, CallContext & ctx) -> MethodResult {
            const auto deadline = std::chrono::steady_clock::now() + 5s;
            while (!ctx.is_cancelled() && !release && std::chrono::steady_clock::now() < deadline) {
                std::this_thread::sleep_for(1ms);
            }
            if (ctx.is_cancelled()) {
                saw_cancel = true;
                return make_error(ERR_CANCELLED, "Request cancelled");
            }
            return "released";
        });
    }
    void start(StdioOptions opts = {}) {
        runner = std::thread([this, opts] {
            StdioServer server(d, in, out, opts);
            rc = server.run();
        });
    }
    // Closes the input and waits for run() to return.
    std::vector<Msg> finish() {
        in_buf.close();
        if (runner.joinable()) runner.join();
        return parse_output(out_buf.text());
    }
    std::size_t n_out() { return parse_output(out_buf.text(), true).size(); }
    ~StdioTest() override {
        release = true;
        in_buf.close();
        if (runner.joinable()) runner.join();
    }
};

}  // namespace

TEST_F(StdioTest, LineFraming) {
    start();
    in_buf.feed(R"({"jsonrpc":"2.0","method":"add","params":{"a":1,"b":2},"id":1})" "\n");
    in_buf.feed("\n  \r\n");  // blank lines are skipped
    in_buf.feed(R"({"jsonrpc":"2.0","method":"echo","params":[1]})" "\n");  // notification: silent
    in_buf.feed(R"({"jsonrpc":"2.0","method":"foobar","id":"x"})" "\r\n");
    in_buf.feed(R"({"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz])" "\n");
    in_buf.feed("[]\n");
    auto msgs = finish();
    EXPECT_EQ(rc, 0);
    ASSERT_EQ(msgs.size(), 4u);
    std::multiset<std::string> got, want;
    for (const auto & m : msgs) {
        EXPECT_FALSE(m.framed);
        got.insert(m.body.dump());
    }
    want.insert(R"({"id":1,"jsonrpc":"2.0","result":3})");
    want.insert(R"({"error":{"code":-32601,"message":"Method not found"},"id":"x","jsonrpc":"2.0"})");
    want.insert(R"({"error":{"code":-32700,"message":"Parse error"},"id":null,"jsonrpc":"2.0"})");
    want.insert(R"({"error":{"code":-32600,"message":"Invalid Request"},"id":null,"jsonrpc":"2.0"})");
    EXPECT_EQ(got, want);
}

TEST_F(StdioTest, ContentLengthFramingExactBytes) {
    start();
    in_buf.feed(framed(R"({"jsonrpc":"2.0","method":"add","params":{"a":20,"b":22},"id":7})"));
    auto msgs = finish();
    EXPECT_EQ(out_buf.text(), "Content-Length: 36\r\n\r\n{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":42}");
    ASSERT_EQ(msgs.size(), 1u);
    EXPECT_TRUE(msgs[0].framed);
}

TEST_F(StdioTest, MixedFramingRepliesInKind) {
    StdioOptions opts;
    opts.n_workers = 1;  // replies in request order
    start(opts);
    // Headers in any case, with Content-Type, split across feeds; a body spanning lines.
    const std::string first = "{\"jsonrpc\":\"2.0\",\n\"method\":\"echo\",\"params\":[1],\"id\":1}";
    in_buf.feed("content-length: " + std::to_string(first.size()) +
                "\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n");
    in_buf.feed("\r\n" + first);
    in_buf.feed(R"({"jsonrpc":"2.0","method":"echo","params":[2],"id":2})" "\n");
    in_buf.feed(framed(R"({"jsonrpc":"2.0","method":"echo","params":[3],"id":3})"));
    auto msgs = finish();
    ASSERT_EQ(msgs.size(), 3u);
    EXPECT_TRUE(msgs[0].framed);
    EXPECT_EQ(msgs[0].body["result"], json::array({1}));
    EXPECT_FALSE(msgs[1].framed);
    EXPECT_EQ(msgs[1].body["result"], json::array({2}));
    EXPECT_TRUE(msgs[2].framed);
    EXPECT_EQ(msgs[2].body["result"], json::array({3}));
}

TEST_F(StdioTest, NotificationsPrecedeTheResponse) {
    start();
    in_buf.feed(framed(R"({"jsonrpc":"2.0","method":"chunks","params":{"n":3},"id":"s"})"));
    in_buf.feed(R"({"jsonrpc":"2.0","method":"chunks","params":{"n":1},"id":"t"})" "\n");
    auto msgs = finish();
    ASSERT_EQ(msgs.size(), 6u);
    std::vector<json> s, t;
    for (const auto & m : msgs) {
        const json & id = m.body.contains("params") ? m.body["params"]["id"] : m.body["id"];
        (id == "s" ? s : t).push_back(m.body);
        EXPECT_EQ(m.framed, id == "s");
    }
    ASSERT_EQ(s.size(), 4u);
    for (int i = 0; i < 3; i++) {
        EXPECT_EQ(s[i]["method"], "completion.chunk");
        EXPECT_EQ(s[i]["params"]["data"], i);
    }
    EXPECT_EQ(s[3]["result"], "done");
    ASSERT_EQ(t.size(), 2u);
    EXPECT_EQ(t[1]["result"], "done");
}

TEST_F(StdioTest, CancelOvertakesRunningCall) {
    StdioOptions opts;
    opts.n_workers = 1;  // the only worker is busy: the cancel must not wait for it
    start(opts);
    in_buf.feed(R"({"jsonrpc":"2.0","method":"slow","id":41})" "\n");
    ASSERT_TRUE(wait_until([&] { return d.in_flight() == 1; }));
    const auto t0 = std::chrono::steady_clock::now();
    in_buf.feed(framed(R"({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":41}})"));
    ASSERT_TRUE(wait_until([&] { return n_out() == 1; }, 2000ms));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
    EXPECT_TRUE(saw_cancel.load());
    auto msgs = finish();
    ASSERT_EQ(msgs.size(), 1u);  // the cancel notification itself is not answered
    EXPECT_EQ(msgs[0].body["id"], 41);
    EXPECT_EQ(msgs[0].body["error"]["code"], ERR_CANCELLED);
}

// A cancel read right behind its call, before a worker took the call or before the dispatcher
// registered it, found nothing and was lost (the call ran to its end). Ids come after the params,
// after a nested "id", and as strings, so that the reader's id scan is driven too.
TEST_F(StdioTest, CancelRightBehindItsCallIsNeverLost) {
    StdioOptions opts;
    opts.n_workers = 2;
    start(opts);
    for (int i = 0; i < 40; i++) {
        const json id   = i % 2 ? json("call-" + std::to_string(i)) : json(i);
        json       call = {{"jsonrpc", "2.0"}, {"method", "slow"}, {"params", {{"x", {1, {{"id", 777}}}}}}, {"id", id}};
        json       cancel = {{"jsonrpc", "2.0"}, {"method", "$/cancelRequest"}, {"params", {{"id", id}}}};
        in_buf.feed(call.dump() + "\n" + cancel.dump() + "\n");
        ASSERT_TRUE(wait_until([&] { return n_out() == static_cast<std::size_t>(i + 1); }, 2000ms))
            << "call " << i << ": the cancel behind it was lost";
        const auto msgs = parse_output(out_buf.text(), true);
        EXPECT_EQ(msgs.back().body["id"], id);
        EXPECT_EQ(msgs.back().body["error"]["code"], ERR_CANCELLED);
    }
    finish();
}

TEST_F(StdioTest, EofWaitsForCallsInFlight) {
    start();
    for (int i = 0; i < 20; i++) {
        in_buf.feed(json{{"jsonrpc", "2.0"}, {"method", "add"}, {"params", {{"a", i}, {"b", 1}, {"sleep_ms", 5}}}, {"id", i}}
                        .dump() +
                    "\n");
    }
    auto msgs = finish();  // input closes right away
    EXPECT_EQ(rc, 0);
    ASSERT_EQ(msgs.size(), 20u);
    std::set<int> ids;
    for (const auto & m : msgs) {
        EXPECT_EQ(m.body["result"], m.body["id"].get<int>() + 1);
        ids.insert(m.body["id"].get<int>());
    }
    EXPECT_EQ(ids.size(), 20u);
}

TEST_F(StdioTest, RunsCallsConcurrently) {
    StdioOptions opts;
    opts.n_workers = 4;
    start(opts);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 8; i++) {
        in_buf.feed(json{{"jsonrpc", "2.0"}, {"method", "add"}, {"params", {{"a", i}, {"b", 0}, {"sleep_ms", 100}}}, {"id", i}}
                        .dump() +
                    "\n");
    }
    ASSERT_TRUE(wait_until([&] { return n_out() == 8; }));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 600ms);  // 8 x 100 ms on 4 workers, not 800 ms
    finish();
}

TEST_F(StdioTest, OversizedAndBadMessages) {
    StdioOptions opts;
    opts.n_workers = 1;
    start(opts);
    in_buf.feed(std::string(5000, 'x') + "\n");                         // line over max_body (4096)
    in_buf.feed("Content-Length: 5000\r\n\r\n" + std::string(5000, ' '));  // framed over max_body
    in_buf.feed("Content-Type: text/plain\r\n\r\n");                     // no Content-Length
    in_buf.feed(R"({"jsonrpc":"2.0","method":"echo","params":[9],"id":9})" "\n");
    auto msgs = finish();
    ASSERT_EQ(msgs.size(), 4u);
    EXPECT_FALSE(msgs[0].framed);
    EXPECT_EQ(msgs[0].body["error"]["code"], ERR_INVALID_REQUEST);
    EXPECT_TRUE(msgs[1].framed);
    EXPECT_EQ(msgs[1].body["error"]["code"], ERR_INVALID_REQUEST);
    EXPECT_TRUE(msgs[2].framed);
    EXPECT_EQ(msgs[2].body["error"]["code"], ERR_INVALID_REQUEST);
    EXPECT_EQ(msgs[3].body["result"], json::array({9}));
}

TEST_F(StdioTest, FullQueueAnswersOverloaded) {
    StdioOptions opts;
    opts.n_workers = 1;
    opts.max_queue = 1;
    start(opts);
    in_buf.feed(R"({"jsonrpc":"2.0","method":"slow","id":0})" "\n");
    ASSERT_TRUE(wait_until([&] { return d.in_flight() == 1; }));
    std::string burst;
    for (int i = 1; i <= 4; i++) burst += R"({"jsonrpc":"2.0","method":"echo","params":[],"id":)" + std::to_string(i) + "}\n";
    // an id that is no string or number is still an id, not a notification: answered, with null
    burst += R"({"jsonrpc":"2.0","method":"echo","params":{"id":5},"id":{"x":[1]}})" "\n";
    burst += R"({"jsonrpc":"2.0","method":"echo","params":[]})" "\n";  // notification: dropped silently
    in_buf.feed(burst);
    ASSERT_TRUE(wait_until([&] { return n_out() == 4; }));
    for (const auto & m : parse_output(out_buf.text())) {
        EXPECT_EQ(m.body["error"]["code"], ERR_OVERLOADED);
        EXPECT_EQ(m.body["error"]["data"]["retry_after"], 1.0);
    }
    EXPECT_TRUE(parse_output(out_buf.text())[3].body["id"].is_null());
    release = true;
    auto msgs = finish();
    ASSERT_EQ(msgs.size(), 6u);  // 4 overloaded + the slow call + the queued one
    EXPECT_EQ(msgs[4].body["result"], "released");
    EXPECT_EQ(msgs[5].body["id"], 1);
}
