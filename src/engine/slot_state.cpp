// Slot caches as files (save / restore / erase) and idle sleep: the engine's state that outlives
// a request, and what it costs to keep it. Both run on the engine thread between rounds, because
// the contexts are the engine thread's (engine_impl.h).
#include <algorithm>
#include <cstdio>

#include "common/log.h"
#include "engine/backend.h"
#include "engine/context.h"
#include "engine/engine_impl.h"
#include "llama.h"

namespace specrpc {

namespace {

// The token payload of a slot file, as llama-server writes it (its server_tokens state, text
// only): LLAMA_TOKEN_NULL, a version, the token count, the tokens, and an empty list of media
// chunks. A file that does not start with LLAMA_TOKEN_NULL is a plain token list (older servers).
constexpr uint32_t kPackedVersion = 1;

std::vector<llama_token> pack_tokens(const std::vector<token_id> & t) {
    std::vector<llama_token> out;
    out.reserve(t.size() + 4);
    out.push_back(LLAMA_TOKEN_NULL);
    out.push_back(static_cast<llama_token>(kPackedVersion));
    out.push_back(static_cast<llama_token>(t.size()));
    out.insert(out.end(), t.begin(), t.end());
    out.push_back(0);  // no media chunks
    return out;
}

Result<std::vector<token_id>> unpack_tokens(const std::vector<llama_token> & p) {
    if (p.empty() || p[0] != LLAMA_TOKEN_NULL) return std::vector<token_id>(p.begin(), p.end());
    if (p.size() < 3 || static_cast<uint32_t>(p[1]) != kPackedVersion)
        return Status(ErrorCode::INVALID_ARGUMENT, "unsupported slot file token format (version " +
                                                       (p.size() > 1 ? std::to_string(p[1]) : std::string("?")) + ")");
    const size_t n = static_cast<uint32_t>(p[2]);
    if (p.size() < 3 + n + 1) return Status(ErrorCode::INVALID_ARGUMENT, "slot file token list is truncated");
    if (p[3 + n] != 0)
        return Status(ErrorCode::UNSUPPORTED, "the slot file holds media chunks (images, audio): not supported here");
    return std::vector<token_id>(p.begin() + 3, p.begin() + 3 + static_cast<long>(n));
}

std::string base_name(const std::string & path) {
    const size_t k = path.find_last_of('/');
    return k == std::string::npos ? path : path.substr(k + 1);
}

}  // namespace

// ---- slot files --------------------------------------------------------------------------------

Result<SlotFileResult> Engine::Impl::slot_action(const SlotAction & a) {
    const int32_t n = static_cast<int32_t>(slots.size());
    if (a.slot < 0 || a.slot >= n)
        return Status(ErrorCode::NOT_FOUND, "slot " + std::to_string(a.slot) + " does not exist (slots 0.." +
                                                std::to_string(n - 1) + ")", "id_slot");
    Slot & s = slots[static_cast<size_t>(a.slot)];
    if (s.active)
        return Status(ErrorCode::OVERLOADED, "slot " + std::to_string(a.slot) + " is busy with request " +
                                                  std::to_string(s.req_id) + "; retry when it is idle", "id_slot");
    auto * mem = llama_get_memory(ctx);
    const auto t0 = Clock::now();
    SlotFileResult r;
    r.id_slot = a.slot;
    switch (a.kind) {
        case SlotAction::ERASE: {
            r.n_tokens = static_cast<int32_t>(s.cache.size());
            llama_memory_seq_rm(mem, s.seq, -1, -1);
            s.cache.clear();
            if (dft_ctx) llama_memory_seq_rm(llama_get_memory(dft_ctx), s.seq, -1, -1);
            s.dft_cache.clear();
            break;
        }
        case SlotAction::SAVE: {
            const std::vector<llama_token> packed = pack_tokens(s.cache);
            const size_t nw = llama_state_seq_save_file(ctx, a.path.c_str(), s.seq, packed.data(), packed.size());
            if (nw == 0)
                return Status(ErrorCode::INTERNAL, "could not write the slot file " + base_name(a.path));
            r.n_tokens = static_cast<int32_t>(s.cache.size());
            r.n_bytes  = nw;
            break;
        }
        case SlotAction::RESTORE: {
            // The slot's old cache goes first: a failed load leaves the slot empty, never half old.
            llama_memory_seq_rm(mem, s.seq, -1, -1);
            s.cache.clear();
            if (dft_ctx) llama_memory_seq_rm(llama_get_memory(dft_ctx), s.seq, -1, -1);
            s.dft_cache.clear();
            auto bad = [&](const std::string & why) {
                llama_memory_seq_rm(mem, s.seq, -1, -1);
                return Status(ErrorCode::INVALID_ARGUMENT, "cannot restore slot " + std::to_string(a.slot) + " from " +
                                                               base_name(a.path) + ": " + why, "filename");
            };
            if (FILE * f = std::fopen(a.path.c_str(), "rb")) std::fclose(f);
            else return Status(ErrorCode::NOT_FOUND, "slot file " + base_name(a.path) + " not found", "filename");
            size_t n_packed = 0;
            size_t nr = llama_state_seq_load_file(ctx, a.path.c_str(), s.seq, nullptr, 0, &n_packed);
            if (nr == 0) return bad("not a llama.cpp sequence state file");
            // the payload is at most a few words beyond the slot's tokens
            if (n_packed > static_cast<size_t>(n_ctx_slot) + 4) return bad("its cache does not fit the slot's context");
            std::vector<llama_token> packed(std::max<size_t>(1, n_packed));
            nr = llama_state_seq_load_file(ctx, a.path.c_str(), s.seq, packed.data(), packed.size(), &n_packed);
            if (nr == 0) return bad("its KV cache does not load into this context (another model, or no room)");
            packed.resize(n_packed);
            auto toks = unpack_tokens(packed);
            if (!toks) return bad(toks.status().message());
            std::vector<token_id> & t = toks.value();
            if (static_cast<int32_t>(t.size()) > n_ctx_slot) return bad("its cache does not fit the slot's context");
            for (token_id id : t)
                if (id < 0 || id >= info.n_vocab) return bad("token id " + std::to_string(id) + " is out of range");
            // the KV must hold exactly positions 0..n-1 of the tokens: the prefix reuse relies on it
            if (llama_memory_seq_pos_min(mem, s.seq) != (t.empty() ? -1 : 0) ||
                llama_memory_seq_pos_max(mem, s.seq) != static_cast<llama_pos>(t.size()) - 1)
                return bad("its KV cells do not match its token list");
            s.cache    = std::move(t);
            r.n_tokens = static_cast<int32_t>(s.cache.size());
            r.n_bytes  = nr;
            break;
        }
    }
    r.t_ms = ms_since(t0);
    SPR_LOG_INFO("slot %d: %s %s, %d token(s)", a.slot,
                 a.kind == SlotAction::SAVE ? "saved to" : a.kind == SlotAction::RESTORE ? "restored from" : "erased",
                 a.kind == SlotAction::ERASE ? "" : base_name(a.path).c_str(), r.n_tokens);
    return r;
}

static Result<SlotFileResult> post_action(Engine::Impl & impl, SlotAction::Kind kind, int32_t slot,
                                          const std::string & path) {
    auto a  = std::make_shared<SlotAction>();
    a->kind = kind;
    a->slot = slot;
    a->path = path;
    auto fut = a->done.get_future();
    {
        std::lock_guard<std::mutex> lock(impl.mutex);
        if (impl.stopping) return Status(ErrorCode::UNAVAILABLE, "engine is shutting down");
        impl.slot_actions.push_back(a);
    }
    impl.cv.notify_all();
    return fut.get();
}

Result<SlotFileResult> Engine::save_slot(int32_t id_slot, const std::string & path) {
    return post_action(*impl_, SlotAction::SAVE, id_slot, path);
}
Result<SlotFileResult> Engine::restore_slot(int32_t id_slot, const std::string & path) {
    return post_action(*impl_, SlotAction::RESTORE, id_slot, path);
}
Result<int32_t> Engine::erase_slot(int32_t id_slot) {
    auto r = post_action(*impl_, SlotAction::ERASE, id_slot, std::string());
    if (!r) return r.status();
    return r.value().n_tokens;
}

// ---- idle sleep ----------------------------------------------------------------------------------

bool Engine::is_sleeping() const { return impl_->sleeping.load(); }

std::shared_lock<std::shared_mutex> Engine::Impl::awake_lock() {
    for (;;) {
        std::shared_lock<std::shared_mutex> lk(model_mu);
        touch();
        if (!sleeping.load()) return lk;
        lk.unlock();
        std::unique_lock<std::shared_mutex> ul(model_mu);
        if (sleeping.load()) {
            if (Status st = wake_locked(); !st) {
                // the models stay unloaded (the next call tries again): no lock, the caller fails
                SPR_LOG_ERROR("waking up: %s", st.to_string().c_str());
                return {};
            }
        }
    }
}

Status Engine::Impl::wake_locked() {
    const auto t0 = Clock::now();
    auto tgt = Model::load(params.target);
    if (!tgt) return tgt.status();
    std::shared_ptr<Model> dft;
    if (!params.draft.path.empty()) {
        auto d = Model::load(params.draft);
        if (!d) return d.status();
        dft = d.value();
    }
    llama_context * c = context_new(*tgt.value(), params, n_ctx_cells, n_seq_cells, kv_unified, info.flash_attn, threadpool);
    if (!c) return Status(ErrorCode::LOAD_FAILED, "failed to create the target context");
    llama_context * dc = nullptr;
    if (dft) {
        dc = context_new(*dft, params, n_ctx_cells, n_seq_cells, kv_unified, info.draft_flash_attn, threadpool);
        if (!dc) { llama_free(c); return Status(ErrorCode::LOAD_FAILED, "failed to create the draft context"); }
    }
    target = tgt.value();
    draft  = dft;
    ctx     = c;
    dft_ctx = dc;
    cpu_threads_apply(ctx, dft_ctx, threadpool, thread_choice.threads(), thread_choice.threads());
    touch();
    {
        // under the queue's mutex: the engine thread, asleep in its wait, must not miss the change
        std::lock_guard<std::mutex> lock(mutex);
        sleeping = false;
    }
    cv.notify_all();
    SPR_LOG_INFO("awake: models loaded again in %.0f ms", ms_since(t0));
    return Status::ok();
}

// Frees models and contexts once nothing has used the engine for sleep_idle_seconds. Called by
// the engine thread with no request active; rechecks under model_mu, which waits out callers
// still reading the model.
void Engine::Impl::sleep_if_idle() {
    if (params.sleep_idle_seconds <= 0 || sleeping.load()) return;
    std::unique_lock<std::shared_mutex> ml(model_mu);
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (stopping || !queue.empty() || !slot_actions.empty() || !cancels.empty()) return;
    }
    const int64_t idle_ns = Clock::now().time_since_epoch().count() - last_use_ns.load();
    if (idle_ns < int64_t(params.sleep_idle_seconds) * 1000000000LL) return;
    for (auto & s : slots) {
        if (s.active) return;
        s.cache.clear();
        s.dft_cache.clear();
        s.sampler.reset();      // samplers (grammars) point into the vocabulary
        s.dft_sampler.reset();
    }
    if (dft_ctx) llama_free(dft_ctx);
    if (ctx) llama_free(ctx);
    dft_ctx = ctx = nullptr;
    draft.reset();
    target.reset();
    sleeping = true;
    SPR_LOG_INFO("sleeping: idle for %d s, models unloaded", params.sleep_idle_seconds);
}

}  // namespace specrpc
