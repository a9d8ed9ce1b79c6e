// What speculation costs on this machine, for the draft-length policy (docs/design.md §3): the
// target's cost curve v(n) (a pass over n tokens in 1-token passes), the draft cost ratio c and the
// per-round overhead o. Taken from this process's or the disk's cache (engine/cost_cache.h), else
// guessed on first use (cost_guess_curve, with t(1) read from the slot's first plain passes), then
// refined by every steady pass (speculative/cost_estimator.h). Nothing is timed for its own sake,
// except by the bounded probe: the fallback when no single slot's plain passes come to read t(1)
// from. The engine thread owns a CostTracker; only snapshot() is for other threads.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/cost_cache.h"
#include "speculative/cost_estimator.h"
#include "speculative/draft_length.h"
#include "specrpc/engine.hpp"

struct llama_context;
struct llama_batch;

namespace specrpc {

struct Slot;

// A longer pass never costs less than a shorter one: v(n) = min over m >= n of v(m), then made
// non-decreasing (see cost_tracker.cpp).
void cost_make_monotone(CostModel & cm);

// The costs this process measured, per cost key, for the next engine of the same key in it (the
// disk cache may be off). One per process: engines come and go, what they measured stays.
class CostMemo {
  public:
    static CostMemo & process();
    std::optional<CostRecord> get(const std::string & key) const;
    void                      put(const std::string & key, const CostRecord & rec);
    void                      clear();  // tests: as a new process would start

  private:
    mutable std::mutex                mutex_;
    std::map<std::string, CostRecord> records_;
};

class CostTracker {
  public:
    // Every pass of a round whose size equals the last round's is a steady sample of v(n) after
    // this many in a row (after a size change llama.cpp rebuilds the graph and caches refill); a
    // 1-token pass reaches plain decoding's speed only as the kSteadyPlainRun-th in a row.
    static constexpr int32_t kSteadyPlainRun = 5;

    // The curve prices passes of 1..kCurveMax tokens: a draft of up to SpecParams::kMaxDraft
    // plus its root. The start-up probe times up to 17 of them; past that the guess's shape, then
    // the passes the rounds run, price them (on 2 cores n/v(n) still grows to ~32: v(16) 6.3,
    // v(32) 10.0 on x100M, docs/benchmarks.md).
    static constexpr int32_t kCurveMax = SpecParams::kMaxDraft + 1;
    // The longest pass the curve prices for this engine: kCurveMax, or less when the batch is
    // smaller (no pass can exceed n_batch).
    static int32_t curve_len(const Engine::Impl & e);

    // The cost model on first speculative use, without timing anything: the one this process or
    // an earlier one on this machine measured for the same key, else a prior until the probe.
    void start(Engine::Impl & e);
    bool started() const { return measured_; }

    // Plain rounds a first use waits for a single slot's 1-token passes to read t(1) from (its
    // first pass after the prompt is not one: the prompt evicted the weights); after that many
    // without them (several slots at once, always) the bounded probe times the costs instead.
    static constexpr int32_t kGuessT1Passes  = 3;
    static constexpr int32_t kGuessMaxRounds = 48;
    // Depth at which a guessed curve's t(1) is read again (before_round).
    static constexpr int32_t kDeepT1Depth    = 128;

    // Before each round: the first round of a fresh engine decodes plain (the first token comes
    // as fast as without speculation); without cached costs, the next few rounds stay plain until
    // t(1) is read, and the guess takes over.
    void before_round(Engine::Impl & e, const std::vector<Slot *> & act);

    // A round's target pass of n_tok tokens on `threads` threads took ms, after `depth` cells of
    // the slot's context; only a single slot's pass is a sample.
    void observe_verify(int32_t n_tok, double ms, bool single_slot, int32_t threads, int32_t depth);
    // Whether a round's target pass would be a sample of the curve (observe_verify): the only
    // slot's, on the threads the curve was timed on, once the curve is seeded.
    bool samples(bool single_slot, int32_t threads) const {
        return single_slot && threads == threads_ && measured_ && est_.seeded();
    }
    // A model draft of n_tokens (one slot) took ms, catch-up excluded.
    void observe_draft(int32_t n_tokens, double ms);
    // A speculative round's overhead beyond its draft and verify passes, in ms.
    void observe_round_overhead(double ms);
    // A prompt or the probe came between two rounds: the next pass is no steady sample.
    void break_steady_run() { pass_last_n_ = 0; }

    const CostModel & model() const { return cost_; }  // v, c and o
    bool              seeded() const { return est_.seeded(); }  // a cached or probed curve is in use
    bool              guessed(int32_t n) const { return est_.guessed(n); }  // v(n) is the guess's
    int32_t           threads() const { return threads_; }       // threads the curve was timed on
    int32_t           draft_threads() const { return draft_threads_; } // threads a drafted token runs on
    double            t1() const { return t_target_1_; } // ms of a 1-token target pass (0: unknown)
    CostCurve         snapshot() const;                  // any thread

  private:
    void probe(Engine::Impl & e, Slot & s);
    void guess(Engine::Impl & e, int32_t threads);  // seeds est_ from cost_guess_curve and t1_reads_
    std::string key_for(const Engine::Impl & e, int32_t threads) const;  // key_ with the threads a curve ran on
    bool        from_cache(Engine::Impl & e, int32_t threads);            // seeds est_ from the memo or disk
    void publish();  // cost_ and t_target_1_ from est_; the snapshot; saves now and then

    CostModel     cost_;                  // set on first speculative use (cache, prior, probe)
    CostEstimator est_;                   // v(n), c and t(1): the cache or probe, refined online
    bool          measured_ = false;      // cost_ initialised (from the cache or a prior)
    bool          guess_due_ = false;     // nothing cached: t(1) is read from plain passes, then
                                          // the guessed curve is used (before_round)
    bool          probe_due_ = false;     // the guess found no passes to read: the bounded probe
                                          // runs after a slot's first token (before_round)
    bool          deep_due_ = false;      // the guess's t(1) is to be read again at depth
    bool          deep_reading_ = false;  // ... and the rounds are held plain for it now
    std::vector<double> t1_reads_;        // steady 1-token passes of a single slot, for the guess
    int32_t       t1_threads_ = 0;        // the threads they ran on
    int32_t       guess_rounds_ = 0;      // rounds held plain for them
    int32_t       looked_up_ = 0;         // thread count the caches were last asked for
    bool          hold_first_ = true;     // the engine's first speculative round decodes plain: a
                                          // fresh process's first token as fast as without
                                          // speculation, cached costs or not
    std::string   key_;                   // this engine's key in the cost cache
    std::string   key_threads_;           // the key of the curve in use (key_for(threads_))
    int64_t       next_save_ = 0;         // observations at which the costs are saved next
    int32_t       draft_threads_ = 0;     // threads a drafted token runs on
    int32_t       threads_ = 0;           // threads the cost curve was timed on
    double        t_target_1_ = 0;        // ms of a 1-token target pass at the last pass's depth (for o)
    int32_t       pass_last_n_ = 0;       // size of the last target pass of a round (0: a prompt
                                          // or the probe came between)
    int32_t       pass_run_ = 0;          // how many rounds in a row had that size

    mutable std::mutex snapshot_mutex_;
    CostCurve          snapshot_;         // copy of cost_ for other threads
};

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
