// Tests of the cost model and the adaptive draft-length policy (src/speculative/draft_length.h),
// with cost curves measured on the x100M and x25M benchmark pairs (docs/benchmarks.md).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "engine/engine_impl.h"  // cost_make_monotone
#include "common/recent_median.h"
#include "speculative/cost_estimator.h"
#include "speculative/draft_length.h"
#include "test_util.h"

using namespace specrpc;

namespace {

// x100M target: v(7) not measured (0 = interpolate), c = 0.02.
CostModel x100m() { return CostModel{{0, 1.0, 1.61, 2.24, 2.31, 2.70, 2.95, 0, 3.56}, 0.02, 0.0}; }

// x25M target: measured up to n = 4, c = 0.085.
CostModel x25m() { return CostModel{{0, 1.0, 1.83, 2.24, 2.47}, 0.085, 0.0}; }

// x100M-near as measured on this 2-core machine (v(2) ≈ 2.8: only long drafts pay), c = 0.021.
CostModel x100m_near_here() {
    return CostModel{{0, 1.0, 2.82, 3.33, 3.69, 4.16, 4.21, 4.21, 4.21, 4.64, 4.64, 4.64, 4.64, 5.04, 5.04, 5.04, 5.04, 5.5},
                     0.021, 0.01};
}

}  // namespace

TEST(CostModel, ExpectedTokens) {
    EXPECT_DOUBLE_EQ(expected_tokens(0.0, 5), 1.0);
    EXPECT_DOUBLE_EQ(expected_tokens(1.0, 5), 6.0);
    EXPECT_DOUBLE_EQ(expected_tokens(0.5, 2), 1.75);
    EXPECT_DOUBLE_EQ(expected_tokens(0.9, 0), 1.0);
    for (double a : {0.3, 0.76, 0.9, 0.999})
        for (int g = 1; g <= 10; ++g)
            EXPECT_NEAR(expected_tokens(a, g), (1 - std::pow(a, g + 1)) / (1 - a), 1e-12);
}

TEST(CostModel, InterpolatesAndExtrapolates) {
    const CostModel cm = x100m();
    EXPECT_DOUBLE_EQ(cost_model_v(cm, 1), 1.0);
    EXPECT_DOUBLE_EQ(cost_model_v(cm, 4), 2.31);
    EXPECT_NEAR(cost_model_v(cm, 7), (2.95 + 3.56) / 2, 1e-12);         // between 6 and 8
    EXPECT_NEAR(cost_model_v(cm, 10), 3.56 + 2 * (3.56 - 2.95) / 2, 1e-12);  // slope of 6..8
    EXPECT_DOUBLE_EQ(cost_model_v(CostModel{}, 5), 5.0);                 // nothing measured
    EXPECT_DOUBLE_EQ(cost_model_v(CostModel{{0, 1, 3, 2.5}, 0, 0}, 6), 2.5);  // slope clamped ≥ 0
    EXPECT_TRUE(cost_model_check(cm).is_ok());
    EXPECT_FALSE(cost_model_check(CostModel{{0, 2.0}, 0, 0}).is_ok());
    EXPECT_FALSE(cost_model_check(CostModel{{0, 1.0}, -1, 0}).is_ok());
}

// cost_model_v walks the curve in place; the reference builds the list of measured points and
// interpolates between them (as cost_model_v did before it ran on the hot path). Random curves
// with gaps, unmeasured entries (0, negative, NaN, inf), a single point and none at all.
TEST(CostModel, InPlaceWalkMatchesTheListOfPoints) {
    auto reference = [](const CostModel & cm, int n) {
        if (n <= 0) return 0.0;
        std::vector<std::pair<int, double>> pts{{1, 1.0}};
        for (size_t k = 2; k < cm.v.size(); ++k)
            if (std::isfinite(cm.v[k]) && cm.v[k] > 0) pts.emplace_back(int(k), cm.v[k]);
        if (pts.size() == 1) return double(n);
        for (size_t i = 0; i < pts.size(); ++i) {
            if (pts[i].first == n) return pts[i].second;
            if (pts[i].first > n)
                return pts[i - 1].second + (pts[i].second - pts[i - 1].second) * double(n - pts[i - 1].first) /
                                               double(pts[i].first - pts[i - 1].first);
        }
        const auto [n0, v0] = pts[pts.size() - 2];
        const auto [n1, v1] = pts.back();
        return v1 + std::max(0.0, (v1 - v0) / double(n1 - n0)) * double(n - n1);
    };
    std::mt19937 rng(18);
    const double odd[] = {0.0, -1.0, NAN, INFINITY};
    int checked = 0;
    for (int trial = 0; trial < 2000; ++trial) {
        const size_t len = rng() % 40;
        CostModel cm{std::vector<double>(len, 0.0), 0.0, 0.0};
        const int keep = int(rng() % 4);  // share of sizes measured: none, few, half, most
        for (size_t k = 1; k < len; ++k) {
            if (int(rng() % 4) < keep) cm.v[k] = 0.5 + double(rng() % 1000) / 50.0;
            else cm.v[k] = odd[rng() % 4];
        }
        for (int n = -1; n <= int(len) + 8; ++n, ++checked)
            ASSERT_NEAR(cost_model_v(cm, n), reference(cm, n), 1e-9) << "trial " << trial << " n " << n;
    }
    EXPECT_GT(checked, 50000);
}

// cost_make_plausible against a reference that fills each size with cost_model_v and applies the
// same envelope: whatever way the fill is written, the curve it gives is this one.
TEST(CostModel, PlausibleFillMatchesTheInterpolation) {
    auto reference = [](CostModel cm) {
        if (cm.v.size() < 2) return cm;
        cm.v[1] = 1.0;
        for (size_t n = 2; n < cm.v.size(); ++n)
            if (std::isfinite(cm.v[n]) && cm.v[n] > 0) cm.v[n] = std::clamp(cm.v[n], 1.0, double(n));
            else cm.v[n] = 0.0;
        std::vector<double> filled(cm.v.size(), 0.0);
        for (size_t n = 1; n < cm.v.size(); ++n) filled[n] = std::min(cost_model_v(cm, int(n)), double(n));
        cm.v = std::move(filled);
        double cap = 1e300;
        for (size_t n = cm.v.size(); n-- > 2;) cap = cm.v[n] = std::min(cm.v[n], cap);
        for (size_t n = 2; n < cm.v.size(); ++n) cm.v[n] = std::max({cm.v[n], cm.v[n - 1], 1.0});
        return cm;
    };
    std::mt19937 rng(1818);
    const double odd[] = {0.0, -1.0, NAN, INFINITY};
    for (int trial = 0; trial < 3000; ++trial) {
        const size_t len = rng() % 70;
        CostModel cm{std::vector<double>(len, 0.0), 0.0, 0.0};
        const int keep = int(rng() % 4);
        for (size_t k = 0; k < len; ++k) {
            if (int(rng() % 4) < keep) cm.v[k] = double(rng() % 4000) / 50.0;  // some above n, some below 1
            else cm.v[k] = odd[rng() % 4];
        }
        CostModel got = cm;
        cost_make_plausible(got);
        const CostModel want = reference(cm);
        ASSERT_EQ(got.v.size(), want.v.size());
        for (size_t n = 0; n < got.v.size(); ++n) {
            if (got.v[n] == want.v[n] || (std::isnan(got.v[n]) && std::isnan(want.v[n]))) continue;  // a curve too short to touch
            ASSERT_NEAR(got.v[n], want.v[n], 1e-9) << "trial " << trial << " n " << n;
        }
    }
}

TEST(CostModel, SpeedupFormula) {
    const CostModel cm = x100m();
    EXPECT_DOUBLE_EQ(predicted_speedup(cm, 0.9, 0), 1.0);
    // γ = 3: E[N] = 1 + .9 + .81 + .729 = 3.439; cost = v(4) + 3c = 2.31 + 0.06 = 2.37.
    EXPECT_NEAR(predicted_speedup(cm, 0.9, 3), 3.439 / 2.37, 1e-12);
    CostModel with_o = cm;
    with_o.o         = 0.5;
    EXPECT_NEAR(predicted_speedup(with_o, 0.9, 3), 3.439 / 2.87, 1e-12);
    // R = max n / v(n) over the measured range: 8 / 3.56.
    EXPECT_NEAR(speedup_limit(cm), 8 / 3.56, 1e-12);
    EXPECT_NEAR(speedup_limit(cm, 4), 4 / 2.31, 1e-12);
}

TEST(CostModel, X100mOptimumAroundOneAndAHalf) {
    const GammaChoice c = choose_gamma(x100m(), 0.9, 1, 8);
    // S(5) = 4.6856/3.05 = 1.536, S(6) = 5.217/3.375 = 1.546, S(7) = 5.695/3.70 = 1.539.
    EXPECT_EQ(c.gamma, 6);
    EXPECT_NEAR(c.predicted, 1.546, 0.002);
    EXPECT_GT(c.predicted, 1.4);
    EXPECT_LT(c.predicted, 1.7);
    for (int g = 1; g <= 8; ++g) EXPECT_LE(predicted_speedup(x100m(), 0.9, g), c.predicted);
    // Speculation pays only above α ≈ 0.63 (γ = 1: (1 + α) / 1.63 = 1).
    EXPECT_EQ(choose_gamma(x100m(), 0.60, 1, 8).gamma, 0);
    EXPECT_EQ(choose_gamma(x100m(), 0.66, 1, 8).gamma, 1);
}

