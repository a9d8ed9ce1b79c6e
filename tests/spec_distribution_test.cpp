// Lossless at every option, tested through the engine (the public C++ API, real models) where
// the tests have power: drafts run 4–5 deep, and the draft (stories260K-Q4_0 for the F32 target)
// samples at T = 2 where the target samples at T = 1 (test_hooks::draft_temperature), so 40–70%
// of the drafted tokens are rejected and the residual path runs in most rounds. For each option
// (p_min, n_min, penalties with prompt tokens, grammar, logit bias, top-k/top-p/min-p/typical,
// trees, n-gram drafts) the emitted tokens at positions 1..kPos are compared with plain
// decoding's: token 1 against its exact transformed p (chi-square goodness of fit), tokens
// 1..kPos and the joint (token 1, token 2) against plain decoding's samples
// (two-sample chi-square homogeneity). Fixed seeds: the test is deterministic.
//
// Power, in the engine path: test_hooks::draft_bug puts 47abea0's p_min and n_min rules back
// into the drafter, and the same checks must reject them; the penalties' prompt history is
// checked against a p computed here from the raw logits' softmax (presence/frequency penalties
// shift logits, so they act on log-probabilities exactly), which 47abea0 (no prompt history in
// the penalties) fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "engine/test_hooks.h"
#include "stats_util.h"
#include "test_util.h"

using namespace specrpc;
using namespace specrpc::test;

