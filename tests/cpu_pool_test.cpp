// The engine's CPU thread pool and start-up core check (engine/backend.h), on the real ggml pool:
// a new pool and a parked one take no CPU (their workers wait instead of polling for work), and
// busy threads are seen by the start-up check. The pause used to be looked up in the backend
// registry, which does not offer it, and silently did nothing.
#include <gtest/gtest.h>

#include <atomic>
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

TEST(CpuPool, ANewPoolWaitsForItsFirstGraph) {
    backend_init();
    ggml_threadpool * tp = cpu_threadpool_new(2);
    ASSERT_NE(tp, nullptr);
    // a polling worker would take most of these 200 ms
    EXPECT_LT(cpu_ms_while_sleeping(200), 50.0);
    cpu_threadpool_free(tp);
}

TEST(CpuPool, APausedPoolStopsPolling) {
    backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(SPECRPC_MODELS_DIR "/stories260K-F32.gguf", mp);
    ASSERT_NE(model, nullptr);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = 64;
    cp.n_batch         = 64;
    cp.n_threads       = 2;
    cp.n_threads_batch = 2;
    llama_context * ctx = llama_init_from_model(model, cp);
    ASSERT_NE(ctx, nullptr);
    ggml_threadpool * tp = cpu_threadpool_new(2);
    ASSERT_NE(tp, nullptr);
    llama_attach_threadpool(ctx, tp, tp);
    llama_token tok = 1;
    ASSERT_EQ(llama_decode(ctx, llama_batch_get_one(&tok, 1)), 0);
    // after a graph the worker polls for the next one (ggml's default), then...
    cpu_threadpool_pause(tp);
    // ...parked, it waits: no CPU while nothing runs
    EXPECT_LT(cpu_ms_while_sleeping(200), 50.0);
    // and the next graph wakes it again
    tok = 2;
    EXPECT_EQ(llama_decode(ctx, llama_batch_get_one(&tok, 1)), 0);
    cpu_threadpool_pause(tp);
    llama_free(ctx);
    cpu_threadpool_free(tp);
    llama_model_free(model);
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