TEST(CostModel, X25mIsMarginalAtAlpha076) {
    // α = 0.76: S(1) = 1.76/1.915 = 0.92, S(2) = 2.338/2.41 = 0.97, S(3) = 2.777/2.725 = 1.019;
    // γ = 4 needs v(5), extrapolated to 2.47 + 0.23 = 2.70: S(4) = 3.110/3.04 = 1.023;
    // S(5) = 3.364/3.355 = 1.003. A 2% predicted gain at best: barely worth it.
    const CostModel cm = x25m();
    EXPECT_NEAR(predicted_speedup(cm, 0.76, 3), 2.776576 / 2.725, 1e-6);
    EXPECT_NEAR(predicted_speedup(cm, 0.76, 4), 3.11020 / 3.04, 1e-5);
    const GammaChoice measured_range = choose_gamma(cm, 0.76, 1, 3);  // v measured up to n = 4
    EXPECT_EQ(measured_range.gamma, 3);
    EXPECT_GT(measured_range.predicted, 1.0);
    EXPECT_LT(measured_range.predicted, 1.03);
    const GammaChoice c = choose_gamma(cm, 0.76, 1, 8);
    EXPECT_EQ(c.gamma, 4);
    EXPECT_LT(c.predicted, 1.03);

    // The policy with α = 0.76 decides the same; with a 5% safety margin, or with any real
    // per-round overhead (o = 0.1 target steps), it switches speculation off.
    DraftLengthOptions opts;
    opts.alpha_prior = 0.76;
    opts.min_speedup = 1.0;
    DraftLengthPolicy policy(cm, opts);
    EXPECT_EQ(policy.next_gamma(), 4);
    EXPECT_FALSE(policy.last_decision().off);
    opts.min_speedup = DraftLengthOptions{}.min_speedup;  // the default keeps the 5% margin
    DraftLengthPolicy cautious(cm, opts);
    EXPECT_EQ(cautious.next_gamma(), 0);
    EXPECT_TRUE(cautious.last_decision().off);
    CostModel with_o = cm;
    with_o.o         = 0.1;
    opts.min_speedup = 1.0;
    DraftLengthPolicy overhead(with_o, opts);
    EXPECT_EQ(overhead.next_gamma(), 0);
    EXPECT_TRUE(overhead.last_decision().off);
}

TEST(DraftLengthPolicy, AlphaMovingAverage) {
    DraftLengthOptions opts;
    opts.alpha_prior = 0.5;
    opts.ema_weight  = 0.1;
    DraftLengthPolicy p(x100m(), opts);
    p.observe(4, 4);  // 4 successes, no failure: n = 4, k/n = 1
    EXPECT_NEAR(p.alpha(), std::pow(0.9, 4) * 0.5 + (1 - std::pow(0.9, 4)), 1e-12);
    const double a = p.alpha();
    p.observe(4, 1);  // success then failure: n = 2, k/n = 0.5
    EXPECT_NEAR(p.alpha(), 0.81 * a + 0.19 * 0.5, 1e-12);
    const double b = p.alpha();
    p.observe(0, 0);  // nothing drafted: no information
    EXPECT_DOUBLE_EQ(p.alpha(), b);
    for (int i = 0; i < 200; ++i) p.observe(3, 0);
    EXPECT_LT(p.alpha(), 1e-6);
}

TEST(DraftLengthPolicy, SwitchesOffProbesAndRecovers) {
    DraftLengthOptions opts;
    opts.probe_budget   = 1.0;  // the interval alone decides here (the budget has its own test)
    opts.min_speedup    = 1.0;  // the switch-off point these α figures are computed for
    opts.alpha_prior    = 0.9;
    opts.probe_interval = 16;
    opts.probe_gamma    = 2;
    DraftLengthPolicy p(x100m(), opts);
    ASSERT_EQ(p.next_gamma(), 6);

    // Acceptance collapses: every draft rejected at the first token.
    int rounds = 0;
    for (int g = 6; g > 0; g = p.next_gamma()) {
        p.observe(g, 0);
        ASSERT_LT(++rounds, 50);
    }
    EXPECT_TRUE(p.last_decision().off);
    EXPECT_LT(p.alpha(), 0.63);

    // Off for probe_interval rounds (this one included), then a short probe.
    for (int i = 1; i < 16; ++i) ASSERT_EQ(p.next_gamma(), 0) << i;
    ASSERT_EQ(p.next_gamma(), 2);
    EXPECT_TRUE(p.last_decision().probe);
    p.observe(2, 0);  // the probe fails too: off again, for twice the interval (back-off)
    for (int i = 0; i < 32; ++i) ASSERT_EQ(p.next_gamma(), 0) << i;
    ASSERT_EQ(p.next_gamma(), 2);

    // Acceptance becomes high: probes succeed until speculation pays again.
    rounds = 0;
    int g  = 2;
    for (;;) {
        if (g > 0) p.observe(g, g);
        g = p.next_gamma();
        if (g > 0 && !p.last_decision().probe) break;
        ASSERT_LT(++rounds, 200);
    }
    // Then it stays on and climbs back to the α = 0.9 choice or longer.
    for (int i = 0; i < 50; ++i) {
        ASSERT_GT(g, 0);
        p.observe(g, g);
        g = p.next_gamma();
    }
    EXPECT_GE(g, 6);
    EXPECT_GT(p.n_off_rounds(), 30);
    EXPECT_EQ(p.gamma_hist()[0], p.n_off_rounds());  // no cap-forced plain rounds here
}

TEST(DraftLengthPolicy, ProbeBackOffIsCappedAndCheap) {
    DraftLengthOptions opts;
    opts.alpha_prior        = 0.0;
    opts.probe_interval     = 16;
    opts.probe_interval_max = 256;
    DraftLengthPolicy p(x100m(), opts);
    // A drafter that never pays: count the share of rounds spent probing over a long request.
    int probes = 0, rounds = 4000;
    for (int i = 0; i < rounds; ++i) {
        int g = p.next_gamma();
        if (g > 0) { ++probes; p.observe(g, 0); }
    }
    // 16 + 32 + 64 + 128 + 256 + 256 ... : about rounds / 256 probes once backed off
    EXPECT_LE(probes, 5 + rounds / 256 + 1);
    EXPECT_GE(probes, rounds / 256 - 1);
}

// Requests of a drafter with true acceptance truth(request, round, depth), the policy's books and
// profiles carried from request to request as the engine carries them (probes in shadow, as a
// model draft's are): tokens per unit of target work, and the share of rounds off (and of those
// from round `after` on). Over 20 seeds of n_req requests of 250 rounds each, or (tokens > 0) of
// as many rounds as emit that many tokens; rounds count across the requests.
namespace {
struct Drafted { double speedup = 0, off = 0, off_after = 0; };
struct Requests {
    int  after     = 1000;
    int  tokens    = 0;
    int  n_req     = 4;
    bool long_prior = true;  // carry DraftLengthPolicy::next_long_prior as the engine does
};
template <class Truth>
Drafted run_requests(const CostModel & cm, DraftLengthOptions opts, Truth truth, Requests rq = {}) {
    double  done = 0, work = 0;
    int64_t off = 0, rounds = 0, off_late = 0, late = 0;
    for (int seed = 0; seed < 20; ++seed) {
        std::mt19937_64                        rng{uint64_t(seed)};
        std::uniform_real_distribution<double> u(0, 1);
        DraftLengthOptions                     o = opts;
        int                                    round = 0;
        for (int req = 0; req < rq.n_req; ++req) {
            DraftLengthPolicy p(cm, o);
            int emitted = 0;
            for (int r = 0; rq.tokens > 0 ? emitted < rq.tokens : r < 250; ++r, ++rounds, ++round) {
                const int g = p.next_gamma(rq.tokens > 0 ? rq.tokens - emitted : INT_MAX);
                const bool is_off = p.last_decision().off;
                off += is_off;
                if (round >= rq.after) { ++late; off_late += is_off; }
                int k = 0;
                while (k < g && u(rng) < truth(req, round, k + 1)) ++k;
                if (g == 0) { done += 1; work += 1; emitted += 1; continue; }
                if (p.shadow_probe()) {  // decodes plain, compares the draft
                    p.observe_shadow_probe(g, k);
                    done += 1;
                    work += 1 + g * cm.c;
                    emitted += 1;
                    continue;
                }
                p.observe(g, k);
                done += k + 1;
                work += cost_model_v(cm, g + 1) + g * cm.c + cm.o;
                emitted += k + 1;
            }
            o.probe_ledger = p.probe_ledger();
            o.depth_prior  = p.next_depth_prior();  // as the engine's learned prior
            if (rq.long_prior) o.long_prior = p.next_long_prior();
        }
    }
    return {done / work, double(off) / double(rounds), late ? double(off_late) / double(late) : 0};
}
}  // namespace

// A drafter worth ~1.25x (α = 0.8 at every depth on x100M: S(3) = 1.246) is judged on a moving
// average of ~20 positions a depth, which dips below min_speedup by chance every few dozen rounds.
// Off, it learns only from probes: without off_relax the dip stayed, and the next requests
// started from it (x100M at T = 0.8 in spec_bench: off in 30-90% of its rounds). With it, the
// dip fades to the longer run while nothing is drafted, and the drafter comes on again. A
// drafter that is not worth drafting, or gets worse for good, stays off all the same.
TEST(DraftLengthPolicy, ADipFadesWhileTheDrafterIsOff) {
    const CostModel    cm = x100m();
    DraftLengthOptions relax;
    DraftLengthOptions stays = relax;
    stays.off_relax          = 0;
    // The fade alone: the longer run starts from the last request's profile, not from the earlier
    // requests pooled (TheLongerRunPoolsEarlierRequestsByPositions has both).
    const Requests one_profile{1000, 0, 4, false};
    EXPECT_NEAR(choose_gamma(cm, 0.8, 1, 8).predicted, 1.246, 0.01);  // what α = 0.8 is worth

    auto flat = [](double a) { return [a](int, int, int) { return a; }; };
    const Drafted good = run_requests(cm, relax, flat(0.8), one_profile), good0 = run_requests(cm, stays, flat(0.8), one_profile);
    EXPECT_GT(good.speedup, 1.19);
    EXPECT_LT(good.off, 0.25);
    EXPECT_GT(good.speedup, good0.speedup + 0.03);  // without: measured 1.16x, off 60%
    EXPECT_LT(good.off, 0.5 * good0.off);

    // Not worth drafting (S(1) = 0.93 at α = 0.65, less deeper): off as much, within 1% as fast.
    for (double a : {0.0, 0.5, 0.65}) {
        const Drafted weak = run_requests(cm, relax, flat(a), one_profile), weak0 = run_requests(cm, stays, flat(a), one_profile);
        EXPECT_GT(weak.speedup, weak0.speedup - 0.01) << a;
        EXPECT_GT(weak.off, 0.9) << a;
    }
    // A request that ends on a dip hands the next one its longer run, not the dip.
    for (double relax_w : {0.1, 0.0}) {
        DraftLengthOptions o;
        o.off_relax = relax_w;
        DraftLengthPolicy p(cm, o);
        for (int r = 0; r < 60; ++r) {
            const int g = p.next_gamma();
            ASSERT_GT(g, 0);
            p.observe(g, r % 5 == 4 ? g - 1 : g);  // ~0.95 at depth 1
        }
        for (int r = 0; r < 8; ++r) {
            const int g = p.next_gamma();
            if (g > 0) p.observe(g, 0);
        }
        EXPECT_LT(p.depth_acceptance()[1], 0.7);
        if (relax_w > 0) EXPECT_GT(p.next_depth_prior()[1], 0.75);  // measured 0.80 (the dip: 0.4)
        else EXPECT_EQ(p.next_depth_prior(), p.depth_acceptance());
    }
    // Worse for good from round 500 (0.85, then 0.2): off in the second half as without.
    auto falls = [](int, int round, int) { return round < 500 ? 0.85 : 0.2; };
    const Requests late{600, 0, 4, false};
    const Drafted fell = run_requests(cm, relax, falls, late), fell0 = run_requests(cm, stays, falls, late);
    EXPECT_GT(fell.off_after, 0.95);
    EXPECT_GT(fell.off_after, fell0.off_after - 0.01);
}

