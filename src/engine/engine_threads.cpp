// The engine's side of the thread-count choice (engine/thread_choice.h): each target pass of a
// round is fed to it, and a change is applied to both contexts before the next pass.
#include <cmath>

#include "common/log.h"
#include "engine/backend.h"
#include "engine/engine_impl.h"

namespace specrpc {

// The CPU time of the pass's threads: this one and the pool's workers, read exactly; the
// process's clock (when the workers are unknown) adds another thread's time only at its tick,
// and a pass shorter than a tick read a share of 0.5 or 1.5 (docs/design.md, "Threads").
static double pass_threads_cpu_ms(const std::vector<int> & workers, int n_threads) {
    return int(workers.size()) + 1 == n_threads ? cpu_threads_ms(workers) : process_cpu_ms();
}

double Engine::Impl::threads_cpu_mark() {
    return thread_choice.want_share() ? pass_threads_cpu_ms(pool_workers, params.n_threads) : NAN;
}

void Engine::Impl::threads_after_pass(int32_t n_tok, double wall_ms, double cpu_mark) {
    const int n = thread_choice.threads();
    // a pass's expected cost in 1-token passes: the cost curve's once known (plain passes: 1)
    const double units = n_tok <= 1 ? 1.0 : costs.seeded() ? cost_model_v(costs.model(), n_tok) : 0.0;
    if (!(units > 0) || !(wall_ms > 0)) return;
    const double share =
        std::isfinite(cpu_mark) ? (pass_threads_cpu_ms(pool_workers, params.n_threads) - cpu_mark) / (wall_ms * n) : NAN;
    if (!thread_choice.observe(wall_ms / units, share)) return;
    const int now = thread_choice.threads();
    cpu_threads_apply(ctx, dft_ctx, threadpool, now, now > 1 && costs.draft_threads() > 0 ? costs.draft_threads() : now);
    SPR_LOG_DEBUG("passes on %d thread(s)%s (share of the cores %.2f, %.3f ms per unit)", now,
                  thread_choice.trying() ? " as a trial" : "", share, wall_ms / units);
}

}  // namespace specrpc
