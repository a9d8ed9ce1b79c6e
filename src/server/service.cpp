// Service: the engine's lifecycle (load / unload / status) and the llama-server methods.
// The OpenAI methods are in service_oai.cpp, parsing in service_params.cpp / service_init.cpp,
// formatting in service_results.cpp.
#include "server/service.h"

#include <chrono>
#include <climits>
#include <cstdlib>
#include <deque>
#include <filesystem>

#include "common/log.h"
#include "server/embedder.h"

namespace specrpc::server {

namespace fs = std::filesystem;

bool is_rest_call(const rpc::CallContext & ctx) { return ctx.transport == rpc::Transport::HTTP_REST; }

// One engine request being waited for: the engine thread fills it, the calling thread drains it.
struct Service::Run {
    std::mutex                              mu;
    std::condition_variable                 cv;
    std::deque<CompletionChunk>             chunks;  // guarded by mu
    std::optional<Result<CompletionResult>> done;    // guarded by mu
};

namespace {

// Registers an engine call with the service for its lifetime (so unload() can cancel and wait).
class CallGuard {
  public:
    CallGuard(std::mutex & mu, std::condition_variable & cv, int & n,
              std::set<std::shared_ptr<std::atomic<bool>>> & flags)
        : mu_(mu), cv_(cv), n_(n), flags_(flags), flag_(std::make_shared<std::atomic<bool>>(false)) {
        // mu_ is held by the caller while constructing
        n_++;
        flags_.insert(flag_);
    }
    ~CallGuard() {
        std::lock_guard<std::mutex> lock(mu_);
        n_--;
        flags_.erase(flag_);
        cv_.notify_all();
    }
    CallGuard(const CallGuard &) = delete;
    CallGuard & operator=(const CallGuard &) = delete;
    bool cancelled() const { return flag_->load(); }