// Requests of 256 tokens draft ~15-20 positions a depth before a dip can switch them off: too few
// for a longer run of their own, so off_relax faded the dip towards the request's own start, and
// the drafter stayed off for most of the request (x100M at T = 0.8 in spec_bench: off in 19-67%
// of its rounds, whole requests at a time). The longer run starts from the learned profile
// (DraftLengthOptions::prior_run), which carries what the earlier requests measured; a drafter
// not worth drafting, or one that gets worse for good, stays off all the same.
TEST(DraftLengthPolicy, TheLongerRunStartsFromTheLearnedProfile) {
    const CostModel    cm = x100m();
    DraftLengthOptions carried;
    DraftLengthOptions fresh = carried;
    fresh.prior_run          = 0;  // each request's longer run starts empty (before)
    auto flat = [](double a) { return [a](int, int, int) { return a; }; };
    // from the last request's profile (the earlier requests pooled: the next test)
    const Requests short_req{1 << 30, 256, 10, false}, late_req{600, 256, 10, false};
    // measured (now / before): α 0.75 1.078x off 61% / 1.036x off 85%; 0.78 1.159x 30% / 1.121x
    // 56%; 0.8 1.217x 11% / 1.175x 42%; 0.85 1.347x 1% / 1.341x 5%; 0.9 1.536x / 1.531x, never off
    for (double a : {0.75, 0.78, 0.8}) {
        const Drafted now = run_requests(cm, carried, flat(a), short_req);
        const Drafted was = run_requests(cm, fresh, flat(a), short_req);
        EXPECT_GT(now.speedup, was.speedup + 0.02) << a;
        EXPECT_LT(now.off, was.off - 0.2) << a;
    }
    for (double a : {0.85, 0.9}) {  // seldom off before: nothing lost
        const Drafted now = run_requests(cm, carried, flat(a), short_req);
        const Drafted was = run_requests(cm, fresh, flat(a), short_req);
        EXPECT_GT(now.speedup, was.speedup - 0.005) << a;
    }
    for (double a : {0.0, 0.5, 0.65}) {  // not worth drafting: off as much, within 1% as fast
        const Drafted weak = run_requests(cm, carried, flat(a), short_req);
        const Drafted weak0 = run_requests(cm, fresh, flat(a), short_req);
        EXPECT_GT(weak.speedup, weak0.speedup - 0.01) << a;
        EXPECT_GT(weak.off, 0.9) << a;
    }
    // Worse for good from the fifth request on (0.85, then 0.2): off in the later requests.
    auto falls = [](int, int round, int) { return round < 400 ? 0.85 : 0.2; };
    const Drafted fell = run_requests(cm, carried, falls, late_req);
    const Drafted fell0 = run_requests(cm, fresh, falls, late_req);
    EXPECT_GT(fell.off_after, 0.95);
    EXPECT_GT(fell.off_after, fell0.off_after - 0.01);
}

// Texts differ: a request whose text the drafter cannot follow hands the next one a low profile,
// which then starts off and, with the longer run started from that profile too, fades to a
// run as low, whatever its own text (spec_bench's x100M at T = 0.8: after a prompt measured at
// α 0.66, the next three, of which plain decoding's text is as easy as the others', were off in
// 144-254 of their rounds). The longer run starts from the positions of the earlier requests
// pooled (DraftLengthOptions::long_prior), so a bad text, off after a few rounds, moves it little.
TEST(DraftLengthPolicy, TheLongerRunPoolsEarlierRequestsByPositions) {
    // the pooling: the prior's counts discounted by kLongKeep, plus this request's positions
    DraftLengthOptions o;
    o.adaptive     = false;
    o.n_max        = 3;
    o.long_prior.s = {0, 8, 4, 2, 1};
    o.long_prior.n = {0, 10, 8, 4, 2};
    DraftLengthPolicy p(x100m(), o);
    p.observe(3, 1);  // depth 1 accepted, 2 rejected, 3 not at risk
    p.observe(3, 3);
    const DraftClassEvidence lp = p.next_long_prior();
    const double k = DraftLengthPolicy::kLongKeep;
    EXPECT_DOUBLE_EQ(lp.s[1], k * 8 + 2);
    EXPECT_DOUBLE_EQ(lp.n[1], k * 10 + 2);
    EXPECT_DOUBLE_EQ(lp.s[2], k * 4 + 1);
    EXPECT_DOUBLE_EQ(lp.n[2], k * 8 + 2);
    EXPECT_DOUBLE_EQ(lp.s[3], k * 2 + 1);
    EXPECT_DOUBLE_EQ(lp.n[3], k * 4 + 1);
    EXPECT_DOUBLE_EQ(lp.n[4], k * 2);

    // one request in four on a text the drafter cannot follow (α 0.6; 0.85 on the others)
    const CostModel cm   = x100m();
    auto            text = [](int req, int, int) { return req % 4 == 1 ? 0.6 : 0.85; };
    const Requests  pooled{1 << 30, 256, 12}, last_only{1 << 30, 256, 12, false};
    const Drafted   now = run_requests(cm, DraftLengthOptions{}, text, pooled);
    const Drafted   was = run_requests(cm, DraftLengthOptions{}, text, last_only);
    EXPECT_GT(now.speedup, was.speedup + 0.03);  // measured 1.223x against 1.153x
    EXPECT_LT(now.off, was.off - 0.1);           // measured 43% against 66%
    // the same drafter on one kind of text, and one not worth drafting: nothing lost
    for (double a : {0.5, 0.85}) {
        auto one = [a](int, int, int) { return a; };
        EXPECT_GT(run_requests(cm, DraftLengthOptions{}, one, pooled).speedup,
                  run_requests(cm, DraftLengthOptions{}, one, last_only).speedup - 0.01) << a;
    }
    // The price: a drafter worse for good (0.85, then 0.2) is tried again for a few rounds in
    // each of the next requests while the pooled run still remembers it good. Measured: off in
    // 98.2% of the later rounds against 99.3%, 1.135x against 1.139x (requests of 256 tokens);
    // 97.4% against 99.5%, 1.196x against 1.205x (250 rounds a request).
    auto falls = [](int, int round, int) { return round < 400 ? 0.85 : 0.2; };
    for (const auto & [p_late, l_late] : {std::pair{Requests{600, 256, 12}, Requests{600, 256, 12, false}},
                                          std::pair{Requests{600, 0, 4}, Requests{600, 0, 4, false}}}) {
        const Drafted fell  = run_requests(cm, DraftLengthOptions{}, falls, p_late);
        const Drafted fell0 = run_requests(cm, DraftLengthOptions{}, falls, l_late);
        EXPECT_GT(fell.off_after, 0.95);
        EXPECT_GT(fell.speedup, fell0.speedup - 0.01);
    }
}

// A draft that never pays on a target where a perfect one would (x25M-like: c = 0.2): probes
// and the draft catch-up they need stay within the budget share of the work, however short the
// probe interval, also when the books are carried from request to request (short requests that
// could not afford a probe each).
TEST(DraftLengthPolicy, ProbeBudgetBoundsWhatAUselessDraftCosts) {
    const CostModel cm{{0, 1.0, 2.5, 3.0, 3.3, 4.0, 4.0, 4.7, 4.7, 4.9}, 0.2, 0.02};
    for (double catch_up : {0.5, 8.0}) {
        for (double budget : {0.03, 0.01}) {
            DraftLengthOptions opts;
            opts.alpha_prior        = 0.0;
            opts.probe_interval     = 4;
            opts.probe_interval_max = 8;  // back-off alone would probe every 8 rounds
            opts.probe_budget       = budget;
            double total = 0, spent = 0;  // the same accounting, kept by the test
            int    probes = 0;
            for (int request = 0; request < 40; ++request) {  // 40 requests of 100 rounds
                DraftLengthPolicy p(cm, opts);
                for (int i = 0; i < 100; ++i) {
                    const int g = p.next_gamma();
                    if (g == 0) { total += 1; continue; }
                    ++probes;
                    const double round = cost_model_v(cm, g + 1) + g * cm.c + cm.o;
                    p.add_catch_up(catch_up);
                    p.observe(g, 0);  // emits 1 token
                    total += round + catch_up;
                    spent += round - 1 + catch_up;
                }
                opts.probe_ledger = p.probe_ledger();
            }
            EXPECT_GT(probes, 1) << budget;
            EXPECT_LE(probes, 40 * 100 / 8) << budget;
            // within the budget, give or take the first probe (its catch-up was not yet known)
            EXPECT_LE(spent, budget * total + catch_up) << budget << " " << catch_up;
        }
    }
}

