// Engine internals: the slots (one per concurrently generated request), the task queue the
// public API feeds, and the contexts the engine thread owns. Everything here except the queue
// (guarded by `mutex`) and the metrics (guarded by `metrics_mutex`) is touched only by the engine
// thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/recent_median.h"
#include "engine/cost_tracker.h"
#include "engine/learned_cache.h"
#include "engine/model.h"
#include "engine/text_stream.h"
#include "engine/thread_choice.h"
#include "sampling/sampler.h"
#include "speculative/draft_length.h"
#include "speculative/ngram_cache.h"
#include "speculative/spec_stats.h"
#include "speculative/suffix_tree.h"
#include "speculative/tree_layout.h"
#include "speculative/verify.h"
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

// Whether a request's drafter chain holds drafter t.
inline bool chain_has(const std::vector<SpecType> & types, SpecType t) {
    return std::find(types.begin(), types.end(), t) != types.end();
}

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
    SuffixContext                      suffix;       // suffix trie of prompt + output (SUFFIX drafter)
    bool                               spec_on = false;
    bool                               free_drafters = false; // no draft model in the chain: drafting costs ~0
    bool                               feeds_ngrams = false;  // the chain has the NGRAM drafter: ctx_ngrams is kept
    bool                               copying = false;  // the prompt ends inside a copy of its own text
                                                         // (a regime of the learned prior, prior_key)
    double                             catch_up_ms = 0;  // this round's draft catch-up (draft_with_model)
    // Shadow draft (free drafters, in rounds that decode plain): what the drafters
    // would have proposed, compared with the tokens plain decoding then emits. Each comparison
    // is an unbiased sample of the acceptance (P(y = x) = p(x), the one-hot acceptance
    // probability), so the policy learns α without paying for probes.
    // A probe of a model draft is a shadow too (Impl::probe_in_shadow), booked as the probe's
    // outcome when the comparison ends, with the draft's confidence bins. A sampled probe keeps
    // the q each token was drawn from: the plain rounds then draw their tokens coupled with it
    // (sample_coupled), so the comparison has the law of the verification's outcome.
    std::vector<token_id>              shadow;
    std::vector<Dist>                  shadow_q;  // empty, or one q per shadow token
    size_t                             shadow_matched = 0;
    int32_t                            shadow_cls = 0;   // its draft class (draft_length.h)
    bool                               shadow_probe = false;
    std::vector<int8_t>                shadow_bins;
    void drop_shadow() {
        shadow.clear();
        shadow_matched = 0;
        shadow_probe   = false;
        shadow_bins.clear();
        shadow_q.clear();
    }

    CompletionResult  result;
    Clock::time_point t_start, t_gen_start;

    // the draft of the current round
    int32_t           gamma = 0;         // draft length the policy chose
    std::vector<token_id> proposal;      // a free drafter's proposal, made before γ was chosen
    int32_t           proposal_cls = 0;  // ... and its draft class, which γ was chosen on
    DraftTree         tree;
    // A greedy model draft under the learned confidence stop (SpecParams::p_min < 0): per drafted
    // depth, its confidence bin and the chance that the path up to it is accepted
    std::vector<int8_t> draft_bins;
    std::vector<double> draft_path_p;
    bool                stop_cut = false;  // ... which ended this round's chain before γ
    std::vector<int32_t> batch_idx;      // per tree node: index of its logits in the target batch
};

// A slot file action (Engine::save_slot / restore_slot / erase_slot), run by the engine thread
// between rounds.
struct SlotAction {
    enum Kind { SAVE, RESTORE, ERASE } kind = SAVE;
    int32_t     slot = -1;
    std::string path;
    std::promise<Result<SlotFileResult>> done;
};

// What a round's steps measured, for the statistics and the cost model.
struct RoundTimes {
    double draft_ms  = 0;      // step 1, all slots
    double verify_ms = 0;      // step 2, the target pass
    bool   drafted   = false;  // some slot verified a draft (the round was speculative)
    bool   one_slot  = false;  // the round ran a single slot (its times are that slot's)
};

