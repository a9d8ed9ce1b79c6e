// The engine's learned priors on disk (prior_cache.h): read once before the first speculative
// request, written after requests that taught something. Engine thread only (and the engine's
// destructor, after that thread has stopped).
#include "common/log.h"
#include "engine/cost_cache.h"
#include "engine/engine_impl.h"

namespace specrpc {

// Acceptance belongs to the pair of models (and the drafters and regime, which key each block
// inside): a file written for other model files, or the same path rewritten, is not read.
std::string Engine::Impl::priors_key() const {
    return "target " + file_identity(params.target.path) + "\ndraft " + file_identity(params.draft.path);
}

void Engine::Impl::priors_load() {
    if (priors_loaded) return;
    priors_loaded         = true;
    const std::string dir = prior_cache_dir();
    if (dir.empty()) return;
    std::optional<PriorBook> book = prior_cache_load(dir, priors_key());
    if (!book) return;
    // what this process learned before reading (nothing, when read before the first request) wins
    for (auto & [k, L] : *book) learned.emplace(k, std::move(L));
    SPR_LOG_INFO("draft-length priors of %zu chain(s) from %s", book->size(), prior_cache_path(dir, priors_key()).c_str());
}

void Engine::Impl::priors_save(bool now) {
    if (!priors_dirty) return;
    // at most once a second: a busy server finishes many requests a second, and what one request
    // changes in a prior is small; the destructor writes the rest
    const Clock::time_point t = Clock::now();
    if (!now && priors_saved != Clock::time_point{} && t - priors_saved < std::chrono::seconds(1)) return;
    const std::string dir = prior_cache_dir();
    priors_dirty = false;
    priors_saved = t;
    if (dir.empty()) return;
    if (Status st = prior_cache_save(dir, priors_key(), learned); !st)
        SPR_LOG_WARN("draft-length priors not kept: %s", st.message().c_str());
}

}  // namespace specrpc