// A model draft back on after plain rounds (a dip faded, off_relax) first catches up on the
// tokens emitted meanwhile, which S does not price: it comes on only while the probe budget can
// pay about the last catch-up, and pays it from there. (x25M beside stories260K came back on again
// and again that way: ~5% of a request in catch-ups, outside the budget.) A free proposal (c = 0
// this round) has nothing to catch up and is not held.
TEST(DraftLengthPolicy, ASwitchOnPaysItsCatchUpFromTheBudget) {
    struct Seen { int off_rounds; GammaDecision on; double spent_before, spent_after; };
    auto run = [](double spent, double c) {
        DraftLengthOptions opts;
        opts.probe_interval = 0;  // no probes: only the fading dip brings the drafter back
        opts.probe_ledger   = ProbeLedger{1000.0, spent, 5.0};
        CostModel cm        = x100m();
        cm.c                = c;
        DraftLengthPolicy p(cm, opts);
        for (int r = 0; r < 40; ++r) {  // good...
            const int g = p.next_gamma();
            if (g > 0) p.observe(g, g);
        }
        for (int r = 0; r < 50 && !p.last_decision().off; ++r) {  // ...then a dip: off
            const int g = p.next_gamma();
            if (g > 0) p.observe(g, 0);
        }
        EXPECT_TRUE(p.last_decision().off);
        Seen s{0, {}, 0, 0};
        while (s.off_rounds < 1000 && p.next_gamma() == 0) ++s.off_rounds;
        s.on           = p.last_decision();
        s.spent_before = p.probe_ledger().spent;
        p.add_catch_up(5.0);
        s.spent_after = p.probe_ledger().spent;
        return s;
    };
    const Seen room = run(0.0, 0.02);
    ASSERT_LT(room.off_rounds, 1000);
    EXPECT_TRUE(room.on.switch_on);
    EXPECT_FALSE(room.on.probe);
    EXPECT_NEAR(room.spent_after - room.spent_before, 5.0, 1e-9) << "the switch-on's catch-up is paid from the budget";
    // 30 spent, the budget 2% of ~1200 (the prior 1000 and this request's rounds): 5 more fit
    // once the work has grown to 1745, several hundred plain rounds later
    const Seen tight = run(30.0, 0.02);
    EXPECT_GE(tight.off_rounds, 300);
    EXPECT_GT(tight.off_rounds, room.off_rounds + 100) << room.off_rounds;
    EXPECT_TRUE(tight.on.switch_on);
    const Seen free_draft = run(30.0, 0.0);
    EXPECT_EQ(free_draft.off_rounds, run(0.0, 0.0).off_rounds) << "nothing to catch up";
}

// A probe in shadow (a deterministic model draft compared with plain decoding instead of verified):
// the same decisions as verified probes that are rejected, the same back-off, but the budget pays
// the draft alone (γc a probe) and the work booked is a plain round's. Shadows that match teach
// the profile like verified probes and turn the drafter on; a first look is never shadowed.
TEST(DraftLengthPolicy, ProbesInShadowCostTheirDraftAndBackOffAlike) {
    const CostModel cm{{0, 1.0, 2.5, 3.0, 3.3, 4.0, 4.0, 4.7, 4.7, 4.9}, 0.05, 0.1};
    DraftLengthOptions opts;
    opts.alpha_prior        = 0.0;
    opts.probe_budget       = 1.0;  // the interval alone decides here
    opts.probe_interval     = 4;
    opts.probe_interval_max = 64;
    struct Run {
        std::vector<int> probe_rounds;
        ProbeLedger      ledger;
        double           shadow_draft = 0;  // Σ γc over the shadowed probes
    };
    auto run = [&](bool shadow) {
        Run r;
        DraftLengthPolicy p(cm, opts);
        EXPECT_FALSE(p.shadow_probe());  // no decision yet
        for (int i = 0; i < 600; ++i) {
            const int g = p.next_gamma();
            if (g == 0) {
                EXPECT_FALSE(p.shadow_probe()) << i;  // off rounds are no probes
                continue;
            }
            EXPECT_TRUE(p.last_decision().probe) << i;
            r.probe_rounds.push_back(i);
            if (shadow) {
                EXPECT_TRUE(p.shadow_probe()) << i;
                EXPECT_FALSE(p.shadow_probe()) << i;  // once per probe
                r.shadow_draft += g * cm.c;
                p.observe_shadow_probe(g, 0);
            } else {
                p.observe(g, 0);
            }
        }
        r.ledger = p.probe_ledger();
        return r;
    };
    const Run verified = run(false), shadowed = run(true);
    ASSERT_GE(verified.probe_rounds.size(), 5u);
    EXPECT_EQ(shadowed.probe_rounds, verified.probe_rounds);  // 4, 13, 30, ...: the same back-off
    EXPECT_DOUBLE_EQ(shadowed.ledger.spent, shadowed.shadow_draft);
    EXPECT_LT(shadowed.ledger.spent, verified.ledger.spent / 10);  // a verified probe: v(γ+1) + γc + o − 1
    // the work of 600 rounds: plain passes, plus the shadows' drafts
    EXPECT_NEAR(shadowed.ledger.work, 600 + shadowed.shadow_draft, 1e-9);
    EXPECT_GT(verified.ledger.work, shadowed.ledger.work + 5);

    // Shadows that match: the drafter comes back on, as with verified probes that are accepted.
    // After a shadow accepted whole the next probe is verified (the drafter may be climbing
    // back: a verified probe also emits what it drafted), and the one after that is a shadow again.
    DraftLengthPolicy p(cm, opts);
    int rounds = 0, g = 0, shadows = 0, checked = 0;
    for (;; ++rounds) {
        ASSERT_LT(rounds, 400);
        g = p.next_gamma();
        if (g == 0) continue;
        if (!p.last_decision().probe) break;  // on
        if (p.shadow_probe()) {
            ASSERT_EQ(shadows, checked) << "a shadow after a shadow accepted whole";
            ++shadows;
            p.observe_shadow_probe(g, g);
        } else {
            ASSERT_EQ(shadows, checked + 1) << "a verified probe without a shadow accepted whole before it";
            ++checked;
            p.observe(g, g);
        }
    }
    EXPECT_GE(shadows, 1);
    EXPECT_GT(g, 0);
    EXPECT_GT(p.alpha(), 0.3);
    EXPECT_EQ(p.n_accepted(), p.n_at_risk());

    // A first look drafts for real.
    DraftLengthOptions look = opts;
    look.first_look = 16;
    DraftLengthPolicy q(cm, look);
    ASSERT_GT(q.next_gamma(), 0);
    EXPECT_TRUE(q.last_decision().probe);
    EXPECT_FALSE(q.shadow_probe());
}

TEST(DraftLengthPolicy, NoProbesWhenPerfectAcceptanceCannotPay) {
    CostModel cm;
    cm.v = {0, 1, 3.0, 4.5, 6.0, 7.5, 9.0, 10.5, 12.0, 13.5};  // a pass over n tokens costs 1.5n
    cm.c = 0.05;
    DraftLengthOptions opts;
    opts.alpha_prior = 1.0;
    DraftLengthPolicy p(cm, opts);
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(p.next_gamma(), 0) << i;
    EXPECT_EQ(p.n_off_rounds(), 1000);
}

TEST(DraftLengthPolicy, NeverProbesWhenIntervalZero) {
    DraftLengthOptions opts;
    opts.alpha_prior    = 0.2;
    opts.probe_interval = 0;
    DraftLengthPolicy p(x100m(), opts);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(p.next_gamma(), 0);
    EXPECT_EQ(p.n_off_rounds(), 100);
}

TEST(DraftLengthPolicy, RespectsCaps) {
    DraftLengthOptions opts;
    opts.alpha_prior = 0.95;
    opts.n_min       = 2;
    opts.n_max       = 5;
    DraftLengthPolicy p(x100m(), opts);
    EXPECT_EQ(p.next_gamma(), 5);               // wants more than n_max
    EXPECT_EQ(p.next_gamma(4), 3);              // up to γ + 1 = 4 tokens may be emitted
    EXPECT_TRUE(p.last_decision().capped);
    EXPECT_EQ(p.next_gamma(3), 2);
    EXPECT_EQ(p.next_gamma(2), 0);              // γ = 1 < n_min
    EXPECT_FALSE(p.last_decision().off);        // not the policy's choice: the cap's
    EXPECT_EQ(p.next_gamma(0), 0);
    EXPECT_EQ(p.next_gamma(-3), 0);
    EXPECT_EQ(p.n_off_rounds(), 0);
    EXPECT_EQ(p.gamma_hist().size(), 6u);
    EXPECT_EQ(p.gamma_hist()[5], 1);
    EXPECT_EQ(p.gamma_hist()[0], 3);

    opts.adaptive    = false;  // always n_max, even when it does not pay
    opts.alpha_prior = 0.0;
    DraftLengthPolicy fixed(x100m(), opts);
    EXPECT_EQ(fixed.next_gamma(), 5);
    EXPECT_EQ(fixed.next_gamma(3), 2);
    EXPECT_EQ(fixed.next_gamma(2), 0);

    opts.n_min = 0;  // n_min 0 behaves as 1
    opts.n_max = 0;  // speculation disabled
    DraftLengthPolicy none(x100m(), opts);
    EXPECT_EQ(none.next_gamma(), 0);
}

