// The C ABIs (include/specrpc/rpcserver.h, include/specrpc/specrpc.h) over one process-wide
// Dispatcher + Service, the same ones the transports use. Every entry point catches everything:
// no exception crosses the boundary.
//
// Legacy strings: each thread owns its last returned string (t_slot); it is released when the
// same thread gets its next legacy string, or at thread exit. g_legacy maps every live legacy
// string to its owning thread so that specrpc_free() can release it early from any thread
// without the owner freeing it a second time.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/heap.h"
#include "common/log.h"
#include "server/jsonrpc.h"
#include "server/service.h"
#include "specrpc/rpcserver.h"
#include "specrpc/specrpc.h"

using nlohmann::json;
using namespace specrpc;

namespace {

const char kOutOfMemory[] = "{\"success\":false,\"error\":{\"code\":-32603,\"message\":\"out of memory\"}}";

// ---- legacy string ownership -------------------------------------------------------------------

struct LegacyRegistry {
    std::mutex                            mu;
    std::unordered_map<void *, uint64_t>  owner;  // guarded by mu: live legacy string → thread token
    std::atomic<uint64_t>                 next_token{1};
};
LegacyRegistry & registry() {
    static LegacyRegistry * r = new LegacyRegistry();  // never destroyed: thread exits may come late
    return *r;
}

struct ThreadSlot {
    uint64_t token = registry().next_token.fetch_add(1);
    char *   last  = nullptr;  // this thread's current legacy string (may have been freed early)
    ~ThreadSlot() {
        LegacyRegistry & r = registry();
        std::lock_guard<std::mutex> lock(r.mu);
        release_locked(r);
    }
    void release_locked(LegacyRegistry & r) {
        if (!last) return;
        auto it = r.owner.find(last);
        if (it != r.owner.end() && it->second == token) {
            r.owner.erase(it);
            std::free(last);
        }
        last = nullptr;
    }
};
thread_local ThreadSlot t_slot;

const char * legacy_return(const std::string & s) noexcept {
    char * p = static_cast<char *>(std::malloc(s.size() + 1));
    if (!p) return kOutOfMemory;
    std::memcpy(p, s.data(), s.size() + 1);
    LegacyRegistry & r = registry();
    try {
        std::lock_guard<std::mutex> lock(r.mu);
        t_slot.release_locked(r);
        r.owner[p] = t_slot.token;
        t_slot.last = p;
    } catch (...) {
        std::free(p);
        return kOutOfMemory;
    }
    return p;
}

char * malloc_copy(const std::string & s) noexcept {
    char * p = static_cast<char *>(std::malloc(s.size() + 1));
    if (p) std::memcpy(p, s.data(), s.size() + 1);
    return p;
}

// ---- the process-wide service --------------------------------------------------------------

struct AsyncJob {
    std::mutex                         mu;
    json                               updates = json::array();  // guarded by mu
    bool                               finished = false;         // guarded by mu
    rpc::MethodResult                  result;                   // guarded by mu, once finished
    std::shared_ptr<std::atomic<bool>> conn = std::make_shared<std::atomic<bool>>(false);
    std::thread                        thread;
};

struct Capi {
    rpc::Dispatcher  dispatcher;
    server::Service  service;
    std::mutex       jobs_mu;
    std::map<int64_t, std::shared_ptr<AsyncJob>> jobs;  // guarded by jobs_mu
    int64_t          next_job = 1;                      // guarded by jobs_mu
    int64_t          last_job = 0;                      // guarded by jobs_mu

