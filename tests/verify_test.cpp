// Tests of the verifiers (src/speculative/verify.h): greedy by hand and against plain greedy decoding;
// the stochastic verifier by a chi-square goodness-of-fit test of the emitted tokens against the
// target (chains, deterministic drafts, trees), with the power of that test shown by deliberately
// wrong verifiers that must fail it on the same setup.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "speculative/verify.h"
#include "dist_util.h"
#include "stats_util.h"

using namespace specrpc;
using specrpc::test::make_dist;
using specrpc::test::chi_square_gof;
using specrpc::test::ChiSquare;

namespace {

constexpr int     V        = 8;        // vocabulary of the toy models
constexpr int     N_TRIALS = 100000;   // samples per goodness-of-fit test
constexpr double  P_PASS   = 1e-4;     // a correct verifier must reach this p-value (18 checks:
                                       // a valid refactor that reorders draws fails ~0.2%)
constexpr double  P_FAIL   = 1e-6;     // a wrong one must fall below this
constexpr token_id START   = 0;        // the "last accepted token" every generation starts from

std::vector<double> dense(const Dist & d) {
    std::vector<double> out(V, 0.0);
    for (const auto & tp : d) out[size_t(tp.id)] = tp.p;
    return out;
}

// Toy language models as Markov chains: P[a] = target's next-token law after token a (some
// tokens truncated away), Q[a] = the drafter's (missing some of P's tokens, and proposing
// tokens P has truncated away). Random but fixed.
struct Models {
    std::vector<Dist> P, Q;
};

const Models & models() {
    static const Models m = [] {
        Models               out;
        std::mt19937_64      rng(20240611);
        std::uniform_real_distribution<double> u(0.0, 1.0);
        for (int a = 0; a < V; ++a) {
            std::vector<double> wp(V), wq(V);
            for (int t = 0; t < V; ++t) {
                wp[size_t(t)] = std::pow(u(rng), 2.0) + 0.02;
                wq[size_t(t)] = std::pow(u(rng), 2.0) + 0.02;
            }
            wp[size_t((a + 1) % V)] = 0.0;  // truncated p: q proposes it, p never accepts it
            wp[size_t((a + 4) % V)] = 0.0;
            wq[size_t((a + 2) % V)] = 0.0;  // p's token the drafter never proposes
            wq[size_t((a + 6) % V)] = 0.0;
            wq[size_t((a + 1) % V)] += 0.3;  // make q put real mass outside p's support
            out.P.push_back(make_dist(wp));
            out.Q.push_back(make_dist(wq));
        }
        return out;
    }();
    return m;
}

// p for every node of a tree: the target's law after that node's token.
std::vector<Dist> target_dists(const DraftTree & tree) {
    std::vector<Dist> p;
    for (const auto & n : tree.nodes) p.push_back(models().P[size_t(n.token)]);
    return p;
}

// Drafters: build a tree from the last token.
using Drafter = std::function<DraftTree(token_id last, std::mt19937_64 & rng)>;

Drafter chain_sampled(int gamma) {
    return [gamma](token_id last, std::mt19937_64 & rng) {
        DraftTree t = draft_tree_init(last);
        int32_t   u = 0;
        for (int i = 0; i < gamma; ++i) {
            const Dist & q = models().Q[size_t(t.nodes[size_t(u)].token)];
            u = draft_tree_add(t, u, sample_from(q, rng), q);
        }
        return t;
    };
}

Drafter chain_deterministic(int gamma) {  // a greedy draft model: argmax q, no q stored
    return [gamma](token_id last, std::mt19937_64 &) {
        DraftTree t = draft_tree_init(last);
        int32_t   u = 0;
        for (int i = 0; i < gamma; ++i)
            u = draft_tree_add(t, u, models().Q[size_t(t.nodes[size_t(u)].token)].front().id);
        return t;
    };
}

// k children sampled from Q[last] (i.i.d., or without replacement storing the conditional q),
// each with one sampled grandchild.
Drafter tree_sampled(int k, bool without_replacement) {
    return [k, without_replacement](token_id last, std::mt19937_64 & rng) {
        DraftTree           t = draft_tree_init(last);
        std::vector<double> w = dense(models().Q[size_t(last)]);
        for (int i = 0; i < k; ++i) {
            const Dist q = without_replacement ? make_dist(w) : models().Q[size_t(last)];
            if (q.empty()) break;
            const token_id x = sample_from(q, rng);
            if (without_replacement) w[size_t(x)] = 0.0;
            const int32_t c  = draft_tree_add(t, 0, x, q);
            const Dist &  q2 = models().Q[size_t(x)];
            draft_tree_add(t, c, sample_from(q2, rng), q2);
        }
        return t;
    };
}

// One sampled child and one deterministic child (a fixed function of `last`, here last+3,
// sometimes outside p's support), in either order.
Drafter tree_mixed(bool deterministic_first) {
    return [deterministic_first](token_id last, std::mt19937_64 & rng) {
        DraftTree      t   = draft_tree_init(last);
        const Dist &   q   = models().Q[size_t(last)];
        const token_id det = token_id((last + 3) % V);
        if (deterministic_first) draft_tree_add(t, 0, det);
        draft_tree_add(t, 0, sample_from(q, rng), q);
        if (!deterministic_first) draft_tree_add(t, 0, det);
        return t;
    };
}

// A round: draft, verify, return the emitted tokens.
using Round = std::function<std::vector<token_id>(token_id last, std::mt19937_64 & rng)>;

Round spec_round(Drafter draft) {
    return [draft](token_id last, std::mt19937_64 & rng) {
        const DraftTree t   = draft(last, rng);
        auto            res = verify_stochastic(t, target_dists(t), rng);
        EXPECT_TRUE(res.is_ok()) << res.status().to_string();
        return res.is_ok() ? verify_emitted(t, *res) : std::vector<token_id>{0};
    };
}

struct Fit {
    ChiSquare first;  // first emitted token vs P[START]
    ChiSquare joint;  // (first, second) vs P[START](a) · P[a](b)
};

// Generates N_TRIALS two-token continuations of START (as many rounds as needed) and tests them.
Fit fit(const Round & round, uint64_t seed) {
    std::mt19937_64      rng(seed);
    std::vector<int64_t> first(V, 0), joint(V * V, 0);
    for (int trial = 0; trial < N_TRIALS; ++trial) {
        std::vector<token_id> seq;
        while (seq.size() < 2) {
            const auto out = round(seq.empty() ? START : seq.back(), rng);
            seq.insert(seq.end(), out.begin(), out.end());
        }
        first[size_t(seq[0])]++;
        joint[size_t(seq[0] * V + seq[1])]++;
    }
    const auto          p0 = dense(models().P[START]);
    std::vector<double> pj(V * V, 0.0);
    for (int a = 0; a < V; ++a) {
        const auto pa = dense(models().P[size_t(a)]);
        for (int b = 0; b < V; ++b) pj[size_t(a * V + b)] = p0[size_t(a)] * pa[size_t(b)];
    }
    return {chi_square_gof(first, p0), chi_square_gof(joint, pj)};
}

void expect_fits(const Round & round, uint64_t seed) {
    const Fit f = fit(round, seed);
    EXPECT_GT(f.first.p_value, P_PASS) << "X2=" << f.first.statistic << " dof=" << f.first.dof;
    EXPECT_GT(f.joint.p_value, P_PASS) << "X2=" << f.joint.statistic << " dof=" << f.joint.dof;
}

// A deliberately WRONG verifier: after rejecting a sampled child the residual stays r (= p at
// the first sibling) instead of max(0, r − q) normalised. Depth-1 trees only.
std::vector<token_id> verify_wrong_residual(const DraftTree & t, std::mt19937_64 & rng) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const Dist &                           p = models().P[size_t(t.nodes[0].token)];
    for (size_t c = 1; c < t.nodes.size(); ++c) {
        const token_id x = t.nodes[c].token;
        if (u(rng) < std::min(1.0, double(dist_prob(p, x)) / dist_prob(t.nodes[c].q, x)))
            return {x};
    }
    return {sample_from(p, rng)};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Greedy

TEST(VerifyGreedy, ChainByHand) {
    // argmax p after root / d1 / d2 / d3 = 5, 2, 7, 1
    const std::vector<Dist> p = {make_dist({0, 0, 0, 0, .1, .6, 0, .3}),
                                 make_dist({0, .2, .5, .3, 0, 0, 0, 0}),
                                 make_dist({.1, 0, 0, 0, 0, 0, 0, .9}),
                                 make_dist({0, 1, 0, 0, 0, 0, 0, 0})};
    auto r = verify_greedy(draft_tree_chain(9, {5, 2, 3}), p);  // mismatch at the 3rd
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->accepted_nodes, (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(r->next, 7);
    r = verify_greedy(draft_tree_chain(9, {5, 2, 7}), p);  // full accept: bonus argmax p[3]
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->accepted_nodes, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(r->next, 1);
    r = verify_greedy(draft_tree_chain(9, {4, 2, 7}), p);  // first token wrong
    ASSERT_TRUE(r.is_ok());
    EXPECT_TRUE(r->accepted_nodes.empty());
    EXPECT_EQ(r->next, 5);
    r = verify_greedy(draft_tree_chain(9, {}), {p[0]});  // no draft: plain greedy step
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->next, 5);
}

TEST(VerifyGreedy, TreeByHand) {
    DraftTree t = draft_tree_init(9);
    draft_tree_add(t, 0, 4);      // 1: wrong
    draft_tree_add(t, 0, 5);      // 2: right (the first matching child wins)
    draft_tree_add(t, 0, 5);      // 3: a duplicate, never considered
    draft_tree_add(t, 2, 3);      // 4: wrong under 2
    draft_tree_add(t, 2, 2);      // 5: right under 2 (a leaf) → bonus from p[5]
    draft_tree_add(t, 3, 2);      // 6: under the duplicate
    std::vector<Dist> p(t.nodes.size(), make_dist({1, 0, 0, 0, 0, 0, 0, 0}));
    p[0] = make_dist({0, 0, 0, 0, .1, .6, 0, .3});
    p[2] = make_dist({0, .2, .5, .3, 0, 0, 0, 0});
    p[5] = make_dist({0, 0, 0, 0, 0, 0, .7, .3});
    auto r = verify_greedy(t, p);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->accepted_nodes, (std::vector<int32_t>{2, 5}));
    EXPECT_EQ(r->next, 6);
    EXPECT_EQ(verify_emitted(t, *r), (std::vector<token_id>{5, 2, 6}));
}

