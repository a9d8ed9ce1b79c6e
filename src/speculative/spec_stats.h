// Speculative-decoding statistics of one request (or, merged, of a slot or the server): what was
// drafted, accepted and emitted, per draft position, where the time went, and the draft-length
// decisions. Plain value type; not thread-safe (merge copies across threads).
//
// Invariants (check_invariants): no bad add_round or add_empty call; n_accepted ≤ n_drafted;
// n_emitted = n_accepted + n_steps (each verification pass emits its accepted tokens plus one
// correction/bonus token);
// Σ accepted_at_pos = n_accepted; Σ drafted_at_pos ≤ n_drafted (= for chains: a tree has ≥ 1
// node per depth); per position accepted ≤ drafted; both non-increasing in the position; every
// verification pass and every empty round followed a decision of γ > 0.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace specrpc {

struct SpecStats {
    int64_t              n_drafted    = 0;    // draft tokens proposed (tree: all non-root nodes)
    int64_t              n_accepted   = 0;    // draft tokens accepted
    int64_t              n_steps      = 0;    // verification passes (rounds with ≥ 1 draft token)
    int64_t              n_emitted    = 0;    // tokens emitted by those passes
    std::vector<int64_t> drafted_at_pos;      // [i] = passes whose draft reached depth i + 1
    std::vector<int64_t> accepted_at_pos;     // [i] = passes that accepted depth i + 1
    double               t_draft_ms   = 0.0;  // time spent drafting
    double               t_verify_ms  = 0.0;  // time in the target's verification passes
    double               t_sample_ms  = 0.0;  // time computing p and accepting/resampling
    std::vector<int64_t> gamma_hist;          // [γ] = rounds for which γ was chosen (0 = plain)
    int64_t              n_off_rounds = 0;    // rounds the policy judged speculation not to pay
    // Rounds the confidence stop left with no draft worth a pass: the draft model ran, the target
    // decoded plain (no verification pass, so not in n_steps), and the draft's time then
    // (catch-ups after plain rounds left out), which t_draft_ms does not hold.
    int64_t              n_empty_rounds   = 0;
    double               t_empty_draft_ms = 0.0;
    int64_t              n_bad_rounds = 0;    // add_round and add_empty calls with impossible
                                              // values (not recorded); check_invariants fails
                                              // while > 0

    // Records one verification pass: `n_drafted` draft tokens (tree: nodes), `n_accepted_len`
    // accepted, the draft's depth (≤ 0: n_drafted, i.e. a chain) and the pass's timings.
    // Impossible values (negative, accepted > depth, depth > drafted) only count n_bad_rounds.
    void add_round(int n_drafted, int n_accepted_len, double t_draft_ms = 0.0,
                   double t_verify_ms = 0.0, double t_sample_ms = 0.0, int depth = 0);

    // Records one draft-length decision (DraftLengthPolicy::last_decision()).
    void add_decision(int gamma, bool off);

    // Records one round the confidence stop left empty, its draft having taken `t_draft_ms`
    // (negative: not recorded, only n_bad_rounds counts it).
    void add_empty(double t_draft_ms);

    // Adds `other` into this (counts, per-position vectors, timings, histogram).
    void merge(const SpecStats & other);

    // n_accepted / n_drafted; 0 when nothing was drafted.
    double accept_rate() const;

    // Tokens per verification pass, 1 + n_accepted / n_steps; 0 when there was no pass.
    double mean_accept_len() const;

    // Ok iff the invariants in the file comment hold; INTERNAL naming the first broken one.
    Status check_invariants() const;
};

}  // namespace specrpc
