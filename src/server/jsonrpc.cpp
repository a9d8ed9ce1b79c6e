#include "server/jsonrpc.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "common/log.h"

namespace specrpc::rpc {

using nlohmann::json;

namespace {

constexpr const char * CANCEL_METHOD = "$/cancelRequest";

// Deepest [ / { nesting of `body`, stopping early once it exceeds `limit`. Strings are skipped.
int nesting_depth(std::string_view body, int limit) {
    int  depth = 0, max_depth = 0;
    bool in_string = false, escaped = false;
    for (char c : body) {
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') in_string = true;
        else if (c == '[' || c == '{') {
            max_depth = std::max(max_depth, ++depth);
            if (max_depth > limit) break;
        } else if (c == ']' || c == '}') depth--;
    }
    return max_depth;
}

bool is_valid_id(const json & id) { return id.is_string() || id.is_number() || id.is_null(); }

std::string id_key(const CallContext & ctx) {
    return ctx.is_notification ? std::string() : dump_json(ctx.id);
}

}  // namespace

// ---- helpers ---------------------------------------------------------------------------------

RpcError make_error(int code, std::string message, json data) {
    return RpcError{code, std::move(message), std::move(data)};
}

RpcError invalid_params(std::string message, std::string param) {
    json data = json::object();
    data["param"] = std::move(param);
    return RpcError{ERR_INVALID_PARAMS, std::move(message), std::move(data)};
}

RpcError overloaded(std::string message, double retry_after_s) {
    return RpcError{ERR_OVERLOADED, std::move(message), json{{"retry_after", retry_after_s}}};
}

// Every -32800 says `cancelled: true` in its data, whatever the method and whenever the
// cancellation landed, so a client tests one field. A call cancelled while it waited (for the
// model, or for a free slot) has produced nothing: its partial result is empty.
RpcError cancelled(json partial) {
    if (!partial.is_object()) partial = json::object();
    partial["cancelled"] = true;
    return RpcError{ERR_CANCELLED, "Request cancelled", std::move(partial)};
}

RpcError error_from_status(const Status & status) {
    const std::string & msg = status.message();
    switch (status.code()) {
        case ErrorCode::INVALID_ARGUMENT:
            if (!status.param().empty()) return invalid_params(msg, status.param());
            return make_error(ERR_INVALID_PARAMS, msg);
        case ErrorCode::NOT_FOUND:        return make_error(ERR_NOT_FOUND, msg);
        case ErrorCode::LOAD_FAILED:      return make_error(ERR_SERVER, msg);
        case ErrorCode::VOCAB_MISMATCH:   return make_error(ERR_SERVER, msg);
        case ErrorCode::CONTEXT_EXCEEDED: return make_error(ERR_CONTEXT_EXCEEDED, msg);
        case ErrorCode::UNAVAILABLE:      return make_error(ERR_LOADING, msg);
        case ErrorCode::OVERLOADED:       return overloaded(msg, 1.0);
        case ErrorCode::CANCELLED:        return make_error(ERR_CANCELLED, msg);
        case ErrorCode::UNSUPPORTED:      return make_error(ERR_UNSUPPORTED, msg);
        case ErrorCode::INTERNAL:         return make_error(ERR_INTERNAL, msg);
        case ErrorCode::OK:               break;
    }
    return make_error(ERR_INTERNAL, "internal error: ok status reported as an error");
}

const char * error_code_message(int code) {
    switch (code) {
        case ERR_PARSE:            return "Parse error";
        case ERR_INVALID_REQUEST:  return "Invalid Request";
        case ERR_METHOD_NOT_FOUND: return "Method not found";
        case ERR_INVALID_PARAMS:   return "Invalid params";
        case ERR_INTERNAL:         return "Internal error";
        case ERR_LOADING:          return "Loading model";
        case ERR_CONTEXT_EXCEEDED: return "Context size exceeded";
        case ERR_UNAUTHORIZED:     return "Unauthorized";
        case ERR_NOT_FOUND:        return "Not found";
        case ERR_OVERLOADED:       return "Server overloaded";
        case ERR_UNSUPPORTED:      return "Not supported";
        case ERR_CANCELLED:        return "Request cancelled";
        default:                   return "Server error";
    }
}

std::string dump_json(const json & j) {
    try {
        return j.dump(-1, ' ', false, json::error_handler_t::replace);
    } catch (...) {  // bad_alloc; nothing else is thrown with the replace handler
        return "null";
    }
}

std::string make_result_response(const json & id, const json & result) {
    std::string out = "{\"jsonrpc\":\"2.0\",\"id\":";
    out += dump_json(id);
    out += ",\"result\":";
    out += dump_json(result);
    out += '}';
    return out;
}

std::string make_error_response(const json & id, const RpcError & error) {
    json err = {{"code", error.code}, {"message", error.message}};
    if (!error.data.is_null()) err["data"] = error.data;
    std::string out = "{\"jsonrpc\":\"2.0\",\"id\":";
    out += dump_json(id);
    out += ",\"error\":";
    out += dump_json(err);
    out += '}';
    return out;
}

std::string make_notification(const std::string & method, const json & params) {
    std::string out = "{\"jsonrpc\":\"2.0\",\"method\":";
    out += dump_json(json(method));
    if (!params.is_null()) {
        out += ",\"params\":";
        out += dump_json(params);
    }
    out += '}';
    return out;
}

// ---- in-flight registry ----------------------------------------------------------------------

// Registers a call (with a fresh flag linked to the connection flag) for its lifetime.
class Dispatcher::Registration {
  public:
    Registration(Dispatcher & d, CallContext & ctx) : d_(d), key_(id_key(ctx)) {
        const std::shared_ptr<std::atomic<bool>> conn = ctx.cancelled;
        flag_ = std::make_shared<std::atomic<bool>>(false);
        ctx.cancelled = flag_;
        std::lock_guard<std::mutex> lock(d_.inflight_mu_);
        d_.inflight_.emplace(key_, InFlight{flag_, conn.get()});
        if (conn && conn->load()) flag_->store(true);  // the connection dropped before we started
    }
    ~Registration() {
        std::lock_guard<std::mutex> lock(d_.inflight_mu_);
        auto range = d_.inflight_.equal_range(key_);
        for (auto it = range.first; it != range.second; ++it) {
            if (it->second.flag == flag_) {
                d_.inflight_.erase(it);
                break;
            }
        }
    }
    Registration(const Registration &) = delete;
    Registration & operator=(const Registration &) = delete;