  private:
    std::mutex &                                   mu_;
    std::condition_variable &                      cv_;
    int &                                          n_;
    std::set<std::shared_ptr<std::atomic<bool>>> & flags_;
    std::shared_ptr<std::atomic<bool>>             flag_;
};

const char * state_name(LoadState s) {
    switch (s) {
        case LoadState::EMPTY:   return "unloaded";
        case LoadState::LOADING: return "loading";
        case LoadState::READY:   return "ok";
        case LoadState::FAILED:  return "error";
    }
    return "unloaded";
}

}  // namespace

Service::Service(ServiceOptions options) : opts_(std::move(options)) {}

Service::~Service() { unload(); }

// ---- lifecycle ---------------------------------------------------------------------------------

Status Service::check_model_paths(const LoadConfig & cfg) const {
    std::error_code ec;
    const fs::path dir = fs::weakly_canonical(opts_.model_load_dir, ec);
    if (opts_.model_load_dir.empty() || ec) return Status(ErrorCode::INVALID_ARGUMENT, "model loading is not allowed");
    // n-gram cache files are written back on unload: a client naming one could overwrite any file
    // of the folder (a model), so cache paths come from the operator's command line only
    for (const std::string * p : {&cfg.lookup_static, &cfg.lookup_dynamic})
        if (!p->empty())
            return invalid_arg("lookup cache paths are set on the server's command line, not by a client",
                               p == &cfg.lookup_static ? "lookup_cache_static" : "lookup_cache_dynamic");
    for (const std::string * p : {&cfg.engine.target.path, &cfg.engine.draft.path}) {
        if (p->empty()) continue;
        const fs::path abs = fs::weakly_canonical(*p, ec);
        const std::string a = abs.string(), d = dir.string() + (dir.string().back() == '/' ? "" : "/");
        if (ec || a.compare(0, d.size(), d) != 0)
            return invalid_arg("'" + *p + "' is outside the allowed model folder", "model");
    }
    return Status::ok();
}

Status Service::load(LoadConfig cfg) {
    std::lock_guard<std::mutex> lk(load_mu_);
    if (state() == LoadState::LOADING) return Status(ErrorCode::UNAVAILABLE, "a model is being loaded");
    if (load_thread_.joinable()) load_thread_.join();
    return load_locked(std::move(cfg));
}

Status Service::load_async(LoadConfig cfg) {
    std::lock_guard<std::mutex> lk(load_mu_);
    if (state() == LoadState::LOADING) return Status(ErrorCode::UNAVAILABLE, "a model is being loaded");
    if (load_thread_.joinable()) load_thread_.join();
    {
        std::lock_guard<std::mutex> lock(mu_);
        state_ = LoadState::LOADING;  // visible at once, before the thread runs
        progress_ = 0.0f;
        model_path_ = cfg.engine.target.path;
    }
    load_thread_ = std::thread([this, cfg = std::move(cfg)]() mutable { load_locked(std::move(cfg)); });
    return Status::ok();
}

// Runs with load_mu_ held by the caller (load) or by the thread's creator's protocol (load_async:
// unload/load join the thread under load_mu_ before touching the engine).
Status Service::load_locked(LoadConfig cfg) {
    // 1. drop the old engine
    std::shared_ptr<Engine> old;
    {
        std::unique_lock<std::mutex> lock(mu_);
        for (auto & f : call_flags_) f->store(true);
        calls_cv_.wait_for(lock, std::chrono::seconds(30), [&] { return n_calls_ == 0; });
        old = std::move(engine_);
        ++generation_;
        embedder_.reset();
        fim_.reset();
        state_      = LoadState::LOADING;
        progress_   = 0.0f;
        error_.clear();
        model_path_ = cfg.engine.target.path;
        model_alias_ = cfg.model_alias;
        model_tags_ = cfg.model_tags;
        slots_endpoint_ = cfg.slots_endpoint;
        metrics_endpoint_ = cfg.metrics_endpoint;
        slot_save_path_ = cfg.slot_save_path;
        last_scrape_    = EngineMetrics{};  // a new engine counts from zero
        n_batch_ = std::max(1, cfg.engine.n_batch);
        request_defaults_ = CompletionRequest{};
        reasoning_        = cfg.reasoning;
        reasoning_format_ = cfg.reasoning_format;
        request_defaults_.sampling      = cfg.sampling;
        request_defaults_.n_predict     = cfg.n_predict;
        request_defaults_.context_shift = cfg.context_shift;
    }
    if (old) {
        if (!lookup_dynamic_.empty()) old->save_ngram_cache(lookup_dynamic_);
        old.reset();
    }
    // 2. load
    SPR_LOG_INFO("loading %s%s%s", cfg.engine.target.path.c_str(), cfg.engine.draft.path.empty() ? "" : " + draft ",
                 cfg.engine.draft.path.c_str());
    EngineParams p = cfg.engine;
    p.on_progress  = [this](float x, const std::string &) {
        progress_ = std::min(1.0f, std::max(0.0f, x));
        return !abort_load_.load();
    };
    Status st;
    std::shared_ptr<Engine> eng;
    if (abort_load_) {
        st = Status(ErrorCode::CANCELLED, "loading was aborted");
    } else {
        auto created = Engine::create(p);
        if (!created) st = created.status();
        else eng = std::shared_ptr<Engine>(std::move(created.value()));
    }
    if (eng && !cfg.lookup_static.empty()) st = eng->load_ngram_cache(cfg.lookup_static, false);
    if (eng && st && !cfg.lookup_dynamic.empty()) {
        Status d = eng->load_ngram_cache(cfg.lookup_dynamic, true);
        if (!d && d.code() != ErrorCode::NOT_FOUND) st = d;
    }
    if (eng && st) eng->set_default_spec(cfg.spec);
    // The chat template (the model's, or --chat-template's) is parsed now: one that cannot render
    // a conversation fails the load, as in llama-server, rather than every chat request.
    std::shared_ptr<ChatTemplates> chat;
    if (eng && st) {
        auto ct = ChatTemplates::create(eng->target_model(), cfg.chat_template, cfg.jinja);
        if (ct) chat = std::move(ct.value());
        else st = ct.status();
    }
    std::shared_ptr<Embedder> emb;
    if (eng && st && (cfg.embedding || cfg.reranking)) {
        EmbedderOptions eo;
        eo.model_path   = cfg.engine.target.path;
        eo.pooling      = cfg.pooling.empty() && cfg.reranking ? "rank" : cfg.pooling;
        eo.n_ctx        = eng->info().n_ctx_slot;
        eo.n_threads    = cfg.engine.n_threads;
        eo.n_gpu_layers = cfg.engine.target.n_gpu_layers;
        auto made = Embedder::create(eo);
        if (!made) st = made.status();
        else emb = std::shared_ptr<Embedder>(std::move(made.value()));
    }

    std::lock_guard<std::mutex> lock(mu_);
    if (!st) {
        state_ = LoadState::FAILED;
        error_ = st.to_string();
        SPR_LOG_ERROR("loading failed: %s", error_.c_str());
        return st;
    }
    engine_         = std::move(eng);
    embedder_       = std::move(emb);
    state_          = LoadState::READY;
    progress_       = 1.0f;
    chat_           = std::move(chat);
    lookup_dynamic_ = cfg.lookup_dynamic;
    std::lock_guard<std::mutex> work_lock(work_mu_);
    work_running_max_ = std::max(1, engine_->info().n_parallel);
    work_waiting_max_ = std::max(0, cfg.engine.n_queue_max);
    return Status::ok();
}

std::shared_ptr<ChatTemplates> Service::chat_templates() const {
    std::lock_guard<std::mutex> lock(mu_);
    return chat_;
}

std::optional<rpc::RpcError> Service::enter_work(rpc::CallContext & ctx) {
    std::unique_lock<std::mutex> lock(work_mu_);
    if (work_running_ < work_running_max_) {
        work_running_++;
        return std::nullopt;
    }
    if (work_waiting_ >= work_waiting_max_) return rpc::overloaded("Server overloaded: queue full", 1.0);
    work_waiting_++;
    while (work_running_ >= work_running_max_) {
        if (ctx.is_cancelled()) {
            work_waiting_--;
            return rpc::cancelled();
        }
        work_cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
    work_waiting_--;
    work_running_++;
    return std::nullopt;
}

void Service::leave_work() {
    {
        std::lock_guard<std::mutex> lock(work_mu_);
        work_running_--;
    }
    work_cv_.notify_one();
}

void Service::unload() {
    {
        // before the abort: the load it ends must already read as superseded when it fails
        std::lock_guard<std::mutex> lock(mu_);
        ++generation_;
    }
    abort_load_ = true;
    std::lock_guard<std::mutex> lk(load_mu_);
    if (load_thread_.joinable()) load_thread_.join();
    abort_load_ = false;
    std::shared_ptr<Engine> old;
    std::string dyn;
    {
        std::unique_lock<std::mutex> lock(mu_);
        for (auto & f : call_flags_) f->store(true);
        calls_cv_.wait_for(lock, std::chrono::seconds(30), [&] { return n_calls_ == 0; });
        old = std::move(engine_);
        embedder_.reset();
        fim_.reset();
        dyn = lookup_dynamic_;
        state_ = LoadState::EMPTY;
        progress_ = 0.0f;
        error_.clear();
        model_path_.clear();
        model_alias_.clear();
        chat_.reset();
        lookup_dynamic_.clear();
    }
    if (old && !dyn.empty()) {
        if (Status st = old->save_ngram_cache(dyn); !st) SPR_LOG_WARN("saving %s: %s", dyn.c_str(), st.message().c_str());
    }
}

void Service::set_failed(const Status & st) {
    unload();
    std::lock_guard<std::mutex> lock(mu_);
    state_ = LoadState::FAILED;
    error_ = st.to_string();
}

void Service::cancel_all() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto & f : call_flags_) f->store(true);
}

