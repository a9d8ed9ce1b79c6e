// The engine's side of a lost RPC worker (engine/rpc_link.h): the requests it was running fail
// with an error naming it, later ones fail at once (submit), and once every worker answers the
// RPC handshake again the target is loaded anew (the workers lost its weights with their
// connections) and the engine serves as before.
#include <chrono>
#include <string>

#include "common/log.h"
#include "engine/backend.h"
#include "engine/context.h"
#include "engine/engine_impl.h"
#include "engine/rpc_link.h"
#include "llama.h"

namespace specrpc {

namespace {
constexpr auto kProbeEvery      = std::chrono::seconds(1);
constexpr int  kProbeTimeoutMs  = 3000;  // generous: rpc-server dies of SIGPIPE if a client leaves before its reply
}  // namespace

Status Engine::Impl::rpc_status() const {
    const Model * m = target_weights ? target_weights.get() : target.get();
    return m && m->rpc() ? m->rpc()->status() : Status::ok();
}

Status Engine::health() const {
    if (!impl_->degraded.load()) return Status::ok();
    std::lock_guard<std::mutex> lock(impl_->rpc_mutex);
    return Status(ErrorCode::UNAVAILABLE, impl_->rpc_down);
}

Status Engine::Impl::rpc_check() {
    Status st = rpc_status();
    if (!st && !degraded.load()) {
        {
            std::lock_guard<std::mutex> lock(rpc_mutex);
            rpc_down = st.message() + "; requests fail until it answers again";
        }
        degraded.store(true);  // after rpc_down: health() reads it once it sees the flag
        rpc_next_probe = Clock::now() + kProbeEvery;
    }
    return st;
}

void Engine::Impl::rpc_watch() {
    const Status st = rpc_check();
    if (st) return;
    // the requests of the pass that met the loss have failed with it; any others fail now
    const Status down = Status(ErrorCode::UNAVAILABLE, st.message());
    for (auto & s : slots)
        if (s.active) fail(s, down);
    std::deque<PendingRequest> queued;
    {
        std::lock_guard<std::mutex> lock(mutex);
        queued.swap(queue);
    }
    for (auto & pr : queued)
        if (pr.sink.on_done) pr.sink.on_done(down);
    if (Clock::now() >= rpc_next_probe) rpc_recover();
}

bool Engine::Impl::rpc_recover() {
    rpc_next_probe = Clock::now() + kProbeEvery;
    for (const std::string & w : params.target.rpc_servers)
        if (std::string why = rpc_hello(w, kProbeTimeoutMs); !why.empty()) {
            SPR_LOG_DEBUG("RPC worker %s: %s", w.c_str(), why.c_str());
            return false;
        }
    SPR_LOG_INFO("RPC workers answer again: loading the target on them");
    const auto t0 = Clock::now();
    auto m = Model::load(params.target);
    if (!m) {
        SPR_LOG_WARN("RPC workers answer again, but the target did not load: %s", m.status().message().c_str());
        return false;
    }
    // the context exactly as Engine::create made it
    const uint32_t n_seq = kv_unified ? static_cast<uint32_t>(params.n_parallel * params.n_tree_max) : 1;
    const uint32_t n_ctx = static_cast<uint32_t>(params.n_parallel) * static_cast<uint32_t>(n_ctx_slot + kv_tree_headroom) + 16;
    llama_context * c = context_new(*m.value(), params, n_ctx, n_seq, kv_unified, info.flash_attn, threadpool);
    if (!c) {
        SPR_LOG_WARN("RPC workers answer again, but the target context could not be created");
        return false;
    }
    if (Status st = m.value()->rpc()->status(); !st) {  // lost again while loading
        llama_free(c);
        return false;
    }
    // The old context's (and a previous reload's model's) buffers are on the lost links, which
    // answer the frees themselves: nothing reaches the workers and nothing aborts.
    llama_free(ctx);
    ctx            = c;
    target_weights = m.value();
    const int n = thread_choice.threads();
    cpu_threads_apply(ctx, dft_ctx, threadpool, n, n > 1 && costs.draft_threads() > 0 ? costs.draft_threads() : n);
    for (auto & s : slots) s.cache.clear();  // the new target KV is empty; the draft's is intact
    {
        std::lock_guard<std::mutex> lock(rpc_mutex);
        rpc_down.clear();
    }
    degraded.store(false);
    std::string names;
    for (const std::string & w : params.target.rpc_servers) names += (names.empty() ? "" : ",") + w;
    SPR_LOG_WARN("RPC worker(s) %s answer again: target reloaded in %.1f s, serving", names.c_str(),
                 ms_since(t0) / 1000.0);
    return true;
}

}  // namespace specrpc