TEST(VerifyGreedy, LazyDistsAskedOnlyAlongThePath) {
    const DraftTree  t = draft_tree_chain(9, {5, 2, 3});
    const Dist       d5 = make_dist({0, 0, 0, 0, 0, 1, 0, 0}), d7 = make_dist({0, 0, 0, 0, 0, 0, 0, 1});
    std::vector<int> asked;
    auto r = verify_greedy(t, [&](int32_t node) -> const Dist * {
        asked.push_back(node);
        return node == 0 ? &d5 : &d7;
    });
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(asked, (std::vector<int>{0, 1}));  // node 1 accepted, node 2 rejected
    EXPECT_EQ(r->next, 7);
}

TEST(VerifyGreedy, SameTokensAsPlainGreedyDecoding) {
    auto argmax_next = [](token_id a) { return models().P[size_t(a)].front().id; };
    std::vector<token_id> plain{START};
    for (int i = 0; i < 200; ++i) plain.push_back(argmax_next(plain.back()));
    std::mt19937_64       rng(7);
    std::vector<token_id> spec{START};
    while (spec.size() < plain.size()) {  // drafts: random chains/trees, often right
        DraftTree t = draft_tree_init(spec.back());
        const int n = int(rng() % 6);
        for (int i = 0; i < n; ++i) {
            const int32_t  par = int32_t(rng() % t.nodes.size());
            const token_id x   = rng() % 2 ? argmax_next(t.nodes[size_t(par)].token) : token_id(rng() % V);
            draft_tree_add(t, par, x);
        }
        auto r = verify_greedy(t, target_dists(t));
        ASSERT_TRUE(r.is_ok());
        for (token_id x : verify_emitted(t, *r)) spec.push_back(x);
    }
    spec.resize(plain.size());
    EXPECT_EQ(spec, plain);
}

