// Engine internals: the slots (one per concurrently generated request), the task queue the
// public API feeds, and the contexts the engine thread owns. Everything here except the queue
// (guarded by `mutex`) and the metrics (guarded by `metrics_mutex`) is touched only by the engine
// thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/recent_median.h"
#include "engine/model.h"
#include "engine/text_stream.h"
#include "engine/thread_choice.h"
#include "sampling/sampler.h"
#include "spec/cost_estimator.h"
#include "spec/draft_length.h"
#include "spec/ngram_cache.h"
#include "spec/spec_stats.h"
#include "spec/tree_layout.h"
#include "spec/verify.h"
#include "specrpc/engine.hpp"

struct llama_context;
struct llama_batch;
struct ggml_threadpool;

namespace specrpc {

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct PendingRequest {
    int64_t           id;
    CompletionRequest req;
    CompletionSink    sink;
};

// One request being generated. Positions: cache[i] sits at KV position i of the slot's sequence
// in the target context; `pending` is the last emitted token, not yet in the KV (the next target
// pass starts with it). The draft context mirrors the same sequence in `dft_cache`.
struct Slot {
    int32_t  id  = 0;
    int32_t  seq = 0;                    // main sequence id (target and draft contexts)
    bool     active = false;
    bool     cancelled = false;
    int64_t  req_id = -1;
    CompletionRequest req;
    CompletionSink    sink;

    std::vector<token_id> cache;         // tokens in the target KV (prompt + accepted output)
    std::vector<token_id> dft_cache;     // tokens in the draft KV
    token_id              pending = -1;  // emitted, not yet in the KV
    int32_t               n_prompt = 0;  // prompt tokens (after truncation)
    std::vector<token_id> output;        // emitted tokens
    std::vector<token_id> all;           // prompt + output (what drafters continue)
    SpecStats             stats;         // speculation statistics of this request
    int64_t               n_passes = 0;  // target passes during generation

    std::unique_ptr<Sampler>           sampler;      // target sampling state
    std::unique_ptr<Sampler>           dft_sampler;  // draft model sampling state (same params)
    std::unique_ptr<TextStream>        text;
    std::unique_ptr<DraftLengthPolicy> policy;
    NgramCache                         ctx_ngrams;   // n-grams of prompt + output (NGRAM drafter)
    bool                               spec_on = false;
    bool                               free_drafters = false; // no draft model in the chain: drafting costs ~0
    double                             catch_up_ms = 0;  // this round's draft catch-up (draft_with_model)
    // Shadow draft (free drafters, while the policy has speculation off): what the drafters
    // would have proposed, compared with the tokens plain decoding then emits. Each comparison
    // is an unbiased sample of the acceptance (P(y = x) = p(x), the one-hot acceptance
    // probability), so the policy learns α without paying for probes.
    std::vector<token_id>              shadow;
    size_t                             shadow_matched = 0;

    CompletionResult  result;
    Clock::time_point t_start, t_gen_start;

    // the draft of the current round
    int32_t           gamma = 0;         // draft length the policy chose
    DraftTree         tree;
    std::vector<int32_t> batch_idx;      // per tree node: index of its logits in the target batch
};

void cost_make_monotone(CostModel & cm);

// Smallest n_batch the engine accepts: start-up times target passes of up to 17 tokens.
constexpr int32_t kMinBatch = 17;

struct Engine::Impl {
    ~Impl();  // frees the contexts, then the pool (also when Engine::create fails half-way)
    EngineParams                 params;
    std::shared_ptr<Model>       target, draft;
    llama_context *              ctx = nullptr;      // target
    llama_context *              dft_ctx = nullptr;  // draft model (optional)
    ggml_threadpool *            threadpool = nullptr; // shared by both contexts (used in turn)
    bool                         pool_paused = false;  // engine thread only
    ThreadChoice                 thread_choice;      // passes on all threads or one (engine_threads.cpp)
    EngineInfo                   info;
    int32_t                      n_ctx_slot = 0;
    int32_t                      n_seq_per_slot = 1; // tree branches reserved per slot
    int32_t                      kv_tree_headroom = 0; // KV cells per slot beyond n_ctx_slot (tree nodes)
    bool                         kv_unified = false; // one cell pool for all sequences (trees, slots)
    std::vector<Slot>            slots;
    CostModel                    cost;               // set on first speculative use (cache, prior, probe)
    CostEstimator                cost_est;           // v(n), c and t(1): the cache or probe, refined online
    bool                         cost_measured = false; // cost initialised (from the cache or a prior)
    bool                         cost_probe_due = false;// nothing cached: the bounded probe runs after
                                                     // a slot's first token (cost_before_round)
    bool                         cost_hold_first = true;// the engine's first speculative round decodes
                                                     // plain: a fresh process's first token as fast
                                                     // as without speculation, cached costs or not
    std::string                  cost_key;           // this engine's key in the cost cache
    int64_t                      cost_next_save = 0; // observations at which the costs are saved next
    int32_t                      draft_threads = 0;  // threads a drafted token runs on
    int32_t                      cost_threads = 0;   // threads the cost curve was measured on
    double                       t_target_1 = 0;     // ms of a 1-token target pass (for o)
    int32_t                      pass_last_n = 0;    // size of the last target pass of a round (0: a
                                                     // prompt or the probe came between)
    int32_t                      pass_run    = 0;    // how many rounds in a row had that size
    static constexpr int32_t     kSteadyPlainRun = 5;// a 1-token pass is timed as plain decoding
                                                     // runs it: the 5th in a row or later
    static constexpr int         kFirstLook = 16;    // a fresh drafter drafts until this many
                                                     // positions are tested (DraftLengthOptions::
                                                     // first_look): at α ≈ 0.9 the estimate's
                                                     // spread is then ±0.075, not ±0.17 as after
                                                     // one 3-position round
    // What earlier requests taught the next one's draft-length policy (a fresh request starts
    // informed), per first drafter of the chain and acceptance regime (prior_key). Greedy,
    // rejection-sampled and one-hot-at-T>0 drafts of the same drafter accept at very different
    // rates, so one regime's requests must not set another's.
    struct Learned {
        std::optional<double> alpha;   // per-position acceptance: the next prior
        std::vector<double>   depth;   // acceptance by depth of the last request that drafted
                                       // enough to measure it (empty: none yet)
        ProbeLedger           ledger;  // the probe budget's books
    };
    std::map<std::pair<SpecType, int>, Learned> learned;

