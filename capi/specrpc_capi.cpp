// The C ABI of libspecrpc (include/specrpc/specrpc.h; librpcserver maps the existing library's
// names of rpcserver.h onto its specrpc_* functions) over one process-wide Dispatcher + Service,
// the same ones the transports use. Every entry point catches everything:
// no exception crosses the boundary.
//
// Strings: every string either header returns is malloc'd and belongs to the caller, who releases
// it with free() or specrpc_free() (the existing rpcserver library returned strdup copies and its
// callers free them). The legacy answers keep that library's JSON shapes and return codes
// (shared/legacy/rpcserver.cpp); specrpc adds fields and never removes or retypes one.
//
// Async jobs: each job runs on a detached thread that owns nothing but its job (shared_ptr) and
// the never-destroyed Capi, so no std::thread object is ever destroyed joinable, whatever order
// init/deinit/poll come in. The registry counts live job threads so that deinit/init can wait for
// the ones they cancelled.
#include <chrono>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/heap.h"
#include "common/log.h"
#include "server/jsonrpc.h"
#include "server/service.h"
#include "specrpc/specrpc.h"

using nlohmann::json;
using namespace specrpc;

namespace {

// specrpc.h's error codes are the dispatcher's.
static_assert(SPECRPC_ERR_PARSE == rpc::ERR_PARSE && SPECRPC_ERR_INVALID_REQUEST == rpc::ERR_INVALID_REQUEST &&
              SPECRPC_ERR_METHOD_NOT_FOUND == rpc::ERR_METHOD_NOT_FOUND &&
              SPECRPC_ERR_INVALID_PARAMS == rpc::ERR_INVALID_PARAMS && SPECRPC_ERR_INTERNAL == rpc::ERR_INTERNAL &&
              SPECRPC_ERR_SERVER == rpc::ERR_SERVER && SPECRPC_ERR_LOADING == rpc::ERR_LOADING &&
              SPECRPC_ERR_CONTEXT_EXCEEDED == rpc::ERR_CONTEXT_EXCEEDED &&
              SPECRPC_ERR_UNAUTHORIZED == rpc::ERR_UNAUTHORIZED && SPECRPC_ERR_NOT_FOUND == rpc::ERR_NOT_FOUND &&
              SPECRPC_ERR_OVERLOADED == rpc::ERR_OVERLOADED && SPECRPC_ERR_UNSUPPORTED == rpc::ERR_UNSUPPORTED &&
              SPECRPC_ERR_CANCELLED == rpc::ERR_CANCELLED,
              "specrpc.h's SPECRPC_ERR_* differ from server/jsonrpc.h");

const char kOutOfMemory[] = "{\"success\":false,\"error\":{\"code\":-32603,\"message\":\"out of memory\"}}";

char * malloc_copy(const char * s, std::size_t n) noexcept {
    char * p = static_cast<char *>(std::malloc(n + 1));
    if (p) {
        std::memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}
char * malloc_copy(const std::string & s) noexcept { return malloc_copy(s.data(), s.size()); }
// NULL only when not even the short error fits in memory.
char * out_of_memory() noexcept { return malloc_copy(kOutOfMemory, sizeof kOutOfMemory - 1); }

// ---- async jobs --------------------------------------------------------------------------------

// How long, and how many, finished jobs nobody polled keep their results (a caller that starts
// jobs and never polls them must not grow the process without bound).
constexpr auto        kUnpolledKeep   = std::chrono::minutes(10);
constexpr std::size_t kUnpolledMax    = 256;

struct AsyncJob {
    std::mutex                         mu;
    json                               updates = json::array();  // guarded by mu
    bool                               finished = false;         // guarded by mu: the call ended
    bool                               reported = false;         // guarded by mu: a poll reported it
    rpc::MethodResult                  result;                   // guarded by mu, once finished
    std::chrono::steady_clock::time_point finished_at;           // guarded by mu
    std::shared_ptr<std::atomic<bool>> conn = std::make_shared<std::atomic<bool>>(false);
};

struct Capi {
    rpc::Dispatcher  dispatcher;
    server::Service  service;
    std::mutex       jobs_mu;
    std::condition_variable threads_cv;                 // signalled when a job thread ends
    std::map<int64_t, std::shared_ptr<AsyncJob>> jobs;  // guarded by jobs_mu: not yet reported
    std::set<int64_t> live_threads;                     // guarded by jobs_mu: jobs whose thread runs
    int64_t          next_job = 1;                      // guarded by jobs_mu
    int64_t          last_job = 0;                      // guarded by jobs_mu
    int              lifecycle = 0;                     // guarded by jobs_mu: init/deinit calls under way

    Capi() { service.register_methods(dispatcher); }
};
Capi & capi() {
    static Capi * c = new Capi();  // never destroyed: the engine and job threads must not race static teardown
    return *c;
}

// Calls of specrpc_rpc_stream on this thread (>0: we are inside one, e.g. in its callback), and a
// deinit() requested from there, run when the outermost call returns.
thread_local int  t_call_depth     = 0;
thread_local bool t_deinit_pending = false;

std::string error_json(const rpc::RpcError & e) {
    json err = {{"code", e.code}, {"message", e.message}};
    if (!e.data.is_null()) err["data"] = e.data;
    return rpc::dump_json(json{{"success", false}, {"error", std::move(err)}});
}

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

// Runs one legacy call: `fn` returns the JSON text, returned as a malloc'd copy (any exception
// becomes an error JSON). `req` (may be NULL) counts towards the size of the call: once
// everything the call allocated but the answer is freed, a large call's memory goes back to the
// OS (common/heap.h; without it each calling thread's glibc arena keeps its largest call).
template <typename F> char * guarded(const char * req, F && fn) noexcept {
    heap_configure();
    char *      out   = nullptr;
    std::size_t moved = req ? std::strlen(req) : 0;
    try {
        const std::string answer = fn();
        moved += answer.size();
        out = malloc_copy(answer);
    } catch (const std::exception & e) {
        try {
            out = malloc_copy(error_json(rpc::make_error(rpc::ERR_INTERNAL, std::string("internal error: ") + e.what())));
        } catch (...) {
        }
    } catch (...) {
    }
    heap_release_after(moved);
    return out ? out : out_of_memory();
}

// The answer of an engine call while no model is ready (as the service's own -32001).
std::string not_ready_json() {
    json st = capi().service.status();
    const std::string state = st.value("state", "unloaded");
    json data = {{"status", state}, {"loading_progress", st.value("loading_progress", 0.0)}};
    if (st.contains("error")) data["error"] = st["error"];
    const std::string msg = state == "loading" ? "Loading model"
                          : state == "error"   ? "the model failed to load: " + st.value("error", std::string())
                                               : "no model loaded (call init first)";
    return error_json(rpc::make_error(rpc::ERR_LOADING, msg, std::move(data)));
}

std::string success(json j) {
    if (!j.is_object()) j = json{{"result", std::move(j)}};
    j["success"] = true;
    return rpc::dump_json(j);
}

// The text of tokens as the existing library printed them: the pieces concatenated, control
// tokens (BOS) as "" (llama.cpp's token_to_piece of 2023 printed nothing for them).
std::string piece_of(const Engine & eng, token_id id) {
    return id == eng.info().bos ? std::string() : eng.token_piece(id);
}
std::string pieces_text(const Engine & eng, const std::vector<token_id> & t, size_t begin, size_t end) {
    std::string s;
    for (size_t i = begin; i < end && i < t.size(); ++i) s += piece_of(eng, t[i]);
    return s;
}

// The existing library's prompt_stats (its loadPrompt()): n_past is the prompt prefix reused
// from the KV cache, `cached` / `to_eval` the text of both parts.
json prompt_stats(const Engine & eng, const std::vector<token_id> & prompt, bool truncated, int32_t n_past) {
    n_past = std::max<int32_t>(0, std::min<int32_t>(n_past, static_cast<int32_t>(prompt.size())));
    return json{{"n_ctx", eng.info().n_ctx_slot},
                {"total_prompt_tokens", prompt.size()},
                {"truncated", truncated},
                {"n_past", n_past},
                {"cached", pieces_text(eng, prompt, 0, n_past)},
                {"to_eval", pieces_text(eng, prompt, n_past, prompt.size())}};
}

// A completion request from a legacy caller: llama-server's fields, with the existing library's
// defaults where specrpc's differ (it truncated a prompt longer than the context instead of
// refusing it).
json legacy_completion_params(json p) {
    if (!p.contains("truncate")) p["truncate"] = true;
    return p;
}

// Adds the existing library's shape to completion_probabilities ({"content": piece, "probs":
// [{"tok_str": piece, "prob": p}, ...]} per token) beside llama-server's keys.
void legacy_probs(json & r) {
    auto it = r.find("completion_probabilities");
    if (it == r.end() || !it->is_array()) return;
    for (json & t : *it) {
        if (!t.is_object()) continue;
        t["content"] = t.value("token", "");
        json probs = json::array();
        const bool post = t.contains("top_probs");
        for (const json & c : t.value(post ? "top_probs" : "top_logprobs", json::array())) {
            const double p = post ? c.value("prob", 0.0) : std::exp(c.value("logprob", -1e30));
            probs.push_back({{"tok_str", c.value("token", "")}, {"prob", p}});
        }
        t["probs"] = std::move(probs);
    }
}

// Adds the existing library's keys to a completion result: `status`, `prompt` as sent, and the
// generation_settings names of its time (temp, tfs_z, penalize_nl: tail-free sampling is gone from
// llama.cpp, so 1.0 = off; the penalties apply to newlines too).
void legacy_result(json & r, const json & params) {
    legacy_probs(r);
    r["status"] = 200;
    r["prompt"] = params.contains("prompt") && !params["prompt"].is_null() ? params["prompt"] : json("");
    if (auto it = r.find("generation_settings"); it != r.end() && it->is_object()) {
        json & g = *it;
        if (g.contains("temperature")) g["temp"] = g["temperature"];
        g["tfs_z"]       = 1.0;
        g["penalize_nl"] = true;
    }
}

// The last update of a finished stream, as the existing library queued it: the final response
// with empty content (the text came in the earlier updates).
json final_update(const json & result) {
    json f = result;
    f["content"] = "";
    f["tokens"]  = json::array();
    f["stop"]    = true;
    return f;
}

// Drops finished, unreported jobs beyond kUnpolledMax or older than kUnpolledKeep. Caller holds jobs_mu.
void reap_unpolled_locked(Capi & c) {
    const auto now = std::chrono::steady_clock::now();
    std::vector<int64_t> finished;  // ascending ids = oldest first
    for (auto & [id, job] : c.jobs) {
        std::lock_guard<std::mutex> lock(job->mu);
        if (!job->finished) continue;
        if (now - job->finished_at > kUnpolledKeep) finished.insert(finished.begin(), id);  // dropped first
        else finished.push_back(id);
    }
    size_t n_drop = 0;
    for (size_t i = 0; i < finished.size(); ++i) {
        const auto & job = c.jobs[finished[i]];
        std::lock_guard<std::mutex> lock(job->mu);
        if (now - job->finished_at > kUnpolledKeep || finished.size() - n_drop > kUnpolledMax) {
            c.jobs.erase(finished[i]);
            ++n_drop;
        }
    }
}

// The body of a job thread. Its arguments are moved into locals that are gone before the thread
// tells the registry it ended, so deinit() returns with nothing of a job's left on any thread.
void job_main(int64_t id, std::shared_ptr<AsyncJob> job_arg, json params_arg) {
    {
        std::shared_ptr<AsyncJob> job = std::move(job_arg);
        const json params = std::move(params_arg);
        rpc::MethodResult r;
        try {
            if (job->conn->load()) {
                r = rpc::make_error(rpc::ERR_CANCELLED, "Request cancelled", json{{"content", ""}, {"tokens_predicted", 0}});
            } else {
                rpc::CallContext ctx;
                ctx.transport = rpc::Transport::CAPI;
                ctx.cancelled = job->conn;
                ctx.notify = [&job](const std::string &, const json & p) {
                    json u = p.is_object() && p.contains("data") ? p["data"] : p;
                    legacy_probs(u);
                    std::lock_guard<std::mutex> lock(job->mu);
                    job->updates.push_back(std::move(u));
                };
                r = capi().dispatcher.call("completion", params, ctx);
            }
            json * res = std::get_if<json>(&r);
            auto * err = std::get_if<rpc::RpcError>(&r);
            json * partial = err && err->code == rpc::ERR_CANCELLED && err->data.is_object() ? &err->data : nullptr;
            if (res) legacy_result(*res, params);
            if (partial) legacy_result(*partial, params);
            std::lock_guard<std::mutex> lock(job->mu);
            if (res) job->updates.push_back(final_update(*res));
            if (partial && partial->contains("generation_settings")) job->updates.push_back(final_update(*partial));
        } catch (const std::exception & e) {
            r = rpc::make_error(rpc::ERR_INTERNAL, e.what());
        } catch (...) {
            r = rpc::make_error(rpc::ERR_INTERNAL, "internal error");
        }
        std::lock_guard<std::mutex> lock(job->mu);
        job->result      = std::move(r);
        job->finished    = true;
        job->finished_at = std::chrono::steady_clock::now();
    }
    Capi & c = capi();
    std::lock_guard<std::mutex> lock(c.jobs_mu);
    c.live_threads.erase(id);
    c.threads_cv.notify_all();
}

// Cancels and forgets every job, and waits until their threads have ended.
void stop_all_jobs(Capi & c) {
    std::map<int64_t, std::shared_ptr<AsyncJob>> jobs;
    std::unique_lock<std::mutex> lock(c.jobs_mu);
    jobs.swap(c.jobs);
    c.last_job = 0;
    for (auto & [id, job] : jobs) c.dispatcher.cancel_connection(job->conn);
    c.threads_cv.wait(lock, [&] {
        for (auto & [id, job] : jobs)
            if (c.live_threads.count(id)) return false;
        return true;
    });
}

// An init/deinit under way: from its start until the engine has been replaced or freed, new async
// jobs are refused as "loading", so that callers starting jobs in a loop cannot keep the engine
// busy forever while init waits for its calls to end.
class Lifecycle {
  public:
    explicit Lifecycle(Capi & c) : c_(c) {
        {
            std::lock_guard<std::mutex> lock(c_.jobs_mu);
            c_.lifecycle++;
        }
        stop_all_jobs(c_);
    }
    ~Lifecycle() {
        std::lock_guard<std::mutex> lock(c_.jobs_mu);
        c_.lifecycle--;
    }
    Lifecycle(const Lifecycle &) = delete;
    Lifecycle & operator=(const Lifecycle &) = delete;

  private:
    Capi & c_;
};

// Keys of the existing library's JSON init (its server_params) that an embedded engine has no use for.
const char * const kLegacyServerKeys[] = {"hostname", "public_path", "port", "read_timeout", "write_timeout"};

// Flags of the existing library's command line (llama.cpp's server of late 2023) that have no
// meaning here: dropped with a log line, so that its callers' command lines keep loading.
const char * const kLegacyFlagsWithValue[] = {
    "--path", "--rope-scaling", "--rope-freq-base", "--rope-freq-scale", "--yarn-ext-factor", "--yarn-attn-factor",
    "--yarn-beta-fast", "--yarn-beta-slow", "-tb", "--threads-batch", "-ts", "--tensor-split", "-mg", "--main-gpu",
    "--lora", "--lora-base", "-n", "--n-predict", "-spf", "--system-prompt-file", "--mmproj"};
const char * const kLegacyFlags[] = {"--memory-f32", "-nommq", "--no-mul-mat-q", "--numa", "--embedding"};

// The command line without kLegacyFlags*, re-quoted; unchanged when there is none to drop.
std::string drop_legacy_flags(const std::string & text) {
    auto args = server::split_command_line(text);
    if (!args) return text;  // the parser reports the open quote
    std::vector<std::string> kept;
    std::string dropped;
    for (size_t i = 0; i < args->size(); ++i) {
        const std::string & a = (*args)[i];
        const std::string name = a.rfind("--", 0) == 0 ? a.substr(0, a.find('=')) : a;
        bool with_value = false, flag = false;
        for (const char * f : kLegacyFlagsWithValue) with_value |= name == f;
        for (const char * f : kLegacyFlags) flag |= a == f;
        if (!with_value && !flag) {
            kept.push_back(a);
            continue;
        }
        dropped += (dropped.empty() ? "" : " ") + name;
        if (with_value && name == a) ++i;  // its value is the next word
    }
    if (dropped.empty()) return text;
    SPR_LOG_INFO("init: %s ignored (flags of the existing library without a use here)", dropped.c_str());
    std::string out;
    for (const std::string & a : kept) {
        out += out.empty() ? "'" : " '";
        for (char ch : a) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
        out += "'";
    }
    return out;
}

// The smallest context init accepts (the engine's per slot, checked here on the total too).
constexpr int32_t kMinCtx = kMinCtxSlot;

Status init_from(const char * cmd, bool async) {
    Capi & c = capi();
    std::string text = cmd ? cmd : "";
    if (size_t first = text.find_first_not_of(" \t\r\n"); first != std::string::npos && text[first] == '{') {
        json j = json::parse(text, nullptr, false);
        if (j.is_object()) {
            for (const char * k : kLegacyServerKeys) j.erase(k);
            text = j.dump();
        }
    } else {
        text = drop_legacy_flags(text);
    }
    auto cfg = server::parse_load_config(text);
    if (cfg && cfg.value().engine.n_ctx > 0 && cfg.value().engine.n_ctx < kMinCtx)
        cfg = invalid_arg("ctx_size " + std::to_string(cfg.value().engine.n_ctx) + " is too small: a slot needs at least " +
                              std::to_string(kMinCtx) + " tokens (0 = the model's training context)",
                          "ctx_size");
    if (!cfg) {
        // a command line that does not parse leaves a running engine alone (as the RPC init does)
        if (!c.service.engine()) c.service.set_failed(cfg.status());
        return cfg.status();
    }
    if (async) return c.service.load_async(std::move(cfg.value()));
    return c.service.load(std::move(cfg.value()));
}

// init()/init_async() from inside a specrpc_rpc_stream callback would wait for the very call
// that runs the callback: refused.
bool init_inside_callback(const char * fn) {
    if (t_call_depth == 0) return false;
    SPR_LOG_ERROR("%s cannot be called from inside a specrpc_rpc_stream callback", fn);
    return true;
}

void deinit_now() {
    Capi & c = capi();
    Lifecycle lc(c);
    c.service.unload();
}

}  // namespace

// ---- the existing library's functions (rpcserver.h through librpcserver) ----------------------

extern "C" {

SPECRPC_API int specrpc_init(const char * cmd) {
    try {
        if (init_inside_callback("init")) return 1;
        Lifecycle lc(capi());
        Status st = init_from(cmd, false);
        if (!st) SPR_LOG_ERROR("init failed: %s", st.to_string().c_str());
        return st.is_ok() ? 0 : 1;
    } catch (...) {
        return 1;
    }
}

SPECRPC_API void specrpc_init_async(const char * cmd) {
    try {
        if (init_inside_callback("init_async")) return;
        Lifecycle lc(capi());
        Status st = init_from(cmd, true);
        if (!st) SPR_LOG_ERROR("init_async failed: %s", st.to_string().c_str());
    } catch (...) {
    }
}

SPECRPC_API char * specrpc_poll_system_status(void) {
    return guarded(nullptr, [] {
        json st = capi().service.status();
        const std::string state = st.value("state", "");
        st["init_success"] = state == "ok" ? 1 : state == "error" ? -1 : 0;
        return success(std::move(st));
    });
}

SPECRPC_API char * specrpc_tokenize(const char * req) {
    return guarded(req, [&] {
        auto parsed = parse_request(req);
        if (auto * err = std::get_if<rpc::RpcError>(&parsed)) return error_json(*err);
        const json & p = std::get<json>(parsed);
        auto eng = capi().service.engine();
        if (!eng) return not_ready_json();
        const json * text = p.contains("text") ? &p["text"] : p.contains("content") ? &p["content"] : nullptr;
        if (!text || !text->is_string()) return error_json(rpc::invalid_params("text must be a string", "text"));
        bool add_special = true, parse_special = false;  // the existing library: BOS added, specials as text
        for (auto [key, out] : {std::pair<const char *, bool *>{"add_special", &add_special}, {"parse_special", &parse_special}}) {
            auto it = p.find(key);
            if (it == p.end() || it->is_null()) continue;
            if (!it->is_boolean()) return error_json(rpc::invalid_params(std::string(key) + " must be a boolean", key));
            *out = it->get<bool>();
        }
        auto toks = eng->tokenize(text->get<std::string>(), add_special && eng->info().add_bos, parse_special);
        if (!toks) return error_json(rpc::invalid_params(toks.status().message(), "text"));
        json pieces = json::array(), ids = json::array();
        for (token_id id : toks.value()) {
            pieces.push_back(piece_of(*eng, id));
            ids.push_back(id);
        }
        return success(json{{"tokens", std::move(pieces)}, {"ids", std::move(ids)}, {"length", toks.value().size()}});
    });
}

SPECRPC_API char * specrpc_get_completion(const char * req) {
    return guarded(req, [&] {
        auto parsed = parse_request(req);
        if (auto * err = std::get_if<rpc::RpcError>(&parsed)) return error_json(*err);
        const json params = legacy_completion_params(std::move(std::get<json>(parsed)));
        rpc::CallContext ctx;
        ctx.transport = rpc::Transport::CAPI;
        rpc::MethodResult r = capi().dispatcher.call("completion", params, ctx);
        if (auto * err = std::get_if<rpc::RpcError>(&r)) return error_json(*err);
        json out = std::move(std::get<json>(r));
        legacy_result(out, params);
        if (auto eng = capi().service.engine()) {
            auto pc = server::parse_completion(params, *eng);
            if (auto * ok = std::get_if<server::ParsedCompletion>(&pc))
                out["prompt_stats"] = prompt_stats(*eng, ok->req.prompt, out.value("truncated", false),
                                                   out.value("tokens_cached", 0));
        }
        return success(std::move(out));
    });
}

SPECRPC_API char * specrpc_async_completion_init(const char * req) {
    return guarded(req, [&] {
        Capi & c = capi();
        auto parsed = parse_request(req);
        if (auto * err = std::get_if<rpc::RpcError>(&parsed)) return error_json(*err);
        json params = legacy_completion_params(std::move(std::get<json>(parsed)));
        params["stream"] = true;
        auto eng = c.service.engine();
        if (!eng) return not_ready_json();
        auto pc = server::parse_completion(params, *eng);
        if (auto * err = std::get_if<rpc::RpcError>(&pc)) return error_json(*err);
        const auto & prompt = std::get<server::ParsedCompletion>(pc).req.prompt;
        // the slot (and so its cached prefix) is chosen when the job runs: n_past 0 here
        json stats = prompt_stats(*eng, prompt, static_cast<int32_t>(prompt.size()) >= eng->info().n_ctx_slot, 0);
        auto job = std::make_shared<AsyncJob>();
        int64_t id;
        {
            // registered and started under one lock: stop_all_jobs never sees a job without its thread
            std::lock_guard<std::mutex> lock(c.jobs_mu);
            if (c.lifecycle > 0)
                return error_json(rpc::make_error(rpc::ERR_LOADING, "Loading model: init or deinit is under way",
                                                  json{{"status", "loading"}, {"loading_progress", 0.0}}));
            reap_unpolled_locked(c);
            id = c.next_job++;
            std::thread t(job_main, id, job, std::move(params));
            t.detach();
            c.jobs[id] = job;
            c.live_threads.insert(id);
            c.last_job = id;
        }
        return success(json{{"request_id", id}, {"prompt_stats", std::move(stats)}});
    });
}

SPECRPC_API char * specrpc_async_completion_poll(const char * cmd) {
    return guarded(cmd, [&] {
        Capi & c = capi();
        auto parsed = parse_request(cmd);
        if (auto * err = std::get_if<rpc::RpcError>(&parsed)) return error_json(*err);
        const json & p = std::get<json>(parsed);
        std::shared_ptr<AsyncJob> job;
        int64_t id;
        std::unique_lock<std::mutex> lock(c.jobs_mu);
        id = c.last_job;
        if (auto it = p.find("request_id"); it != p.end() && !it->is_null()) {
            if (!it->is_number_integer()) return error_json(rpc::invalid_params("request_id must be an integer", "request_id"));
            id = it->get<int64_t>();
        }
        if (auto it = c.jobs.find(id); it != c.jobs.end()) job = it->second;
        json updates;
        bool finished = false;
        rpc::MethodResult result;
        if (job) {
            std::lock_guard<std::mutex> jlock(job->mu);
            updates = std::exchange(job->updates, json::array());
            // exactly one poll reports the end: the one that sees it first, under both locks
            finished = job->finished && !job->reported;
            if (finished) {
                job->reported = true;
                result = std::move(job->result);
                c.jobs.erase(id);
            }
        }
        lock.unlock();
        if (!job) {
            // with the keys a polling loop reads, so that a loop written for the existing library
            // (which kept answering finished: true) ends
            json e = json::parse(error_json(rpc::make_error(
                rpc::ERR_NOT_FOUND, "no async completion with request_id " + std::to_string(id), json{{"param", "request_id"}})));
            e["completion_updates"] = json::array();
            e["finished"]           = true;
            return rpc::dump_json(e);
        }
        json out = {{"request_id", id}, {"completion_updates", std::move(updates)}, {"finished", finished}};
        if (!finished) return success(std::move(out));
        if (auto * err = std::get_if<rpc::RpcError>(&result)) {
            // a cancelled job ends as the existing library's did: success, finished, and its partial result
            if (err->code == rpc::ERR_CANCELLED) {
                json partial = err->data.is_object() ? std::move(err->data) : json::object();
                partial["cancelled"] = true;
                out["cancelled"] = true;
                out["result"]    = std::move(partial);
                return success(std::move(out));
            }
            json e = json::parse(error_json(*err));
            e["request_id"] = id;
            e["completion_updates"] = std::move(out["completion_updates"]);
            e["finished"] = true;
            return rpc::dump_json(e);
        }
        out["result"] = std::move(std::get<json>(result));
        return success(std::move(out));
    });
}

SPECRPC_API char * specrpc_async_completion_cancel(const char * req) {
    return guarded(req, [&] {
        Capi & c = capi();
        auto parsed = parse_request(req);
        if (auto * err = std::get_if<rpc::RpcError>(&parsed)) return error_json(*err);
        const json & p = std::get<json>(parsed);
        std::lock_guard<std::mutex> lock(c.jobs_mu);
        int64_t id = c.last_job;
        if (auto it = p.find("request_id"); it != p.end() && !it->is_null()) {
            if (!it->is_number_integer()) return error_json(rpc::invalid_params("request_id must be an integer", "request_id"));
            id = it->get<int64_t>();
        }
        auto it = c.jobs.find(id);
        if (it == c.jobs.end() && !p.contains("request_id")) return success(json::object());  // nothing to cancel: as the existing library
        if (it == c.jobs.end())
            return error_json(rpc::make_error(rpc::ERR_NOT_FOUND, "no async completion with request_id " + std::to_string(id),
                                              json{{"param", "request_id"}}));
        c.dispatcher.cancel_connection(it->second->conn);
        return success(json{{"request_id", id}});
    });
}

SPECRPC_API void specrpc_deinit(void) {
    try {
        if (t_call_depth > 0) {
            // inside a specrpc_rpc_stream callback: unloading now would wait for the call that runs
            // this callback; cancel everything now and free the engine when that call returns
            stop_all_jobs(capi());
            capi().service.cancel_all();
            t_deinit_pending = true;
            return;
        }
        deinit_now();
    } catch (...) {
    }
}

// ---- new C ABI -------------------------------------------------------------------------------

SPECRPC_API char * specrpc_rpc_stream(const char * request, void (*on_notification)(const char *, void *),
                                      void * user) {
    char * answer = nullptr;
    try {
        if (!request)
            return malloc_copy(rpc::make_error_response(
                nullptr, rpc::make_error(rpc::ERR_INVALID_REQUEST, "Invalid Request: NULL request")));
        rpc::CallContext base;
        base.transport = rpc::Transport::CAPI;
        if (on_notification) {
            base.notify = [on_notification, user](const std::string & method, const json & params) {
                const std::string msg = rpc::make_notification(method, params);
                on_notification(msg.c_str(), user);
            };
        }
        heap_configure();
        std::size_t moved = std::strlen(request);
        {
            ++t_call_depth;
            struct Depth {
                ~Depth() { --t_call_depth; }
            } depth;
            std::optional<std::string> out = capi().dispatcher.handle(request, base);
            if (out) {
                moved += out->size();
                answer = malloc_copy(*out);
                if (!answer) answer = out_of_memory();
            }
        }
        heap_release_after(moved);  // as guarded()
    } catch (...) {
        if (!answer)
            answer = malloc_copy(rpc::make_error_response(nullptr, rpc::make_error(rpc::ERR_INTERNAL, "Internal error")));
    }
    if (t_call_depth == 0 && t_deinit_pending) {
        t_deinit_pending = false;
        try {
            deinit_now();
        } catch (...) {
        }
    }
    return answer;
}

SPECRPC_API char * specrpc_rpc(const char * request) { return specrpc_rpc_stream(request, nullptr, nullptr); }

SPECRPC_API void specrpc_free(void * p) {
    if (!p) return;
    const std::size_t n = std::strlen(static_cast<const char *>(p));
    std::free(p);
    heap_release_after(n);
}

SPECRPC_API const char * specrpc_version(void) { return SPECRPC_VERSION; }

}  // extern "C"