  private:
    Dispatcher &                       d_;
    std::string                        key_;
    std::shared_ptr<std::atomic<bool>> flag_;
};

// ---- Dispatcher ------------------------------------------------------------------------------

Dispatcher::Dispatcher(DispatcherOptions options) : options_(options) {}

void Dispatcher::add_method(std::string name, MethodFn fn) {
    if (name == CANCEL_METHOD) {
        SPR_LOG_WARN("rpc: %s is built in and cannot be replaced", CANCEL_METHOD);
        return;
    }
    auto ptr = std::make_shared<const MethodFn>(std::move(fn));
    std::unique_lock<std::shared_mutex> lock(methods_mu_);
    methods_[std::move(name)] = std::move(ptr);
}

void Dispatcher::add_alias(std::string alias, std::string name) {
    std::unique_lock<std::shared_mutex> lock(methods_mu_);
    aliases_[std::move(alias)] = std::move(name);
}

std::shared_ptr<const MethodFn> Dispatcher::find(const std::string & name) const {
    std::shared_lock<std::shared_mutex> lock(methods_mu_);
    auto it = methods_.find(name);
    if (it != methods_.end()) return it->second;
    auto al = aliases_.find(name);
    if (al == aliases_.end()) return nullptr;
    it = methods_.find(al->second);
    return it != methods_.end() ? it->second : nullptr;
}

bool Dispatcher::has_method(std::string_view name) const {
    const std::string n(name);
    return n == CANCEL_METHOD || find(n) != nullptr;
}

std::vector<std::string> Dispatcher::method_names() const {
    std::vector<std::string> names{CANCEL_METHOD};
    {
        std::shared_lock<std::shared_mutex> lock(methods_mu_);
        for (const auto & [name, fn] : methods_) names.push_back(name);
        for (const auto & [alias, target] : aliases_) names.push_back(alias);
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
}

std::size_t Dispatcher::cancel(const json & id) {
    const std::string key = dump_json(id);
    std::size_t n = 0;
    std::lock_guard<std::mutex> lock(inflight_mu_);
    auto range = inflight_.equal_range(key);
    for (auto it = range.first; it != range.second; ++it, ++n) it->second.flag->store(true);
    return n;
}

std::size_t Dispatcher::cancel_connection(const std::shared_ptr<std::atomic<bool>> & conn) {
    if (!conn) return 0;
    conn->store(true);
    std::size_t n = 0;
    std::lock_guard<std::mutex> lock(inflight_mu_);
    for (auto & [key, call] : inflight_) {
        if (call.conn == conn.get()) {
            call.flag->store(true);
            n++;
        }
    }
    return n;
}

std::size_t Dispatcher::in_flight() const {
    std::lock_guard<std::mutex> lock(inflight_mu_);
    return inflight_.size();
}

MethodResult Dispatcher::cancel_request(const json & params) {
    const json * id = nullptr;
    if (params.is_object() && params.contains("id")) id = &params["id"];
    else if (params.is_array() && params.size() == 1) id = &params[0];
    if (id == nullptr || !is_valid_id(*id)) return invalid_params("id: missing or not a valid id", "id");
    const std::size_t n = cancel(*id);
    SPR_LOG_DEBUG("rpc: cancel %s: %zu call(s) flagged", dump_json(*id).c_str(), n);
    return json(nullptr);
}

const char * transport_name(Transport t) {
    switch (t) {
        case Transport::HTTP: return "http";
        case Transport::HTTP_REST: return "http-rest";
        case Transport::STDIO: return "stdio";
        case Transport::CAPI: return "capi";
        case Transport::NONE: break;
    }
    return "none";
}

MethodResult Dispatcher::invoke(const std::string & method, const json & params, CallContext & ctx) {
    auto fn = find(method);
    if (!fn) return make_error(ERR_METHOD_NOT_FOUND, error_code_message(ERR_METHOD_NOT_FOUND));
    try {
        if (ctx.on_start) ctx.on_start(method);
        return (*fn)(params, ctx);
    } catch (const std::exception & e) {
        SPR_LOG_ERROR("rpc: method %s threw: %s", method.c_str(), e.what());
        return make_error(ERR_INTERNAL, error_code_message(ERR_INTERNAL), json{{"detail", e.what()}});
    } catch (...) {
        SPR_LOG_ERROR("rpc: method %s threw a non-standard exception", method.c_str());
        return make_error(ERR_INTERNAL, error_code_message(ERR_INTERNAL));
    }
}

MethodResult Dispatcher::call(const std::string & method, const json & params, CallContext & ctx) {
    if (method == CANCEL_METHOD) return cancel_request(params);
    try {
        Registration reg(*this, ctx);
        return invoke(method, params, ctx);
    } catch (...) {  // bad_alloc while registering
        return make_error(ERR_INTERNAL, error_code_message(ERR_INTERNAL));
    }
}

std::optional<std::string> Dispatcher::handle_one(const json & req, const CallContext & base) {
    auto invalid = [](const json & id, const char * why) {
        SPR_LOG_DEBUG("rpc: invalid request: %s", why);
        return make_error_response(id, make_error(ERR_INVALID_REQUEST, error_code_message(ERR_INVALID_REQUEST)));
    };
    if (!req.is_object()) return invalid(nullptr, "not an object");

    const auto id_it  = req.find("id");
    const bool has_id = id_it != req.end();
    if (has_id && !is_valid_id(*id_it)) return invalid(nullptr, "id is not a string, number or null");
    const json id = has_id ? *id_it : json(nullptr);

    const auto ver = req.find("jsonrpc");
    if (ver == req.end() || !ver->is_string() || ver->get_ref<const std::string &>() != "2.0") {
        return invalid(id, "jsonrpc is not \"2.0\"");
    }
    const auto method = req.find("method");
    if (method == req.end() || !method->is_string()) return invalid(id, "method is not a string");
    const auto params = req.find("params");
    if (params != req.end() && !params->is_object() && !params->is_array()) {
        return invalid(id, "params is not an object or an array");
    }

    CallContext ctx     = base;
    ctx.id              = id;
    ctx.is_notification = !has_id;
    const std::string & name = method->get_ref<const std::string &>();
    MethodResult result = call(name, params != req.end() ? *params : json::object(), ctx);

    if (!has_id) {
        if (auto * err = std::get_if<RpcError>(&result)) {
            SPR_LOG_DEBUG("rpc: notification %s failed (%d %s), not answered", name.c_str(), err->code,
                          err->message.c_str());
        }
        return std::nullopt;
    }
    if (auto * err = std::get_if<RpcError>(&result)) return make_error_response(id, *err);
    return make_result_response(id, std::get<json>(result));
}

MethodResult Dispatcher::parse_body(std::string_view body) const {
    try {
        if (body.size() > options_.max_body) {
            return make_error(ERR_INVALID_REQUEST, "Invalid Request: body of " + std::to_string(body.size()) +
                                                       " bytes exceeds the limit of " +
                                                       std::to_string(options_.max_body) + " bytes");
        }
        if (nesting_depth(body, options_.max_depth) > options_.max_depth) {
            return make_error(ERR_INVALID_REQUEST, "Invalid Request: JSON nested deeper than " +
                                                       std::to_string(options_.max_depth) + " levels");
        }
        json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded()) return make_error(ERR_PARSE, error_code_message(ERR_PARSE));
        return j;
    } catch (const std::exception & e) {
        return make_error(ERR_INTERNAL, error_code_message(ERR_INTERNAL), json{{"detail", e.what()}});
    }
}

std::optional<std::string> Dispatcher::handle(std::string_view body, const CallContext & base) {
    try {
        MethodResult parsed = parse_body(body);
        if (auto * err = std::get_if<RpcError>(&parsed)) return make_error_response(nullptr, *err);
        const json & req = std::get<json>(parsed);
        if (!req.is_array()) return handle_one(req, base);
        if (req.empty()) {
            return make_error_response(nullptr,
                                       make_error(ERR_INVALID_REQUEST, error_code_message(ERR_INVALID_REQUEST)));
        }
        if (req.size() > options_.max_batch) {
            return make_error_response(nullptr, make_error(ERR_INVALID_REQUEST,
                                                           "Invalid Request: batch of more than " +
                                                               std::to_string(options_.max_batch) + " calls"));
        }
        std::string out;
        for (const json & member : req) {
            std::optional<std::string> r;
            if (out.size() > options_.max_batch_answer) {
                // not run: answer the calls (notifications get nothing) with a short error
                const auto id = member.is_object() ? member.find("id") : member.end();
                if (member.is_object() && id == member.end()) continue;
                r = make_error_response(id != member.end() && (id->is_string() || id->is_number()) ? *id : json(nullptr),
                                        make_error(ERR_INVALID_REQUEST, "Invalid Request: batch answer larger than " +
                                                                            std::to_string(options_.max_batch_answer) +
                                                                            " bytes; call not run"));
            } else {
                r = handle_one(member, base);
            }
            if (!r) continue;
            out += out.empty() ? '[' : ',';
            out += *r;
        }
        if (out.empty()) return std::nullopt;
        out += ']';
        return out;
    } catch (const std::exception & e) {  // bad_alloc and the like
        SPR_LOG_ERROR("rpc: handle failed: %s", e.what());
        return make_error_response(nullptr, make_error(ERR_INTERNAL, error_code_message(ERR_INTERNAL)));
    }
}

}  // namespace specrpc::rpc
