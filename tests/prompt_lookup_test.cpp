// Model-free drafters: prompt lookup, n-gram cache drafting (thresholds, cache order, static
// validation, persistence) and the replay statistics.
#include "speculative/draft_length.h"
#include "speculative/prompt_lookup.h"

#include <gtest/gtest.h>

#include "test_util.h"

#include <cstdio>
#include <random>
#include <string>
#include <unistd.h>

namespace specrpc {
namespace {

using Tokens = std::vector<token_id>;

Tokens random_tokens(size_t n, int vocab, uint32_t seed) {
    std::mt19937                       rng(seed);
    std::uniform_int_distribution<int> d(0, vocab - 1);
    Tokens                             v(n);
    for (auto & t : v) t = d(rng);
    return v;
}

Tokens periodic(const Tokens & period, size_t n) {
    Tokens v;
    for (size_t i = 0; i < n; ++i) v.push_back(period[i % period.size()]);
    return v;
}

NgramCache cache_of(const Tokens & t, int nmin = 1, int nmax = 4) {
    NgramCache c(nmin, nmax);
    c.update(t, t.size());
    return c;
}

// ---- prompt lookup ----

TEST(PromptLookup, FindsMostRecentMatch) {
    const Tokens t = {1, 2, 3, 10, 11, 1, 2, 3, 20, 21, 7, 1, 2, 3};
    EXPECT_EQ(prompt_lookup_draft(t, {}, 2), (Tokens{20, 21}));
    EXPECT_EQ(prompt_lookup_draft(t, {}, 3), (Tokens{20, 21, 7}));
}

TEST(PromptLookup, PrefersLongerMatch) {
    const Tokens t = {5, 1, 2, 30, 9, 9, 6, 1, 2, 40, 8, 5, 1, 2};
    EXPECT_EQ(prompt_lookup_draft(t, {}, 1), (Tokens{30}));  // [5 1 2] beats the later [1 2]
    PromptLookupParams p;
    p.n_match_max = 2;
    EXPECT_EQ(prompt_lookup_draft(t, p, 1), (Tokens{40}));
}

TEST(PromptLookup, ExtendsPeriodicTailAndHandlesEdges) {
    PromptLookupParams unlimited;
    unlimited.draft_per_match = 0;
    EXPECT_EQ(prompt_lookup_draft({1, 2, 3, 1, 2, 3}, unlimited, 7), (Tokens{1, 2, 3, 1, 2, 3, 1}));
    EXPECT_EQ(prompt_lookup_draft({1, 2, 3, 1, 2, 3}, {}, 7), (Tokens{1, 2, 3, 1, 2, 3}));  // 3 matched: 6
    EXPECT_TRUE(prompt_lookup_draft({1, 2, 3, 4, 5}, {}, 4).empty());  // nothing repeats
    EXPECT_TRUE(prompt_lookup_draft({1, 2, 1, 2}, {}, 0).empty());
    EXPECT_TRUE(prompt_lookup_draft({}, {}, 4).empty());
    PromptLookupParams one;
    one.n_match_min = 1;
    EXPECT_TRUE(prompt_lookup_draft({4, 8, 9, 4}, {}, 2).empty());  // default min is 2
    EXPECT_EQ(prompt_lookup_draft({4, 8, 9, 4}, one, 2), (Tokens{8, 9}));
}

// The draft is as long as its match justifies: a 1-token match (the engine's default match
// minimum is 1) proposes 2 tokens, not the whole γ, which on copy-heavy text mostly failed and
// pulled the policy's acceptance down (bench/copy_bench --replay: mean predicted S 0.67 -> 1.26
// at γ 16 on 12 copy-heavy prompts); a match that runs back 8 tokens proposes 16.
TEST(PromptLookup, DraftLengthFollowsMatchLength) {
    PromptLookupParams one;
    one.n_match_min = 1;
    // ... 9 | 5 6 7 8 ... 9: only [9] matches (4 before the first 9 differs from 3 before the last)
    const Tokens short_match = {4, 9, 5, 6, 7, 8, 20, 21, 22, 3, 9};
    EXPECT_EQ(prompt_lookup_draft(short_match, one, 8), (Tokens{5, 6}));
    // the same continuation after an 8-token match: the whole γ (copying into the draft)
    Tokens long_match = {30, 31, 32, 33, 34, 35, 36, 37, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 40,
                         30, 31, 32, 33, 34, 35, 36, 37};
    EXPECT_EQ(prompt_lookup_draft(long_match, one, 16),
              (Tokens{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 40}));
    // a 3-token match: 6 tokens
    const Tokens three = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 2, 3, 4};
    EXPECT_EQ(prompt_lookup_draft(three, {}, 16), (Tokens{5, 6, 7, 8, 9, 10}));
    PromptLookupParams x1 = one;
    x1.draft_per_match = 1;
    EXPECT_EQ(prompt_lookup_draft(three, x1, 16), (Tokens{5, 6, 7}));
    // the match is measured past n_match_max, up to kLookupMatchCap
    Tokens very_long;
    for (int i = 0; i < 100; ++i) very_long.push_back(100 + i);
    very_long.push_back(7);
    for (int i = 0; i < 100; ++i) very_long.push_back(100 + i);
    const Tokens d = prompt_lookup_draft(very_long, {}, 300);
    ASSERT_EQ(d.size(), size_t(2 * kLookupMatchCap));
    EXPECT_EQ(d[0], 7);
    EXPECT_EQ(d[1], 100);
}

// The match a draft copies from is reported with it, and its class grows with it: the policy
// learns one acceptance profile per class (draft_length.h, kDraftClasses).
TEST(PromptLookup, ReportsTheMatchAndItsClass) {
    int match = -1;
    const Tokens three = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 2, 3, 4};
    EXPECT_EQ(prompt_lookup_draft(three, {}, 16, &match), (Tokens{5, 6, 7, 8, 9, 10}));
    EXPECT_EQ(match, 3);
    EXPECT_TRUE(prompt_lookup_draft({1, 2, 3, 4, 5}, {}, 4, &match).empty());
    EXPECT_EQ(match, 0);
    Tokens very_long;
    for (int i = 0; i < 100; ++i) very_long.push_back(100 + i);
    very_long.push_back(7);
    for (int i = 0; i < 100; ++i) very_long.push_back(100 + i);
    prompt_lookup_draft(very_long, {}, 8, &match);
    EXPECT_EQ(match, kLookupMatchCap);

