// Creating the llama contexts of an engine and choosing each one's attention path (the cost
// probe's timers are in engine/cost_tracker.h).
#pragma once

#include <cstdint>

#include "engine/model.h"
#include "specrpc/engine.hpp"

struct llama_context;
struct ggml_threadpool;

namespace specrpc {

// Flash attention by default from this attention head size up: it cost 2x at 8 and paid 15-25% at
// 64 here; 32 lies between the two measured points.
inline constexpr int32_t kFlashAttnMinHeadDim = 32;

// A context for `m` with the engine's batch, threads and KV type, n_ctx cells for n_seq
// sequences (unified: one cell pool shared by all), flash attention on or off, attached to `tp`
// (may be null).
llama_context * context_new(const Model & m, const EngineParams & p, uint32_t n_ctx, uint32_t n_seq, bool unified,
                            bool flash_attn, ggml_threadpool * tp);

// Whether `m` runs with llama.cpp's flash attention: `setting` 0 = no, 1 = yes, -1 = by rule:
// on iff the model's attention head size is at least kFlashAttnMinHeadDim. A rule, not a
// measurement: flash attention changes the logits, so a choice made by timing (a race that
// flips with the machine's load) changed the text of a seeded request across restarts, and the
// race cost ~0.6 s before the first token on x100M.
//
// Why the rule: on CPUs flash attention slows models with small heads and speeds up those with
// large ones (docs/benchmarks.md); llama.cpp's "auto" turns it on for both. `n_ctx` and `tp` are
// unused (kept for callers).
bool flash_attn_choose(const Model & m, const EngineParams & p, int32_t setting, uint32_t n_ctx, ggml_threadpool * tp);

}  // namespace specrpc