namespace {

#if defined(__SANITIZE_ADDRESS__)
#define SPECRPC_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPECRPC_TEST_ASAN 1
#endif
#endif
#ifdef SPECRPC_TEST_ASAN
constexpr int  kRuns = 500;    // ASan (llama.cpp itself is not instrumented): ~1 min; less power
constexpr bool kAsan = true;
#else
constexpr int  kRuns = 1500;   // per sample; the whole file runs ~35,000 requests
constexpr bool kAsan = false;
#endif
constexpr int    kPos   = 4;      // output positions compared
constexpr int    kPred  = 6;      // tokens generated per run
constexpr double kPPass = 1e-4;   // per check; ~6 checks per case, ~12 cases
constexpr double kPFail = 1e-6;   // a broken variant must fall below this in its best check

const char * kPrompt = "Once upon a time, there was a little";
// The draft samples at this temperature while the target samples at 1 (test_hooks): its q is then
// far enough from p that the residual path runs at a large share of the positions.
constexpr float kDraftTemperature = 2.0f;
// p_min 0.3 stops a T=2 draft now and then (its top q is often below), and the old rule dropped
// many samples; n_min 3 with p_min 0.4: the old n_min rule's bias is the weaker one, so those
// samples are twice the size.
constexpr float kPMin     = 0.3f;
constexpr float kPMinNMin = 0.4f;
constexpr int   kNMin     = 3;

struct Sample {
    std::vector<std::vector<token_id>> out;  // first kPred tokens of each run
    int64_t draft_n = 0, accepted = 0, steps = 0, emitted = 0;
    double  reject_share() const { return draft_n ? 1.0 - double(accepted) / double(draft_n) : 0.0; }
};

Sample run_many(Engine & e, const std::vector<token_id> & prompt, const SamplingParams & sp, const SpecParams & spec,
                uint32_t seed0, int runs = kRuns) {
    Sample s;
    for (int i = 0; i < runs; ++i) {
        CompletionRequest r;
        r.prompt        = prompt;
        r.n_predict     = kPred;
        r.sampling      = sp;
        // seeds 2 apart: the draft's stream is seed + 1, which must not be another run's target stream
        r.sampling.seed = seed0 + 2 * static_cast<uint32_t>(i);
        r.spec          = spec;
        auto res = e.complete(r);
        EXPECT_TRUE(res.is_ok()) << res.status().message();
        if (!res) continue;
        s.out.push_back(output_ids(res.value()));
        s.draft_n += res.value().spec.draft_n;
        s.accepted += res.value().spec.draft_n_accepted;
        s.steps += res.value().spec.draft_n_steps;
        s.emitted += static_cast<int64_t>(res.value().tokens.size());
    }
    return s;
}

// Exact p of the first token: the post-sampling probabilities of a plain run.
std::map<token_id, double> exact_first(Engine & e, const std::vector<token_id> & prompt, SamplingParams sp) {
    CompletionRequest r;
    r.prompt = prompt;
    r.n_predict = 1;
    r.sampling = sp;
    r.sampling.n_probs = e.info().n_vocab;
    r.sampling.post_sampling_probs = true;
    auto res = e.complete(r);
    EXPECT_TRUE(res.is_ok());
    std::map<token_id, double> p;
    if (!res || res.value().tokens.empty()) return p;
    for (const auto & tp : res.value().tokens[0].top) p[tp.id] = tp.prob;
    return p;
}

using Key = std::vector<token_id>;
using Bins = std::map<Key, int64_t>;

// Token at output position `pos` (0-based), or the joint of positions [0, n) when n > 1; runs
// that ended earlier (EOS) count as -1 there.
Bins bins(const Sample & s, int pos, int n = 1) {
    Bins b;
    for (const auto & o : s.out) {
        Key k;
        for (int i = pos; i < pos + n; ++i) k.push_back(i < static_cast<int>(o.size()) ? o[i] : -1);
        b[k]++;
    }
    return b;
}

ChiSquare gof_first(const Sample & s, const std::map<token_id, double> & p) {
    Bins b = bins(s, 0);
    std::vector<int64_t> obs;
    std::vector<double>  pi;
    for (auto [id, pr] : p) {
        auto it = b.find(Key{id});
        obs.push_back(it == b.end() ? 0 : it->second);
        pi.push_back(pr);
        if (it != b.end()) b.erase(it);
    }
    int64_t outside = 0;
    for (auto & [k, c] : b) outside += c;
    obs.push_back(outside);
    pi.push_back(0.0);
    return chi_square_gof(obs, pi);
}

ChiSquare homogeneity(const Bins & a, const Bins & b) {
    std::map<Key, std::array<int64_t, 2>> m;
    for (auto & [k, c] : a) m[k][0] += c;
    for (auto & [k, c] : b) m[k][1] += c;
    std::vector<std::array<int64_t, 2>> cells;
    for (auto & [k, c] : m) cells.push_back(c);
    return chi_square_two_sample(cells);
}

struct Verdict {
    double min_p = 1.0;   // smallest p-value over the checks
    std::string worst;    // which check
};

// The checks of one speculative sample against plain decoding (and token 1's exact p).
Verdict compare(const Sample & spec, const Sample & plain, const std::map<token_id, double> & p1, const char * name) {
    Verdict v;
    auto note = [&](const std::string & what, const ChiSquare & c) {
        std::printf("  %-28s %-14s X2 %8.1f dof %3d p %.3g\n", name, what.c_str(), c.statistic, c.dof, c.p_value);
        if (c.p_value < v.min_p) { v.min_p = c.p_value; v.worst = what; }
    };
    if (!p1.empty()) note("token1 vs p", gof_first(spec, p1));
    for (int i = 0; i < kPos; ++i) note("token" + std::to_string(i + 1) + " vs plain", homogeneity(bins(spec, i), bins(plain, i)));
    note("joint(1,2) vs plain", homogeneity(bins(spec, 0, 2), bins(plain, 0, 2)));
    std::printf("  %-28s drafted %lld accepted %lld (%.0f%% of drafted tokens rejected), %lld rounds with a draft, %lld tokens\n",
                name, (long long)spec.draft_n, (long long)spec.accepted, 100.0 * spec.reject_share(),
                (long long)spec.steps, (long long)spec.emitted);
    std::fflush(stdout);
    return v;
}

SamplingParams sampling(float temp = 1.0f, int top_k = 8) {
    SamplingParams sp;
    sp.temperature = temp;
    sp.top_k = top_k;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    return sp;
}

// The rejection-sampling verifiers are what these tests exercise: token-wise by default, block
// verification in the *Block tests. Coupled draws (the default with a seed) accept only what the
// target draws itself, so no drafter could bias them (coupled_test covers that mode).
SpecParams draft_spec(int n_max = 5, SpecVerifier verifier = SpecVerifier::TOKENWISE) {
    SpecParams sp;
    sp.types = {SpecType::DRAFT};
    sp.n_max = n_max;
    sp.adaptive = false;
    sp.verifier = verifier;
    return sp;
}

// Plain decoding by the sampler chain (not keyed Gumbel draws): the reference sample.
SpecParams plain_spec() {
    SpecParams sp;
    sp.verifier = SpecVerifier::TOKENWISE;
    return sp;
}

struct BugGuard {  // sets a test hook for one scope
    explicit BugGuard(DraftBug b) { test_hooks::draft_bug.store(b); }
    ~BugGuard() { test_hooks::draft_bug.store(DraftBug::NONE); }
};

class SpecDistribution : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        engine_ = make_engine("stories260K-F32.gguf", "stories260K-Q4_0.gguf", 1, 0, 4).release();
        test_hooks::draft_temperature.store(kDraftTemperature);
    }
    static void TearDownTestSuite() {
        test_hooks::draft_temperature.store(0.0f);
        delete engine_;
    }
    static Engine * engine_;

    std::vector<token_id> tok(const std::string & text) { return engine_->tokenize(text, true, false).value(); }

    // Plain decoding's sample for a (prompt, sampling) case, shared by the tests of that case.
    static const Sample & plain(const std::string & key, const std::vector<token_id> & prompt, const SamplingParams & sp,
                                int runs = kRuns) {
        static std::map<std::string, Sample> cache;
        const std::string k = key + "/" + std::to_string(runs);
        auto it = cache.find(k);
        if (it == cache.end()) it = cache.emplace(k, run_many(*engine_, prompt, sp, plain_spec(), 1000000, runs)).first;
        return it->second;
    }

    // Plain vs speculative; the speculative sample must pass every check, and (when asked) the
    // draft must be rejected at >= min_reject of its drafted tokens so the residual path runs.
    // `key` names the (prompt, sampling) case whose plain sample is shared.
    Verdict check(const char * name, const std::string & key, const std::vector<token_id> & prompt,
                  const SamplingParams & sp, const SpecParams & spec, double min_reject = 0.3, int runs = kRuns) {
        Verdict v;
        if (!engine_) { ADD_FAILURE() << "no engine"; return v; }
        const Sample & pl = plain(key, prompt, sp, runs);
        Sample s     = run_many(*engine_, prompt, sp, spec, 8000000, runs);
        auto   p1    = exact_first(*engine_, prompt, sp);
        ChiSquare pc = gof_first(pl, p1);
        std::printf("  %-28s plain token1 vs p X2 %.1f dof %d p %.3g\n", name, pc.statistic, pc.dof, pc.p_value);
        EXPECT_GT(pc.p_value, kPPass) << "plain sampling does not follow its own p";
        v = compare(s, pl, p1, name);
        EXPECT_GT(v.min_p, kPPass) << name << ": speculation differs from plain decoding (" << v.worst << ")";
        EXPECT_GT(s.steps, runs / 2) << "speculation did not draft";
        if (min_reject > 0) {
            EXPECT_GE(s.reject_share(), min_reject) << "the residual path runs too rarely to test it";
        }
        return v;
    }
};
Engine * SpecDistribution::engine_ = nullptr;

}  // namespace

