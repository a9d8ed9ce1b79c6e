// Model-free drafters: tokens proposed by looking the recent context up, either directly in the
// token stream (prompt lookup) or in n-gram caches (speculative/ngram_cache.h). Both are deterministic,
// so their draft distribution q is one-hot (docs/design.md §2). Also a replay that measures how well the
// n-gram drafter would have done on a corpus, for `specrpc lookup stats`.
//
// Thread-safety: pure functions of their arguments; caches are only read.
#pragma once

#include "speculative/dist.h"
#include "speculative/ngram_cache.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace specrpc {

// ---------------------------------------------------------------------------------------------
// Prompt lookup

struct PromptLookupParams {
    int n_match_max = 4;  // longest suffix searched for, tokens (clamped to >= n_match_min)
    int n_match_min = 2;  // shortest suffix searched for, tokens (>= 1; 1 matches too eagerly)
    // At most this many draft tokens per token of the match, the match measured back from the
    // suffix as far as the occurrence agrees (up to kLookupMatchCap); 0 = no limit. A 1-token
    // match then drafts 2 tokens, not a whole γ of tokens that usually all fail.
    int draft_per_match = 2;
};

constexpr int kLookupMatchCap = 64;  // match lengths are measured up to this many tokens

// Up to n_max tokens continuing `tokens`: for n = n_match_max down to n_match_min, finds the most
// recent earlier occurrence of the last n tokens and proposes what followed it, at most
// draft_per_match tokens per token of the match. A continuation that runs into the end of
// `tokens` keeps copying from the draft itself (as LZ77 does), so a periodic tail is extended
// periodically. Empty if no suffix occurs earlier or n_max <= 0. `match`, if given, gets the
// length of the match the draft copies from (0 with an empty draft).
// O(tokens.size() * n_match_max + kLookupMatchCap + n_max).
std::vector<token_id> prompt_lookup_draft(const std::vector<token_id> & tokens, const PromptLookupParams & p,
                                          int n_max, int * match = nullptr);

// The draft class (draft_length.h, kDraftClasses) of a lookup draft copied from a match of
// `match` tokens: 1 for up to 2 tokens, then 3, 4-5, 6-9, 10-17, 18-33, and 7 for 34 or more; 0
// for none. Roughly doubling bounds: what a match says of the copy's future grows with its
// length, and a class needs rounds enough of its own to learn from.
int lookup_draft_class(int match);

// ---------------------------------------------------------------------------------------------
// N-gram cache drafting

// Acceptance thresholds of the n-gram drafter. Arrays are indexed by n-gram length - 1. A
// continuation is drafted only if it was seen at least min_count times AND makes up at least
// min_percent of all continuations of its n-gram; short n-grams are held to stricter values.
struct NgramDraftParams {
    int ngram_min = 1;  // shortest context suffix looked up, tokens [1, NGRAM_MAX_LEN]
    int ngram_max = 4;  // longest context suffix looked up, tokens [ngram_min, NGRAM_MAX_LEN]

    // Context cache (this request's own tokens): lax, repetition inside a request is reliable.
    std::array<uint32_t, NGRAM_MAX_LEN> ctx_min_count   = {2, 2, 1, 1};      // occurrences
    std::array<uint32_t, NGRAM_MAX_LEN> ctx_min_percent = {66, 50, 50, 50};  // % of n-gram total
    // Dynamic cache (earlier requests): strict, other requests are weaker evidence.
    std::array<uint32_t, NGRAM_MAX_LEN> dyn_min_count   = {4, 3, 2, 2};      // occurrences
    std::array<uint32_t, NGRAM_MAX_LEN> dyn_min_percent = {75, 66, 66, 66};  // % of n-gram total

    // Static cache (offline corpus): weights the candidates of the other two caches (a candidate's
    // score is its count times 1 + its static count after the longest suffix the static cache
    // knows), and drafts on its own as a last resort if these thresholds pass.
    bool     static_validate    = true;  // use static counts to choose between candidates
    uint32_t static_min_count   = 2;     // occurrences, last-resort drafting
    uint32_t static_min_percent = 50;    // % of n-gram total, last-resort drafting
};

// Up to n_max tokens continuing `context` (prompt + output so far). At each step, the suffixes of
// context + draft from ngram_max down to ngram_min are looked up in ctx_cache, then in dyn_cache;
// the best-scoring continuation of the longest suffix that passes its thresholds is drafted,
// else the static cache's own best one if it passes; drafting stops when nothing passes. Null
// caches are skipped. Ties go to the smaller token id. Deterministic; empty if n_max <= 0.
std::vector<token_id> ngram_draft(const std::vector<token_id> & context, const NgramCache * ctx_cache,
                                  const NgramCache * dyn_cache, const NgramCache * static_cache,
                                  const NgramDraftParams & params, int n_max);

// ---------------------------------------------------------------------------------------------
// Replay statistics

// What the n-gram drafter would have achieved generating a corpus greedily.
// Invariants: n_accepted <= n_drafted; n_accepted + n_steps == tokens generated.
struct LookupReplayStats {
    uint64_t n_drafted  = 0;  // tokens proposed
    uint64_t n_accepted = 0;  // proposed tokens equal to the corpus continuation (prefix-wise)
    uint64_t n_steps    = 0;  // simulated verify steps; each emits n_accepted_step + 1 tokens
    int64_t  draft_us   = 0;  // wall time spent in ngram_draft, microseconds

    double acceptance_rate() const { return n_drafted ? double(n_accepted) / double(n_drafted) : 0.0; }
    double tokens_per_step() const { return n_steps ? double(n_accepted + n_steps) / double(n_steps) : 0.0; }
};

// Walks corpus[n_prompt_tokens..] as if generating it greedily: at each position drafts up to
// n_draft tokens (never past the corpus's second-to-last token, so each step has a token to emit)
// from a context cache built on the fly from the corpus so far (ngram range from params) and
// the given dyn/static caches (read only, may be null), counts the matching prefix as accepted
// and advances by accepted + 1. Empty stats if n_prompt_tokens >= corpus.size().
LookupReplayStats ngram_replay(const std::vector<token_id> & corpus, const NgramCache * dyn_cache,
                               const NgramCache * static_cache, const NgramDraftParams & params, int n_draft,
                               size_t n_prompt_tokens);

}  // namespace specrpc
