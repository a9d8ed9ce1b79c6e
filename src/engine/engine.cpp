// Engine lifecycle, the task queue and the engine thread's loop; request admission (slot choice,
// prompt-prefix reuse, prompt evaluation) and completion. The speculative round is in step.cpp.
#include <algorithm>
#include <cmath>
#include <future>

#include "common/log.h"
#include "engine/backend.h"
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
    }
    return "none";
}

bool spec_type_from_name(const std::string & s, SpecType * out) {
    static const std::pair<const char *, SpecType> names[] = {
        {"none", SpecType::NONE},     {"draft", SpecType::DRAFT},   {"draft-simple", SpecType::DRAFT},
        {"tree", SpecType::DRAFT},    {"ngram", SpecType::NGRAM},   {"ngram-cache", SpecType::NGRAM},
        {"lookup", SpecType::LOOKUP}, {"prompt-lookup", SpecType::LOOKUP}, {"synth", SpecType::SYNTH}};
    for (const auto & [n, t] : names)
        if (s == n) { *out = t; return true; }
    return false;
}

static llama_context * make_context(const Model & m, const EngineParams & p, uint32_t n_ctx, uint32_t n_seq,
                                     bool unified) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = n_ctx;
    cp.n_batch         = static_cast<uint32_t>(p.n_batch);
    cp.n_ubatch        = static_cast<uint32_t>(p.n_batch);
    cp.n_seq_max       = n_seq;
    cp.n_threads       = p.n_threads;
    cp.n_threads_batch = p.n_threads;
    cp.kv_unified      = unified;  // tree branches share the prefix cells of their slot
    cp.no_perf         = true;
    if (p.kv_f32) { cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32; }
    return llama_init_from_model(m.get(), cp);
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineParams & params_in) {
    auto impl    = std::make_unique<Impl>();
    auto & p     = impl->params;
    p            = params_in;
    if (p.n_threads <= 0) p.n_threads = std::max(1u, std::thread::hardware_concurrency());
    if (p.n_parallel < 1 || p.n_parallel > 64) return invalid_arg("n_parallel must be in [1, 64]", "n_parallel");
    if (p.n_batch < 8) return invalid_arg("n_batch must be >= 8", "n_batch");
    if (p.n_ctx < 0) return invalid_arg("n_ctx must be >= 0", "n_ctx");
    if (p.n_tree_max < 1 || p.n_tree_max > 16) return invalid_arg("n_tree_max must be in [1, 16]", "n_tree_max");
    if (p.n_queue_max < 0) return invalid_arg("n_queue_max must be >= 0", "n_queue_max");

    const bool has_draft = !p.draft.path.empty();
    auto progress = [&](float base, float span, const char * what) {
        return [&p, base, span, what](float x) {
            return p.on_progress ? p.on_progress(base + span * x, what) : true;
        };
    };
    auto tgt = Model::load(p.target, progress(0.0f, has_draft ? 0.8f : 1.0f, "target"));
    if (!tgt) return tgt.status();
    impl->target = tgt.value();
    if (has_draft) {
        auto dft = Model::load(p.draft, progress(0.8f, 0.2f, "draft"));
        if (!dft) return dft.status();
        impl->draft = dft.value();
        if (Status st = vocab_check_compatible(*impl->target, *impl->draft); !st) return st;
    }

    impl->n_ctx_slot     = p.n_ctx > 0 ? p.n_ctx : impl->target->n_ctx_train();
    impl->n_seq_per_slot = p.n_tree_max;
    // One slot with chains needs a single sequence: a non-unified cache, which spares every pass
    // llama.cpp's check of all 256 sequence ids (see EngineParams::n_tree_max). Otherwise one
    // unified cell pool, plus a scratch sequence for the cost probe.
    impl->kv_unified     = p.n_parallel > 1 || p.n_tree_max > 1;
    impl->scratch_seq    = impl->kv_unified ? p.n_parallel * p.n_tree_max : 0;
    const uint32_t n_seq = impl->kv_unified ? static_cast<uint32_t>(impl->scratch_seq + 1) : 1;
    if (n_seq > llama_max_parallel_sequences())
        return invalid_arg("n_parallel * n_tree_max exceeds llama.cpp's sequence limit", "n_parallel");
    // Each slot owns n_ctx_slot cells plus room for the extra cells of a draft tree.
    const uint32_t headroom = p.n_tree_max > 1 ? 64 : 0;
    const uint32_t n_ctx    = static_cast<uint32_t>(p.n_parallel) * (impl->n_ctx_slot + headroom) + 16;
    impl->ctx = make_context(*impl->target, p, n_ctx, n_seq, impl->kv_unified);
    if (!impl->ctx) return Status(ErrorCode::LOAD_FAILED, "failed to create the target context");
    if (impl->draft) {
        impl->dft_ctx = make_context(*impl->draft, p, n_ctx, n_seq, impl->kv_unified);
        if (!impl->dft_ctx) return Status(ErrorCode::LOAD_FAILED, "failed to create the draft context");
    }
    // One persistent pool for both contexts (the engine thread uses them in turn): no thread is
    // created per pass, and no idle pool of the other context spins beside the working one.
    impl->threadpool = cpu_threadpool_new(p.n_threads);
    if (impl->threadpool) {
        llama_attach_threadpool(impl->ctx, impl->threadpool, impl->threadpool);
        if (impl->dft_ctx) llama_attach_threadpool(impl->dft_ctx, impl->threadpool, impl->threadpool);
    }

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
    if (impl_->dft_ctx) llama_free(impl_->dft_ctx);
    if (impl_->ctx) llama_free(impl_->ctx);
    cpu_threadpool_free(impl_->threadpool);
}