TEST_F(SpecDistribution, Chain) { check("chain", "story", tok(kPrompt), sampling(), draft_spec()); }

TEST_F(SpecDistribution, PMin) {
    SpecParams spec = draft_spec();
    spec.p_min = kPMin;
    check("p_min", "story", tok(kPrompt), sampling(), spec, 0.2);
}

TEST_F(SpecDistribution, NMinWithPMin) {
    SpecParams spec = draft_spec();
    spec.p_min = kPMinNMin;
    spec.n_min = kNMin;
    check("n_min p_min", "story", tok(kPrompt), sampling(), spec, 0.2, 2 * kRuns);
}

// Block verification of the same deep, often-rejected sampled chains.
TEST_F(SpecDistribution, ChainBlock) {
    check("chain block", "story", tok(kPrompt), sampling(), draft_spec(5, SpecVerifier::BLOCK));
}

TEST_F(SpecDistribution, PMinBlock) {
    SpecParams spec = draft_spec(5, SpecVerifier::BLOCK);
    spec.p_min = kPMin;
    check("p_min block", "story", tok(kPrompt), sampling(), spec, 0.2);
}

// Power in the engine path: a drafter with 47abea0's bug, on the same case as the test of the
// fix, must fail the same checks. Skipped under ASan (fewer runs: not the power to show).
static Verdict run_broken(Engine & e, DraftBug bug, const SpecParams & spec, const Sample & plain, int runs, const char * name) {
    Sample bad;
    {
        BugGuard g(bug);
        bad = run_many(e, e.tokenize(kPrompt, true, false).value(), sampling(), spec, 8000000, runs);
    }
    return compare(bad, plain, exact_first(e, e.tokenize(kPrompt, true, false).value(), sampling()), name);
}

TEST_F(SpecDistribution, PowerBrokenPMinIsRejected) {
    if (kAsan) GTEST_SKIP() << "power needs the full sample";
    SpecParams spec = draft_spec();
    spec.p_min = kPMin;
    Verdict v = run_broken(*engine_, DraftBug::PMIN_FILTERS_SAMPLE, spec, plain("story", tok(kPrompt), sampling()), kRuns,
                           "BROKEN p_min");
    EXPECT_LT(v.min_p, kPFail) << "the checks cannot see 47abea0's p_min bias";
}