TEST(Verify, RejectsMalformedInput) {
    std::mt19937_64 rng(1);
    DraftTree       t = draft_tree_chain(0, {1, 2});
    EXPECT_FALSE(verify_greedy(t, std::vector<Dist>(2, make_dist({1}))).is_ok());  // p too short
    {  // empty p: nothing may follow (a grammar ended), the walk stops with next = -1
        auto e = verify_stochastic(t, std::vector<Dist>(3), rng);
        ASSERT_TRUE(e.is_ok());
        EXPECT_TRUE(e->accepted_nodes.empty());
        EXPECT_EQ(e->next, -1);
        auto g = verify_greedy(t, std::vector<Dist>{make_dist({0, 1}), {}, make_dist({1})});
        ASSERT_TRUE(g.is_ok());  // node 1 accepted (argmax 1), then p is empty
        EXPECT_EQ(g->accepted_nodes, std::vector<int32_t>{1});
        EXPECT_EQ(g->next, -1);
    }
    t.nodes[2].parent = 2;
    EXPECT_FALSE(draft_tree_check(t).is_ok());
    EXPECT_FALSE(verify_greedy(t, std::vector<Dist>(3, make_dist({1}))).is_ok());
    DraftTree s = draft_tree_chain(0, {3}, {make_dist({0.5, 0.5})});  // token 3 not in its q
    auto      r = verify_stochastic(s, std::vector<Dist>(2, make_dist({1, 1, 1, 1})), rng);
    EXPECT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), ErrorCode::INTERNAL);
    EXPECT_FALSE(verify_greedy(DraftTree{}, std::vector<Dist>{}).is_ok());
}