// A slot's outcome of step 3: the verifier's result, and p at the nodes its walk reached (the
// others empty), which step 4 reports with the emitted tokens.
struct Verdict {
    VerifyResult      vr;
    std::vector<Dist> p;
};

// Smallest n_batch the engine accepts: start-up times target passes of up to 17 tokens.
constexpr int32_t kMinBatch = 17;

struct Engine::Impl {
    ~Impl();  // frees the contexts, then the pool (also when Engine::create fails half-way)
    EngineParams                 params;
    int32_t n_batch_prompt = 512;  // the caller's n_batch: tokens per prompt pass (params.n_batch may be larger)
    std::shared_ptr<Model>       target, draft;
    llama_context *              ctx = nullptr;      // target
    llama_context *              dft_ctx = nullptr;  // draft model (optional)
    ggml_threadpool *            threadpool = nullptr; // shared by both contexts (used in turn)
    std::vector<int>             pool_workers;         // its workers' thread ids (empty: unknown)
    bool                         pool_paused = false;  // engine thread only
    ThreadChoice                 thread_choice;      // passes on all threads or one (engine_threads.cpp)
    EngineInfo                   info;
    int32_t                      n_ctx_slot = 0;
    int32_t                      n_seq_per_slot = 1; // tree branches reserved per slot
    int32_t                      kv_tree_headroom = 0; // KV cells per slot beyond n_ctx_slot (tree nodes)
    bool                         kv_unified = false; // one cell pool for all sequences (trees, slots)
    std::vector<Slot>            slots;
    CostTracker                  costs;              // v(n), c, o: cached, probed, refined online
    static constexpr int         kFirstLook = 16;    // a fresh drafter drafts until this many
                                                     // positions are tested (DraftLengthOptions::
                                                     // first_look): at α ≈ 0.9 the estimate's
                                                     // spread is then ±0.075, not ±0.17 as after
                                                     // one 3-position round
    // What earlier requests taught the next one's draft-length policy (a fresh request starts
    // informed), per chain of drafters and acceptance regime (prior_key). Greedy,
    // rejection-sampled and one-hot-at-T>0 drafts of the same drafter accept at very different
    // rates, so one regime's requests must not set another's. Read from the learned cache
    // (learned_cache.h) by the first request that speculates, written after each that did.
    using Learned    = LearnedPrior;
    using LearnedKey = specrpc::LearnedKey;
    LearnedPriors                learned;
    std::optional<std::string>   learned_key;        // set once the cache was read; "" = none kept
    void                         learned_read();
    void                         learned_write();

    // n-gram caches shared by all requests; written by the engine thread (dynamic: after each
    // request) and by load/save callers, so every access holds ngram_mutex
    std::mutex                   ngram_mutex;
    NgramCache                   dyn_ngrams, static_ngrams;
    bool                         has_static_ngrams = false;
    // recent responses for the SUFFIX drafter (engine thread only: fed in finish, read in step)
    SuffixStore                  suffix_store;

    // task queue (guarded by mutex)
    std::mutex                   mutex;
    std::condition_variable      cv;
    std::deque<PendingRequest>   queue;
    std::vector<int64_t>         cancels;
    bool                         stopping = false;
    std::atomic<int64_t>         next_id{1};
    SpecParams                   default_spec;

    std::deque<std::shared_ptr<SlotAction>> slot_actions;  // guarded by mutex

    // Idle sleep (slot_state.cpp): the models and contexts are freed while `sleeping`. The engine
    // thread frees them holding model_mu exclusively; callers outside it that read the model
    // (tokenize, ...) hold it shared through awake_lock(), which loads them again first.
    mutable std::shared_mutex    model_mu;
    std::atomic<bool>            sleeping{false};
    std::atomic<int64_t>         last_use_ns{0};     // steady clock: the last call or finished work
    uint32_t                     n_ctx_cells = 0, n_seq_cells = 0;  // the contexts' sizes, to recreate them
    void   touch() { last_use_ns = Clock::now().time_since_epoch().count(); }
    std::shared_lock<std::shared_mutex> awake_lock();  // not owning: the models could not be loaded
    Status wake_locked();   // model_mu held exclusively
    void   sleep_if_idle(); // engine thread
    Result<SlotFileResult> slot_action(const SlotAction & a);  // engine thread