    Capi() { service.register_methods(dispatcher); }
};
Capi & capi() {
    static Capi * c = new Capi();  // never destroyed: the engine thread must not race static teardown
    return *c;
}

std::string error_json(const rpc::RpcError & e) {
    json err = {{"code", e.code}, {"message", e.message}};
    if (!e.data.is_null()) err["data"] = e.data;
    return rpc::dump_json(json{{"success", false}, {"error", std::move(err)}});
}

std::string error_json(int code, const std::string & msg) { return error_json(rpc::make_error(code, msg)); }

// Parses a legacy request: NULL or "" = {}; otherwise a JSON object.
std::variant<json, rpc::RpcError> parse_request(const char * req) {
    if (!req || !*req) return json::object();
    rpc::MethodResult r = capi().dispatcher.parse_body(req);
    if (auto * err = std::get_if<rpc::RpcError>(&r)) {
        if (err->code == rpc::ERR_PARSE) err->message = "malformed JSON in the request";
        return *err;
    }
    json j = std::move(std::get<json>(r));
    if (!j.is_object()) return rpc::make_error(rpc::ERR_INVALID_PARAMS, "the request must be a JSON object");
    return j;
}

// Runs one legacy call: `fn` returns the JSON text, which becomes the thread's legacy string (any
// exception becomes an error JSON). `req` (may be NULL) counts towards the size of the call: once
// everything the call allocated but the answer is freed, a large call's memory goes back to the
// OS (common/heap.h; without it each calling thread's glibc arena keeps its largest call).
template <typename F> const char * guarded(const char * req, F && fn) noexcept {
    heap_configure();
    const char * out   = kOutOfMemory;
    std::size_t  moved = req ? std::strlen(req) : 0;
    try {
        const std::string answer = fn();
        moved += answer.size();
        out = legacy_return(answer);
    } catch (const std::exception & e) {
        try {
            out = legacy_return(error_json(rpc::ERR_INTERNAL, std::string("internal error: ") + e.what()));
        } catch (...) {
            out = kOutOfMemory;
        }
    } catch (...) {
        out = kOutOfMemory;
    }
    heap_release_after(moved);
    return out;
}

std::string success(json j) {
    if (!j.is_object()) j = json{{"result", std::move(j)}};
    j["success"] = true;
    return rpc::dump_json(j);
}

// Selects the job named by {"request_id": N} (default: the most recent). Caller holds jobs_mu.
using JobRef = std::pair<int64_t, std::shared_ptr<AsyncJob>>;
std::variant<int64_t, rpc::RpcError> pick_job(Capi & c, const json & j);

// The async job a poll/cancel request names (its request_id, or the most recent one).
std::variant<JobRef, rpc::RpcError> find_job(Capi & c, const char * req) {
    auto parsed = parse_request(req);
    if (auto * err = std::get_if<rpc::RpcError>(&parsed)) return *err;
    std::lock_guard<std::mutex> lock(c.jobs_mu);
    auto picked = pick_job(c, std::get<json>(parsed));
    if (auto * err = std::get_if<rpc::RpcError>(&picked)) return *err;
    const int64_t id = std::get<int64_t>(picked);
    return JobRef{id, c.jobs[id]};
}

std::variant<int64_t, rpc::RpcError> pick_job(Capi & c, const json & j) {
    int64_t id = c.last_job;
    if (auto it = j.find("request_id"); it != j.end() && !it->is_null()) {
        if (!it->is_number_integer()) return rpc::invalid_params("request_id must be an integer", "request_id");
        id = it->get<int64_t>();
    }
    if (!c.jobs.count(id))
        return rpc::make_error(rpc::ERR_NOT_FOUND, "no async completion with request_id " + std::to_string(id),
                               json{{"param", "request_id"}});
    return id;
}

void stop_all_jobs(Capi & c) {
    std::map<int64_t, std::shared_ptr<AsyncJob>> jobs;
    {
        std::lock_guard<std::mutex> lock(c.jobs_mu);
        jobs.swap(c.jobs);
        c.last_job = 0;
    }
    for (auto & [id, job] : jobs) c.dispatcher.cancel_connection(job->conn);
    for (auto & [id, job] : jobs)
        if (job->thread.joinable()) job->thread.join();
}

Status init_from(const char * cmd, bool async) {
    Capi & c = capi();
    auto cfg = server::parse_load_config(cmd ? cmd : "");
    if (!cfg) {
        // a command line that does not parse leaves a running engine alone (as the RPC init does)
        if (!c.service.engine()) c.service.set_failed(cfg.status());
        return cfg.status();
    }
    if (async) return c.service.load_async(std::move(cfg.value()));
    return c.service.load(std::move(cfg.value()));
}

}  // namespace