Status Service::save_dynamic_cache() {
    std::shared_ptr<Engine> e;
    std::string path;
    {
        std::lock_guard<std::mutex> lock(mu_);
        e = engine_;
        path = lookup_dynamic_;
    }
    if (!e || path.empty()) return Status::ok();
    return e->save_ngram_cache(path);
}

uint64_t Service::generation() const {
    std::lock_guard<std::mutex> lock(mu_);
    return generation_;
}

LoadState Service::state() const {
    std::lock_guard<std::mutex> lock(mu_);
    return state_;
}

std::shared_ptr<Engine> Service::engine() const {
    std::lock_guard<std::mutex> lock(mu_);
    return state_ == LoadState::READY ? engine_ : nullptr;
}

CompletionRequest Service::request_defaults() const {
    std::lock_guard<std::mutex> lock(mu_);
    return request_defaults_;
}

std::set<std::string> split_list(const std::string & s) {
    std::set<std::string> out;
    std::string cur;
    for (char c : s + ",") {
        if (c != ',') { cur += c; continue; }
        if (!cur.empty()) out.insert(cur);
        cur.clear();
    }
    return out;
}

std::string Service::model_name() const {
    std::lock_guard<std::mutex> lock(mu_);
    // several aliases (-a a,b,c): the first in sorted order is the id, as llama-server's std::set
    if (auto aliases = split_list(model_alias_); !aliases.empty()) return *aliases.begin();
    return fs::path(model_path_).filename().string();
}

