// Tests of the speculative-decoding statistics (src/speculative/spec_stats.h): the invariants hold for
// any sequence of valid rounds, merge adds up, and each broken invariant is detected.
#include <gtest/gtest.h>

#include <random>

#include "speculative/spec_stats.h"

using namespace specrpc;

TEST(SpecStats, EmptyIsValid) {
    SpecStats s;
    EXPECT_TRUE(s.check_invariants().is_ok());
    EXPECT_EQ(s.accept_rate(), 0.0);
    EXPECT_EQ(s.mean_accept_len(), 0.0);
}

TEST(SpecStats, ChainRoundsByHand) {
    SpecStats s;
    s.add_round(4, 2, 1.0, 2.0, 0.5);  // drafted 4, accepted 2: emits 3
    s.add_round(3, 3, 1.0, 2.0, 0.5);  // full accept: emits 4 (bonus)
    s.add_round(2, 0);                 // emits the correction only
    EXPECT_EQ(s.n_drafted, 9);
    EXPECT_EQ(s.n_accepted, 5);
    EXPECT_EQ(s.n_steps, 3);
    EXPECT_EQ(s.n_emitted, 8);
    EXPECT_EQ(s.drafted_at_pos, (std::vector<int64_t>{3, 3, 2, 1}));
    EXPECT_EQ(s.accepted_at_pos, (std::vector<int64_t>{2, 2, 1}));
    EXPECT_DOUBLE_EQ(s.accept_rate(), 5.0 / 9.0);
    EXPECT_DOUBLE_EQ(s.mean_accept_len(), 1.0 + 5.0 / 3.0);
    EXPECT_DOUBLE_EQ(s.t_draft_ms, 2.0);
    EXPECT_DOUBLE_EQ(s.t_verify_ms, 4.0);
    EXPECT_DOUBLE_EQ(s.t_sample_ms, 1.0);
    EXPECT_TRUE(s.check_invariants().is_ok()) << s.check_invariants().to_string();
}

TEST(SpecStats, TreeRoundUsesDepthPerPosition) {
    SpecStats s;
    s.add_round(7, 2, 0, 0, 0, /*depth=*/3);  // 7 nodes, 3 levels, path of 2 accepted
    EXPECT_EQ(s.n_drafted, 7);
    EXPECT_EQ(s.drafted_at_pos, (std::vector<int64_t>{1, 1, 1}));
    EXPECT_EQ(s.accepted_at_pos, (std::vector<int64_t>{1, 1}));
    EXPECT_TRUE(s.check_invariants().is_ok());
}

TEST(SpecStats, RandomRoundsKeepInvariantsAndMergeAdds) {
    std::mt19937_64 rng(42);
    SpecStats       a, b, all;
    for (int i = 0; i < 1000; ++i) {
        const int g = 1 + int(rng() % 8);
        const int k = int(rng() % (g + 1));
        SpecStats & half = (i % 3 == 0) ? a : b;
        if (i % 7 == 3) {  // a round the confidence stop left empty
            half.add_empty(0.25);
            all.add_empty(0.25);
        } else {
            half.add_round(g, k, 0.1, 0.2, 0.3);
            all.add_round(g, k, 0.1, 0.2, 0.3);
        }
        half.add_decision(g, false);
        all.add_decision(g, false);
        if (i % 10 == 0) {
            half.add_decision(0, true);
            all.add_decision(0, true);
        }
    }
    ASSERT_TRUE(a.check_invariants().is_ok());
    ASSERT_TRUE(b.check_invariants().is_ok());
    SpecStats m = a;
    m.merge(b);
    EXPECT_TRUE(m.check_invariants().is_ok());
    EXPECT_EQ(m.n_drafted, all.n_drafted);
    EXPECT_EQ(m.n_accepted, all.n_accepted);
    EXPECT_EQ(m.n_steps, all.n_steps);
    EXPECT_EQ(m.n_emitted, all.n_emitted);
    EXPECT_EQ(m.drafted_at_pos, all.drafted_at_pos);
    EXPECT_EQ(m.accepted_at_pos, all.accepted_at_pos);
    EXPECT_EQ(m.gamma_hist, all.gamma_hist);
    EXPECT_EQ(m.n_off_rounds, all.n_off_rounds);
    EXPECT_NEAR(m.t_sample_ms, all.t_sample_ms, 1e-9);
    EXPECT_EQ(m.n_off_rounds, 100);
    EXPECT_EQ(m.n_empty_rounds, all.n_empty_rounds);
    EXPECT_EQ(m.n_empty_rounds, 143);
    EXPECT_NEAR(m.t_empty_draft_ms, 143 * 0.25, 1e-9);
    EXPECT_EQ(m.n_steps + m.n_empty_rounds, 1000);
    SpecStats empty;
    empty.merge(m);  // merging into an empty one grows its vectors
    EXPECT_EQ(empty.accepted_at_pos, m.accepted_at_pos);
}

TEST(SpecStats, DetectsBrokenInvariants) {
    SpecStats good;
    good.add_round(3, 1);
    good.add_round(2, 2);
    ASSERT_TRUE(good.check_invariants().is_ok());

    SpecStats s = good;
    s.add_round(2, 3);  // accepted more than drafted in a round: not recorded, but flagged
    EXPECT_EQ(s.n_bad_rounds, 1);
    EXPECT_EQ(s.n_steps, good.n_steps);
    EXPECT_FALSE(s.check_invariants().is_ok());
    SpecStats merged = good;
    merged.merge(s);
    EXPECT_FALSE(merged.check_invariants().is_ok());
    s = good;
    s.add_round(5, 1, 0, 0, 0, /*depth=*/6);  // deeper than it has nodes
    EXPECT_FALSE(s.check_invariants().is_ok());

    s = good;
    s.n_accepted = s.n_drafted + 1;
    EXPECT_FALSE(s.check_invariants().is_ok());

    s = good;
    s.n_emitted += 1;  // emitted != accepted + steps
    EXPECT_FALSE(s.check_invariants().is_ok());

    s = good;
    s.accepted_at_pos[0] += 1;  // sum != accepted
    EXPECT_FALSE(s.check_invariants().is_ok());

    s = good;
    s.drafted_at_pos.push_back(5);  // more drafted per position than in total, and increasing
    EXPECT_FALSE(s.check_invariants().is_ok());

    s = good;
    s.n_off_rounds = 1;  // an off round without a γ = 0 decision
    EXPECT_FALSE(s.check_invariants().is_ok());

    s = good;
    s.add_empty(-1);  // an empty round's draft time cannot be negative
    EXPECT_FALSE(s.check_invariants().is_ok());

    s = good;
    s.add_decision(3, false);  // the two rounds' decisions to draft
    s.add_decision(2, false);
    ASSERT_TRUE(s.check_invariants().is_ok());
    s.add_empty(0.5);  // an empty round without a decision to draft
    EXPECT_FALSE(s.check_invariants().is_ok());
    s.add_decision(4, false);
    EXPECT_TRUE(s.check_invariants().is_ok());

    s = good;
    s.t_verify_ms = -1;
    EXPECT_FALSE(s.check_invariants().is_ok());
    EXPECT_EQ(s.check_invariants().code(), ErrorCode::INTERNAL);
}
