// The engine's CPU thread pool and start-up core check (engine/backend.h), on the real ggml pool:
// a new pool and a parked one take no CPU (their workers wait instead of polling for work), and
// busy threads are seen by the start-up check. The pause used to be looked up in the backend
// registry, which does not offer it, and silently did nothing. A pass's threads' CPU time is read
// exactly, the pool's worker included.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <thread>
#include <vector>

#include "engine/backend.h"
#include "llama.h"

using namespace specrpc;

namespace {

// CPU time this process spends over `ms` of wall time while this thread sleeps.
double cpu_ms_while_sleeping(int ms) {
    const double c0 = process_cpu_ms();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return process_cpu_ms() - c0;
}

// stories260K on two threads with the engine's pool attached (`workers`: its worker's thread id).
struct PooledModel {
    llama_model *     model = nullptr;
    llama_context *   ctx   = nullptr;
    ggml_threadpool * tp    = nullptr;
    std::vector<int>  workers;

    explicit PooledModel(uint32_t n_ctx) {
        backend_init();
        model = llama_model_load_from_file(SPECRPC_MODELS_DIR "/stories260K-F32.gguf", llama_model_default_params());
        if (!model) return;
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx           = n_ctx;
        cp.n_batch         = 64;
        cp.n_threads       = 2;
        cp.n_threads_batch = 2;
        ctx = llama_init_from_model(model, cp);
        tp  = cpu_threadpool_new(2, &workers);
        if (ctx && tp) llama_attach_threadpool(ctx, tp, tp);
    }
    ~PooledModel() {
        if (tp) cpu_threadpool_pause(tp);
        if (ctx) llama_free(ctx);
        cpu_threadpool_free(tp);
        if (model) llama_model_free(model);
    }
    bool ok() const { return model && ctx && tp; }
    int  decode(llama_token tok) { return llama_decode(ctx, llama_batch_get_one(&tok, 1)); }
};

TEST(CpuPool, ANewPoolWaitsForItsFirstGraph) {
    backend_init();
    ggml_threadpool * tp = cpu_threadpool_new(2);
    ASSERT_NE(tp, nullptr);
    // a polling worker would take most of these 200 ms
    EXPECT_LT(cpu_ms_while_sleeping(200), 50.0);
    cpu_threadpool_free(tp);
}

TEST(CpuPool, APausedPoolStopsPolling) {
    PooledModel m(64);
    ASSERT_TRUE(m.ok());
    ASSERT_EQ(m.decode(1), 0);
    // after a graph the worker polls for the next one (ggml's default), then...
    cpu_threadpool_pause(m.tp);
    // ...parked, it waits: no CPU while nothing runs
    EXPECT_LT(cpu_ms_while_sleeping(200), 50.0);
    // and the next graph wakes it again
    EXPECT_EQ(m.decode(2), 0);
}

// The share of their cores a pass's threads got (engine/engine_threads.cpp) is read from each
// thread's own CPU clock: the process's clock adds the worker's time only at the worker's tick
// (4 ms at HZ 250), so over passes shorter than that it read 0 or a whole tick of the worker,
// a share of 0.5 or ~10, and the thread choice tried one thread for nothing. Exact clocks never
// read more than the pass's wall time on each thread, and they do see the worker's time.
TEST(CpuPool, APassReadsItsThreadsTimeExactly) {
    PooledModel m(512);
    ASSERT_TRUE(m.ok());
    const std::vector<int> & workers = m.workers;
    ASSERT_EQ(workers.size(), 1u) << "the pool's one worker was not found in /proc/self/task";
    int    over = 0, passes = 300;
    double worker_ms = 0, wall_ms = 0;
    for (int i = 0; i < passes; ++i) {
        // the reads lie within the wall time: the worker polls between passes, and a read
        // outside it would count its polling while this thread was switched out
        const auto   t0   = std::chrono::steady_clock::now();
        const double own0 = cpu_threads_ms({}), all0 = cpu_threads_ms(workers);
        ASSERT_EQ(m.decode(1 + i % 100), 0);
        const double all  = cpu_threads_ms(workers) - all0, own = cpu_threads_ms({}) - own0;
        const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        over += all > 2 * wall + 0.001;
        worker_ms += all - own;
        wall_ms += wall;
    }
    EXPECT_EQ(over, 0) << "passes whose threads read more CPU time than they had";
    EXPECT_GT(worker_ms, 0.1 * wall_ms) << "the worker's time is not seen";
    int ended = 0;
    std::thread([&ended] { ended = static_cast<int>(syscall(SYS_gettid)); }).join();
    EXPECT_TRUE(std::isnan(cpu_threads_ms({ended}))) << "a thread that has ended";
}

TEST(CpuCores, BusyThreadsAreSeen) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    std::atomic<bool> stop{false};
    std::vector<std::thread> busy;
    for (unsigned i = 0; i < cores; ++i)
        busy.emplace_back([&stop] {
            volatile unsigned long x = 0;
            while (!stop.load(std::memory_order_relaxed)) x = x + 1;
        });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // all running
    EXPECT_FALSE(cpu_cores_free(2)) << "every core is busy";
    stop = true;
    for (auto & t : busy) t.join();
}

}  // namespace