json Service::status() const {
    std::lock_guard<std::mutex> lock(mu_);
    json j = {{"init_success", state_ == LoadState::READY},
              {"state", state_name(state_)},
              {"loading_progress", state_ == LoadState::READY ? 1.0 : static_cast<double>(progress_.load())},
              {"model", model_path_},
              {"model_alias", model_alias_.empty() ? fs::path(model_path_).filename().string() : model_alias_}};
    if (state_ == LoadState::FAILED) j["error"] = error_;
    return j;
}

rpc::RpcError Service::not_ready_error() const {
    json st = status();
    json data = {{"status", st["state"]}, {"loading_progress", st["loading_progress"]}};
    if (st.contains("error")) data["error"] = st["error"];
    const std::string s = st["state"].get<std::string>();
    std::string msg = s == "loading" ? "Loading model"
                    : s == "error"   ? "the model failed to load: " + st.value("error", std::string())
                                     : "no model loaded (call init first)";
    return rpc::make_error(rpc::ERR_LOADING, msg, data);
}

// ---- running a completion ------------------------------------------------------------------

std::variant<CompletionResult, rpc::RpcError> Service::run(const std::shared_ptr<Engine> & eng, CompletionRequest req,
                                                           rpc::CallContext & ctx, const ChunkFn & on_chunk) {
    std::optional<CallGuard> guard;
    {
        std::lock_guard<std::mutex> lock(mu_);
        guard.emplace(mu_, calls_cv_, n_calls_, call_flags_);
    }
    const int32_t n_prompt = static_cast<int32_t>(req.prompt.size());
    req.stream = req.stream && static_cast<bool>(on_chunk);
    auto st = std::make_shared<Run>();
    CompletionSink sink;
    if (req.stream) {
        sink.on_chunk = [st](const CompletionChunk & c) {
            std::lock_guard<std::mutex> lock(st->mu);
            st->chunks.push_back(c);
            st->cv.notify_one();
        };
    }
    sink.on_done = [st](Result<CompletionResult> r) {
        std::lock_guard<std::mutex> lock(st->mu);
        st->done.emplace(std::move(r));
        st->cv.notify_one();
    };
    const int64_t id = eng->submit(std::move(req), std::move(sink));
    bool cancel_sent = false;
    int32_t n_so_far = 0;
    for (;;) {
        std::deque<CompletionChunk> batch;
        bool finished = false;
        {
            std::unique_lock<std::mutex> lock(st->mu);
            st->cv.wait_for(lock, std::chrono::milliseconds(opts_.poll_ms),
                            [&] { return !st->chunks.empty() || st->done.has_value(); });
            batch.swap(st->chunks);
            finished = st->done.has_value();
        }
        for (const auto & c : batch) {
            n_so_far += static_cast<int32_t>(c.tokens.size());
            on_chunk(c, n_so_far);
        }
        if (finished) break;
        if (!cancel_sent && (ctx.is_cancelled() || guard->cancelled())) {
            eng->cancel(id);
            cancel_sent = true;
        }
    }
    Result<CompletionResult> r = std::move(*st->done);
    if (!r) {
        rpc::RpcError err = rpc::error_from_status(r.status());
        if (r.status().code() == ErrorCode::CONTEXT_EXCEEDED)
            err.data = {{"n_prompt_tokens", n_prompt}, {"n_ctx", eng->info().n_ctx_slot}};
        if (r.status().code() == ErrorCode::CANCELLED) err.data = {{"content", ""}, {"tokens_predicted", 0}};
        return err;
    }
    count_result(r.value());
    return std::move(r.value());
}