// The handed-on profile takes the longer run only at depths the request measured itself: where it
// drafted nothing, the longer run is the prior's, which came from this same profile, and taking
// the max there ratcheted a seldom reached depth up to the best it ever read (x100M-near at
// T = 0.8 drafted longer and accepted 69% of its drafted tokens against 73%).
TEST(DraftLengthPolicy, TheHandedOnProfileDoesNotRatchetUnmeasuredDepths) {
    DraftLengthOptions o;
    o.n_max       = 16;
    o.depth_prior.assign(18, 0.9);
    for (size_t j = 10; j < o.depth_prior.size(); ++j) o.depth_prior[j] = 0.99;  // read high once
    DraftLengthPolicy p(x100m(), o);
    for (int r = 0; r < 20; ++r) p.observe(4, 4);  // drafts to depth 4 only, all accepted
    const std::vector<double> a = p.depth_acceptance(), next = p.next_depth_prior();
    EXPECT_LT(a[12], 0.98) << "the prior's weight at depth 12 has faded towards the depths above";
    EXPECT_EQ(next[12], a[12]) << "not the longer run started from the prior (0.99)";
    EXPECT_GE(next[3], a[3]);
}

TEST(DraftLengthPolicy, OptionsCheck) {
    EXPECT_TRUE(draft_length_options_check(DraftLengthOptions{}).is_ok());
    DraftLengthOptions o;
    o.n_min = 5;
    o.n_max = 3;
    EXPECT_EQ(draft_length_options_check(o).param(), "n_max");
    o       = {};
    o.ema_weight = 0.0;
    EXPECT_EQ(draft_length_options_check(o).param(), "ema_weight");
    o       = {};
    o.alpha_prior = 1.5;
    EXPECT_EQ(draft_length_options_check(o).param(), "alpha_prior");
    o       = {};
    o.slow_weight = 0.0;
    EXPECT_EQ(draft_length_options_check(o).param(), "slow_weight");
    o       = {};
    o.off_relax = std::nan("");
    EXPECT_EQ(draft_length_options_check(o).param(), "off_relax");
    o       = {};
    o.prior_run = -1;
    EXPECT_EQ(draft_length_options_check(o).param(), "prior_run");
    o.prior_run = std::numeric_limits<double>::infinity();
    EXPECT_EQ(draft_length_options_check(o).param(), "prior_run");
}

TEST(DraftLengthPolicy, TracksSimulatedAcceptance) {
    // Chains with a true per-position acceptance α*: the estimate converges near α*.
    for (double truth : {0.5, 0.8, 0.95}) {
        DraftLengthOptions opts;
        opts.adaptive = false;
        opts.n_max    = 4;
        opts.ema_weight = 0.02;
        DraftLengthPolicy               p(x100m(), opts);
        std::mt19937_64                 rng(5);
        std::bernoulli_distribution     acc(truth);
        double                          avg = 0.0;
        for (int r = 0; r < 4000; ++r) {
            const int g = p.next_gamma();
            int       k = 0;
            while (k < g && acc(rng)) ++k;
            p.observe(g, k);
            if (r >= 2000) avg += p.alpha() / 2000;
        }
        EXPECT_NEAR(avg, truth, 0.03) << truth;
    }
}

// The measured curve is cleaned as a lower envelope: a stalled size is capped by the next larger
// one (noise only adds time) and the result never decreases.
TEST(CostCurve, MonotoneEnvelopeCapsAStalledMeasurement) {
    CostModel cm;
    cm.v = {0.0, 1.0, 2.4, 6.3, 3.7, 4.3, 0.0, 5.0};  // v(3) stalled; v(6) not measured
    cost_make_monotone(cm);
    EXPECT_DOUBLE_EQ(cm.v[3], 3.7);  // capped by v(4)
    for (size_t n = 2; n < cm.v.size(); ++n) {
        EXPECT_GE(cm.v[n], cm.v[n - 1]) << n;
        EXPECT_GE(cm.v[n], 1.0) << n;
    }
    EXPECT_DOUBLE_EQ(cm.v[6], 4.3);  // filled from below
    EXPECT_DOUBLE_EQ(cm.v[7], 5.0);
}

// A probe that is fully accepted does not back off: α is climbing, so the next probe comes after
// the same interval, until speculation pays; a rejected probe doubles the interval.
TEST(DraftLengthPolicy, AcceptedProbesKeepTheInterval) {
    DraftLengthOptions opts;
    opts.probe_budget   = 1.0;  // the interval alone decides here
    opts.alpha_prior    = 0.3;
    opts.probe_interval = 16;
    opts.probe_gamma    = 2;
    DraftLengthPolicy p(x100m(), opts);
    std::vector<int> gaps;
    int since = 0;
    for (int i = 0; i < 400; ++i) {
        const int g = p.next_gamma();
        if (g == 0) { ++since; continue; }
        if (!p.last_decision().probe) break;  // on again
        gaps.push_back(since);
        since = 0;
        p.observe(g, g);
    }
    ASSERT_GE(gaps.size(), 3u);
    for (size_t i = 1; i < gaps.size(); ++i) EXPECT_EQ(gaps[i], gaps[0]) << i;
    EXPECT_GT(p.alpha(), 0.6);  // it came back on

    DraftLengthPolicy q(x100m(), opts);  // the same with a rejected probe: the gap doubles
    since = 0;
    gaps.clear();
    for (int i = 0; i < 200 && gaps.size() < 3; ++i) {
        const int g = q.next_gamma();
        if (g == 0) { ++since; continue; }
        gaps.push_back(since);
        since = 0;
        q.observe(g, 0);
    }
    ASSERT_EQ(gaps.size(), 3u);
    EXPECT_EQ(gaps[2], 2 * gaps[1]);
}

// The probe back-off is the drafter's state, not the request's: carried in the ledger from
// request to request, a useless drafter's probes thin out across a stream of short requests as
// they do within one long request. (Restarting at probe_interval, every 256-token request probed
// at rounds 16, 48, 112 and 240, until only the budget stopped it: ~2% of all the work.)
TEST(DraftLengthPolicy, ProbeBackOffCarriesAcrossRequests) {
    const CostModel cm{{0, 1.0, 2.15, 2.5, 2.9, 3.4, 3.7, 4.1, 4.58, 4.7, 4.8, 4.9, 5.0, 5.1, 5.3, 5.4, 5.59, 5.9}, 0.169, 0.03};
    DraftLengthOptions opts;
    opts.probe_budget = 1.0;  // the interval alone decides here
    opts.n_max        = 16;
    opts.alpha_prior  = 0.0;  // learned: this drafter is useless
    int probes_late = 0;
    for (int request = 0; request < 40; ++request) {
        DraftLengthPolicy p(cm, opts);
        for (int i = 0; i < 256; ++i) {
            const int g = p.next_gamma();
            if (g == 0) continue;
            ASSERT_TRUE(p.last_decision().probe);
            probes_late += request >= 20;
            p.observe(g, 0);
        }
        opts.probe_ledger = p.probe_ledger();
    }
    // backed off to probe_interval_max (512 rounds): one probe per two requests at most
    EXPECT_LE(probes_late, 20 * 256 / opts.probe_interval_max + 1);
    EXPECT_GE(probes_late, 1);  // but it still looks now and then
}

// The cost of sizes the policy never drafts is never measured again: a start-up probe that read
// v(16) too high during a burst of load (6.67 where another engine read 6.25) kept γ at 11 for a
// whole run. While on, every explore_every-th round drafts to the cap twice in a row, so the
// engine gets a steady sample of the long pass (the second) and the curve can correct itself.
TEST(DraftLengthPolicy, ExploresTheLongestDraftNowAndThen) {
    CostModel cm = x100m_near_here();
    cm.v.back() = 7.5;  // v(17) read high: a 16-token draft looks worse than a shorter one
    DraftLengthOptions opts;
    opts.n_max       = 16;
    opts.alpha_prior = 0.95;
    for (int every : {64, 0}) {
        opts.explore_every = every;
        DraftLengthPolicy p(cm, opts);
        std::vector<int> gs;
        for (int i = 0; i < 640; ++i) {
            const int g = p.next_gamma();
            gs.push_back(g);
            EXPECT_EQ(p.last_decision().explore, g == 16) << i;  // the cap only when exploring
            p.observe(g, g);  // all accepted: on throughout, γ* = 15 (v(17) read high)
        }
        int at_cap = 0, pairs = 0;
        for (size_t i = 0; i < gs.size(); ++i) {
            ASSERT_GT(gs[i], 0) << i;
            if (gs[i] != 16) continue;
            ++at_cap;
            if (i + 1 < gs.size() && gs[i + 1] == 16) { ++pairs; ++i; ++at_cap; }
        }
        if (every == 0) {
            EXPECT_EQ(at_cap, 0);
        } else {
            EXPECT_NEAR(pairs, 640 / every, 1);
            EXPECT_EQ(at_cap, 2 * pairs);  // always two in a row
        }
    }
}

// A fresh engine looks before it decides: with nothing learned for a drafter, its first rounds
// draft (probes, outside the budget, as deep as speculation would draft), whatever the flat
// prior predicts. On this machine's honest cost curve (v(16) ≈ 5.75, c ≈ 0.055) the prior 0.85
// predicts S ≈ 0.92: the first request started off, its first probe came at round 17 and, landing
// where draft and target part ways, kept a good draft (α 0.95) off for the whole request. One
// round of looking was not enough either: a first draft that breaks at depth 3 leaves α at 0.80,
// below break-even, and speculation was off for 41 of 55 rounds of a request accepted at 0.96:
// it looks until 16 positions are tested (at most first_look_rounds rounds).
TEST(DraftLengthPolicy, FreshDrafterLooksInItsFirstRounds) {
    const CostModel cm{{0, 1.0, 2.49, 2.90, 3.46, 3.9, 4.32, 4.4, 4.47, 4.7, 4.9, 5.1, 5.3, 5.4, 5.5, 5.6, 5.75, 6.19}, 0.055, 0.02};
    DraftLengthOptions opts;
    opts.n_max = 16;
    ASSERT_EQ(choose_gamma(cm, opts.alpha_prior, 1, 16).gamma, 0);  // the prior alone says off
    {
        DraftLengthPolicy p(cm, opts);
        EXPECT_EQ(p.next_gamma(), 0);  // without the rule: off from the start
    }
    opts.first_look = 16;
    {  // right from the start: on
        DraftLengthPolicy p(cm, opts);
        const int g = p.next_gamma();
        EXPECT_TRUE(p.last_decision().probe);
        EXPECT_GE(g, opts.probe_gamma);
        p.observe(g, g);
        EXPECT_GT(p.next_gamma(), 0);
        EXPECT_FALSE(p.last_decision().probe);
    }
    {  // an unlucky first draft (broken at depth 3), then right: the second look turns it on
        DraftLengthPolicy p(cm, opts);
        const int g = p.next_gamma();
        p.observe(g, 2);
        ASSERT_EQ(choose_gamma(cm, p.alpha(), 1, 16).gamma, 0);  // judged now, it would be off
        const int g2 = p.next_gamma();
        EXPECT_GT(g2, 0);
        EXPECT_TRUE(p.last_decision().probe);
        p.observe(g2, g2);
        for (int i = 0; i < 8; ++i) {
            const int gi = p.next_gamma();
            EXPECT_GT(gi, 0) << i;
            EXPECT_FALSE(p.last_decision().probe) << i;
            p.observe(gi, gi);
        }
    }
    // a drafter that is wrong (one position per round) drafts in exactly first_look_rounds rounds,
    // then is off; the looks are no failed probes: the probe interval does not back off (their
    // cost is booked, though)
    DraftLengthPolicy q(cm, opts);
    for (int i = 0; i < opts.first_look_rounds; ++i) {
        const int g = q.next_gamma();
        EXPECT_GT(g, 0) << i;
        q.observe(g, 0);
    }
    for (int i = 0; i < 8; ++i) EXPECT_EQ(q.next_gamma(), 0) << i;
    EXPECT_EQ(q.probe_ledger().interval, opts.probe_interval);
    EXPECT_GT(q.probe_ledger().spent, 3.0);
}

