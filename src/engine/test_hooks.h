// Test-only switches that put a known bug back into the engine, so the distribution tests
// (tests/spec_distribution_test.cpp) can show in CI that they detect it. Never set outside tests;
// the default (NONE) is the correct engine.
#pragma once

#include <atomic>
#include <cstdint>

#include "speculative/draft_length.h"

namespace specrpc {

enum class DraftBug : int {
    NONE = 0,
    // Sampled model drafts: x ~ q, dropped when q(x) < p_min, the node keeps the unfiltered q
    // (47abea0's rule): the verified token comes from q restricted to {q >= p_min}.
    PMIN_FILTERS_SAMPLE = 1,
    // Sampled model drafts: p_min (decided from q's top before sampling) may stop a draft below
    // n_min, and a sampled draft shorter than n_min is discarded whole (47abea0's n_min rule):
    // the drafts that are verified are those whose sampled tokens led to confident continuations.
    NMIN_DISCARDS_SAMPLED = 2,
    // Draft trees: when the accepted path lies on a side branch, the main sequence keeps its own
    // (rejected) cells beside the copied path, so later passes attend to rejected tokens.
    TREE_KEEPS_REJECTED = 3,
    // The learned confidence stop of greedy model drafts: every drafted token counts in one bin,
    // so the stop knows the draft's acceptance but not what its confidence says of it.
    STOP_IGNORES_CONFIDENCE = 4,
    // Sampled probes in shadow: a plain round that rejects the shadow's token draws from p itself
    // instead of the residual max(0, p − q) (Engine::Impl::couple_with_shadow): the emitted
    // token leans towards the draft's.
    SHADOW_REJECTION_DRAWS_P = 5,
};

namespace test_hooks {
extern std::atomic<DraftBug> draft_bug;          // read by the engine thread every round
// > 0: the draft model samples at this temperature instead of the request's (read when a request
// starts). Any q is lossless when stored exactly; a q far from p makes the verifier's rejection
// and residual path run at most positions, which is what the distribution tests need.
extern std::atomic<float>    draft_temperature;
// true: the SUFFIX drafter attaches a made-up q to its deterministic tokens (engine/suffix_drafter.cpp)
extern std::atomic<bool>     suffix_claims_q;
// true: an engine without cached costs times them by the bounded probe (engine/cost_tracker.cpp)
// instead of guessing, as it does when no single slot's plain passes come to read t(1) from
extern std::atomic<bool>     force_cost_probe;
// non-null: every request's policy prices rounds on this curve instead of the measured one (read
// every round), and draft catch-ups are not timed into the probe budget, so a test of the
// policy's choices in the engine repeats exactly whatever the machine's timings. The pointee must
// outlive the requests that read it.
extern std::atomic<const CostModel *> fixed_cost;
// true: probes of deterministic model drafts are verified, as before they were compared with plain
// decoding in shadow (Engine::Impl::probe_in_shadow); read every round
extern std::atomic<bool>     verified_probes;
// true: every chain the draft model drafts while its slot compares no shadow becomes a shadow, and
// every chain drafted while one is compared is dropped, with or without a policy (read every
// round): all the output positions of the distribution tests are then drawn by the plain rounds'
// coupling with sampled shadows (Engine::Impl::probe_in_shadow)
extern std::atomic<bool>     shadow_every_draft;
// Plain rounds' tokens drawn coupled with a sampled shadow, and how many of them were the
// shadow's (Engine::Impl::couple_with_shadow): the tests read how often the rejection path ran
extern std::atomic<int64_t>  shadow_coupled, shadow_coupled_kept;
}  // namespace test_hooks

}  // namespace specrpc