void Service::count_result(const CompletionResult & r) {
    int32_t n_batch = 512;
    {
        std::lock_guard<std::mutex> lock(mu_);
        n_batch = n_batch_;
    }
    // one line per finished request: what it cost and what speculation saved
    SPR_LOG_INFO("request: prompt %d tokens (+%d cached) in %.1f ms, %d generated in %.1f ms (%.1f tokens/s), "
                 "drafted %lld, accepted %lld, stop %s",
                 r.timings.prompt_n, r.tokens_cached, r.timings.prompt_ms, r.timings.predicted_n, r.timings.predicted_ms,
                 r.timings.predicted_per_second(), static_cast<long long>(r.spec.draft_n),
                 static_cast<long long>(r.spec.draft_n_accepted), stop_type_label(r.stop_type));
    n_tokens_cached_ += r.tokens_cached;
    // target passes: the prompt's batches, then one per generation step
    n_decode_ += (r.timings.prompt_n + n_batch - 1) / n_batch + r.spec.n_steps;
    const int64_t n = int64_t(r.tokens_cached) + r.timings.prompt_n + r.tokens_predicted;
    for (int64_t m = n_tokens_max_.load(); n > m && !n_tokens_max_.compare_exchange_weak(m, n);) {
    }
}

std::optional<rpc::RpcError> Service::check_completion(const json & params) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    const CompletionRequest defaults = request_defaults();
    auto parsed = parse_completion(params, *eng, &defaults);
    if (auto * err = std::get_if<rpc::RpcError>(&parsed)) return *err;
    return std::nullopt;
}

namespace {

// llama-server's JSON prompt object {"prompt_string": ...}: its text (multimodal data: an error).
std::variant<json, rpc::RpcError> plain_prompt(const json & p) {
    if (!p.is_object()) return p;
    if (p.contains("multimodal_data"))
        return rpc::invalid_params("multimodal prompts are not supported (no multimodal projector)", "prompt");
    auto it = p.find("prompt_string");
    if (it == p.end() || !it->is_string()) return rpc::invalid_params("a prompt object needs prompt_string", "prompt");
    return *it;
}

// Several prompts, as llama-server reads them: an array that is neither token ids nor token ids
// mixed with strings (all strings, or holding arrays / prompt objects). A single-element array
// holding one prompt is that prompt.
bool several_prompts(const json & p) {
    if (!p.is_array() || p.empty()) return false;
    bool any_number = false, any_nested = false;
    for (const json & e : p) {
        any_number |= e.is_number();
        any_nested |= e.is_array() || e.is_object();
    }
    if (any_number) return false;
    return p.size() > 1 || (any_nested && p[0].is_object());
}

// response_fields: only these fields, "a/b" naming b inside a (the key keeps the path).
json pick_fields(const json & j, const json & fields) {
    json out = json::object();
    for (const json & f : fields) {
        if (!f.is_string()) continue;
        const std::string path = f.get<std::string>();
        const json * cur = &j;
        size_t start = 0;
        bool found = true;
        while (found && start <= path.size()) {
            const size_t slash = path.find('/', start);
            const std::string key = path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
            if (!cur->is_object() || !cur->contains(key)) found = false;
            else cur = &(*cur)[key];
            if (slash == std::string::npos) break;
            start = slash + 1;
        }
        if (found) out[path] = *cur;
    }
    return out;
}

}  // namespace