// A drafter that is right for four tokens and then guesses (a[j] = 0.98 for j <= 4, 0.4 after):
// its pooled α is ~0.85, and the i.i.d. model would draft long; the depth profile learns the
// cliff and keeps γ near 4, where the real speed-up is.
TEST(DraftLengthPolicy, DepthProfileLearnsWhereDraftsFallApart) {
    DraftLengthOptions opts;
    opts.n_max       = 16;
    opts.alpha_prior = 0.9;
    DraftLengthPolicy p(x100m(), opts);
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> u(0, 1);
    std::vector<int64_t> chosen(17, 0);
    for (int r = 0; r < 3000; ++r) {
        const int g = p.next_gamma();
        if (g <= 0) continue;
        int k = 0;
        while (k < g && u(rng) < (k < 4 ? 0.98 : 0.4)) ++k;
        p.observe(g, k);
        if (r >= 1000) chosen[size_t(g)]++;
    }
    const auto a = p.depth_acceptance();
    EXPECT_NEAR(a[2], 0.98, 0.05);
    EXPECT_LT(a[6], 0.7);
    int64_t mode = 0;
    for (size_t g = 1; g < chosen.size(); ++g)
        if (chosen[g] > chosen[size_t(mode)]) mode = int64_t(g);
    EXPECT_GE(mode, 4);
    EXPECT_LE(mode, 6);
    // the expected-token model agrees with the truth at the chosen depth
    std::vector<double> truth(17, 0.4);
    for (int j = 1; j <= 4; ++j) truth[size_t(j)] = 0.98;
    EXPECT_NEAR(expected_tokens(a, int(mode)), expected_tokens(truth, int(mode)), 0.25);
    // with a[j] = α everywhere the profile form equals the scalar one
    EXPECT_NEAR(expected_tokens(std::vector<double>(9, 0.8), 6), expected_tokens(0.8, 6), 1e-12);
}

// The profile a request learned is the next one's starting point: with the same pooled α, a
// fresh policy drafts long from its first round, one given the profile of a draft that falls
// apart after depth 4 drafts near 4 at once.
TEST(DraftLengthPolicy, DepthPriorCarriesWhereDraftsFallApart) {
    DraftLengthOptions opts;
    opts.n_max       = 16;
    opts.alpha_prior = 0.95;
    DraftLengthPolicy fresh(x100m(), opts);
    std::vector<double> learned(18, 0.4);
    for (int j = 1; j <= 4; ++j) learned[size_t(j)] = 0.98;
    opts.depth_prior = learned;
    DraftLengthPolicy informed(x100m(), opts);
    const int g_fresh = fresh.next_gamma(), g_informed = informed.next_gamma();
    EXPECT_GE(g_fresh, 7);
    EXPECT_GE(g_informed, 3);
    EXPECT_LE(g_informed, 5);
    EXPECT_NEAR(informed.depth_acceptance()[2], 0.98, 1e-9);
    EXPECT_NEAR(informed.depth_acceptance()[8], 0.4, 1e-9);
}

// On a steep cost curve (this machine's x100M-near: only long drafts pay) a probe drafts as deep
// as speculation would if it turned on, so it refreshes the acceptance that decides. Here the
// learned profile says the draft falls apart after depth 3, but the draft now holds at 0.95 at
// every depth: 3-token probes could never show it (S(3) < 1 even at α = 1 up to depth 3, and
// depths 4+ would keep their learned 0.5), deep probes turn speculation on within a few probes.
TEST(DraftLengthPolicy, ProbesDraftToTheDepthThatDecides) {
    const CostModel steep = x100m_near_here();
    DraftLengthOptions opts;
    opts.n_max        = 16;
    opts.probe_budget = 1.0;  // the interval alone decides here
    opts.min_speedup  = 1.0;  // the switch-on point these figures are computed for
    opts.alpha_prior  = 0.9;
    opts.depth_prior  = std::vector<double>(18, 0.5);
    for (int j = 1; j <= 3; ++j) opts.depth_prior[size_t(j)] = 0.9;
    DraftLengthPolicy p(steep, opts);
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> u(0, 1);
    int probes = 0, first_on = -1;
    for (int r = 0; r < 2000 && first_on < 0; ++r) {
        const int g = p.next_gamma();
        if (g <= 0) continue;
        if (p.last_decision().probe) {
            ++probes;
            EXPECT_GE(g, 6) << "probe " << probes;
        } else {
            first_on = r;
        }
        int k = 0;
        while (k < g && u(rng) < 0.95) ++k;
        p.observe(g, k);
    }
    EXPECT_GE(first_on, 0) << "speculation never turned on";
    EXPECT_LE(probes, 4);
    EXPECT_GE(p.last_decision().gamma, 6);
}

// The same stale profile while speculation is on: the depths past the chosen γ are never drafted,
// so what the prior says there would hold for good (γ stuck where the old draft fell apart). The
// prior's weight past the drafted depths fades, γ grows, and the deep depths are measured again.
TEST(DraftLengthPolicy, StaleDeepPriorFadesWhileOn) {
    const CostModel steep = x100m_near_here();
    DraftLengthOptions opts;
    opts.n_max        = 16;
    opts.alpha_prior  = 0.95;
    opts.depth_prior  = std::vector<double>(18, 0.3);
    for (int j = 1; j <= 4; ++j) opts.depth_prior[size_t(j)] = 0.97;
    DraftLengthPolicy p(steep, opts);
    const int g0 = p.next_gamma();
    EXPECT_GE(g0, 1);
    EXPECT_LE(g0, 7);  // the prior is believed at first (v is flat from 5 to 8 tokens here)
    std::mt19937 rng(5);
    std::uniform_real_distribution<double> u(0, 1);
    double sum_g = 0;
    for (int r = 0, g = g0; r < 600; ++r, g = p.next_gamma()) {
        int k = 0;
        while (k < g && u(rng) < 0.95) ++k;
        if (g > 0) p.observe(g, k);
        if (r >= 300) sum_g += g;
    }
    EXPECT_GE(sum_g / 300, 10.0);  // the truth (0.95 at every depth) wants γ ≈ 15
    EXPECT_NEAR(p.depth_acceptance()[10], 0.95, 0.08);
}

// The online pass-time estimate: a median of the recent samples. A few stalls (another process
// taking a core) must not move it, a lasting change of speed must, and old samples leave the window.
TEST(RecentMedian, IgnoresStallsFollowsLastingChanges) {
    RecentMedian m;
    EXPECT_EQ(m.median(), 0.0);
    for (int i = 0; i < 20; ++i) m.add(4.0 + 0.01 * (i % 3));
    EXPECT_NEAR(m.median(), 4.01, 1e-9);
    for (int i = 0; i < 5; ++i) m.add(30.0);  // five stalls: a moving average would be at ~20
    EXPECT_NEAR(m.median(), 4.01, 0.011);
    for (int i = 0; i < RecentMedian::kWindow; ++i) m.add(6.0);  // the machine got slower
    EXPECT_EQ(m.median(), 6.0);
    EXPECT_EQ(m.count(), 20 + 5 + RecentMedian::kWindow);
}

// Seeded requests at T > 0 draw coupled (drafter-invariant) tokens, which accept less than
// rejection sampling on the same pair: what unseeded requests learned must not be a seeded
// request's prior, nor the other way round (the engine keys priors by regime).
TEST(LearnedPrior, CoupledDrawsAreARegimeOfTheirOwn) {
    auto e = test::make_engine("stories260K-F32.gguf", "", 1, 256);
    ASSERT_NE(e, nullptr);
    CompletionRequest req = test::greedy_request(*e, "Once upon a time", 48);
    // a free drafter: its acceptance is learned from shadow drafts whether it pays or not
    req.spec.types           = {SpecType::SYNTH};
    req.spec.synth_rates     = {0.5f};
    req.spec.synth_reference = test::output_ids(e->complete(req).value());
    req.sampling.temperature = 0.8f;
    req.sampling.seed        = 0xFFFFFFFF;  // unseeded: rejection sampling
    auto a = e->complete(req);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    auto b = e->complete(req);
    ASSERT_TRUE(b.is_ok());
    const double fresh = DraftLengthOptions{}.alpha_prior;
    ASSERT_NE(b.value().spec.alpha_prior, fresh) << "the second unseeded request starts from what the first learned";
    req.sampling.seed = 42;  // seeded: coupled draws
    auto c = e->complete(req);
    ASSERT_TRUE(c.is_ok());
    EXPECT_EQ(c.value().spec.alpha_prior, fresh) << "a seeded request started from the unseeded requests' prior";
}