Result<std::vector<token_id>> Engine::tokenize(const std::string & text, bool add_bos, bool parse_special) const {
    return tokenize_text(*impl_->target, text, add_bos, parse_special);
}
std::string Engine::detokenize(const std::vector<token_id> & t, bool special) const {
    return detokenize_tokens(*impl_->target, t, special);
}
std::string Engine::token_piece(token_id id) const { return token_to_piece(*impl_->target, id); }
Status Engine::validate_tokens(const std::vector<token_id> & t) const { return validate_token_ids(*impl_->target, t); }
const EngineInfo & Engine::info() const { return impl_->info; }

EngineMetrics Engine::metrics() const {
    std::lock_guard<std::mutex> lock(impl_->metrics_mutex);
    EngineMetrics m = impl_->metrics;
    std::lock_guard<std::mutex> lock2(impl_->mutex);
    m.queue_len = static_cast<int32_t>(impl_->queue.size());
    return m;
}

CostCurve Engine::cost_curve() const {
    std::lock_guard<std::mutex> lock(impl_->metrics_mutex);
    return impl_->cost_snapshot;
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
    if (dynamic) impl_->dyn_ngrams.merge(c.value());
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

// ---------------------------------------------------------------------------------------------
// Engine thread

void Engine::Impl::run() {
    for (;;) {
        std::vector<PendingRequest> admitted;
        {
            std::unique_lock<std::mutex> lock(mutex);
            auto busy = [&] { return std::any_of(slots.begin(), slots.end(), [](const Slot & s) { return s.active; }); };
            auto work = [&] { return stopping || !queue.empty() || !cancels.empty() || busy(); };
            if (!work() && threadpool && !pool_paused) {
                cpu_threadpool_pause(threadpool);  // idle: no worker polls beside other processes' work
                pool_paused = true;
            }
            cv.wait(lock, work);
            if (stopping) {
                lock.unlock();
                for (auto & s : slots)
                    if (s.active) finish(s, StopType::CANCELLED);
                std::lock_guard<std::mutex> relock(mutex);
                for (auto & pr : queue)
                    if (pr.sink.on_done) pr.sink.on_done(Status(ErrorCode::CANCELLED, "engine shut down"));
                queue.clear();
                return;
            }
            for (int64_t id : cancels) {
                for (auto & s : slots)
                    if (s.active && s.req_id == id) s.cancelled = true;
                auto it = std::find_if(queue.begin(), queue.end(), [id](const PendingRequest & r) { return r.id == id; });
                if (it != queue.end()) {
                    CompletionResult r;
                    r.stop_type = StopType::CANCELLED;
                    if (it->sink.on_done) it->sink.on_done(std::move(r));
                    queue.erase(it);
                }
            }
            cancels.clear();
            int32_t n_free = static_cast<int32_t>(std::count_if(slots.begin(), slots.end(), [](const Slot & s) { return !s.active; }));
            while (n_free-- > 0 && !queue.empty()) {
                admitted.push_back(std::move(queue.front()));
                queue.pop_front();
            }
        }
        if (!admitted.empty()) pool_paused = false;  // prompts are evaluated: the pool resumes
        for (auto & pr : admitted) admit(std::move(pr));
        for (auto & s : slots)
            if (s.active && s.cancelled) finish(s, StopType::CANCELLED);
        if (std::any_of(slots.begin(), slots.end(), [](const Slot & s) { return s.active; })) {
            pool_paused = false;  // the next graph resumes the pool
            step();
        }
        {
            std::lock_guard<std::mutex> lock(metrics_mutex);
            metrics.slots.resize(slots.size());
            metrics.slots_busy = 0;
            for (size_t i = 0; i < slots.size(); ++i) {
                const Slot & s = slots[i];
                metrics.slots[i] = {s.id, s.active, s.active ? s.req_id : -1, static_cast<int32_t>(s.cache.size()),
                                    static_cast<int32_t>(s.output.size())};
                metrics.slots_busy += s.active;
            }
        }
    }
}

// The free slot whose cached tokens share the longest prefix with `prompt` (prompt-cache reuse).
Slot * Engine::Impl::pick_slot(const std::vector<token_id> & prompt) {
    Slot * best = nullptr;
    size_t best_len = 0;
    for (auto & s : slots) {
        if (s.active) continue;
        size_t n = 0;
        while (n < s.cache.size() && n < prompt.size() && s.cache[n] == prompt[n]) ++n;
        if (!best || n > best_len) { best = &s; best_len = n; }
    }
    return best;
}

static Status check_request(const CompletionRequest & r, const EngineInfo & info, bool has_draft) {
    if (r.prompt.empty()) return invalid_arg("prompt is empty", "prompt");
    for (size_t i = 0; i < r.prompt.size(); ++i)
        if (r.prompt[i] < 0 || r.prompt[i] >= info.n_vocab)
            return invalid_arg("prompt token id " + std::to_string(r.prompt[i]) + " at index " + std::to_string(i) +
                               " is out of range [0, " + std::to_string(info.n_vocab) + ")", "prompt");
    if (r.n_predict < -1) return invalid_arg("n_predict must be >= -1", "n_predict");
    if (r.n_keep < -1) return invalid_arg("n_keep must be >= -1", "n_keep");
    const auto & sp = r.spec;
    if (sp.n_max < 0 || sp.n_max > 64) return invalid_arg("speculative.n_max must be in [0, 64]", "speculative.n_max");
    if (sp.n_min < 0 || sp.n_min > sp.n_max) return invalid_arg("speculative.n_min must be in [0, n_max]", "speculative.n_min");
    if (!(sp.p_min >= 0 && sp.p_min <= 1)) return invalid_arg("speculative.p_min must be in [0, 1]", "speculative.p_min");
    if (sp.ngram_min < 1 || sp.ngram_max < sp.ngram_min || sp.ngram_max > 4)
        return invalid_arg("speculative n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= 4", "speculative.ngram_max");
    for (float x : sp.synth_rates)
        if (!(x >= 0 && x <= 1)) return invalid_arg("speculative.synth_rates must be in [0, 1]", "speculative.synth_rates");
    for (SpecType t : sp.types)
        if (t == SpecType::DRAFT && !has_draft)
            return invalid_arg("speculative type 'draft' needs a draft model (-md)", "speculative.type");
    return Status::ok();
}

void Engine::Impl::admit(PendingRequest && pr) {
    if (Status st = check_request(pr.req, info, draft != nullptr); !st) {
        if (pr.sink.on_done) pr.sink.on_done(st);
        return;
    }
    auto & req = pr.req;
    bool truncated = false;
    if (static_cast<int32_t>(req.prompt.size()) >= n_ctx_slot) {
        if (!req.truncate_prompt) {
            if (pr.sink.on_done)
                pr.sink.on_done(Status(ErrorCode::CONTEXT_EXCEEDED,
                                       "the prompt has " + std::to_string(req.prompt.size()) +
                                           " tokens, more than the context per slot allows (" +
                                           std::to_string(n_ctx_slot) + ")", "prompt"));
            return;
        }
        // keep n_keep head tokens and the most recent tail, leaving half the context for output
        int32_t n_keep = req.n_keep < 0 ? 0 : std::min(req.n_keep, n_ctx_slot / 2);
        int32_t n_tail = n_ctx_slot / 2 - n_keep;
        std::vector<token_id> p(req.prompt.begin(), req.prompt.begin() + n_keep);
        p.insert(p.end(), req.prompt.end() - n_tail, req.prompt.end());
        req.prompt = std::move(p);
        truncated  = true;
    }
    auto smp = Sampler::create(*target, req.sampling);
    if (!smp) { if (pr.sink.on_done) pr.sink.on_done(smp.status()); return; }
    Slot * sp = pick_slot(req.prompt);
    Slot & s  = *sp;
    s.active = true; s.cancelled = false; s.req_id = pr.id;
    s.req  = std::move(req);
    s.sink = std::move(pr.sink);
    s.sampler = std::move(smp.value());
    s.dft_sampler.reset();
    if (draft && !s.sampler->mirostat()) {
        SamplingParams dp = s.req.sampling;
        dp.seed = s.sampler->params().seed + 1;  // an independent stream for the draft's own samples
        auto d = Sampler::create(*draft, dp);
        if (d) s.dft_sampler = std::move(d.value());
    }
    s.text = std::make_unique<TextStream>(s.req.stop);
    s.result = CompletionResult{};
    s.result.truncated = truncated;
    s.result.slot_id = s.id;
    s.output.clear();
    s.shadow.clear();
    s.shadow_matched = 0;
    s.all      = s.req.prompt;
    s.stats    = SpecStats{};
    s.n_passes = 0;
    s.t_start = Clock::now();
    s.spec_on = !s.req.spec.types.empty() && !s.sampler->mirostat() && s.req.spec.n_max > 0;
    if (s.spec_on) {
        if (s.req.spec.n_parallel > n_seq_per_slot)
            s.result.warnings.push_back("draft tree limited to " + std::to_string(n_seq_per_slot) +
                                        " branch(es): the engine's n_tree_max (--tree-max)");
        if (!cost_measured) measure_costs(s);
        DraftLengthOptions o;
        o.n_min    = s.req.spec.n_min;
        o.n_max    = s.req.spec.n_max;
        o.adaptive = s.req.spec.adaptive;
        s.free_drafters = std::find(s.req.spec.types.begin(), s.req.spec.types.end(), SpecType::DRAFT) ==
                          s.req.spec.types.end();
        if (s.free_drafters) o.probe_interval = 0;  // shadow drafts measure α for free instead
        auto it = alpha_learned.find(s.req.spec.types.front());
        if (it != alpha_learned.end()) o.alpha_prior = it->second;
        s.policy   = std::make_unique<DraftLengthPolicy>(slot_cost(s), o);
    } else {
        s.policy.reset();
    }
    s.ctx_ngrams = NgramCache(s.req.spec.ngram_min, s.req.spec.ngram_max);
    if (Status st = eval_prompt(s); !st) fail(s, st);
}

// Evaluates the prompt except its last token (which becomes `pending`), reusing the slot's KV
// prefix when it matches.
Status Engine::Impl::eval_prompt(Slot & s) {
    const auto & prompt = s.req.prompt;
    auto * mem = llama_get_memory(ctx);
    size_t n_reuse = 0;
    if (s.req.cache_prompt)
        while (n_reuse < s.cache.size() && n_reuse + 1 < prompt.size() && s.cache[n_reuse] == prompt[n_reuse]) ++n_reuse;
    llama_memory_seq_rm(mem, s.seq, static_cast<llama_pos>(n_reuse), -1);
    s.cache.resize(n_reuse);
    if (dft_ctx) {  // the draft context catches up lazily (draft_sync); drop what no longer matches
        size_t nd = 0;
        while (nd < s.dft_cache.size() && nd + 1 < prompt.size() && s.dft_cache[nd] == prompt[nd]) ++nd;
        llama_memory_seq_rm(llama_get_memory(dft_ctx), s.seq, static_cast<llama_pos>(nd), -1);
        s.dft_cache.resize(nd);
    }
    s.result.tokens_cached    = static_cast<int32_t>(n_reuse);
    s.result.tokens_evaluated = static_cast<int32_t>(prompt.size());
    s.n_prompt = static_cast<int32_t>(prompt.size());

    auto t0 = Clock::now();
    llama_batch batch = llama_batch_init(params.n_batch, 0, 1);
    Status st;
    for (size_t i = n_reuse; i + 1 < prompt.size() && st.is_ok();) {
        batch.n_tokens = 0;
        for (; i + 1 < prompt.size() && batch.n_tokens < params.n_batch; ++i) {
            int32_t k = batch.n_tokens++;
            batch.token[k] = prompt[i]; batch.pos[k] = static_cast<llama_pos>(i);
            batch.n_seq_id[k] = 1; batch.seq_id[k][0] = s.seq; batch.logits[k] = 0;
        }
        st = decode_or_error(ctx, batch, "prompt");
        if (st) s.cache.insert(s.cache.end(), prompt.begin() + (s.cache.size()), prompt.begin() + static_cast<long>(i));
    }
    llama_batch_free(batch);
    if (!st) return st;
    s.pending = prompt.back();
    s.result.timings.prompt_n  = static_cast<int32_t>(prompt.size() - n_reuse);
    s.result.timings.prompt_ms = ms_since(t0);
    s.t_gen_start = Clock::now();
    if (s.spec_on) s.ctx_ngrams.update(prompt, prompt.size());
    s.all = prompt;
    return Status::ok();
}

// The cost model of this slot's drafter chain: model drafting costs c per token, n-gram and
// lookup drafting is free next to a target pass.
CostModel Engine::Impl::slot_cost(const Slot & s) const {
    CostModel cm = cost;
    if (s.req.spec.types.empty() || s.req.spec.types.front() != SpecType::DRAFT) cm.c = 0;
    return cm;
}

Status Engine::Impl::decode_or_error(llama_context * c, llama_batch & b, const char * what) {
    int32_t rc = llama_decode(c, b);
    if (rc == 0) return Status::ok();
    return Status(ErrorCode::INTERNAL, std::string("llama_decode failed during ") + what + " (rc=" + std::to_string(rc) +
                                           (rc == 1 ? ": no KV cache slot" : "") + ")");
}

void Engine::Impl::finish(Slot & s, StopType stop) {
    std::string rest = s.text->flush();
    if (!s.text->stopped() && !rest.empty() && s.req.stream && s.sink.on_chunk) {
        CompletionChunk c;
        c.content = rest;
        s.sink.on_chunk(c);
    }
    auto & r         = s.result;
    r.content        = s.text->text();
    r.stop_type      = s.text->stopped() ? StopType::WORD : stop;
    r.stopping_word  = s.text->stopped() ? s.text->stop_word() : "";
    r.tokens_predicted = static_cast<int32_t>(s.output.size());
    r.timings.predicted_n  = r.tokens_predicted;
    r.timings.predicted_ms = ms_since(s.t_gen_start);
    // The next request's prior: this one's measured acceptance (accepted ÷ positions at risk),
    // not the policy's moving average, which still remembers its own prior when the request
    // was mostly off (a low prior would then teach itself).
    if (s.policy && s.policy->n_at_risk() >= 8) {
        const double meas = double(s.policy->n_accepted()) / double(s.policy->n_at_risk());
        double & a = alpha_learned.try_emplace(s.req.spec.types.front(), meas).first->second;
        a = 0.5 * a + 0.5 * meas;
    }
    const SpecStats & st = s.stats;
    if (Status inv = st.check_invariants(); !inv) SPR_LOG_ERROR("speculation statistics: %s", inv.message().c_str());
    r.spec.draft_n          = st.n_drafted;
    r.spec.draft_n_accepted = st.n_accepted;
    r.spec.draft_n_steps    = st.n_steps;
    r.spec.n_steps          = s.n_passes;
    r.spec.drafted_at_pos   = st.drafted_at_pos;
    r.spec.accepted_at_pos  = st.accepted_at_pos;
    r.spec.accepted_at_pos.resize(std::max(st.accepted_at_pos.size(), st.drafted_at_pos.size()), 0);
    r.spec.gamma_hist       = st.gamma_hist;
    r.spec.n_off_rounds     = st.n_off_rounds;
    r.spec.t_draft_ms       = st.t_draft_ms;
    r.spec.t_verify_ms      = st.t_verify_ms;
    r.spec.t_sample_ms      = st.t_sample_ms;
    // Every finished request feeds the dynamic n-gram cache (lookup decoding across requests).
    {
        std::lock_guard<std::mutex> lock(ngram_mutex);
        dyn_ngrams.update(s.all, s.all.size());
    }
    // keep the pending token's place consistent: the KV holds `cache`; pending is dropped
    {
        std::lock_guard<std::mutex> lock(metrics_mutex);
        metrics.requests_done++;
        if (stop == StopType::CANCELLED) metrics.requests_cancelled++;
        metrics.tokens_predicted += r.tokens_predicted;
        metrics.tokens_evaluated += r.timings.prompt_n;
        metrics.t_predicted_ms   += r.timings.predicted_ms;
        metrics.t_prompt_ms      += r.timings.prompt_ms;
        metrics.draft_n          += r.spec.draft_n;
        metrics.draft_n_accepted += r.spec.draft_n_accepted;
        metrics.draft_n_steps    += r.spec.draft_n_steps;
    }
    s.active = false;
    auto sink = std::move(s.sink);
    s.sink = {};
    if (sink.on_done) sink.on_done(std::move(r));
}

void Engine::Impl::fail(Slot & s, Status st) {
    SPR_LOG_ERROR("request %lld failed: %s", static_cast<long long>(s.req_id), st.to_string().c_str());
    llama_memory_seq_rm(llama_get_memory(ctx), s.seq, -1, -1);
    s.cache.clear();
    if (dft_ctx) { llama_memory_seq_rm(llama_get_memory(dft_ctx), s.seq, -1, -1); s.dft_cache.clear(); }
    {
        std::lock_guard<std::mutex> lock(metrics_mutex);
        metrics.requests_failed++;
    }
    s.active = false;
    auto sink = std::move(s.sink);
    s.sink = {};
    if (sink.on_done) sink.on_done(st);
}

}  // namespace specrpc
