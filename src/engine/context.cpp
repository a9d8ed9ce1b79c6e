// Context creation and the rule that chooses flash attention (see context.h).
#include "engine/context.h"

#include <algorithm>
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
