// JSON-RPC 2.0 dispatcher, transport-agnostic: method table, request validation, batches,
// notifications, error objects and $/cancelRequest. Transports (HTTP, stdio, C ABI) hand it a
// body and a CallContext template and send back whatever string it returns.
//
// Conventions: no exception leaves this layer (a handler that throws is answered with -32603);
// errors are values (RpcError). Ids are echoed as parsed: strings, integers and null exactly;
// a number id that does not fit 64 bits or has a fraction is echoed as nlohmann prints a double.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace specrpc::rpc {

// Error codes: JSON-RPC 2.0 reserved codes, then our server errors (-32000..-32099).
inline constexpr int ERR_PARSE            = -32700;  // invalid JSON
inline constexpr int ERR_INVALID_REQUEST  = -32600;  // not a valid request object / body too large
inline constexpr int ERR_METHOD_NOT_FOUND = -32601;
inline constexpr int ERR_INVALID_PARAMS   = -32602;  // data.param names the offending field
inline constexpr int ERR_INTERNAL         = -32603;  // also: a handler threw
inline constexpr int ERR_SERVER           = -32000;  // generic server error
inline constexpr int ERR_LOADING          = -32001;  // model still loading / engine unavailable
inline constexpr int ERR_CONTEXT_EXCEEDED = -32002;  // data: n_prompt_tokens, n_ctx
inline constexpr int ERR_UNAUTHORIZED     = -32003;  // missing or wrong API key
inline constexpr int ERR_NOT_FOUND        = -32004;  // slot, file or request id does not exist
inline constexpr int ERR_OVERLOADED       = -32005;  // data: retry_after (seconds)
inline constexpr int ERR_UNSUPPORTED      = -32006;  // valid but not supported with these options
inline constexpr int ERR_CANCELLED        = -32800;  // request cancelled; data: partial result

inline constexpr std::size_t DEFAULT_MAX_BODY = 8u << 20;  // 8 MiB

struct RpcError {
    int            code = ERR_INTERNAL;
    std::string    message;
    nlohmann::json data;  // null = omitted from the error object
};

// Where a call came from: some methods are refused over the network (init), REST routes get
// llama-server's shapes.
enum class Transport {
    NONE,       // a direct caller (tests)
    HTTP,       // POST /rpc
    HTTP_REST,  // a REST route of the HTTP transport (/completion, /metrics, ...)
    STDIO,
    CAPI,
};
inline bool is_network(Transport t) { return t == Transport::HTTP || t == Transport::HTTP_REST; }
const char * transport_name(Transport t);  // "http", "http-rest", "stdio", "capi", "none"

// A REST answer that is not JSON (Prometheus text): the method sets CallContext::raw_body, and
// the HTTP transport sends it as is.
struct RawBody {
    std::string                                      body;
    std::string                                      content_type = "text/plain; charset=utf-8";
    std::vector<std::pair<std::string, std::string>> headers;
};

// One per call. Transports fill notify/cancelled/transport in the template given to handle();
// the dispatcher fills id/is_notification and gives every call its own cancelled flag.
struct CallContext {
    nlohmann::json id;                     // the request id (null for notifications)
    bool           is_notification = false;
    // Sends a notification to this client (streaming chunks); empty or a no-op where the
    // transport cannot. May be called from any thread while the call runs; never after it returns.
    std::function<void(const std::string & method, const nlohmann::json & params)> notify;
    // Set by $/cancelRequest or a dropped connection. In the template passed to handle() this is
    // the connection's flag (may be null): see Dispatcher::cancel_connection.
    std::shared_ptr<std::atomic<bool>> cancelled;
    Transport   transport = Transport::NONE;
    // Called with the method's name just before it runs (each member of a batch): the HTTP
    // transport watches the connection for a hangup while a generating method runs.
    std::function<void(const std::string & method)> on_start;
    // Set by a method whose REST answer is not JSON (only read by the REST routes).
    std::optional<RawBody> raw_body;

    bool is_cancelled() const { return cancelled && cancelled->load(std::memory_order_relaxed); }
    void send(const std::string & method, const nlohmann::json & params) const {
        if (notify) notify(method, params);
    }
};

using MethodResult = std::variant<nlohmann::json, RpcError>;
using MethodFn     = std::function<MethodResult(const nlohmann::json & params, CallContext & ctx)>;