TEST(Verify, TreeHelpers) {
    DraftTree t = draft_tree_chain(4, {1, 2, 3});
    EXPECT_EQ(draft_tree_size(t), 3);
    EXPECT_EQ(draft_tree_depth(t), 3);
    draft_tree_add(t, 0, 6);
    EXPECT_EQ(draft_tree_size(t), 4);
    EXPECT_EQ(draft_tree_depth(t), 3);
    EXPECT_EQ(draft_tree_depth(draft_tree_init(1)), 0);
}

// ---------------------------------------------------------------------------------------------
// Stochastic: edge cases

TEST(VerifyStochastic, DegenerateResidualStaysInSupport) {
    std::mt19937_64 rng(3);
    const Dist      p = make_dist({0, .25, .75, 0, 0, 0, 0, 0});
    const Dist      one = make_dist({0, 0, 1, 0, 0, 0, 0, 0});
    for (int i = 0; i < 2000; ++i) {
        // q == p: β = 0, rejection impossible: always accepted.
        auto r = verify_stochastic(draft_tree_chain(0, {sample_from(p, rng)}, {p}), {p, p}, rng);
        ASSERT_TRUE(r.is_ok());
        ASSERT_EQ(r->accepted_nodes.size(), 1u);
        // p one-hot on 2, deterministic child 2: accepted; child 5: rejected, next = 2.
        r = verify_stochastic(draft_tree_chain(0, {2}), {one, p}, rng);
        ASSERT_EQ(r->accepted_nodes.size(), 1u);
        DraftTree t = draft_tree_init(0);
        draft_tree_add(t, 0, 5);
        draft_tree_add(t, 0, 2, p);  // sampled from p, tested against the residual δ_2
        draft_tree_add(t, 0, 1);
        r = verify_stochastic(t, {one, p, p, p}, rng);
        ASSERT_TRUE(r.is_ok());
        const auto out = verify_emitted(t, *r);
        ASSERT_EQ(out[0], 2);
    }
}

TEST(VerifyStochastic, AcceptanceRateIsSumOfMin) {
    // One sampled child: P(accept) = Σ_y min(p(y), q(y)).
    std::mt19937_64 rng(11);
    const Dist &    p = models().P[START];
    const Dist &    q = models().Q[START];
    double          expected = 0.0;
    for (int y = 0; y < V; ++y) expected += std::min(dist_prob(p, y), dist_prob(q, y));
    int accepted = 0;
    for (int i = 0; i < N_TRIALS; ++i) {
        const DraftTree t = chain_sampled(1)(START, rng);
        accepted += int(verify_stochastic(t, target_dists(t), rng)->accepted_nodes.size());
    }
    const double sd = std::sqrt(expected * (1 - expected) / N_TRIALS);
    EXPECT_NEAR(double(accepted) / N_TRIALS, expected, 5 * sd);
}

// ---------------------------------------------------------------------------------------------
// Stochastic: the emitted tokens follow the target (chi-square goodness of fit)

TEST(VerifyStochasticFit, SampledChainLength1) { expect_fits(spec_round(chain_sampled(1)), 101); }
TEST(VerifyStochasticFit, SampledChainLength3) { expect_fits(spec_round(chain_sampled(3)), 102); }
TEST(VerifyStochasticFit, DeterministicChain) { expect_fits(spec_round(chain_deterministic(3)), 103); }
TEST(VerifyStochasticFit, TreeIidSiblings) { expect_fits(spec_round(tree_sampled(3, false)), 104); }
TEST(VerifyStochasticFit, TreeSiblingsWithoutReplacement) {
    expect_fits(spec_round(tree_sampled(3, true)), 105);
}
TEST(VerifyStochasticFit, TreeSampledThenDeterministic) { expect_fits(spec_round(tree_mixed(false)), 106); }
TEST(VerifyStochasticFit, TreeDeterministicThenSampled) { expect_fits(spec_round(tree_mixed(true)), 107); }