rpc::MethodResult Service::completion(const json & params, rpc::CallContext & ctx) {
    if (!params.is_object() || !params.contains("prompt")) return completion_one(params, ctx, 0);
    const json & prompt = params["prompt"];
    if (!several_prompts(prompt)) {
        auto p = plain_prompt(prompt);
        if (auto * err = std::get_if<rpc::RpcError>(&p)) return *err;
        if (!prompt.is_object()) return completion_one(params, ctx, 0);
        json one = params;
        one["prompt"] = std::get<json>(p);
        return completion_one(one, ctx, 0);
    }
    // several prompts: one result each, in order (run one after the other)
    json out = json::array();
    for (size_t i = 0; i < prompt.size(); ++i) {
        auto p = plain_prompt(prompt[i]);
        if (auto * err = std::get_if<rpc::RpcError>(&p)) return *err;
        json one = params;
        one["prompt"] = std::get<json>(p);
        rpc::MethodResult r = completion_one(one, ctx, static_cast<int>(i));
        if (std::holds_alternative<rpc::RpcError>(r)) return r;
        out.push_back(std::move(std::get<json>(r)));
    }
    return out;
}

rpc::MethodResult Service::completion_one(const json & params, rpc::CallContext & ctx, int index) {
    auto eng = engine();
    if (!eng) return not_ready_error();
    const CompletionRequest defaults = request_defaults();
    auto parsed = parse_completion(params, *eng, &defaults);
    if (auto * err = std::get_if<rpc::RpcError>(&parsed)) return *err;
    ParsedCompletion & pc = std::get<ParsedCompletion>(parsed);
    const bool stream = pc.req.stream && static_cast<bool>(ctx.notify);
    const CompletionRequest & req = pc.req;
    const bool per_token = params.value("timings_per_token", json(false)) == json(true);
    pc.req.return_progress = params.value("return_progress", json(false)) == json(true);
    StreamClock clock;
    clock.n_prompt = static_cast<int32_t>(req.prompt.size());
    ChunkFn on_chunk;
    if (stream) {
        on_chunk = [&](const CompletionChunk & c, int32_t n) {
            if (c.progress) {  // the engine's prompt progress: before the prompt and per batch
                json j = {{"index", index}, {"content", ""}, {"tokens", json::array()}, {"stop", false},
                          {"prompt_progress", progress_to_json(*c.progress)}, {"timings", progress_timings(*c.progress)}};
                ctx.send("completion.chunk", {{"id", ctx.id}, {"data", std::move(j)}});
                return;
            }
            json j = chunk_to_json(c, req, n);
            j["index"] = index;
            json t = clock.timings(n);  // also marks the first token's time
            if (per_token) j["timings"] = std::move(t);
            ctx.send("completion.chunk", {{"id", ctx.id}, {"data", std::move(j)}});
        };
    }
    auto r = run(eng, req, ctx, on_chunk);
    if (auto * err = std::get_if<rpc::RpcError>(&r)) return *err;
    const CompletionResult & res = std::get<CompletionResult>(r);
    json j = result_to_json(res, req, *eng, pc.warnings, model_name());
    j["index"] = index;
    if (res.stop_type == StopType::CANCELLED)
        return rpc::cancelled(std::move(j));
    if (is_rest_call(ctx)) {
        rest_timings(j);
        // llama-server's REST answer lists the token ids only on request
        if (params.value("return_tokens", json(false)) != json(true)) j["tokens"] = json::array();
    }
    if (auto f = params.find("response_fields"); f != params.end() && f->is_array() && !f->empty())
        return pick_fields(j, *f);
    if (stream && is_rest_call(ctx)) {  // llama-server's last SSE event: the text was streamed already
        j["content"] = "";
        j["tokens"]  = json::array();
        j.erase("completion_probabilities");
    }
    return j;
}

}  // namespace specrpc::server
