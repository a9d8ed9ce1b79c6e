// Context creation and the measured choice of flash attention (see context.h).
#include "engine/context.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "common/log.h"
#include "llama.h"

namespace specrpc {

llama_context * context_new(const Model & m, const EngineParams & p, uint32_t n_ctx, uint32_t n_seq, bool unified,
                            bool flash_attn, ggml_threadpool * tp) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = n_ctx;
    cp.n_batch         = static_cast<uint32_t>(p.n_batch);
    cp.n_ubatch        = static_cast<uint32_t>(p.n_batch);
    cp.n_seq_max       = n_seq;
    cp.n_threads       = p.n_threads;
    cp.n_threads_batch = p.n_threads;
    cp.kv_unified      = unified;  // tree branches share the prefix cells of their slot
    cp.no_perf         = true;
    cp.flash_attn_type = flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    if (p.kv_f32) { cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32; }
    llama_context * ctx = llama_init_from_model(m.get(), cp);
    if (ctx && tp) llama_attach_threadpool(ctx, tp, tp);
    return ctx;
}

namespace {

// Median ms of a 1-token plus a 16-token pass at `depth`, or a huge value if a pass fails.
double time_passes(llama_context * ctx, int32_t depth, int32_t n_vocab) {
    using Clock = std::chrono::steady_clock;
    const int32_t n_big = 16;
    llama_batch   b     = llama_batch_init(std::max(depth, n_big), 0, 1);
    auto fill = [&](int32_t n, int32_t pos0, bool logits) {
        b.n_tokens = n;
        for (int32_t i = 0; i < n; ++i) {
            b.token[i] = 1 + (pos0 + i) % std::max(1, n_vocab - 1); b.pos[i] = pos0 + i;
            b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = logits;
        }
    };
    double total = 0;
    fill(depth, 0, false);
    if (depth > 0 && llama_decode(ctx, b) != 0) total = 1e30;
    for (int32_t n : {1, n_big}) {
        std::vector<double> ts;
        for (int rep = 0; rep < 8 && total < 1e30; ++rep) {
            fill(n, depth, true);
            const auto t0 = Clock::now();
            if (llama_decode(ctx, b) != 0) total = 1e30;
            if (rep > 0) ts.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
            llama_memory_seq_rm(llama_get_memory(ctx), 0, depth, -1);
        }
        if (ts.empty()) break;
        std::nth_element(ts.begin(), ts.begin() + ts.size() / 2, ts.end());
        total += ts[ts.size() / 2];
    }
    llama_batch_free(b);
    return total;
}

}  // namespace

bool flash_attn_choose(const Model & m, const EngineParams & p, int32_t setting, uint32_t n_ctx, ggml_threadpool * tp) {
    if (setting >= 0) return setting > 0;
    static std::mutex                                    mutex;
    static std::map<std::tuple<std::string, int, uint32_t>, bool> cache;
    const auto key = std::make_tuple(m.path(), p.n_threads, n_ctx);
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
    const int32_t depth = std::min<int32_t>({128, static_cast<int32_t>(n_ctx / 4), p.n_batch});
    double ms[2] = {1e30, 1e30};
    for (int fa = 0; fa < 2; ++fa) {
        llama_context * ctx = context_new(m, p, n_ctx, 1, false, fa == 1, tp);
        if (!ctx) continue;
        ms[fa] = time_passes(ctx, depth, m.n_vocab());
        llama_free(ctx);
    }
    const bool on = ms[1] < ms[0];
    const std::string name = m.path().substr(m.path().find_last_of('/') + 1);
    SPR_LOG_INFO("flash attention %s for %s: a 1- and a 16-token pass take %.2f ms with it, %.2f ms without",
                 on ? "on" : "off", name.c_str(), ms[1], ms[0]);
    cache[key] = on;
    return on;
}

}  // namespace specrpc
