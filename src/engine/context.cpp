// Context creation and the rule that chooses flash attention (see context.h).
#include "engine/context.h"

#include <algorithm>
#include <chrono>
#include <atomic>
#include <string>

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

static std::atomic<int64_t> g_scratch_passes{0};
int64_t scratch_pass_count() { return g_scratch_passes.load(); }

// Fills b with n tokens of sequence seq at positions pos0.., all with or without logits.
static void scratch_fill(llama_batch & b, int32_t seq, int32_t pos0, int32_t n, int32_t n_vocab, bool logits) {
    b.n_tokens = n;
    for (int32_t i = 0; i < n; ++i) {
        b.token[i] = 1 + (pos0 + i) % std::max(1, n_vocab - 1); b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1; b.seq_id[i][0] = seq; b.logits[i] = logits;
    }
}

bool scratch_extend(llama_context * ctx, int32_t seq, int32_t from, int32_t to, int32_t n_vocab, int32_t n_batch) {
    if (to <= from) return true;
    n_batch = std::max(1, std::min(n_batch, to - from));
    llama_batch b = llama_batch_init(n_batch, 0, 1);
    bool ok = true;
    for (int32_t pos = from; ok && pos < to; pos += n_batch) {
        scratch_fill(b, seq, pos, std::min(n_batch, to - pos), n_vocab, false);
        ++g_scratch_passes;
        ok = llama_decode(ctx, b) == 0;
    }
    llama_batch_free(b);
    return ok;
}

bool scratch_prefill(llama_context * ctx, int32_t seq, int32_t depth, int32_t n_vocab) {
    return scratch_extend(ctx, seq, 0, depth, n_vocab, depth);
}

double scratch_time_pass(llama_context * ctx, llama_batch & b, int32_t seq, int32_t depth, int32_t n, int32_t n_vocab) {
    scratch_fill(b, seq, depth, n, n_vocab, true);
    ++g_scratch_passes;
    const auto t0 = std::chrono::steady_clock::now();
    const int32_t rc = llama_decode(ctx, b);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    llama_memory_seq_rm(llama_get_memory(ctx), seq, depth, -1);
    return rc == 0 ? ms : 1e30;
}

double scratch_time_chain(llama_context * ctx, llama_batch & b, int32_t seq, int32_t depth, int32_t n, int32_t n_vocab) {
    int32_t rc = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t i = 0; i < n && rc == 0; ++i) {
        scratch_fill(b, seq, depth + i, 1, n_vocab, true);
        ++g_scratch_passes;
        rc = llama_decode(ctx, b);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    llama_memory_seq_rm(llama_get_memory(ctx), seq, depth, -1);
    return rc == 0 && n > 0 ? ms / n : 1e30;
}

double median_ms(std::vector<double> ts) {
    if (ts.empty()) return 1e30;
    std::nth_element(ts.begin(), ts.begin() + ts.size() / 2, ts.end());
    return ts[ts.size() / 2];
}

bool flash_attn_choose(const Model & m, const EngineParams &, int32_t setting, uint32_t, ggml_threadpool *) {
    if (setting >= 0) return setting > 0;
    const int32_t n_head   = llama_model_n_head(m.get());
    const int32_t head_dim = n_head > 0 ? llama_model_n_embd(m.get()) / n_head : 0;
    const bool    on       = head_dim >= kFlashAttnMinHeadDim;
    const std::string name = m.path().substr(m.path().find_last_of('/') + 1);
    SPR_LOG_INFO("flash attention %s for %s (head size %d)", on ? "on" : "off", name.c_str(), head_dim);
    return on;
}

}  // namespace specrpc