// A prompt that ends inside a copy of its own earlier text is a regime of its own: a drafter
// accepts far more on such text than on other text, and one prior for both taught a fresh process
// the mean (copy-F32 at T = 0.8 stayed off on copy-heavy prompts, where a warm engine found it
// pays). What requests that copy teach must not be the prior of one that does not.
TEST(LearnedPrior, CopiedTextIsARegimeOfItsOwn) {
    auto e = test::make_engine("stories260K-F32.gguf", "", 1, 256);
    ASSERT_NE(e, nullptr);
    const std::string passage = "Lily had a big red ball. She threw the ball to her dog Max, and Max ran after it.";
    auto request = [&](const std::string & prompt) {
        CompletionRequest req = test::greedy_request(*e, prompt, 48);
        req.spec.types.clear();  // the reference: the request's own greedy output, drafted half right
        req.spec.synth_reference = test::output_ids(e->complete(req).value());
        req.spec.types       = {SpecType::SYNTH};
        req.spec.synth_rates = {0.5f};
        auto r = e->complete(req);
        EXPECT_TRUE(r.is_ok()) << r.status().to_string();
        return r.is_ok() ? r.value().spec.alpha_prior : -1.0;
    };
    const double fresh = DraftLengthOptions{}.alpha_prior;
    const std::string copying = passage + "\n\nLily had a big red ball. She threw";  // the repetition's start
    EXPECT_EQ(request(copying), fresh);
    ASSERT_NE(request(copying), fresh) << "the second copying request starts from what the first learned";
    // other text, which repeats itself only in short pieces ("the ball", "Max")
    EXPECT_EQ(request(passage + " Then Max gave the ball back to"), fresh)
        << "a prompt that does not end in a copy started from what copying prompts taught";
}

namespace {

// The copy target (stories260K-copy-x100M) at 2 threads behind 128 cells, steady passes
// (bench/pass_bench --sizes): n/v(n) still grows past 16 tokens, to 3.2 at 32.
CostModel copy_x100m_here() {
    CostModel cm{std::vector<double>(49, 0.0), 0.0, 0.02};
    for (auto [n, v] : {std::pair{1, 1.0}, {2, 2.09}, {4, 2.74}, {8, 4.08}, {12, 6.15}, {16, 6.27}, {20, 7.13},
                        {24, 8.03}, {32, 9.96}, {48, 16.12}})
        cm.v[size_t(n)] = v;
    return cm;
}

// A free drafter's options (the engine's: shadows instead of probes) at the default cap of 32.
DraftLengthOptions free_drafter_options() {
    DraftLengthOptions opts;
    opts.n_max          = 32;
    opts.probe_interval = 0;
    return opts;
}

// A copy drafter on text it half knows: after a long match (class 7) the target copies on and
// every proposal of 32 is accepted whole; after a short one (class 1) the target has left the
// passage and the first token already fails. Rounds the policy leaves off are shadow-measured, as
// the engine does for free drafters. Returns tokens ÷ cost over rounds [from, n) (plain = 1 per
// pass) and fills *g_long / *g_short with the γ of the last decision of each class.
double run_bimodal(DraftLengthPolicy & p, bool use_classes, int n, int from, int * g_long, int * g_short) {
    const CostModel cm = copy_x100m_here();
    std::mt19937 rng(11);
    double tokens = 0, cost = 0;
    for (int r = 0; r < n; ++r) {
        const bool copying = rng() % 2 == 0;
        const int  cls     = copying ? 7 : 1;
        const int  tag     = use_classes ? cls : 0;
        const int  g       = p.next_gamma(33, tag);  // a proposal of 32 tokens
        (copying ? *g_long : *g_short) = g;
        const int k = copying ? std::max(g, 0) : 0;
        if (g > 0) p.observe(g, k, tag);
        else p.observe(32, copying ? 32 : 0, tag);  // the shadow draft
        if (r < from) continue;
        tokens += g > 0 ? k + 1 : 1;
        cost += g > 0 ? cost_model_v(cm, g + 1) + cm.o : 1.0;
    }
    return tokens / cost;
}

}  // namespace

// Prompt lookup's acceptance is bimodal (docs/benchmarks.md, "Draft classes"): one profile for
// both drafts short after long matches and keeps whole copies off. With the proposal's class the
// policy drafts the whole proposal where the copy holds and nothing where it does not.
TEST(DraftClasses, BimodalDrafterDraftsLongOnlyWhereTheCopyHolds) {
    DraftLengthOptions opts = free_drafter_options();
    int g_long = -1, g_short = -1;
    DraftLengthPolicy classed(copy_x100m_here(), opts);
    const double s_classed = run_bimodal(classed, true, 400, 100, &g_long, &g_short);
    EXPECT_GE(g_long, 31);  // v(32) = 9.96 and v(33) = 10.3: S(31) = 3.21 > S(32) = 3.19
    EXPECT_EQ(g_short, 0);
    EXPECT_GT(classed.depth_acceptance(7)[20], 0.95);
    EXPECT_LT(classed.depth_acceptance(1)[1], 0.1);
    DraftLengthPolicy pooled(copy_x100m_here(), opts);
    const double s_pooled = run_bimodal(pooled, false, 400, 100, &g_long, &g_short);
    // ~2.9 against ~1.6: every long proposal drafted whole, and no short one verified
    EXPECT_GT(s_classed, 2.5);
    EXPECT_GT(s_classed, 1.4 * s_pooled);
}

// What a request learned of each class is where the next one starts: its first decisions already
// draft the long match whole and leave the short one off.
TEST(DraftClasses, ClassEvidenceCarriesToTheNextRequest) {
    DraftLengthOptions opts = free_drafter_options();
    int g_long = -1, g_short = -1;
    DraftLengthPolicy first(copy_x100m_here(), opts);
    run_bimodal(first, true, 60, 0, &g_long, &g_short);
    opts.class_prior = first.class_evidence();
    DraftLengthPolicy next(copy_x100m_here(), opts);
    EXPECT_GE(next.next_gamma(33, 7), 31);
    EXPECT_EQ(next.next_gamma(33, 1), 0);
    opts.class_prior.clear();
    DraftLengthPolicy fresh(copy_x100m_here(), opts);
    EXPECT_NEAR(fresh.depth_acceptance(7)[3], fresh.depth_acceptance(0)[1], 1e-9);  // nothing learned: pooled
}

// A class never drafted deeper than its proposals so far borrows each deeper depth from the one
// above it, not from the pooled prior: proposals of 7 tokens, all accepted, must let γ reach the
// cap as soon as a proposal is long enough. (Borrowing the prior's 0.85 kept γ at 7-12 through a
// copy of 100 tokens, every round fully accepted: 294 t/s against 410 t/s.)
TEST(DraftClasses, DepthsNotYetReachedBorrowFromTheDepthAbove) {
    DraftLengthOptions opts = free_drafter_options();
    DraftLengthPolicy p(copy_x100m_here(), opts);
    for (int r = 0; r < 3; ++r) {
        const int g = p.next_gamma(8, 7);  // proposals of 7 tokens (the prior 0.85 drafts 5 first)
        ASSERT_GT(g, 0) << r;
        p.observe(g, g, 7);
    }
    const auto a = p.depth_acceptance(7);
    EXPECT_GT(a[5], 0.97);
    EXPECT_GE(a[20], a[5] - 1e-12);
    EXPECT_GE(p.next_gamma(33, 7), 31);
}

// "lookup, then draft": the model drafts (class 0) when lookup finds nothing. Here lookup's
// proposals (class 7) are copies accepted whole and the model's 15-token drafts fail at the
// second token, each round priced as the engine prices it (c for the model's, 0 for lookup's).
// Returns how many of the last 40 model rounds drafted, and fills *g_long with lookup's last γ.
static int run_chain(bool classes_apart, int * g_long) {
    DraftLengthOptions opts;
    opts.n_max         = 32;
    opts.classes_apart = classes_apart;
    CostModel model = copy_x100m_here();
    model.c         = 0.13;  // copy-F32 beside the x100M copy target
    const CostModel free = copy_x100m_here();
    DraftLengthPolicy p(model, opts);
    int drafted = 0;
    for (int r = 0; r < 200; ++r) {
        const bool copying = r % 2 == 0;
        p.set_cost_model(copying ? free : model);
        const int g = copying ? p.next_gamma(33, 7) : p.next_gamma(16, 0);
        if (copying) *g_long = g;
        if (g <= 0) continue;
        p.observe(g, copying ? g : std::min(g, 1), copying ? 7 : 0);
        if (!copying && r >= 120) ++drafted;
    }
    return drafted;
}

// With classes apart the model's drafts are judged on their own profile: off but for probes,
// while lookup's copies stay drafted whole. Pooled (the broken variant, what the engine did
// before), lookup's whole copies kept the model drafting every round it was asked.
TEST(DraftClasses, AChainsModelDraftsKeepTheirOwnProfile) {
    int g_long = -1;
    const int apart = run_chain(true, &g_long);
    EXPECT_LE(apart, 4);  // probes only (interval 16, doubling after each rejection)
    EXPECT_GE(g_long, 31);
    const int pooled = run_chain(false, &g_long);
    EXPECT_GE(pooled, 30);
}

// Exploration looks at twice the chosen γ, not at the cap: a model drafter at γ ≈ 3 under a cap
// of 32 would otherwise pay for a 32-token draft every explore_every rounds.
TEST(DraftLengthPolicy, ExploresUpToTwiceTheChosenLength) {
    DraftLengthOptions opts;
    opts.n_max         = 32;
    opts.alpha_prior   = 0.9;  // best γ 6-7 on this curve
    opts.explore_every = 8;
    DraftLengthPolicy p(copy_x100m_here(), opts);
    int explored = 0;
    for (int r = 0; r < 64; ++r) {
        const int g = p.next_gamma();
        const int best = choose_gamma(p.cost_model(), p.depth_acceptance(), 1, 32).gamma;
        ASSERT_GT(best, 0);
        ASSERT_LT(2 * best, 32);
        if (p.last_decision().explore) {
            ++explored;
            EXPECT_EQ(g, 2 * best) << r;
        } else {
            EXPECT_EQ(g, best) << r;
        }
    }
    EXPECT_GE(explored, 8);
}

