// The engine thread: its loop over the task queue, request admission (slot choice, prompt-prefix
// reuse, prompt evaluation) and completion. The speculative round is in step.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "common/log.h"
#include "engine/backend.h"
#include "engine/cost_cache.h"
#include "engine/engine_impl.h"
#include "engine/test_hooks.h"
#include "engine/tokenizer.h"
#include "llama.h"
#include "sampling/grammar_check.h"
#include "speculative/prompt_lookup.h"
#include "engine/verifier_choice.h"

namespace specrpc {

void Engine::Impl::run() {
    touch();  // the idle time (sleep_idle_seconds) counts from the start
    for (;;) {
        std::vector<PendingRequest> admitted;
        std::deque<std::shared_ptr<SlotAction>> actions;
        {
            std::unique_lock<std::mutex> lock(mutex);
            auto busy = [&] { return std::any_of(slots.begin(), slots.end(), [](const Slot & s) { return s.active; }); };
            auto work = [&] { return stopping || !queue.empty() || !cancels.empty() || !slot_actions.empty() || busy(); };
            if (!work() && threadpool && !pool_paused) {
                cpu_threadpool_pause(threadpool);  // idle: no worker polls beside other processes' work
                pool_paused = true;
            }
            if (params.sleep_idle_seconds > 0 && !work()) {
                if (!sleeping.load()) {
                    // idle: wake up when the idle time is over, and sleep (slot_state.cpp)
                    const auto idle = std::chrono::seconds(params.sleep_idle_seconds);
                    const Clock::time_point last{Clock::duration(last_use_ns.load())};
                    if (!cv.wait_until(lock, last + idle + std::chrono::milliseconds(10), work)) {
                        lock.unlock();
                        sleep_if_idle();
                        continue;
                    }
                } else {
                    // asleep: until work comes, or a caller (tokenize) wakes the models, which
                    // starts the idle time again
                    cv.wait(lock, [&] { return work() || !sleeping.load(); });
                    if (!work()) continue;
                }
            }
            // over RPC, wake every second for rpc_watch: a worker lost while idle, or back
            if (!params.target.rpc_servers.empty()) cv.wait_for(lock, std::chrono::seconds(1), work);
            else cv.wait(lock, work);
            if (stopping) {
                lock.unlock();
                for (auto & s : slots)
                    if (s.active) finish(s, StopType::CANCELLED);
                std::lock_guard<std::mutex> relock(mutex);
                for (auto & pr : queue)
                    if (pr.sink.on_done) pr.sink.on_done(Status(ErrorCode::CANCELLED, "engine shut down"));
                queue.clear();
                for (auto & a : slot_actions) a->done.set_value(Status(ErrorCode::UNAVAILABLE, "engine shut down"));
                slot_actions.clear();
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
            actions.swap(slot_actions);
            // A request for a given slot (id_slot) waits until that slot is idle; the others take any
            // idle slot. Pinned requests are admitted first, so the others' choice leaves theirs free.
            std::vector<bool> taken(slots.size());
            int32_t n_free = 0;
            for (size_t i = 0; i < slots.size(); ++i) n_free += !(taken[i] = slots[i].active);
            std::vector<PendingRequest> any;
            for (auto it = queue.begin(); it != queue.end() && n_free > static_cast<int32_t>(any.size());) {
                const int32_t id = it->req.id_slot;
                const bool pinned = id >= 0 && id < static_cast<int32_t>(slots.size());
                if (pinned && taken[static_cast<size_t>(id)]) { ++it; continue; }
                if (pinned) { taken[static_cast<size_t>(id)] = true; --n_free; admitted.push_back(std::move(*it)); }
                else any.push_back(std::move(*it));
                it = queue.erase(it);
            }
            for (auto & pr : any) admitted.push_back(std::move(pr));
        }
        touch();
        if ((!admitted.empty() || !actions.empty()) && sleeping.load()) {
            std::unique_lock<std::shared_mutex> ml(model_mu);
            Status st = sleeping.load() ? wake_locked() : Status::ok();
            if (!st) {
                SPR_LOG_ERROR("waking up: %s", st.to_string().c_str());
                for (auto & pr : admitted)
                    if (pr.sink.on_done) pr.sink.on_done(st);
                for (auto & a : actions) a->done.set_value(st);
                continue;
            }
        }
        for (auto & a : actions) a->done.set_value(slot_action(*a));
        if (!admitted.empty()) pool_paused = false;  // prompts are evaluated: the pool resumes
        for (auto & pr : admitted) {
            if (degraded.load()) {  // fail fast: the target's weights are gone with its worker
                if (pr.sink.on_done) pr.sink.on_done(rpc_status());
                continue;
            }
            admit(std::move(pr));
        }
        for (auto & s : slots)
            if (s.active && s.cancelled) finish(s, StopType::CANCELLED);
        if (std::any_of(slots.begin(), slots.end(), [](const Slot & s) { return s.active; })) {
            pool_paused = false;  // the next graph resumes the pool
            step();
        }
        if (!params.target.rpc_servers.empty()) rpc_watch();
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
    if (r.id_slot < -1 || r.id_slot >= info.n_parallel)
        return invalid_arg("id_slot " + std::to_string(r.id_slot) + " does not exist (slots 0.." +
                               std::to_string(info.n_parallel - 1) + ", -1 = any)", "id_slot");
    if (r.n_keep < -1) return invalid_arg("n_keep must be >= -1", "n_keep");
    // before llama.cpp's recursive parser sees it (on this thread): every entry point passes here
    if (!r.sampling.grammar.empty())
        if (Status st = grammar_check(r.sampling.grammar); !st) return st;
    // parameters are named by their C++ path in CompletionRequest: the service checks its JSON first
    const auto & sp = r.spec;
    if (sp.n_max < 0 || sp.n_max > SpecParams::kMaxDraft)
        return invalid_arg("spec.n_max must be in [0, " + std::to_string(SpecParams::kMaxDraft) + "]", "spec.n_max");
    if (sp.n_min < 0 || sp.n_min > sp.n_max) return invalid_arg("spec.n_min must be in [0, n_max]", "spec.n_min");
    if (!(sp.p_min <= 1)) return invalid_arg("spec.p_min must be in [0, 1], or < 0 for the default", "spec.p_min");
    if (sp.ngram_min < 1 || sp.ngram_max < sp.ngram_min || sp.ngram_max > 4)
        return invalid_arg("spec n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= 4", "spec.ngram_max");
    for (float x : sp.synth_rates)
        if (!(x >= 0 && x <= 1)) return invalid_arg("spec.synth_rates must be in [0, 1]", "spec.synth_rates");
    for (SpecType t : sp.types)
        if (t == SpecType::DRAFT && !has_draft)
            return invalid_arg("spec type DRAFT needs a draft model (EngineParams::draft)", "spec.types");
    return Status::ok();
}

// The key of the learned acceptance prior: the whole chain of drafters and the regime its drafts
// are verified in (0 greedy, 1 rejection sampling of sampled drafts, 2 one-hot at T > 0, 3 coupled
// draws: a seeded request, which accepts less than rejection sampling on the same pair). The
// chain, not its first drafter: "lookup, then draft" and "lookup" alone share the first drafter
// but not their rounds (the chain's model drafts, its probes, its class 0), and requests of one
// taught the other's policy wrong priors when a server ran both. The learned confidence stop
// (p_min < 0 after admit) is a regime of its own (+ kStopRegime): a profile learned on drafts it
// cut is not the profile of whole drafts, nor the other way round. A prompt that ends inside a
// copy of its own earlier text (Slot::copying) is a regime of its own too (+ kCopyRegime): a
// drafter accepts far more there than on other text, and one prior for both kinds taught a fresh
// process the mean of the two, which kept a draft model off on the text it pays on.
static constexpr int kStopRegime = 4;
static constexpr int kCopyRegime = 8;
static Engine::Impl::LearnedKey prior_key(const Slot & s) {
    const int regime = s.sampler->greedy()                                  ? 0
                       : s.req.spec.sample_and_compare                      ? 2
                       : verify_coupled_sampling(s.req.sampling, s.req.spec) ? 3
                                                                             : 1;
    return {s.req.spec.types,
            regime + (s.req.spec.p_min < 0 ? kStopRegime : 0) + (s.copying ? kCopyRegime : 0)};
}

// Whether a prompt ends inside a copy of its own earlier text: its last kCopyMatch tokens or more
// occur earlier in it, as prompt lookup measures the match (as far back as the two agree).
// Told apart at admit, before any draft: the prior is what a request starts from.
static constexpr int kCopyMatch = 4;
static bool ends_in_a_copy(const std::vector<token_id> & prompt, int * match) {
    prompt_lookup_draft(prompt, PromptLookupParams{}, 1, match);
    return *match >= kCopyMatch;
}

// The learned cache's key is the two model files: acceptance depends on the models and the text,
// not on the machine or the threads. SPECRPC_LEARNED_CACHE=off keeps none (the tests' default: a
// test's outcome must not depend on which tests ran before it); so does a disabled cost cache.
void Engine::Impl::learned_read() {
    if (learned_key) return;
    const char *      env    = std::getenv("SPECRPC_LEARNED_CACHE");
    const std::string target = file_identity(params.target.path);  // "": no file to name the key by
    learned_key = (env && std::string(env) == "off") || target.empty()
                      ? std::string()
                      : "target " + target + "\ndraft " + file_identity(params.draft.path);
    const std::string dir = cost_cache_dir();
    if (learned_key->empty() || dir.empty()) return;
    if (auto l = learned_cache_load(dir, *learned_key)) {
        SPR_LOG_INFO("learned acceptance from %s (%zu chain(s) and regime(s))",
                     learned_cache_path(dir, *learned_key).c_str(), l->size());
        learned = std::move(*l);
    }
}

void Engine::Impl::learned_write() {
    if (!learned_key || learned_key->empty()) return;
    if (Status st = learned_cache_save(cost_cache_dir(), *learned_key, learned); !st)
        SPR_LOG_DEBUG("learned acceptance not kept: %s", st.message().c_str());
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
    auto smp = Sampler::create({target->vocab(), target->n_vocab(), target->n_ctx_train()}, req.sampling, n_ctx_slot);
    if (!smp) { if (pr.sink.on_done) pr.sink.on_done(smp.status()); return; }
    Slot * sp = req.id_slot >= 0 ? &slots[static_cast<size_t>(req.id_slot)] : pick_slot(req.prompt);
    Slot & s  = *sp;
    s.active = true; s.cancelled = false; s.req_id = pr.id;
    s.req  = std::move(req);
    s.sink = std::move(pr.sink);
    s.sampler = std::move(smp.value());
    s.dft_sampler.reset();
    if (draft && !s.sampler->mirostat()) {
        SamplingParams dp = s.req.sampling;
        dp.seed = s.sampler->params().seed + 1;  // an independent stream for the draft's own samples
        if (float t = test_hooks::draft_temperature.load(); t > 0 && dp.temperature > 0) dp.temperature = t;
        auto d = Sampler::create({draft->vocab(), draft->n_vocab(), draft->n_ctx_train()}, dp, n_ctx_slot);
        if (d) s.dft_sampler = std::move(d.value());
    }
    // penalties count the prompt too (llama-server); the draft's q mirrors the target's p
    s.sampler->accept_prompt(s.req.prompt);
    if (s.dft_sampler) s.dft_sampler->accept_prompt(s.req.prompt);
    s.text = std::make_unique<TextStream>(s.req.stop);
    s.result = CompletionResult{};
    s.result.truncated = truncated;
    s.result.slot_id = s.id;
    s.output.clear();
    s.drop_shadow();
    s.all      = s.req.prompt;
    s.stats    = SpecStats{};
    s.n_passes = 0;
    s.copying  = false;
    s.t_start = Clock::now();
    // p_min < 0: the learned confidence stop (DraftLengthPolicy::stop_below) for drafts that take
    // the draft's argmax, no stop for sampled ones (there it measured as often a loss as a gain)
    if (s.req.spec.p_min < 0 && !s.sampler->greedy() && !s.req.spec.sample_and_compare) s.req.spec.p_min = 0;
    s.spec_on = !s.req.spec.types.empty() && !s.sampler->mirostat() && s.req.spec.n_max > 0;
    if (s.spec_on) {
        if (s.req.spec.n_parallel > n_seq_per_slot)
            s.result.warnings.push_back("draft tree limited to " + std::to_string(n_seq_per_slot) +
                                        " branch(es): the engine's n_tree_max (--tree-max)");
        // Each tree depth is one draft decode of every slot's live branches: they must fit n_batch.
        const int32_t max_branches = std::max(1, std::min(n_seq_per_slot, params.n_batch / params.n_parallel));
        if (s.req.spec.n_parallel > max_branches) {
            if (max_branches < n_seq_per_slot)
                s.result.warnings.push_back("draft tree limited to " + std::to_string(max_branches) +
                                            " branch(es): n_batch / n_parallel");
            s.req.spec.n_parallel = max_branches;
        }
        if (!costs.started()) costs.start(*this);
        DraftLengthOptions o;
        o.n_min    = s.req.spec.n_min;
        o.n_max    = s.req.spec.n_max;
        o.adaptive = s.req.spec.adaptive;
        s.free_drafters = !chain_has(s.req.spec.types, SpecType::DRAFT);
        if (s.free_drafters) o.probe_interval = 0;  // shadow drafts measure α for free instead
        bool has_prior = false;
        int  match     = 0;
        s.copying      = ends_in_a_copy(s.req.prompt, &match);
        learned_read();
        if (auto it = learned.find(prior_key(s)); it != learned.end()) {
            has_prior = it->second.alpha.has_value();
            o.alpha_prior  = it->second.alpha.value_or(o.alpha_prior);
            o.depth_prior  = it->second.depth;
            o.long_prior   = it->second.long_run;
            o.probe_ledger = it->second.ledger;
            o.class_prior  = it->second.classes;
            o.confidence_prior = it->second.confidence;
        }
        // nothing learned yet for this drafter and regime: look (a few rounds) before deciding
        o.first_look = !has_prior && !s.free_drafters ? kFirstLook : 0;
        // a model behind a free drafter: its drafts (class 0) keep a profile of their own
        o.classes_apart = !s.free_drafters && s.req.spec.types.front() != SpecType::DRAFT;
        s.policy   = std::make_unique<DraftLengthPolicy>(slot_cost(s), o);
        const CostModel & cm = s.policy->cost_model();
        SPR_LOG_DEBUG("slot %d: speculation with prior α %.3f%s (prompt tail matched %d token(s): %s), "
                      "cost v(2) %.2f v(4) %.2f v(8) %.2f v(16) %.2f c %.3f; probes spent %.1f of %.1f units",
                      s.id, o.alpha_prior, has_prior ? " (learned)" : "", match,
                      s.copying ? "copied text" : "other text", cost_model_v(cm, 2),
                      cost_model_v(cm, 4), cost_model_v(cm, 8), cost_model_v(cm, 16), cm.c, o.probe_ledger.spent,
                      o.probe_ledger.work);
    } else {
        s.policy.reset();
    }
    s.ctx_ngrams = NgramCache(s.req.spec.ngram_min, s.req.spec.ngram_max);
    // only the NGRAM drafter reads it; fed for every speculative chain, its hash-map inserts
    // (every n-gram length at every emitted token) were work on each round for nothing
    s.feeds_ngrams = s.spec_on && chain_has(s.req.spec.types, SpecType::NGRAM);
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
    // Progress as llama-server reports it: once before, then after each batch; the last report
    // counts the final token, which the first generation pass evaluates.
    const bool progress = s.req.stream && s.req.return_progress && s.sink.on_chunk;
    auto report = [&](size_t processed) {
        CompletionChunk c;
        c.progress = PromptProgress{static_cast<int32_t>(prompt.size()), static_cast<int32_t>(n_reuse),
                                    static_cast<int32_t>(processed), processed > n_reuse ? ms_since(t0) : 0.0};
        s.sink.on_chunk(c);
    };
    if (progress) report(n_reuse);
    llama_batch batch = llama_batch_init(params.n_batch, 0, 1);
    Status st;
    for (size_t i = n_reuse; i + 1 < prompt.size() && st.is_ok();) {
        batch.n_tokens = 0;
        for (; i + 1 < prompt.size() && batch.n_tokens < n_batch_prompt; ++i) {
            int32_t k = batch.n_tokens++;
            batch.token[k] = prompt[i]; batch.pos[k] = static_cast<llama_pos>(i);
            batch.n_seq_id[k] = 1; batch.seq_id[k][0] = s.seq; batch.logits[k] = 0;
        }
        st = decode_or_error(ctx, batch, "prompt");
        if (st) s.cache.insert(s.cache.end(), prompt.begin() + (s.cache.size()), prompt.begin() + static_cast<long>(i));
        if (st && progress) report(i + 1 == prompt.size() ? prompt.size() : i);
    }
    llama_batch_free(batch);
    if (st && progress && n_reuse + 1 >= prompt.size()) report(prompt.size());  // all of it was cached
    if (n_reuse + 1 < prompt.size()) costs.break_steady_run();  // the next round is no steady-state pass
    if (!st) return st;
    s.pending = prompt.back();
    s.result.timings.prompt_n  = static_cast<int32_t>(prompt.size() - n_reuse);
    s.result.timings.prompt_ms = ms_since(t0);
    s.t_gen_start = Clock::now();
    if (s.feeds_ngrams) s.ctx_ngrams.update(prompt, prompt.size());
    s.all = prompt;
    return Status::ok();
}

// The cost model of this slot's drafter chain: model drafting costs c per token, n-gram and
// lookup drafting is free next to a target pass. A chain with a model prices its rounds at c
// unless a free drafter ahead of the model proposed (step_draft): "lookup, then draft" drafts
// with the model whenever lookup finds nothing, and priced free there it drafted 15 tokens a
// round at 8 ms of draft against a 5 ms plain pass (docs/benchmarks.md, "A chain's model drafts
// were priced free").
CostModel Engine::Impl::slot_cost(const Slot & s) const {
    const CostModel * fixed = test_hooks::fixed_cost.load();
    CostModel cm = fixed ? *fixed : costs.model();
    if (!chain_has(s.req.spec.types, SpecType::DRAFT)) cm.c = 0;
    return cm;
}

Status Engine::Impl::decode_or_error(llama_context * c, llama_batch & b, const char * what) {
    int32_t rc = llama_decode(c, b);
    // llama_decode returns once the pass is queued; on an asynchronous backend (RPC workers, a GPU)
    // it is still running. Wait here, so that a timed pass is the whole pass and not a part of
    // the round's "overhead", and so that a worker lost during the pass is seen below.
    llama_synchronize(c);
    if (c == ctx) {  // llama-server's n_busy_slots_per_decode, for /metrics
        const auto busy = std::count_if(slots.begin(), slots.end(), [](const Slot & s) { return s.active; });
        std::lock_guard<std::mutex> lock(metrics_mutex);
        metrics.n_decode++;
        metrics.n_busy_slots += std::max<int64_t>(busy, 1);  // a prompt batch serves a slot not yet active
    }
    // a lost RPC worker: llama.cpp got placeholder replies (rpc_link.h), whatever rc says
    if (Status st = rpc_check(); !st) return st;
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
    // Weighted by the evidence: n positions move the prior by n / (n + 16) of the way, so a
    // request that drafted a few rounds before switching off still teaches the next one (which
    // would otherwise re-pay the optimistic start), and a long one nearly sets it, while a few
    // unlucky positions cannot switch the next requests of a good drafter off.
    if (s.policy) {
        Learned & L = learned[prior_key(s)];
        if (s.policy->n_at_risk() > 0) {
            const double n    = double(s.policy->n_at_risk());
            const double meas = double(s.policy->n_accepted()) / n;
            double & a = L.alpha.has_value() ? *L.alpha : L.alpha.emplace(s.policy->options().alpha_prior);
            a += (meas - a) * n / (n + 16.0);
            if (n >= 16) L.depth = s.policy->next_depth_prior();
            SPR_LOG_DEBUG("slot %d: measured α %.3f over %lld positions, %lld of %lld rounds off; next prior %.3f", s.id,
                          meas, static_cast<long long>(s.policy->n_at_risk()),
                          static_cast<long long>(s.stats.n_off_rounds), static_cast<long long>(s.n_passes), a);
        }
        L.long_run = s.policy->next_long_prior();  // pooled by positions, also when few
        // the probe budget's books carry over; old history fades (work ≤ 16384)
        L.ledger  = s.policy->probe_ledger();
        L.classes = s.policy->class_evidence();
        L.confidence = s.policy->confidence_evidence();
        if (L.ledger.work > 16384) { L.ledger.spent *= 16384 / L.ledger.work; L.ledger.work = 16384; }
        learned_write();
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
    r.spec.alpha_prior      = s.policy ? s.policy->options().alpha_prior : 0.0;
    r.spec.n_off_rounds     = st.n_off_rounds;
    r.spec.n_empty_rounds   = st.n_empty_rounds;
    r.spec.t_empty_draft_ms = st.t_empty_draft_ms;
    r.spec.empty_excess     = s.policy ? s.policy->confidence_evidence().empty_excess : -1.0;
    r.spec.t_draft_ms       = st.t_draft_ms;
    r.spec.t_verify_ms      = st.t_verify_ms;
    r.spec.t_sample_ms      = st.t_sample_ms;
    // Every finished request feeds the dynamic n-gram cache (lookup decoding across requests).
    if (params.ngram_cache_max_mb > 0) {  // capped: NgramCache::set_max_bytes
        std::lock_guard<std::mutex> lock(ngram_mutex);
        dyn_ngrams.update(s.all, s.all.size());
    }
    suffix_record(s);
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
        // The slot shows idle before its client gets the answer: a /slots right after it must
        // not see the request still running (the loop's snapshot comes only after the step).
        for (SlotState & ss : metrics.slots)
            if (ss.id == s.id && ss.busy) {
                ss = {s.id, false, -1, static_cast<int32_t>(s.cache.size()), static_cast<int32_t>(s.output.size())};
                metrics.slots_busy--;
            }
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
