// Engine lifecycle and the public API: creation (contexts, KV layout, thread pool), the task
// queue the callers feed, metrics. The engine thread's loop is in scheduler.cpp, the
// speculative round in step.cpp.
#include <algorithm>
#include <cmath>
#include <future>

#include "common/log.h"
#include "engine/backend.h"
#include "engine/context.h"
#include "engine/engine_impl.h"
#include "engine/tokenizer.h"
#include "llama.h"

namespace specrpc {

const char * stop_type_name(StopType t) {
    switch (t) {
        case StopType::NONE:      return "none";
        case StopType::EOS:       return "eos";
        case StopType::WORD:      return "word";
        case StopType::LIMIT:     return "limit";
        case StopType::CANCELLED: return "cancelled";
        case StopType::CONTEXT:   return "limit";  // llama-server reports a full context as a limit
    }
    return "none";
}

const char * spec_type_name(SpecType t) {
    switch (t) {
        case SpecType::NONE:   return "none";
        case SpecType::DRAFT:  return "draft";
        case SpecType::NGRAM:  return "ngram";
        case SpecType::LOOKUP: return "lookup";
        case SpecType::SYNTH:  return "synth";
        case SpecType::SUFFIX: return "suffix";
    }
    return "none";
}

bool spec_type_from_name(const std::string & s, SpecType * out) {
    static const std::pair<const char *, SpecType> names[] = {
        {"none", SpecType::NONE},     {"draft", SpecType::DRAFT},   {"draft-simple", SpecType::DRAFT},
        {"tree", SpecType::DRAFT},    {"ngram", SpecType::NGRAM},   {"ngram-cache", SpecType::NGRAM},
        {"lookup", SpecType::LOOKUP}, {"prompt-lookup", SpecType::LOOKUP}, {"synth", SpecType::SYNTH},
        {"suffix", SpecType::SUFFIX},
        // llama.cpp's prompt n-gram drafters are our prompt lookup
        {"ngram-simple", SpecType::LOOKUP}, {"ngram-map-k", SpecType::LOOKUP}, {"ngram-map-k4v", SpecType::LOOKUP},
        {"ngram-mod", SpecType::LOOKUP}};
    for (const auto & [n, t] : names)
        if (s == n) { *out = t; return true; }
    return false;
}

Status spec_types_parse(const std::string & list, std::vector<SpecType> * out) {
    out->clear();
    std::string cur;
    for (char c : list + ",") {
        if (c != ',' && c != ' ') {
            cur += c;
            continue;
        }
        if (cur.empty()) continue;
        SpecType t;
        if (!spec_type_from_name(cur, &t))
            return Status(ErrorCode::INVALID_ARGUMENT, "unknown speculative type '" + cur +
                                                           "' (draft, ngram, lookup, suffix, synth, none, or llama.cpp's "
                                                           "draft-simple, ngram-simple, ngram-map-k, ngram-map-k4v, "
                                                           "ngram-mod, ngram-cache)");
        if (t != SpecType::NONE) out->push_back(t);
        cur.clear();
    }
    return Status::ok();
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineParams & params_in) {
    auto impl    = std::make_unique<Impl>();
    auto & p     = impl->params;
    p            = params_in;
    if (p.n_threads <= 0) p.n_threads = std::max(1u, std::thread::hardware_concurrency());
    if (p.n_parallel < 1 || p.n_parallel > 64) return invalid_arg("n_parallel must be in [1, 64]", "n_parallel");
    // start-up times target passes of up to 17 tokens (a draft of 16 and its pending token), and
    // every pass decodes at least one token per slot: llama.cpp aborts on a pass beyond n_batch
    if (p.n_batch < 1) return invalid_arg("n_batch must be >= 1", "n_batch");
    // The prompt goes in chunks of the caller's n_batch; the contexts hold at least kMinBatch
    // tokens per pass, since a verification pass (and the cost probe) decodes up to 17 at once.
    impl->n_batch_prompt = p.n_batch;
    p.n_batch            = std::max(p.n_batch, kMinBatch);
    if (p.n_batch < p.n_parallel)
        return invalid_arg("n_batch must be >= n_parallel (each pass decodes one token of every slot)", "n_batch");
    if (p.n_ctx < 0) return invalid_arg("n_ctx must be >= 0", "n_ctx");
    if (p.n_ctx > 0 && p.n_ctx < kMinCtxSlot)
        return invalid_arg("n_ctx " + std::to_string(p.n_ctx) + " is too small: a slot needs at least " +
                               std::to_string(kMinCtxSlot) + " tokens (0 = the model's training context)", "n_ctx");
    if (p.n_tree_max < 1 || p.n_tree_max > 16) return invalid_arg("n_tree_max must be in [1, 16]", "n_tree_max");
    if (p.flash_attn < -1 || p.flash_attn > 1) return invalid_arg("flash_attn must be -1 (auto), 0 or 1", "flash_attn");
    if (p.draft_flash_attn < -1 || p.draft_flash_attn > 1)
        return invalid_arg("draft_flash_attn must be -1 (auto), 0 or 1", "draft_flash_attn");
    if (p.n_queue_max < 0) return invalid_arg("n_queue_max must be >= 0", "n_queue_max");
    if (p.ngram_cache_max_mb < 0 || p.ngram_cache_max_mb > (1 << 20))
        return invalid_arg("ngram_cache_max_mb must be in [0, 1048576]", "ngram_cache_max_mb");
    if (p.suffix_cache_max_mb < 0 || p.suffix_cache_max_mb > (1 << 20))
        return invalid_arg("suffix_cache_max_mb must be in [0, 1048576]", "suffix_cache_max_mb");

    const bool has_draft = !p.draft.path.empty();
    auto progress = [&](float base, float span, const char * what) {
        return [&p, base, span, what](float x) {
            return p.on_progress ? p.on_progress(base + span * x, what) : true;
        };
    };
    auto tgt = Model::load(p.target, progress(0.0f, has_draft ? 0.9f : 1.0f, "target"));
    if (!tgt) return tgt.status();
    impl->target = tgt.value();

    impl->n_ctx_slot     = p.n_ctx > 0 ? p.n_ctx : impl->target->n_ctx_train();
    impl->n_seq_per_slot = p.n_tree_max;
    // One slot with chains needs a single sequence: a non-unified cache, which spares every pass
    // llama.cpp's check of all 256 sequence ids (see EngineParams::n_tree_max). Otherwise one
    // unified cell pool (the cost probe times its passes on the slot's own sequence).
    impl->kv_unified     = p.n_parallel > 1 || p.n_tree_max > 1;
    const uint32_t n_seq = impl->kv_unified ? static_cast<uint32_t>(p.n_parallel * p.n_tree_max) : 1;
    if (n_seq > llama_max_parallel_sequences())
        return invalid_arg("n_parallel * n_tree_max exceeds llama.cpp's sequence limit", "n_parallel");
    // Each slot owns n_ctx_slot cells plus room for the extra cells of a draft tree.
    const uint32_t headroom = p.n_tree_max > 1 ? 64 : 0;
    const uint32_t n_ctx    = static_cast<uint32_t>(p.n_parallel) * (impl->n_ctx_slot + headroom) + 16;
    // llama.cpp reserves an output row per sequence and aborts when they exceed its batch
    if (static_cast<uint32_t>(p.n_batch) < n_seq)
        return invalid_arg("n_batch must be >= n_parallel * n_tree_max = " + std::to_string(n_seq) +
                               " (llama.cpp keeps an output per KV sequence)", "n_batch");
    // Read before the pool exists: its workers are threads of this process.
    const int n_threads = p.n_threads;
    impl->thread_choice = ThreadChoice(n_threads, cpu_cores_free(n_threads), [n_threads] { return cpu_cores_free_now(n_threads); });
    // One persistent pool for both contexts (the engine thread uses them in turn): no thread is
    // created per pass, and no idle pool of the other context spins beside the working one.
    impl->threadpool = cpu_threadpool_new(p.n_threads, &impl->pool_workers);
    // The draft model and its context are made on a second thread while this one makes the
    // target's context (~15 ms on x100M): a fresh process's first token does not wait the ~3 ms
    // they take. They are independent llama.cpp objects, and the CPU backend is registered by
    // the target's load. The threadpool is attached below (cpu_threads_apply).
    struct DraftBuilt {
        Result<std::shared_ptr<Model>> model = Status(ErrorCode::LOAD_FAILED, "not loaded");
        llama_context *                ctx   = nullptr;
        bool                           flash = false;
    };
    std::future<DraftBuilt> draft_built;
    if (has_draft) {
        const bool unified = impl->kv_unified;
        draft_built = std::async(std::launch::async, [&p, n_ctx, n_seq, unified] {
            DraftBuilt d;
            d.model = Model::load(p.draft);
            if (!d.model) return d;
            d.flash = flash_attn_choose(*d.model.value(), p, p.draft_flash_attn, n_ctx, nullptr);
            d.ctx   = context_new(*d.model.value(), p, n_ctx, n_seq, unified, d.flash, nullptr);
            return d;
        });
    }
    impl->info.flash_attn = flash_attn_choose(*impl->target, p, p.flash_attn, n_ctx, impl->threadpool);
    impl->ctx = context_new(*impl->target, p, n_ctx, n_seq, impl->kv_unified, impl->info.flash_attn, impl->threadpool);
    if (has_draft) {
        DraftBuilt d = draft_built.get();
        if (!d.model) return d.model.status();
        impl->draft                 = d.model.value();
        impl->dft_ctx               = d.ctx;  // freed with impl on any error below
        impl->info.draft_flash_attn = d.flash;
        if (p.on_progress && !p.on_progress(1.0f, "draft")) return Status(ErrorCode::CANCELLED, "loading was aborted");
    }
    if (!impl->ctx) return Status(ErrorCode::LOAD_FAILED, "failed to create the target context");
    if (impl->draft) {
        if (Status st = vocab_check_compatible(*impl->target, *impl->draft); !st) return st;
        if (!impl->dft_ctx) return Status(ErrorCode::LOAD_FAILED, "failed to create the draft context");
    }
    cpu_threads_apply(impl->ctx, impl->dft_ctx, impl->threadpool, impl->thread_choice.threads(), impl->thread_choice.threads());
    // llama.cpp caps a context's batch at its size: drafts are sized to what it really takes
    p.n_batch = std::min<int32_t>(p.n_batch, static_cast<int32_t>(llama_n_batch(impl->ctx)));
    if (impl->dft_ctx) p.n_batch = std::min<int32_t>(p.n_batch, static_cast<int32_t>(llama_n_batch(impl->dft_ctx)));
    impl->kv_tree_headroom = static_cast<int32_t>(headroom);
    impl->n_ctx_cells = n_ctx;  // for the contexts recreated after an idle sleep
    impl->n_seq_cells = n_seq;
    impl->dyn_ngrams.set_max_bytes(static_cast<size_t>(p.ngram_cache_max_mb) << 20);
    impl->suffix_store.set_max_bytes(static_cast<size_t>(p.suffix_cache_max_mb) << 20);

    auto & info        = impl->info;
    info.model_path    = p.target.path;
    info.model_desc    = impl->target->desc();
    info.draft_path    = p.draft.path;
    info.n_vocab       = impl->target->n_vocab();
    info.n_ctx_slot    = impl->n_ctx_slot;
    info.n_ctx_train   = impl->target->n_ctx_train();
    info.n_parallel    = p.n_parallel;
    info.n_threads     = p.n_threads;
    info.bos           = llama_vocab_bos(impl->target->vocab());
    info.eos           = llama_vocab_eos(impl->target->vocab());
    info.add_bos       = llama_vocab_get_add_bos(impl->target->vocab());
    const char * tmpl      = llama_model_chat_template(impl->target->get(), nullptr);
    info.has_chat_template = tmpl != nullptr;
    info.chat_template     = tmpl ? tmpl : "";

    impl->slots.resize(static_cast<size_t>(p.n_parallel));
    for (int32_t i = 0; i < p.n_parallel; ++i) {
        impl->slots[i].id  = i;
        impl->slots[i].seq = i * p.n_tree_max;
    }
    if (impl->draft) impl->default_spec.types = {SpecType::DRAFT};
    SPR_LOG_INFO("engine ready: %s, %d slot(s) x %d ctx, %d thread(s)%s", info.model_desc.c_str(), p.n_parallel,
                 impl->n_ctx_slot, p.n_threads, impl->draft ? ", with draft model" : "");

    Impl * raw   = impl.get();
    impl->thread = std::thread([raw] { raw->run(); });
    return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
    {
        std::lock_guard<std::mutex> lock(impl_->mutex);
        impl_->stopping = true;
    }
    impl_->cv.notify_all();
    if (impl_->thread.joinable()) impl_->thread.join();
}

Engine::Impl::~Impl() {
    if (dft_ctx) llama_free(dft_ctx);
    if (ctx) llama_free(ctx);
    cpu_threadpool_free(threadpool);
}

// Callers outside the engine thread read the model under awake_lock (slot_state.cpp): it loads
// the models again after an idle sleep, and keeps the next sleep from freeing them meanwhile.
static Status not_awake() {
    return Status(ErrorCode::UNAVAILABLE, "the model could not be loaded again after an idle sleep");
}
Result<std::vector<token_id>> Engine::tokenize(const std::string & text, bool add_bos, bool parse_special) const {
    auto lk = impl_->awake_lock();
    if (!lk.owns_lock()) return not_awake();
    return tokenize_text(*impl_->target, text, add_bos, parse_special);
}
std::string Engine::detokenize(const std::vector<token_id> & t, bool special) const {
    auto lk = impl_->awake_lock();
    if (!lk.owns_lock()) return std::string();
    return detokenize_tokens(*impl_->target, t, special);
}
std::string Engine::token_piece(token_id id) const {
    auto lk = impl_->awake_lock();
    if (!lk.owns_lock()) return std::string();
    return token_to_piece(*impl_->target, id);
}
Status Engine::validate_tokens(const std::vector<token_id> & t) const {
    auto lk = impl_->awake_lock();
    if (!lk.owns_lock()) return not_awake();
    return validate_token_ids(*impl_->target, t);
}
const EngineInfo & Engine::info() const { return impl_->info; }

EngineMetrics Engine::metrics() const {
    // One lock at a time: submit() takes mutex, then metrics_mutex; taking them here in the other
    // order deadlocked a server whose metrics call met a submission (ABBA).
    EngineMetrics m;
    {
        std::lock_guard<std::mutex> lock(impl_->metrics_mutex);
        m = impl_->metrics;
    }
    std::lock_guard<std::mutex> lock(impl_->mutex);
    m.queue_len = static_cast<int32_t>(impl_->queue.size());
    return m;
}

const llama_model * Engine::target_model() const {
    auto lk = impl_->awake_lock();
    return lk.owns_lock() ? impl_->target->get() : nullptr;
}

CostCurve Engine::cost_curve() const {
    return impl_->costs.snapshot();
}

SpecParams Engine::default_spec() const {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    return impl_->default_spec;
}
void Engine::set_default_spec(const SpecParams & spec) {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->default_spec = spec;
}

int64_t Engine::submit(CompletionRequest request, CompletionSink sink) {
    const int64_t id = impl_->next_id++;
    {
        std::lock_guard<std::mutex> lock(impl_->mutex);
        if (impl_->stopping) {
            if (sink.on_done) sink.on_done(Status(ErrorCode::UNAVAILABLE, "engine is shutting down"));
            return id;
        }
        if (Status st = health(); !st) {  // a lost RPC worker: fail fast until it is back
            if (sink.on_done) sink.on_done(st);
            return id;
        }
        // requests beyond the free slots wait in the queue, up to n_queue_max of them
        int32_t n_free;
        {
            std::lock_guard<std::mutex> ml(impl_->metrics_mutex);
            n_free = impl_->params.n_parallel - impl_->metrics.slots_busy;
        }
        if (static_cast<int32_t>(impl_->queue.size()) >= impl_->params.n_queue_max + std::max(0, n_free)) {
            if (sink.on_done) sink.on_done(Status(ErrorCode::OVERLOADED, "request queue is full"));
            return id;
        }
        impl_->queue.push_back({id, std::move(request), std::move(sink)});
    }
    impl_->touch();
    impl_->cv.notify_all();
    return id;
}

void Engine::cancel(int64_t request_id) {
    {
        std::lock_guard<std::mutex> lock(impl_->mutex);
        impl_->cancels.push_back(request_id);
    }
    impl_->cv.notify_all();
}

Status Engine::save_ngram_cache(const std::string & path) {
    std::lock_guard<std::mutex> lock(impl_->ngram_mutex);
    return impl_->dyn_ngrams.save(path);
}

Status Engine::load_ngram_cache(const std::string & path, bool dynamic) {
    auto c = NgramCache::load(path);
    if (!c) return c.status();
    std::lock_guard<std::mutex> lock(impl_->ngram_mutex);
    if (dynamic) {
        if (impl_->params.ngram_cache_max_mb > 0) impl_->dyn_ngrams.merge(c.value());
    }
    else { impl_->static_ngrams = std::move(c.value()); impl_->has_static_ngrams = true; }
    return Status::ok();
}

Result<CompletionResult> Engine::complete(CompletionRequest request,
                                          std::function<void(const CompletionChunk &)> on_chunk) {
    std::promise<Result<CompletionResult>> done;
    auto fut = done.get_future();
    CompletionSink sink;
    sink.on_chunk = std::move(on_chunk);
    sink.on_done  = [&done](Result<CompletionResult> r) { done.set_value(std::move(r)); };
    submit(std::move(request), std::move(sink));
    return fut.get();
}

}  // namespace specrpc