    // n-gram caches shared by all requests; written by the engine thread (dynamic: after each
    // request) and by load/save callers, so every access holds ngram_mutex
    std::mutex                   ngram_mutex;
    NgramCache                   dyn_ngrams, static_ngrams;
    bool                         has_static_ngrams = false;

    // task queue (guarded by mutex)
    std::mutex                   mutex;
    std::condition_variable      cv;
    std::deque<PendingRequest>   queue;
    std::vector<int64_t>         cancels;
    bool                         stopping = false;
    std::atomic<int64_t>         next_id{1};
    SpecParams                   default_spec;

    mutable std::mutex           metrics_mutex;
    EngineMetrics                metrics;
    CostCurve                    cost_snapshot;      // copy of `cost` for other threads

    std::thread                  thread;

    // engine.cpp
    void run();
    void admit(PendingRequest && pr);
    void finish(Slot & s, StopType stop);
    void fail(Slot & s, Status st);
    Status eval_prompt(Slot & s);
    Slot * pick_slot(const std::vector<token_id> & prompt);
    CostModel slot_cost(const Slot & s) const;
    // step.cpp: one draft → verify → accept round for every active slot
    void step();
    bool emit(Slot & s, token_id tok, int32_t source, const float * logits, const Dist & p);
    std::vector<token_id> propose_free(Slot & s, SpecType t, int32_t gamma);
    void shadow_observe(Slot & s, token_id emitted);
    Status decode_or_error(llama_context * c, ::llama_batch & b, const char * what);
    std::vector<int32_t> draft_node_caps(const std::vector<Slot *> & act);
    Status verify_pass(const std::vector<Slot *> & act, int32_t * n_tok);
    // draft_model.cpp
    // Drafts for every slot in `slots_needing`; returns the ms spent catching the draft KV up
    // after plain rounds or a new prompt (syncs of more than 2 tokens), which is not drafting
    // cost per token and must stay out of the observed c.
    double draft_with_model(std::vector<Slot *> & slots_needing);
    int32_t draft_sync(Slot & s);  // tokens decoded
    // The cost model on first speculative use: the cache's, else a prior until the probe runs.
    void measure_costs(Slot & starting);
    std::string cost_key_for(int32_t threads) const;  // cost_key with the threads a curve ran on
    bool cost_from_cache(int32_t threads);            // seeds cost_est from the memo or disk
    // Before each round: the first round of a fresh engine decodes plain (the first token comes
    // as fast as without speculation); without cached costs, the round after it runs the bounded probe.
    void cost_before_round(const std::vector<Slot *> & act);
    void cost_probe_run(Slot & s);
    void cost_publish();  // cost and t_target_1 from cost_est; the snapshot; saves now and then
    void observe_pass(int32_t n_tokens, double ms, bool steady);
    void observe_draft(int32_t n_tokens, double ms);
    // engine_threads.cpp: before a round's target pass, the process CPU time (NaN: not read this
    // pass); after it, the pass (n_tok tokens, wall ms) for the thread-count choice
    double threads_cpu_mark();
    void threads_after_pass(int32_t n_tok, double wall_ms, double cpu_mark);
};

}  // namespace specrpc