TEST(VerifyStochasticFit, SampledDraftTreatedAsDeterministicIsStillExact) {
    // Dropping q turns verification into "sample from p and compare": exact, lower acceptance.
    const Drafter d = [](token_id last, std::mt19937_64 & rng) {
        DraftTree t = chain_sampled(2)(last, rng);
        for (auto & n : t.nodes) n.q.clear();
        return t;
    };
    expect_fits(spec_round(d), 108);
}

TEST(VerifyStochasticFit, NoDraftIsPlainSampling) {
    expect_fits(spec_round([](token_id last, std::mt19937_64 &) { return draft_tree_init(last); }), 109);
}

// ---------------------------------------------------------------------------------------------
// sample_coupled: plain decoding coupled with a probe compared in shadow. A "shadow round" drafts
// a chain, then emits one token per plain step coupled with the chain's next token, until a token
// differs from the chain's or the chain is used up: the tokens must follow the target, and how far
// they follow the chain must have the law of the token-wise verifier's accepted length.

using Couple = std::function<token_id(const Dist & p, token_id x, const Dist & q, std::mt19937_64 & rng)>;

token_id couple_right(const Dist & p, token_id x, const Dist & q, std::mt19937_64 & rng) {
    auto r = sample_coupled(p, x, q, rng);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? r.value() : 0;
}

// The wrong one: after rejecting x it draws from p itself, not from the residual max(0, p − q).
token_id couple_wrong(const Dist & p, token_id x, const Dist & q, std::mt19937_64 & rng) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const double qx = q.empty() ? 1.0 : double(dist_prob(q, x));
    if (u(rng) < std::min(1.0, double(dist_prob(p, x)) / qx)) return x;
    return sample_from(p, rng);
}

// Emitted tokens of one shadow round; *matched = how many of them were the chain's.
std::vector<token_id> shadow_round(const DraftTree & t, const Couple & couple, std::mt19937_64 & rng,
                                   int * matched = nullptr) {
    std::vector<token_id> out;
    token_id              last = t.nodes[0].token;
    for (size_t i = 1; i < t.nodes.size(); ++i) {
        const token_id y = couple(models().P[size_t(last)], t.nodes[i].token, t.nodes[i].q, rng);
        out.push_back(y);
        last = y;
        if (y != t.nodes[i].token) break;
    }
    if (matched) *matched = int(out.size()) - (out.back() != t.nodes[out.size()].token ? 1 : 0);
    return out;
}

Round shadow_rounds(Drafter draft, Couple couple) {
    return [draft, couple](token_id last, std::mt19937_64 & rng) { return shadow_round(draft(last, rng), couple, rng); };
}

TEST(SampleCoupledFit, SampledChainInShadow) { expect_fits(shadow_rounds(chain_sampled(3), couple_right), 111); }
TEST(SampleCoupledFit, DeterministicChainInShadow) {
    expect_fits(shadow_rounds(chain_deterministic(3), couple_right), 112);
}

// The accepted length in shadow against the token-wise verifier's on the same chains: equal in law
// (means within 5 standard errors of their difference), and the first position's acceptance is
// Σ min(p, q).
TEST(SampleCoupled, MatchedLengthHasTheVerifiersLaw) {
    std::mt19937_64 rng(113);
    const Drafter   draft = chain_sampled(4);
    double          sum_s = 0, sum2_s = 0, sum_v = 0, sum2_v = 0;
    int             first = 0;
    for (int i = 0; i < N_TRIALS; ++i) {
        const DraftTree t = draft(START, rng);
        int             k = 0;
        shadow_round(t, couple_right, rng, &k);
        sum_s += k;
        sum2_s += double(k) * k;
        first += k > 0;
        const DraftTree t2 = draft(START, rng);
        const double    kv = double(verify_stochastic(t2, target_dists(t2), rng)->accepted_nodes.size());
        sum_v += kv;
        sum2_v += kv * kv;
    }
    const double n = N_TRIALS, ms = sum_s / n, mv = sum_v / n;
    const double se = std::sqrt((sum2_s / n - ms * ms) / n + (sum2_v / n - mv * mv) / n);
    std::printf("mean matched in shadow %.4f, accepted by the verifier %.4f (se %.4f)\n", ms, mv, se);
    EXPECT_NEAR(ms, mv, 5 * se);
    double alpha = 0.0;
    for (int y = 0; y < V; ++y) alpha += std::min(dist_prob(models().P[START], y), dist_prob(models().Q[START], y));
    EXPECT_NEAR(first / n, alpha, 5 * std::sqrt(alpha * (1 - alpha) / n));
}

