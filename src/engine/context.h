// Creating the llama contexts of an engine, choosing each one's attention path, and the timers of the cost probe.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model.h"
#include "specrpc/engine.hpp"

struct llama_context;
struct llama_batch;
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

// Timing passes on a sequence `seq` (the cost probe): after its first `depth` cells (a scratch
// prefix, or a slot's own context), passes of n tokens, each removed again. Token ids are
// arbitrary valid ones (timing does not depend on them).
bool   scratch_prefill(llama_context * ctx, int32_t seq, int32_t depth, int32_t n_vocab);
// Fills cells from..to-1 of `seq` (after a slot's own context) with scratch tokens, so that the
// passes timed after them attend over a context of a length requests really have; the caller
// removes them again (llama_memory_seq_rm from `from`). Decoded n_batch tokens a pass.
bool   scratch_extend(llama_context * ctx, int32_t seq, int32_t from, int32_t to, int32_t n_vocab, int32_t n_batch);
// One pass of n tokens (all with logits) at positions depth.., timed in ms; 1e30 if it fails.
// `b` must hold at least n tokens.
double scratch_time_pass(llama_context * ctx, llama_batch & b, int32_t seq, int32_t depth, int32_t n, int32_t n_vocab);
// n successive 1-token passes (a drafted chain) at positions depth.., timed together: the mean
// ms per pass; 1e30 if one fails. `b` must hold at least 1 token.
double scratch_time_chain(llama_context * ctx, llama_batch & b, int32_t seq, int32_t depth, int32_t n, int32_t n_vocab);
// The median of ts (1e30 when empty): one stalled pass must not decide.
double median_ms(std::vector<double> ts);
// Passes the timers above have run in this process (prefills count one): what start-up
// measurement costs, which must stay a small constant whatever the model.
int64_t scratch_pass_count();

}  // namespace specrpc