    mutable std::mutex           metrics_mutex;
    EngineMetrics                metrics;

    std::thread                  thread;

    // RPC workers (rpc_recover.cpp). `target` keeps serving its vocabulary to the other threads
    // (tokenize) for the engine's life; after a lost worker the target is loaded again into
    // target_weights, which then owns the weights `ctx` runs on.
    std::shared_ptr<Model>       target_weights;
    std::atomic<bool>            degraded{false};  // a worker was lost and the target not reloaded yet
    mutable std::mutex           rpc_mutex;
    std::string                  rpc_down;         // guarded by rpc_mutex: why requests fail meanwhile
    Clock::time_point            rpc_next_probe{};
    Status rpc_status() const;   // ok, or UNAVAILABLE naming the lost worker
    Status rpc_check();          // rpc_status(), entering the degraded state when not ok
    void   rpc_watch();          // after each round: enter the degraded state, or try to leave it
    bool   rpc_recover();

    // engine.cpp
    void run();
    void admit(PendingRequest && pr);
    void finish(Slot & s, StopType stop);
    void fail(Slot & s, Status st);
    Status eval_prompt(Slot & s);
    Slot * pick_slot(const std::vector<token_id> & prompt);
    CostModel slot_cost(const Slot & s) const;
    // step.cpp: one round for every active slot, told in its four steps
    void step();
    double step_draft(const std::vector<Slot *> & act);                   // 1. ms spent
    Status step_verify(const std::vector<Slot *> & act, RoundTimes & r);  // 2. one target pass
    Status step_accept(Slot & s, Verdict & v);                            // 3. the verifier's walk
    void   step_book_keep(Slot & s, const Verdict & v, const RoundTimes & r, Clock::time_point t_accept);  // 4.
    bool emit(Slot & s, token_id tok, int32_t source, const float * logits, const Dist & p);
    std::vector<token_id> propose_free(Slot & s, SpecType t, int32_t gamma, int32_t * cls = nullptr);
    void shadow_observe(Slot & s, token_id emitted);
    void probe_in_shadow(Slot & s, bool timed);  // timed: the round's pass is a cost sample
    Result<token_id> couple_with_shadow(Slot & s, const Dist & p);
    // suffix_drafter.cpp: the SUFFIX drafter's tree for this round (false: no proposal), its chain
    // for shadow drafts (*cls: its match's draft class), and a finished request's tokens into the
    // shared store
    bool propose_suffix(Slot & s, int32_t node_cap);
    std::vector<token_id> suffix_chain(Slot & s, int32_t n_max, int32_t * cls = nullptr);
    void suffix_record(const Slot & s);
    Status decode_or_error(llama_context * c, ::llama_batch & b, const char * what);
    std::vector<int32_t> draft_node_caps(const std::vector<Slot *> & act);
    Status verify_pass(const std::vector<Slot *> & act, int32_t * n_tok);
    // draft_model.cpp
    // Drafts for every slot in `slots_needing`; returns the ms spent catching the draft KV up
    // after plain rounds or a new prompt (syncs of more than 2 tokens), which is not drafting
    // cost per token and must stay out of the observed c.
    double draft_with_model(std::vector<Slot *> & slots_needing);
    int32_t draft_sync(Slot & s);  // tokens decoded
    // engine_threads.cpp: before a round's target pass, the process CPU time (NaN: not read this
    // pass); after it, the pass (n_tok tokens, wall ms) for the thread-count choice
    double threads_cpu_mark();
    void threads_after_pass(int32_t n_tok, double wall_ms, double cpu_mark);
};

}  // namespace specrpc
