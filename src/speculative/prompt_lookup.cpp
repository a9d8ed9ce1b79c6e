#include "speculative/prompt_lookup.h"

#include "speculative/draft_length.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <optional>

namespace specrpc {

namespace {

// Token `i` of the virtual sequence context + draft; requires i < context.size() + draft.size().
token_id token_at(const std::vector<token_id> & context, const std::vector<token_id> & draft, size_t i) {
    return i < context.size() ? context[i] : draft[i - context.size()];
}

// The last n tokens of context + draft; requires n <= context.size() + draft.size().
Ngram suffix_ngram(const std::vector<token_id> & context, const std::vector<token_id> & draft, int n) {
    const size_t start = context.size() + draft.size() - size_t(n);
    Ngram        g;
    g.n = uint8_t(n);
    for (int i = 0; i < n; ++i) g.tokens[i] = token_at(context, draft, start + size_t(i));
    return g;
}

// Count of `token` in `counts` (sorted by token), 0 if absent.
uint32_t count_of(const TokenCounts & counts, token_id token) {
    auto it = std::lower_bound(counts.begin(), counts.end(), token,
                               [](const TokenCount & tc, token_id t) { return tc.token < t; });
    return it != counts.end() && it->token == token ? it->count : 0;
}

// The continuation of `counts` with the highest count * (1 + weight count), ties to the smaller
// id, if its own count passes min_count and min_percent of the total. `weights` may be null.
std::optional<token_id> pick_continuation(const TokenCounts & counts, const TokenCounts * weights,
                                          uint32_t min_count, uint32_t min_percent) {
    uint64_t total      = 0;
    uint64_t best_score = 0;
    uint32_t best_count = 0;
    token_id best       = 0;
    for (const TokenCount & tc : counts) {  // ascending token id: strict '>' keeps the smaller id
        total += tc.count;
        const uint64_t w     = weights ? count_of(*weights, tc.token) : 0;
        const uint64_t score = uint64_t(tc.count) * (1 + w);  // < 2^64: count, 1 + w <= 2^32
        if (score > best_score) {
            best_score = score;
            best_count = tc.count;
            best       = tc.token;
        }
    }
    if (best_count == 0 || best_count < min_count) return std::nullopt;
    if (100 * uint64_t(best_count) < uint64_t(min_percent) * total) return std::nullopt;
    return best;
}

// The first continuation of the longest suffix (n_max down to n_min) in `cache` that passes the
// length-specific thresholds.
std::optional<token_id> draft_from_cache(const NgramCache & cache, const std::vector<token_id> & context,
                                         const std::vector<token_id> & draft, int n_min, int n_max,
                                         const TokenCounts * weights,
                                         const std::array<uint32_t, NGRAM_MAX_LEN> & min_count,
                                         const std::array<uint32_t, NGRAM_MAX_LEN> & min_percent) {
    const size_t len = context.size() + draft.size();
    for (int n = n_max; n >= n_min; --n) {
        if (size_t(n) > len) continue;
        const TokenCounts * counts = cache.find(suffix_ngram(context, draft, n));
        if (counts == nullptr) continue;
        if (auto t = pick_continuation(*counts, weights, min_count[n - 1], min_percent[n - 1])) return t;
    }
    return std::nullopt;
}

}  // namespace

int lookup_draft_class(int match) {
    if (match <= 0) return 0;
    static constexpr int kUpper[] = {2, 3, 5, 9, 17, 33};  // class c + 1 holds matches up to kUpper[c]
    static_assert(std::size(kUpper) + 1 < kDraftClasses, "a class per bound, and one past the last");
    int c = 0;
    while (c < int(std::size(kUpper)) && match > kUpper[c]) ++c;
    return c + 1;
}

std::vector<token_id> prompt_lookup_draft(const std::vector<token_id> & tokens, const PromptLookupParams & p,
                                          int n_max, int * match) {
    std::vector<token_id> draft;
    if (match) *match = 0;
    if (n_max <= 0) return draft;
    const size_t len    = tokens.size();
    const int    n_min  = std::max(1, p.n_match_min);
    const int    n_maxm = std::max(n_min, p.n_match_max);
    for (int n = n_maxm; n >= n_min; --n) {
        if (len < size_t(n) + 1) continue;  // need the suffix plus at least one earlier token
        const size_t s      = len - size_t(n);  // start of the suffix
        size_t       best   = 0;                // start of the most recent occurrence
        size_t       best_l = 0;                // its match length (0 = none found)
        // Most recent occurrence first; j + n <= s keeps at least one token after it.
        for (size_t j = s; j-- > 0;) {
            if (!std::equal(tokens.begin() + j, tokens.begin() + j + n, tokens.begin() + s)) continue;
            best   = j;
            best_l = size_t(n);  // extend backwards while the occurrence agrees (j - k < s - k)
            while (best_l < size_t(kLookupMatchCap) && best_l - size_t(n) < j &&
                   tokens[j - 1 - (best_l - size_t(n))] == tokens[s - 1 - (best_l - size_t(n))])
                ++best_l;
            break;
        }
        if (best_l == 0) continue;
        size_t n_draft = size_t(n_max);
        if (p.draft_per_match > 0) n_draft = std::min(n_draft, size_t(p.draft_per_match) * best_l);
        for (size_t k = 0; k < n_draft; ++k) {  // src < len + k: copies may read the draft
            draft.push_back(token_at(tokens, draft, best + size_t(n) + k));
        }
        if (match) *match = int(best_l);
        return draft;
    }
    return draft;
}

std::vector<token_id> ngram_draft(const std::vector<token_id> & context, const NgramCache * ctx_cache,
                                  const NgramCache * dyn_cache, const NgramCache * static_cache,
                                  const NgramDraftParams & params, int n_max) {
    std::vector<token_id> draft;
    if (n_max <= 0) return draft;
    const int n_min  = std::clamp(params.ngram_min, 1, NGRAM_MAX_LEN);
    const int n_maxg = std::clamp(params.ngram_max, n_min, NGRAM_MAX_LEN);

    while (draft.size() < size_t(n_max)) {
        const size_t len = context.size() + draft.size();

        // 1. The static continuations of the longest suffix the static cache knows.
        const TokenCounts * stat = nullptr;
        if (static_cache != nullptr) {
            for (int n = static_cache->ngram_max(); n >= static_cache->ngram_min() && !stat; --n) {
                if (size_t(n) <= len) stat = static_cache->find(suffix_ngram(context, draft, n));
            }
        }
        const TokenCounts * weights = params.static_validate ? stat : nullptr;

        // 2. Context cache, then dynamic cache, then the static cache alone.
        std::optional<token_id> next;
        if (ctx_cache != nullptr) {
            next = draft_from_cache(*ctx_cache, context, draft, n_min, n_maxg, weights, params.ctx_min_count,
                                    params.ctx_min_percent);
        }
        if (!next && dyn_cache != nullptr) {
            next = draft_from_cache(*dyn_cache, context, draft, n_min, n_maxg, weights, params.dyn_min_count,
                                    params.dyn_min_percent);
        }
        if (!next && stat != nullptr) {
            next = pick_continuation(*stat, nullptr, params.static_min_count, params.static_min_percent);
        }
        if (!next) break;
        draft.push_back(*next);
    }
    return draft;
}

LookupReplayStats ngram_replay(const std::vector<token_id> & corpus, const NgramCache * dyn_cache,
                               const NgramCache * static_cache, const NgramDraftParams & params, int n_draft,
                               size_t n_prompt_tokens) {
    LookupReplayStats st;
    const size_t      len = corpus.size();
    if (n_prompt_tokens >= len) return st;

    // The "prompt": known before generation starts, and the seed of the context cache.
    std::vector<token_id> seq(corpus.begin(), corpus.begin() + ptrdiff_t(n_prompt_tokens));
    seq.reserve(len);
    NgramCache ctx(params.ngram_min, params.ngram_max);
    ctx.update(seq, seq.size());

    int64_t draft_ns = 0;
    size_t  i        = n_prompt_tokens;  // next corpus position to generate
    while (i < len) {
        // 1. Draft, leaving at least one corpus token for the verify step to emit.
        const int  limit = int(std::min<size_t>(size_t(std::max(n_draft, 0)), len - i - 1));
        const auto t0    = std::chrono::steady_clock::now();
        const auto draft = ngram_draft(seq, &ctx, dyn_cache, static_cache, params, limit);
        const auto t1    = std::chrono::steady_clock::now();
        draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();

        // 2. Greedy verification against the corpus.
        size_t accepted = 0;
        while (accepted < draft.size() && draft[accepted] == corpus[i + accepted]) ++accepted;
        st.n_drafted += draft.size();
        st.n_accepted += accepted;
        st.n_steps += 1;

        // 3. Emit the accepted tokens plus the target's own token; feed them to the context cache.
        const size_t n_emit = accepted + 1;
        seq.insert(seq.end(), corpus.begin() + ptrdiff_t(i), corpus.begin() + ptrdiff_t(i + n_emit));
        ctx.update(seq, n_emit);
        i += n_emit;
    }
    st.draft_us = draft_ns / 1000;
    return st;
}

}  // namespace specrpc
