// Proof obligation 2, end to end on a real model pair: with speculation at temperature > 0 the
// emitted tokens follow the target's distribution. Restricted to the first two positions after a
// fixed prompt (top-k keeps the support small) and many seeds:
//   - token 1 against the exact transformed p of the target (chi-square goodness of fit);
//   - (token 1, token 2) jointly against plain sampling (chi-square homogeneity, two samples).
// Cases: model draft chain (rejection sampling of sampled drafts), model draft tree (recursive
// rejection), sample-and-compare, n-gram drafts (one-hot rejection). The verifier's own power
// checks (a wrong residual, a non-sampled draft must fail) are in verify_test.cpp; here the power
// check is that a small change of temperature is detected with the same sample sizes.
#include <gtest/gtest.h>

#include <map>

#include "stats_util.h"
#include "test_util.h"

using namespace specrpc;
using namespace specrpc::test;

namespace {

constexpr int    kRuns  = 1500;
constexpr double kPPass = 1e-4;   // several tests: keep the false-alarm rate small
constexpr double kPFail = 1e-3;

struct Sample {
    std::vector<std::pair<token_id, token_id>> pairs;  // (first, second) emitted token
    int64_t                                    draft_n = 0, accepted = 0;
};

Sample run_many(Engine & e, const std::string & prompt, SamplingParams sp, const SpecParams & spec, uint32_t seed0) {
    Sample s;
    auto toks = e.tokenize(prompt, true, false).value();
    for (int i = 0; i < kRuns; ++i) {
        CompletionRequest r;
        r.prompt    = toks;
        r.n_predict = 2;
        r.sampling  = sp;
        // seeds 2 apart: the draft's stream is seed + 1, which must not be another run's target stream
        r.sampling.seed = seed0 + 2 * static_cast<uint32_t>(i);
        r.spec      = spec;
        auto res = e.complete(r);
        EXPECT_TRUE(res.is_ok());
        if (!res || res.value().tokens.size() < 2) continue;
        s.pairs.push_back({res.value().tokens[0].id, res.value().tokens[1].id});
        s.draft_n += res.value().spec.draft_n;
        s.accepted += res.value().spec.draft_n_accepted;
    }
    return s;
}

// Exact p of the first token: the post-sampling probabilities of a plain run (top-k = the support).
std::map<token_id, double> exact_first(Engine & e, const std::string & prompt, SamplingParams sp) {
    CompletionRequest r;
    r.prompt = e.tokenize(prompt, true, false).value();
    r.n_predict = 1;
    r.sampling = sp;
    r.sampling.n_probs = sp.top_k;
    r.sampling.post_sampling_probs = true;
    auto res = e.complete(r);
    EXPECT_TRUE(res.is_ok());
    std::map<token_id, double> p;
    for (const auto & tp : res.value().tokens.at(0).top) p[tp.id] = tp.prob;
    return p;
}

double gof_first(const Sample & s, const std::map<token_id, double> & p) {
    std::map<token_id, int64_t> cnt;
    for (auto [a, b] : s.pairs) cnt[a]++;
    std::vector<int64_t> obs;
    std::vector<double>  pi;
    for (auto [id, pr] : p) { obs.push_back(cnt[id]); pi.push_back(pr); cnt.erase(id); }
    int64_t outside = 0;
    for (auto [id, c] : cnt) outside += c;
    obs.push_back(outside);
    pi.push_back(0.0);
    return chi_square_gof(obs, pi).p_value;
}

// Two-sample chi-square homogeneity test on the joint (first, second) tokens; bins with a pooled
// count < 10 are merged into one.
double homogeneity(const Sample & a, const Sample & b) {
    std::map<std::pair<token_id, token_id>, std::array<int64_t, 2>> bins;
    for (auto & x : a.pairs) bins[x][0]++;
    for (auto & x : b.pairs) bins[x][1]++;
    std::vector<std::array<double, 2>> cells;
    std::array<double, 2> rare{0, 0};
    for (auto & [k, c] : bins) {
        if (c[0] + c[1] < 10) { rare[0] += c[0]; rare[1] += c[1]; }
        else cells.push_back({double(c[0]), double(c[1])});
    }
    if (rare[0] + rare[1] > 0) cells.push_back(rare);
    const double na = double(a.pairs.size()), nb = double(b.pairs.size());
    double x2 = 0;
    for (auto & c : cells) {
        double tot = c[0] + c[1];
        double ea = tot * na / (na + nb), eb = tot * nb / (na + nb);
        x2 += (c[0] - ea) * (c[0] - ea) / ea + (c[1] - eb) * (c[1] - eb) / eb;
    }
    int dof = static_cast<int>(cells.size()) - 1;
    return dof > 0 ? gamma_q(dof / 2.0, x2 / 2.0) : 1.0;
}

SamplingParams sampling(float temp, int top_k, float top_p) {
    SamplingParams sp;
    sp.temperature = temp;
    sp.top_k = top_k;
    sp.top_p = top_p;
    sp.min_p = 0.0f;
    return sp;
}

SpecParams draft_spec(int n_max, int branches = 1, bool sample_and_compare = false) {
    SpecParams sp;
    sp.types = {SpecType::DRAFT};
    sp.n_max = n_max;
    sp.adaptive = false;
    sp.n_parallel = branches;
    sp.p_split = 0.05f;
    sp.sample_and_compare = sample_and_compare;
    sp.verifier = SpecVerifier::TOKENWISE;  // rejection sampling; block and coupled have their own tests
    return sp;
}

class SpecSampled : public ::testing::Test {
  protected:
    static void SetUpTestSuite() { engine_ = make_engine("stories260K-F32.gguf", "stories260K-Q4_0.gguf").release(); }
    static void TearDownTestSuite() { delete engine_; }
    static Engine * engine_;