TEST_F(SpecDistribution, PowerBrokenNMinIsRejected) {
    if (kAsan) GTEST_SKIP() << "power needs the full sample";
    SpecParams spec = draft_spec();
    spec.p_min = kPMinNMin;
    spec.n_min = kNMin;
    Verdict v = run_broken(*engine_, DraftBug::NMIN_DISCARDS_SAMPLED, spec,
                           plain("story", tok(kPrompt), sampling(), 2 * kRuns), 2 * kRuns, "BROKEN n_min");
    EXPECT_LT(v.min_p, kPFail) << "the checks cannot see 47abea0's n_min bias";
}

TEST_F(SpecDistribution, Penalties) {
    SamplingParams sp = sampling();
    sp.repeat_penalty = 1.5f;
    sp.presence_penalty = 0.5f;
    sp.frequency_penalty = 0.3f;
    sp.repeat_last_n = 32;
    check("penalties", "penalties", tok("Lily saw a little dog. The little dog saw a little"), sp, draft_spec());
}

// The penalties count the prompt (llama-server feeds it to the sampler): token 1's law from the
// raw softmax, shifted by the presence/frequency penalties of the prompt's last repeat_last_n
// tokens, truncated to top-k, at temperature 1, plain and speculative.
TEST_F(SpecDistribution, PenaltiesSeeThePrompt) {
    const auto prompt = tok("Lily saw a little dog. The little dog saw a little");
    for (int32_t last_n : {-1, 0, 8}) {
        SamplingParams sp = sampling();
        sp.presence_penalty = 1.0f;
        sp.frequency_penalty = 0.5f;
        sp.repeat_last_n = last_n;
        // raw softmax of the target at the first position
        CompletionRequest r;
        r.prompt = prompt;
        r.n_predict = 1;
        r.sampling = sampling();
        r.sampling.n_probs = engine_->info().n_vocab;
        auto raw = engine_->complete(r);
        ASSERT_TRUE(raw.is_ok());
        std::map<token_id, int> count;
        const size_t n = last_n < 0 ? prompt.size() : std::min<size_t>(prompt.size(), size_t(last_n));
        for (size_t i = prompt.size() - n; i < prompt.size(); ++i) count[prompt[i]]++;
        std::vector<std::pair<double, token_id>> lp;
        for (const auto & tp : raw.value().tokens[0].top) {
            auto it = count.find(tp.id);
            const int c = it == count.end() ? 0 : it->second;
            lp.push_back({std::log(double(tp.prob)) - (c > 0 ? sp.presence_penalty + c * sp.frequency_penalty : 0.0), tp.id});
        }
        std::sort(lp.rbegin(), lp.rend());
        lp.resize(size_t(sp.top_k));
        double z = 0;
        for (auto & [l, id] : lp) z += std::exp(l - lp[0].first);
        std::map<token_id, double> p;
        for (auto & [l, id] : lp) p[id] = std::exp(l - lp[0].first) / z;
        const std::string name = "prompt penalties last_n " + std::to_string(last_n);
        Sample plain = run_many(*engine_, prompt, sp, plain_spec(), 1000000, kRuns / 2);
        Sample spec  = run_many(*engine_, prompt, sp, draft_spec(), 8000000, kRuns / 2);
        ChiSquare a = gof_first(plain, p), b = gof_first(spec, p);
        std::printf("  %-28s plain X2 %.1f p %.3g | speculative X2 %.1f p %.3g\n", name.c_str(), a.statistic, a.p_value,
                    b.statistic, b.p_value);
        EXPECT_GT(a.p_value, kPPass) << name << ": plain decoding's penalties do not see the prompt";
        EXPECT_GT(b.p_value, kPPass) << name << ": speculative decoding's penalties do not see the prompt";
    }
}

TEST_F(SpecDistribution, Grammar) {
    SamplingParams sp = sampling();
    sp.grammar = "root ::= [^gG]*";  // no letter g: " girl", the top token, and more later are banned
    check("grammar", "grammar", tok(kPrompt), sp, draft_spec());
}

TEST_F(SpecDistribution, LogitBias) {
    // ban token 1's most likely token, favour its fourth
    auto p1 = exact_first(*engine_, tok(kPrompt), sampling());
    std::vector<std::pair<double, token_id>> by_p;
    for (auto [id, p] : p1) by_p.push_back({p, id});
    std::sort(by_p.rbegin(), by_p.rend());
    ASSERT_GE(by_p.size(), 4u);
    SamplingParams sp = sampling();
    sp.logit_bias = {{by_p[0].second, -INFINITY}, {by_p[3].second, 1.5f}};
    check("logit_bias", "logit_bias", tok(kPrompt), sp, draft_spec());
}