    const std::vector<std::pair<int, int>> bounds = {{0, 0},  {1, 1},  {2, 1},  {3, 2},  {4, 3},  {5, 3},
                                                     {6, 4},  {9, 4},  {10, 5}, {17, 5}, {18, 6}, {33, 6},
                                                     {34, 7}, {64, 7}, {1000, 7}};
    for (auto [m, c] : bounds) EXPECT_EQ(lookup_draft_class(m), c) << m;
    for (int m = 1; m <= 100; ++m) {
        EXPECT_LT(lookup_draft_class(m), kDraftClasses);
        EXPECT_GE(lookup_draft_class(m + 1), lookup_draft_class(m));
    }
}

// In the engine a lookup match is at least 2 tokens even at the request's default ngram_min of 1
// (which suits the n-gram caches, whose counts guard 1-grams): a 1-token match has no such guard.
TEST(PromptLookupEngine, RequestNgramMinOneDraftsAsTwo) {
    using namespace test;
    auto e = make_engine();  // stories260K-F32: its greedy text repeats words, not whole phrases
    ASSERT_NE(e, nullptr);
    auto run = [&](int ngram_min) {
        auto req           = greedy_request(*e, "Once upon a time", 96);
        req.spec.types     = {SpecType::LOOKUP};
        req.spec.n_max     = 4;
        req.spec.adaptive  = false;
        req.spec.ngram_min = ngram_min;
        return e->complete(req).value();
    };
    const auto plain = output_ids(e->complete(greedy_request(*e, "Once upon a time", 96)).value());
    run(2);  // the engine's first speculative request holds a plain round and probes the costs
    const auto one = run(1);
    const auto two = run(2);
    EXPECT_EQ(output_ids(one), plain);
    EXPECT_EQ(output_ids(two), plain);
    EXPECT_GT(two.spec.draft_n, 0);
    EXPECT_EQ(one.spec.draft_n, two.spec.draft_n);
    EXPECT_EQ(one.spec.draft_n_accepted, two.spec.draft_n_accepted);
}

// ---- n-gram drafting ----