TEST(SampleCoupled, EmptyPIsTheEnd) {
    std::mt19937_64 rng(1);
    auto r = sample_coupled(Dist{}, 3, models().Q[START], rng);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r.value(), -1);
}

// ---------------------------------------------------------------------------------------------
// Power: wrong verifiers must fail the same test

TEST(SampleCoupledPower, RejectionDrawingFromPFails) {
    EXPECT_LT(fit(shadow_rounds(chain_sampled(3), couple_wrong), 205).first.p_value, P_FAIL);
}

TEST(VerifyStochasticPower, ResidualWithoutSubtractionFails) {
    const Round r = [](token_id last, std::mt19937_64 & rng) {
        return verify_wrong_residual(chain_sampled(1)(last, rng), rng);
    };
    EXPECT_LT(fit(r, 201).first.p_value, P_FAIL);
}

TEST(VerifyStochasticPower, TreeSiblingsAgainstPInsteadOfResidualFails) {
    const Round r = [](token_id last, std::mt19937_64 & rng) {
        DraftTree t = draft_tree_init(last);
        for (int i = 0; i < 3; ++i) {
            const Dist & q = models().Q[size_t(last)];
            draft_tree_add(t, 0, sample_from(q, rng), q);
        }
        return verify_wrong_residual(t, rng);
    };
    EXPECT_LT(fit(r, 202).first.p_value, P_FAIL);
}

TEST(VerifyStochasticPower, DeterministicDraftVerifiedAsSampledFails) {
    // argmax q proposed deterministically but verified as if it had been sampled from q.
    const Drafter d = [](token_id last, std::mt19937_64 &) {
        const Dist & q = models().Q[size_t(last)];
        return draft_tree_chain(last, {q.front().id}, {q});
    };
    EXPECT_LT(fit(spec_round(d), 203).first.p_value, P_FAIL);
}

TEST(VerifyStochasticPower, RecomputedDraftDistributionFails) {
    // Token sampled from a sharpened q' (e.g. another temperature), verified against q.
    const Drafter d = [](token_id last, std::mt19937_64 & rng) {
        const Dist &        q = models().Q[size_t(last)];
        std::vector<double> w = dense(q);
        for (double & x : w) x = x * x * x;
        return draft_tree_chain(last, {sample_from(make_dist(w), rng)}, {q});
    };
    EXPECT_LT(fit(spec_round(d), 204).first.p_value, P_FAIL);
}

// ---------------------------------------------------------------------------------------------
// The chi-square helper itself

TEST(ChiSquareHelper, KnownValues) {
    using specrpc::test::gamma_q;
    EXPECT_NEAR(gamma_q(1.0, 1.5), std::exp(-1.5), 1e-12);   // χ²_2 tail: e^{−x/2}
    EXPECT_NEAR(gamma_q(1.0, 20.0), std::exp(-20.0), 1e-18);
    EXPECT_NEAR(gamma_q(0.5, 0.5 * 3.841458820694124), 0.05, 1e-9);  // χ²_1 95% quantile
    EXPECT_NEAR(gamma_q(5.0, 0.5 * 18.307038053275146), 0.05, 1e-9);  // χ²_10 95% quantile
    EXPECT_NEAR(gamma_q(2.5, 0.5 * 0.5542980767282), 0.99, 1e-9);   // χ²_5 1% quantile
    const auto perfect = chi_square_gof({25, 25, 50}, {.25, .25, .5});
    EXPECT_EQ(perfect.dof, 2);
    EXPECT_NEAR(perfect.p_value, 1.0, 1e-12);
    EXPECT_EQ(chi_square_gof({1, 99}, {0.0, 1.0}).p_value, 0.0);  // impossible outcome seen
    // N = 200: expected 2, 2, 6, 90, 100; the two 2s pool to 4 < 5, which joins the 6.
    const auto pooled = chi_square_gof({2, 2, 6, 90, 100}, {.01, .01, .03, .45, .5});
    EXPECT_EQ(pooled.dof, 2);
    EXPECT_NEAR(pooled.p_value, 1.0, 1e-12);
}