TEST_F(SpecDistribution, Truncations) {
    SamplingParams sp = sampling(1.0f, 40);
    sp.top_p = 0.99f;
    sp.min_p = 0.005f;
    sp.typical_p = 0.99f;
    check("top-k/top-p/min-p/typical", "truncations", tok(kPrompt), sp, draft_spec());
}

TEST_F(SpecDistribution, Tree) {
    SpecParams spec = draft_spec(4);
    spec.n_parallel = 3;
    spec.p_split = 0.1f;
    check("tree 3", "story", tok(kPrompt), sampling(), spec, 0.3);
}

TEST_F(SpecDistribution, TreeWithPMin) {
    SpecParams spec = draft_spec(4);
    spec.n_parallel = 3;
    spec.p_split = 0.1f;
    spec.p_min = kPMin;
    spec.n_min = 2;
    check("tree 3 p_min n_min 2", "story", tok(kPrompt), sampling(), spec, 0.2);
}

// Sampled probes compared in shadow (Engine::Impl::probe_in_shadow): the plain rounds draw each
// token coupled with the shadow's (sample_coupled), exactly from p, and equal to it exactly when
// token-wise rejection would accept it. test_hooks::shadow_every_draft makes every chain a shadow
// (and drops the drafts made while one runs), so every output position is drawn that way, at
// depths 1 to 5. (With one random stream for both, the first tokens are those of the Chain
// test: a shadow's first rejection step uses the same uniforms as the verifier's would.)
struct ShadowCount {
    int64_t coupled = 0, kept = 0;
};

Sample run_in_shadow(Engine & e, DraftBug bug, int runs, ShadowCount * count) {
    BugGuard g(bug);
    test_hooks::shadow_every_draft.store(true);
    test_hooks::shadow_coupled.store(0);
    test_hooks::shadow_coupled_kept.store(0);
    Sample s = run_many(e, e.tokenize(kPrompt, true, false).value(), sampling(), draft_spec(), 8000000, runs);
    test_hooks::shadow_every_draft.store(false);
    count->coupled = test_hooks::shadow_coupled.load();
    count->kept    = test_hooks::shadow_coupled_kept.load();
    std::printf("  in shadow: %lld tokens drawn coupled, %lld of them the shadow's\n", (long long)count->coupled,
                (long long)count->kept);
    return s;
}

TEST_F(SpecDistribution, SampledProbesInShadow) {
    ShadowCount n;
    const Sample s = run_in_shadow(*engine_, DraftBug::NONE, kRuns, &n);
    const Verdict v = compare(s, plain("story", tok(kPrompt), sampling()), exact_first(*engine_, tok(kPrompt), sampling()),
                              "shadow probes");
    EXPECT_GT(v.min_p, kPPass) << "plain rounds beside a sampled shadow differ from plain decoding (" << v.worst << ")";
    EXPECT_EQ(s.steps, 0) << "a draft was verified: not every position was drawn in shadow";
    // nearly every position was drawn coupled (not those where a draft would run past n_predict:
    // 7,499-7,500 of the 9,000 when this was written), and the rejection path ran at a fifth of
    // them or more (23%: 1,726 of 7,500)
    EXPECT_GE(n.coupled, int64_t(kRuns) * (kPred - 2));
    EXPECT_GE(1.0 - double(n.kept) / double(std::max<int64_t>(1, n.coupled)), 0.18);
}

TEST_F(SpecDistribution, PowerShadowRejectionFromPIsRejected) {
    if (kAsan) GTEST_SKIP() << "power needs the full sample";
    ShadowCount n;
    const Sample s = run_in_shadow(*engine_, DraftBug::SHADOW_REJECTION_DRAWS_P, kRuns, &n);
    const Verdict v = compare(s, plain("story", tok(kPrompt), sampling()), exact_first(*engine_, tok(kPrompt), sampling()),
                              "BROKEN shadow coupling");
    EXPECT_LT(v.min_p, kPFail) << "the checks cannot see a coupling that draws from p after a rejection";
}

TEST_F(SpecDistribution, PromptLookup) {
    SpecParams spec;
    spec.types = {SpecType::LOOKUP, SpecType::NGRAM};
    spec.verifier = SpecVerifier::TOKENWISE;
    spec.n_max = 5;
    spec.adaptive = false;
    spec.ngram_min = 1;
    check("lookup+ngram", "lookup", tok("the cat sat on the mat. the cat sat on the mat. the cat sat on the"), sampling(), spec, 0.2);
}