// Classes are ordered by confidence: a class not seen yet starts from the class below it when that
// one does better than the pooled profile, so a fresh process whose copy held at 4-5-token matches
// drafts long at its first 6-9-token match. A class doing worse than the pooled profile does not
// pull the ones above it down.
TEST(DraftClasses, AnUnseenClassStartsFromTheClassBelow) {
    DraftLengthOptions opts = free_drafter_options();
    opts.alpha_prior        = 0.6;
    DraftLengthPolicy p(copy_x100m_here(), opts);
    for (int r = 0; r < 8; ++r) p.observe(16, 16, 3);  // matches of 4-5 tokens: copies hold
    for (int r = 0; r < 8; ++r) p.observe(4, 0, 1);    // 1-2 tokens: they fail
    const double pooled = p.depth_acceptance(0)[1];
    EXPECT_GT(p.depth_acceptance(3)[1], 0.9);
    EXPECT_LT(p.depth_acceptance(1)[1], 0.4);
    EXPECT_NEAR(p.depth_acceptance(2)[1], pooled, 1e-9);                    // above a bad class: pooled
    EXPECT_NEAR(p.depth_acceptance(5)[1], p.depth_acceptance(3)[1], 1e-9);  // above a good one: that one
    EXPECT_GT(p.depth_acceptance(5)[20], 0.99);  // class 3's profile, past its depths its own depth above
    EXPECT_GE(p.next_gamma(33, 5), 24);
    EXPECT_LT(pooled, 0.85);
}

// The confidence stop of greedy model drafts: each bin of the draft's top probability learns what
// its tokens are worth. Here the sure tokens (bin 9) are always accepted and the unsure ones
// (bin 2) never: a path of sure tokens drafts on, one unsure token after it stops the draft, a
// chain that is all doubt is not worth its pass, and probes draft whole (no stop).
TEST(DraftLengthPolicy, ConfidenceStopLearnsWhatEachBinIsWorth) {
    DraftLengthOptions o;
    o.n_max = 16;
    DraftLengthPolicy pol(x100m(), o);
    EXPECT_EQ(DraftLengthPolicy::confidence_bin(0.05), 0);
    EXPECT_EQ(DraftLengthPolicy::confidence_bin(0.25), 1);
    EXPECT_EQ(DraftLengthPolicy::confidence_bin(0.99), kConfBins - 1);
    for (int b = 0; b < kConfBins; ++b) EXPECT_DOUBLE_EQ(pol.confidence_acceptance(b), pol.alpha());  // the prior
    ASSERT_GT(pol.next_gamma(), 0);
    const double stop = pol.stop_below();
    EXPECT_GT(stop, 0.0);  // the speed-up times a verified position's cost, at most A_γ
    EXPECT_LE(stop, std::pow(pol.alpha(), pol.last_decision().gamma) + 1e-12);  // bins at the prior never cut
    for (int i = 0; i < 60; ++i) {
        pol.next_gamma();
        pol.observe(4, 3);
        pol.observe_confidence({9, 9, 9, 2}, 3);
    }
    const double sure = pol.confidence_acceptance(9), unsure = pol.confidence_acceptance(2);
    EXPECT_GT(sure, 0.9);
    EXPECT_LT(unsure, 0.1);
    EXPECT_DOUBLE_EQ(pol.confidence_acceptance(5), pol.alpha());  // a bin never seen keeps the prior
    ASSERT_GT(pol.next_gamma(), 0);
    EXPECT_GE(sure * sure * sure, pol.stop_below());           // three sure tokens: on
    EXPECT_LT(sure * sure * sure * unsure, pol.stop_below());  // then an unsure one: stop
    EXPECT_TRUE(pol.chain_pays({sure, sure * sure, sure * sure * sure}));
    EXPECT_FALSE(pol.chain_pays({unsure}));
    // what a request learned is its next one's prior
    DraftLengthOptions next = o;
    next.confidence_prior   = pol.confidence_evidence();
    DraftLengthPolicy pol2(x100m(), next);
    EXPECT_NEAR(pol2.confidence_acceptance(2), unsure, 0.05);
    // a probe drafts whole (no stop): it is how a bin the stop avoids is tested again
    DraftLengthOptions bad = o;
    bad.alpha_prior    = 0.05;
    bad.probe_interval = 1;
    bad.probe_budget   = 1.0;
    DraftLengthPolicy off(x100m(), bad);
    bool probed = false;
    for (int i = 0; i < 8 && !probed; ++i) {
        if (off.next_gamma() > 0) {
            probed = true;
            EXPECT_TRUE(off.last_decision().probe);
            EXPECT_EQ(off.stop_below(), 0.0);
        }
    }
    EXPECT_TRUE(probed);
}

// The confidence stop's empty rounds (cut before anything worth verifying) run the draft and then
// decode plain: one token for a plain pass and the draft step. The verified rounds here pay (all
// but the last drafted token accepted), but nine paying rounds in ten are empty, each half a pass
// dearer than plain: S_e = ((1 − e)·E + e) / ((1 − e)·cost + e·1.5) < 1, so the draft goes off,
// and while off e fades, so it is tried again now and then; e and x go on to the next request.
// Not told of the empty rounds (the engine before observe_empty), the policy stays on throughout.
TEST(DraftLengthPolicy, EmptyRoundsOfTheStopPriceADraftOff) {
    DraftLengthOptions o;
    o.n_max = 16;
    ConfidenceEvidence carried;
    auto late_on_share = [&](bool told, int * switched_on) {
        DraftLengthPolicy pol(x100m(), o);
        int on = 0, late = 0, paying = 0;
        bool was_off = false;
        *switched_on = 0;
        for (int i = 0; i < 600; ++i) {
            const int g = pol.next_gamma();
            const GammaDecision & d = pol.last_decision();
            const bool pays = g > 0 && !d.probe && !d.explore;
            if (i >= 300) {
                ++late;
                on += pays ? 1 : 0;
                if (pays && was_off) ++*switched_on;
            }
            was_off = !pays;
            if (g <= 0) continue;
            if (pays && ++paying % 10 != 0) {
                if (told) pol.observe_empty(0.5);
                continue;
            }
            pol.observe(g, g - 1);
        }
        carried = pol.confidence_evidence();
        return double(on) / late;
    };
    int back_on = 0, back_on_bug = 0;
    const double share = late_on_share(true, &back_on);
    // the next request of the drafter starts from the empty rounds this one saw
    const ConfidenceEvidence seen = carried;
    DraftLengthOptions next = o;
    next.confidence_prior   = seen;
    next.alpha_prior        = 0.8;
    DraftLengthPolicy fresh(x100m(), o), told(x100m(), next);
    next.confidence_prior = ConfidenceEvidence{};
    DraftLengthPolicy untold(x100m(), next);
    const double share_bug = late_on_share(false, &back_on_bug);
    EXPECT_LT(share, 0.3);
    EXPECT_GE(back_on, 1);  // e faded while off: the draft was tried again
    EXPECT_GT(share_bug, 0.9);
    std::printf("carried e %.3f x %.3f\n", seen.empty_share, seen.empty_excess);
    EXPECT_GT(seen.empty_share, 0.3);
    EXPECT_NEAR(seen.empty_excess, 0.5, 1e-9);
    EXPECT_DOUBLE_EQ(told.empty_share(), seen.empty_share);
    EXPECT_DOUBLE_EQ(fresh.empty_share(), 0.0);
    EXPECT_GT(untold.next_gamma(), 0);          // the same profile pays without the empty rounds
    EXPECT_TRUE(told.next_gamma() == 0 || told.last_decision().probe);  // ... and not with them
}

// The empty rounds' S must clear the same margin as the verified rounds' alone: a prediction within
// min_speedup of break-even is within the cost model's error either way. At 1.0, the stories260K
// draft beside the copy target on a 2-core machine whose short passes cost more (v(2) 2.0, v(4)
// 3.1-3.5) stayed on at S_e ≈ 1.0 with 79% of its paying rounds empty, and ran 0.91-0.98x
// (docs/benchmarks.md, "Empty rounds must clear the margin").
TEST(DraftLengthPolicy, EmptyRoundsMustClearTheMargin) {
    DraftLengthOptions o;
    o.n_max       = 16;
    o.alpha_prior = 0.8;
    const CostModel cm = x100m();
    DraftLengthPolicy untold(cm, o);
    const int    g = untold.next_gamma();
    const double s = untold.last_decision().predicted;
    ASSERT_GT(g, 0);
    ASSERT_GT(s, o.min_speedup + 0.05);
    const double cost   = cost_model_v(cm, g + 1) + g * cm.c + cm.o;
    const double tokens = s * cost;
    const double x      = 0.3;
    // the share e of empty rounds at which S_e = ((1 − e)·tokens + e) / ((1 − e)·cost + e·(1 + x))
    // equals target
    auto share_for = [&](double target) {
        return (tokens - target * cost) / (tokens - target * cost - 1 + target * (1 + x));
    };
    auto drafts_with = [&](double e) {
        DraftLengthOptions told = o;
        told.confidence_prior.empty_share  = e;
        told.confidence_prior.empty_excess = x;
        DraftLengthPolicy pol(cm, told);
        const int gg = pol.next_gamma();
        return gg > 0 && !pol.last_decision().probe && !pol.last_decision().explore;
    };
    const double e_mid  = share_for(1.0 + (o.min_speedup - 1) / 2);  // S_e half-way to the margin
    const double e_high = share_for(o.min_speedup + 0.03);
    ASSERT_GT(e_mid, e_high);
    ASSERT_GT(e_high, 0.0);
    EXPECT_FALSE(drafts_with(e_mid)) << "e " << e_mid;
    EXPECT_TRUE(drafts_with(e_high)) << "e " << e_high;
    EXPECT_TRUE(drafts_with(0.0));
}