    void check(const std::string & prompt, SamplingParams sp, SpecParams spec, bool expect_drafts = true) {
        ASSERT_NE(engine_, nullptr);
        Sample plain = run_many(*engine_, prompt, sp, SpecParams{}, 1000000);
        Sample spec_s = run_many(*engine_, prompt, sp, spec, 2000000);
        if (expect_drafts) {
            EXPECT_GT(spec_s.draft_n, kRuns / 2) << "speculation did not draft";
            EXPECT_GT(spec_s.accepted, 0);
        }
        auto p = exact_first(*engine_, prompt, sp);
        double p1 = gof_first(spec_s, p), p_plain = gof_first(plain, p), p2 = homogeneity(spec_s, plain);
        EXPECT_GT(p_plain, kPPass) << "plain sampling does not match its own distribution";
        EXPECT_GT(p1, kPPass) << "first token with speculation does not follow p";
        EXPECT_GT(p2, kPPass) << "joint (token 1, token 2) with speculation differs from plain";
    }
};
Engine * SpecSampled::engine_ = nullptr;

const char * kPrompt = "Once upon a time, there was a little";

}  // namespace

TEST_F(SpecSampled, DraftChainT07TopK) { check(kPrompt, sampling(0.7f, 8, 1.0f), draft_spec(3)); }
TEST_F(SpecSampled, DraftChainT10TopKTopP) { check(kPrompt, sampling(1.0f, 8, 0.9f), draft_spec(3)); }
TEST_F(SpecSampled, DraftTreeT10) { check(kPrompt, sampling(1.0f, 8, 1.0f), draft_spec(2, 3)); }
TEST_F(SpecSampled, SampleAndCompareT10) { check(kPrompt, sampling(1.0f, 8, 1.0f), draft_spec(3, 1, true)); }

TEST_F(SpecSampled, NgramDraftT10) {
    SpecParams sp;
    sp.types = {SpecType::LOOKUP};
    sp.n_max = 3;
    sp.adaptive = false;
    sp.ngram_min = 1;
    sp.verifier = SpecVerifier::TOKENWISE;
    check("the cat sat on the mat. the cat sat on the mat. the cat sat on the", sampling(1.0f, 8, 1.0f), sp);
}

// Power: the same sample sizes detect a small change of temperature (0.85 vs 1.0).
TEST_F(SpecSampled, TestDetectsSmallDistributionChange) {
    ASSERT_NE(engine_, nullptr);
    Sample hot  = run_many(*engine_, kPrompt, sampling(1.0f, 8, 1.0f), draft_spec(3), 3000000);
    SpecParams plain_sampler;  // llama.cpp's sampler chain, not the coupled (keyed Gumbel) draws
    plain_sampler.verifier = SpecVerifier::TOKENWISE;
    Sample cool = run_many(*engine_, kPrompt, sampling(0.85f, 8, 1.0f), plain_sampler, 4000000);
    EXPECT_LT(homogeneity(hot, cool), kPFail);
    EXPECT_LT(gof_first(hot, exact_first(*engine_, kPrompt, sampling(0.85f, 8, 1.0f))), kPFail);
}