// ---- legacy C ABI ------------------------------------------------------------------------------

extern "C" {

SPECRPC_API int init(const char * cmd) {
    try {
        stop_all_jobs(capi());
        Status st = init_from(cmd, false);
        if (!st) SPR_LOG_ERROR("init failed: %s", st.to_string().c_str());
        return st.is_ok() ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

SPECRPC_API void init_async(const char * cmd) {
    try {
        stop_all_jobs(capi());
        Status st = init_from(cmd, true);
        if (!st) SPR_LOG_ERROR("init_async failed: %s", st.to_string().c_str());
    } catch (...) {
    }
}

SPECRPC_API const char * poll_system_status(void) {
    return guarded(nullptr, [] { return success(capi().service.status()); });
}

SPECRPC_API const char * tokenize(const char * req) {
    return guarded(req, [&] {
        auto parsed = parse_request(req);
        if (auto * err = std::get_if<rpc::RpcError>(&parsed)) return error_json(*err);
        json p = std::get<json>(parsed);
        if (!p.contains("content") && p.contains("text")) p["content"] = p["text"];
        p.erase("text");
        rpc::CallContext ctx;
        ctx.transport = "capi";
        rpc::MethodResult r = capi().dispatcher.call("tokenize", p, ctx);
        if (auto * err = std::get_if<rpc::RpcError>(&r)) {
            if (err->data.is_object() && err->data.value("param", "") == "content") err->data["param"] = "text";
            return error_json(*err);
        }
        json out = std::get<json>(r);
        out["length"] = out["tokens"].size();
        return success(std::move(out));
    });
}

SPECRPC_API const char * get_completion(const char * req) {
    return guarded(req, [&] {
        auto parsed = parse_request(req);
        if (auto * err = std::get_if<rpc::RpcError>(&parsed)) return error_json(*err);
        rpc::CallContext ctx;
        ctx.transport = "capi";
        rpc::MethodResult r = capi().dispatcher.call("completion", std::get<json>(parsed), ctx);
        if (auto * err = std::get_if<rpc::RpcError>(&r)) return error_json(*err);
        return success(std::move(std::get<json>(r)));
    });
}

SPECRPC_API const char * async_completion_init(const char * req) {
    return guarded(req, [&] {
        Capi & c = capi();
        auto parsed = parse_request(req);
        if (auto * err = std::get_if<rpc::RpcError>(&parsed)) return error_json(*err);
        json params = std::get<json>(parsed);
        params["stream"] = true;
        if (auto err = c.service.check_completion(params)) return error_json(*err);
        auto job = std::make_shared<AsyncJob>();
        int64_t id;
        {
            std::lock_guard<std::mutex> lock(c.jobs_mu);
            id = c.next_job++;
            c.jobs[id]  = job;
            c.last_job  = id;
        }
        job->thread = std::thread([job, params = std::move(params)] {
            rpc::MethodResult r;
            try {
                rpc::CallContext ctx;
                ctx.transport = "capi";
                ctx.cancelled = job->conn;
                ctx.notify = [job](const std::string &, const json & p) {
                    std::lock_guard<std::mutex> lock(job->mu);
                    job->updates.push_back(p.is_object() && p.contains("data") ? p["data"] : p);
                };
                r = capi().dispatcher.call("completion", params, ctx);
            } catch (const std::exception & e) {
                r = rpc::make_error(rpc::ERR_INTERNAL, e.what());
            } catch (...) {
                r = rpc::make_error(rpc::ERR_INTERNAL, "internal error");
            }
            std::lock_guard<std::mutex> lock(job->mu);
            job->result   = std::move(r);
            job->finished = true;
        });
        return success(json{{"request_id", id}});
    });
}

SPECRPC_API const char * async_completion_poll(const char * cmd) {
    return guarded(cmd, [&] {
        Capi & c = capi();
        auto found = find_job(c, cmd);
        if (auto * err = std::get_if<rpc::RpcError>(&found)) return error_json(*err);
        auto [id, job] = std::get<JobRef>(found);
        json updates;
        bool finished;
        rpc::MethodResult result;
        {
            std::lock_guard<std::mutex> lock(job->mu);
            updates = std::exchange(job->updates, json::array());
            finished = job->finished;
            if (finished) result = job->result;
        }
        json out = {{"request_id", id}, {"completion_updates", std::move(updates)}, {"finished", finished}};
        if (!finished) return success(std::move(out));
        {
            std::lock_guard<std::mutex> lock(c.jobs_mu);
            c.jobs.erase(id);
        }
        if (job->thread.joinable()) job->thread.join();
        if (auto * err = std::get_if<rpc::RpcError>(&result)) {
            json e = json::parse(error_json(*err));
            e["request_id"] = id;
            e["completion_updates"] = out["completion_updates"];
            e["finished"] = true;
            return rpc::dump_json(e);
        }
        out["result"] = std::move(std::get<json>(result));
        return success(std::move(out));
    });
}

SPECRPC_API const char * async_completion_cancel(const char * req) {
    return guarded(req, [&] {
        Capi & c = capi();
        auto found = find_job(c, req);
        if (auto * err = std::get_if<rpc::RpcError>(&found)) return error_json(*err);
        auto [id, job] = std::get<JobRef>(found);
        c.dispatcher.cancel_connection(job->conn);
        return success(json{{"request_id", id}});
    });
}

SPECRPC_API void deinit(void) {
    try {
        Capi & c = capi();
        stop_all_jobs(c);
        c.service.unload();
    } catch (...) {
    }
}

// ---- new C ABI -------------------------------------------------------------------------------

SPECRPC_API char * specrpc_rpc_stream(const char * request, void (*on_notification)(const char *, void *),
                                      void * user) {
    try {
        if (!request)
            return malloc_copy(rpc::make_error_response(
                nullptr, rpc::make_error(rpc::ERR_INVALID_REQUEST, "Invalid Request: NULL request")));
        rpc::CallContext base;
        base.transport = "capi";
        if (on_notification) {
            base.notify = [on_notification, user](const std::string & method, const json & params) {
                const std::string msg = rpc::make_notification(method, params);
                on_notification(msg.c_str(), user);
            };
        }
        heap_configure();
        char *      answer = nullptr;
        std::size_t moved  = std::strlen(request);
        {
            std::optional<std::string> out = capi().dispatcher.handle(request, base);
            if (out) {
                moved += out->size();
                answer = malloc_copy(*out);
            }
        }
        heap_release_after(moved);  // as guarded()
        return answer;
    } catch (...) {
        return malloc_copy(rpc::make_error_response(nullptr, rpc::make_error(rpc::ERR_INTERNAL, "Internal error")));
    }
}

SPECRPC_API char * specrpc_rpc(const char * request) { return specrpc_rpc_stream(request, nullptr, nullptr); }

SPECRPC_API void specrpc_free(void * p) {
    if (!p || p == static_cast<const void *>(kOutOfMemory)) return;
    try {
        LegacyRegistry & r = registry();
        std::lock_guard<std::mutex> lock(r.mu);
        auto it = r.owner.find(p);
        if (it != r.owner.end()) r.owner.erase(it);  // a legacy string: its owner will not free it again
        if (t_slot.last == p) t_slot.last = nullptr;
    } catch (...) {
    }
    const std::size_t n = std::strlen(static_cast<const char *>(p));
    std::free(p);
    heap_release_after(n);
}

SPECRPC_API const char * specrpc_version(void) { return SPECRPC_VERSION; }

}  // extern "C"
