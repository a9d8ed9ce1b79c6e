// Creating the llama contexts of an engine, and choosing each one's attention path by measuring it.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model.h"
#include "specrpc/engine.hpp"

struct llama_context;
struct llama_batch;
struct ggml_threadpool;

namespace specrpc {

// A context for `m` with the engine's batch, threads and KV type, n_ctx cells for n_seq
// sequences (unified: one cell pool shared by all), flash attention on or off, attached to `tp`
// (may be null).
llama_context * context_new(const Model & m, const EngineParams & p, uint32_t n_ctx, uint32_t n_seq, bool unified,
                            bool flash_attn, ggml_threadpool * tp);

// Whether `m` runs faster with llama.cpp's flash attention on this machine: `setting` 0 = no,
// 1 = yes, -1 = measure. Measuring times a 1-token and a 16-token pass (7 each after a warm-up,
// median) at depth min(128, n_ctx / 4) in a throw-away context of each kind with n_ctx cells,
// and keeps the kind whose sum is smaller: the costs of a plain decoding step and of a full
// verification pass (or a draft catch-up chunk). The answer is cached per (model file, threads,
// n_ctx) for the life of the process.
//
// Why: whether flash attention is faster depends on the model (its head size) and the CPU, in
// either direction, and llama.cpp's "auto" turns it on regardless (docs/benchmarks.md).
bool flash_attn_choose(const Model & m, const EngineParams & p, int32_t setting, uint32_t n_ctx, ggml_threadpool * tp);


// Timing passes on a scratch sequence `seq` (the cost probe, the flash-attention choice): a
// prefix of `depth` tokens, then passes of n tokens after it, each removed again. Token ids are
// arbitrary valid ones (timing does not depend on them).
bool   scratch_prefill(llama_context * ctx, int32_t seq, int32_t depth, int32_t n_vocab);
// One pass of n tokens (all with logits) at positions depth.., timed in ms; 1e30 if it fails.
// `b` must hold at least n tokens.
double scratch_time_pass(llama_context * ctx, llama_batch & b, int32_t seq, int32_t depth, int32_t n, int32_t n_vocab);
// n successive 1-token passes (a drafted chain) at positions depth.., timed together: the mean
// ms per pass; 1e30 if one fails. `b` must hold at least 1 token.
double scratch_time_chain(llama_context * ctx, llama_batch & b, int32_t seq, int32_t depth, int32_t n, int32_t n_vocab);
// The median of ts (1e30 when empty): one stalled pass must not decide.
double median_ms(std::vector<double> ts);

}  // namespace specrpc