// Helpers to build errors and messages. Pure functions, thread-safe.
RpcError make_error(int code, std::string message, nlohmann::json data = nullptr);
RpcError invalid_params(std::string message, std::string param);     // -32602, data.param
RpcError overloaded(std::string message, double retry_after_s);      // -32005, data.retry_after
RpcError cancelled(nlohmann::json partial = nlohmann::json::object()); // -32800, data: partial + cancelled
RpcError error_from_status(const Status & status);                   // ErrorCode -> RPC code
const char * error_code_message(int code);                           // "Parse error", ...
// Serialised messages (compact, invalid UTF-8 replaced, never throws).
std::string make_result_response(const nlohmann::json & id, const nlohmann::json & result);
std::string make_error_response(const nlohmann::json & id, const RpcError & error);
std::string make_notification(const std::string & method, const nlohmann::json & params);
std::string dump_json(const nlohmann::json & j);                     // compact, never throws

struct DispatcherOptions {
    std::size_t max_body  = DEFAULT_MAX_BODY;  // larger bodies get -32600
    int         max_depth = 256;               // deeper JSON nesting gets -32600 (stack safety)
    // A batch answer grows with its members, not with the body (a 1.83 MB batch of `props`
    // answered 236 MB): longer batches get one -32600; once the answer passes max_batch_answer
    // bytes, the remaining members are not run and each gets a short -32600.
    std::size_t max_batch        = 1000;
    std::size_t max_batch_answer = 4 * DEFAULT_MAX_BODY;
};

// The method table and the in-flight call registry.
// Thread-safety: every method may be called concurrently from any thread; methods are usually
// registered before serving starts, but add_method during serving is safe too.
class Dispatcher {
  public:
    explicit Dispatcher(DispatcherOptions options = {});
    Dispatcher(const Dispatcher &) = delete;
    Dispatcher & operator=(const Dispatcher &) = delete;

    // Registers (or replaces) a method. "$/cancelRequest" is built in and cannot be replaced.
    void add_method(std::string name, MethodFn fn);
    // Makes `alias` call whatever `name` resolves to at call time.
    void add_alias(std::string alias, std::string name);
    bool has_method(std::string_view name) const;
    std::vector<std::string> method_names() const;  // sorted, aliases included

    // Handles one body (a request, a notification or a batch). Returns the response text, or
    // nullopt when nothing must be sent (notifications, all-notification batches). Batch members
    // run sequentially on the calling thread; a request without params gets {}. Never throws.
    std::optional<std::string> handle(std::string_view body, const CallContext & base);

    // Parses a body with this dispatcher's limits: -32600 when too large or too deeply nested,
    // -32700 when not JSON. Never throws.
    MethodResult parse_body(std::string_view body) const;

    // Calls a method directly, without the JSON-RPC envelope (REST routes, C ABI). ctx.id, when
    // not null, registers the call for $/cancelRequest; ctx.cancelled is replaced by a fresh
    // per-call flag linked to the connection flag it held. Never throws.
    MethodResult call(const std::string & method, const nlohmann::json & params, CallContext & ctx);

    // Sets the cancelled flag of every in-flight call whose id equals `id`. Ids are tracked per
    // Dispatcher, not per client: two clients using the same id cancel each other's call.
    // Returns the number of calls flagged.
    std::size_t cancel(const nlohmann::json & id);
    // Sets the flag of every in-flight call started with base.cancelled == conn (a connection
    // that dropped), and the connection flag itself.
    std::size_t cancel_connection(const std::shared_ptr<std::atomic<bool>> & conn);
    std::size_t in_flight() const;  // calls running now
    const DispatcherOptions & options() const { return options_; }

  private:
    struct InFlight {
        std::shared_ptr<std::atomic<bool>> flag;  // the call's own flag
        const std::atomic<bool> *          conn;  // connection flag it belongs to, may be null
    };
    class Registration;  // RAII in-flight entry

    std::optional<std::string> handle_one(const nlohmann::json & req, const CallContext & base);
    MethodResult invoke(const std::string & method, const nlohmann::json & params,
                        CallContext & ctx);
    MethodResult cancel_request(const nlohmann::json & params);
    std::shared_ptr<const MethodFn> find(const std::string & name) const;

    const DispatcherOptions options_;

    mutable std::shared_mutex methods_mu_;
    std::unordered_map<std::string, std::shared_ptr<const MethodFn>> methods_;  // guarded
    std::unordered_map<std::string, std::string> aliases_;                     // guarded

    mutable std::mutex inflight_mu_;
    std::unordered_multimap<std::string, InFlight> inflight_;  // key: id.dump(), "" = no id; guarded
};

}  // namespace specrpc::rpc