TEST(NgramDraft, ProposesTrueContinuationOfRepetitiveText) {
    const Tokens period = {10, 11, 12, 13, 14};
    Tokens       ctx    = periodic(period, 32);  // ends with ... 10 11
    NgramCache   c      = cache_of(ctx);
    EXPECT_EQ(ngram_draft(ctx, &c, nullptr, nullptr, {}, 8), (Tokens{12, 13, 14, 10, 11, 12, 13, 14}));
    // Same from the dynamic cache alone, and from both.
    EXPECT_EQ(ngram_draft(ctx, nullptr, &c, nullptr, {}, 3), (Tokens{12, 13, 14}));
    EXPECT_EQ(ngram_draft(ctx, &c, &c, &c, {}, 3), (Tokens{12, 13, 14}));
    EXPECT_TRUE(ngram_draft(ctx, &c, nullptr, nullptr, {}, 0).empty());
    EXPECT_TRUE(ngram_draft(ctx, nullptr, nullptr, nullptr, {}, 8).empty());
}

TEST(NgramDraft, LongestSuffixWins) {
    // After 1: 2 four times, 3 twice; after [8 1]: always 3.
    const Tokens ctx = {7, 1, 2, 8, 1, 3, 8, 1, 3, 9, 1, 2, 9, 1, 2, 9, 1, 2, 8, 1};
    NgramCache   c   = cache_of(ctx);
    EXPECT_EQ(ngram_draft(ctx, &c, nullptr, nullptr, {}, 1), (Tokens{3}));
    NgramDraftParams p;
    p.ngram_max = 1;
    EXPECT_EQ(ngram_draft(ctx, &c, nullptr, nullptr, p, 1), (Tokens{2}));
}

TEST(NgramDraft, ThresholdsStopOnAmbiguousData) {
    // 99 was followed by five different tokens; the suffix [6 99] is new.
    const Tokens ctx = {99, 1, 99, 2, 99, 3, 99, 4, 99, 5, 6, 99};
    NgramCache   c   = cache_of(ctx);
    EXPECT_TRUE(ngram_draft(ctx, &c, nullptr, nullptr, {}, 4).empty());
    EXPECT_TRUE(ngram_draft(ctx, nullptr, &c, nullptr, {}, 4).empty());
    NgramDraftParams lax;  // without thresholds the same data does produce a draft
    lax.ctx_min_count.fill(1);
    lax.ctx_min_percent.fill(0);
    const Tokens d = ngram_draft(ctx, &c, nullptr, nullptr, lax, 1);
    EXPECT_EQ(d, (Tokens{1}));  // tie among five goes to the smallest id

    // Enough samples but no majority: 1 and 2 each followed 99 twice (50% < 66% for 1-grams).
    const Tokens split = {99, 1, 99, 2, 99, 1, 99, 2, 6, 99};
    NgramCache   sc    = cache_of(split);
    EXPECT_TRUE(ngram_draft(split, &sc, nullptr, nullptr, {}, 1).empty());
    NgramDraftParams half;
    half.ctx_min_percent[0] = 50;
    EXPECT_EQ(ngram_draft(split, &sc, nullptr, nullptr, half, 1), (Tokens{1}));

    // A continuation seen once is enough for a 3-gram in the context cache, not in the dynamic one.
    const Tokens once = {4, 5, 6, 7, 0, 4, 5, 6};
    NgramCache   o    = cache_of(once, 3, 3);
    NgramDraftParams p3;
    p3.ngram_min = 3;
    p3.ngram_max = 3;
    EXPECT_EQ(ngram_draft(once, &o, nullptr, nullptr, p3, 1), (Tokens{7}));
    EXPECT_TRUE(ngram_draft(once, nullptr, &o, nullptr, p3, 1).empty());
}

TEST(NgramDraft, StaticCacheChoosesAndIsLastResort) {
    const Tokens     ctx = {1, 2, 3, 50, 1, 2, 3, 60, 1, 2, 3};
    NgramCache       c   = cache_of(ctx, 3, 3);
    NgramDraftParams p;
    p.ngram_min = 3;
    p.ngram_max = 3;
    EXPECT_EQ(ngram_draft(ctx, &c, nullptr, nullptr, p, 1), (Tokens{50}));  // tie -> smaller id

    NgramCache stat(2, 2);  // the corpus says [2 3] is usually followed by 60
    stat.update({2, 3, 60, 2, 3, 60, 2, 3, 60, 2, 3, 50}, 12);
    EXPECT_EQ(ngram_draft(ctx, &c, nullptr, &stat, p, 1), (Tokens{60}));
    p.static_validate = false;
    EXPECT_EQ(ngram_draft(ctx, &c, nullptr, &stat, p, 1), (Tokens{50}));

    // Nothing in the context cache: the static cache drafts alone if its thresholds pass.
    NgramCache empty;
    EXPECT_EQ(ngram_draft({8, 2, 3}, &empty, nullptr, &stat, {}, 1), (Tokens{60}));
    NgramDraftParams strict;
    strict.static_min_percent = 80;  // 60 has 3 of 4 = 75%
    EXPECT_TRUE(ngram_draft({8, 2, 3}, &empty, nullptr, &stat, strict, 1).empty());
}

TEST(NgramDraft, SameDraftsAfterSaveAndLoad) {
    const Tokens corpus = random_tokens(4000, 30, 11);
    NgramCache   dyn    = cache_of(corpus);
    const std::string path = testing::TempDir() + "prompt_lookup_test_" + std::to_string(::getpid()) + ".bin";
    ASSERT_TRUE(dyn.save(path).is_ok());
    auto loaded = NgramCache::load(path);
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    std::remove(path.c_str());

    NgramDraftParams lax;  // low thresholds so that random data drafts often
    lax.dyn_min_count.fill(1);
    lax.dyn_min_percent.fill(20);
    int n_nonempty = 0;
    for (size_t end = 10; end < corpus.size(); end += 37) {
        const Tokens ctx(corpus.begin(), corpus.begin() + end);
        const Tokens a = ngram_draft(ctx, nullptr, &dyn, nullptr, lax, 6);
        const Tokens b = ngram_draft(ctx, nullptr, &*loaded, nullptr, lax, 6);
        ASSERT_EQ(a, b) << "end " << end;
        n_nonempty += !a.empty();
    }
    EXPECT_GT(n_nonempty, 10);
}

// ---- replay ----

void expect_invariants(const LookupReplayStats & st, size_t n_generated) {
    EXPECT_LE(st.n_accepted, st.n_drafted);
    EXPECT_EQ(st.n_accepted + st.n_steps, n_generated);
    EXPECT_GE(st.draft_us, 0);
}

TEST(NgramReplay, PeriodicCorpusIsAlmostFullyAccepted) {
    const Tokens corpus = periodic({3, 1, 4, 1, 5, 9, 2}, 2000);
    const auto   st     = ngram_replay(corpus, nullptr, nullptr, {}, 8, 20);
    expect_invariants(st, corpus.size() - 20);
    EXPECT_GT(st.acceptance_rate(), 0.95);
    EXPECT_GT(st.tokens_per_step(), 7.0);  // n_draft 8 -> at most 9 per step
}

TEST(NgramReplay, RandomCorpusIsRarelyAccepted) {
    const Tokens corpus = random_tokens(3000, 1000, 12);
    const auto   st     = ngram_replay(corpus, nullptr, nullptr, {}, 8, 0);
    expect_invariants(st, corpus.size());
    EXPECT_LT(st.n_accepted, corpus.size() / 50);
    EXPECT_LT(st.tokens_per_step(), 1.05);
}

TEST(NgramReplay, DynamicCacheFromSameTextHelps) {
    const Tokens corpus = random_tokens(1500, 1000, 13);
    NgramCache   dyn    = cache_of(corpus);
    dyn.merge(cache_of(corpus));  // as if seen twice: passes the strict dynamic thresholds
    const auto   without = ngram_replay(corpus, nullptr, nullptr, {}, 6, 0);
    const auto   with    = ngram_replay(corpus, &dyn, nullptr, {}, 6, 0);
    expect_invariants(without, corpus.size());
    expect_invariants(with, corpus.size());
    EXPECT_GT(with.n_accepted, corpus.size() / 2);
    EXPECT_GT(with.n_accepted, 10 * (without.n_accepted + 1));
}

TEST(NgramReplay, EdgeCases) {
    const Tokens corpus = periodic({1, 2}, 10);
    const auto   none   = ngram_replay(corpus, nullptr, nullptr, {}, 4, 10);
    EXPECT_EQ(none.n_steps, 0u);
    const auto zero = ngram_replay(corpus, nullptr, nullptr, {}, 0, 0);
    EXPECT_EQ(zero.n_drafted, 0u);
    EXPECT_EQ(zero.n_steps, corpus.size());
    EXPECT_EQ(ngram_replay({}, nullptr, nullptr, {}, 4, 0).n_steps, 0u);
}

}  // namespace
}  // namespace specrpc
