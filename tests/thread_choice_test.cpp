// The thread-count choice (engine/thread_choice.h) on synthetic pass times: alone it stays on all
// threads and tries nothing; beside a busy process (all threads get a fraction of their cores and
// stall) it moves to one thread within a few passes and stays there; when the neighbour leaves it
// comes back; a neighbour that takes a little does not make it oscillate; while the kernel counts
// a process on the core the other threads need, no trial of all threads runs; all threads that
// won a trial are settled even when their share reads low.
#include <gtest/gtest.h>

#include "engine/thread_choice.h"

using namespace specrpc;

namespace {

// Feeds `n` passes; the machine gives `full_ms` / `full_share` on all threads and `one_ms` on one.
// Returns how many of them ran on all threads.
int run(ThreadChoice & tc, int n, double full_ms, double full_share, double one_ms, double one_share = 1.0) {
    int on_full = 0;
    for (int i = 0; i < n; ++i) {
        const bool full = tc.full();
        on_full += full;
        tc.observe(full ? full_ms : one_ms, full ? full_share : one_share);
    }
    return on_full;
}

TEST(ThreadChoice, AloneMovesToAllThreadsAtOnceAndTriesNothingMore) {
    ThreadChoice tc(2);
    EXPECT_EQ(tc.threads(), 1);  // the first pass runs on one thread
    EXPECT_EQ(run(tc, 5000, 1.0, 0.97, 1.7), 5000 - 1);
    EXPECT_EQ(tc.n_switches(), 1);
    EXPECT_TRUE(tc.settled());
}

TEST(ThreadChoice, BesideABusyProcessFromTheStartNeverStallsLong) {
    ThreadChoice tc(2);
    // one thread gets its core, all threads stall 10x: the trial after the first pass ends at its
    // first pass, later ones ever more rarely
    EXPECT_LE(run(tc, 2000, 10.0, 0.55, 1.8), 8);
    EXPECT_EQ(tc.threads(), 1);
}

TEST(ThreadChoice, BesideABusyProcessMovesToOneThread) {
    ThreadChoice tc(2);
    run(tc, 20, 1.0, 0.97, 1.7);                          // alone first
    const int full = run(tc, 2000, 10.0, 0.55, 1.8);      // a neighbour: all threads stall 10x
    EXPECT_EQ(tc.threads(), 1);
    EXPECT_TRUE(tc.settled()) << "settled on one thread: the cost probe may time one thread's costs";
    // the first stalled pass starts a trial of one thread; trials of all threads after it end at
    // their first pass, ever more rarely
    EXPECT_LE(full, 1 + 8 + 3) << "passes on all threads while they stall (2000 passes: 7 trials)";
}

TEST(ThreadChoice, AnOversubscribedMachineIsNotTriedOnAllThreads) {
    ThreadChoice tc(2);
    run(tc, 1, 50.0, 0.2, 5.0, 0.3);
    ASSERT_EQ(tc.threads(), 1);
    EXPECT_FALSE(tc.trying());
    // even one thread gets a third of its core: every pass on all threads would stall
    EXPECT_EQ(run(tc, 3000, 50.0, 0.2, 5.0, 0.3), 0);
}

TEST(ThreadChoice, ComesBackWhenTheNeighbourLeaves) {
    ThreadChoice tc(2);
    run(tc, 20, 1.0, 0.97, 1.7);
    run(tc, 300, 10.0, 0.55, 1.8);
    ASSERT_EQ(tc.threads(), 1);
    // alone again: the next trial of all threads wins (interval ≤ 2 × kMaxInterval... here small)
    int n = 0;
    while (!tc.full() && n < 4 * ThreadChoice::kMaxInterval) { tc.observe(1.8, 1.0); ++n; }
    ASSERT_TRUE(tc.full());
    run(tc, ThreadChoice::kTrialLen, 1.0, 0.97, 1.8);
    EXPECT_TRUE(tc.full());
    EXPECT_FALSE(tc.trying());
    EXPECT_EQ(run(tc, 1000, 1.0, 0.97, 1.8), 1000);
}

TEST(ThreadChoice, ALightNeighbourDoesNotMakeItOscillate) {
    ThreadChoice tc(2);
    // the threads get 70% of their cores, yet all of them are still faster than one
    const int full = run(tc, 4000, 1.0, 0.7, 1.6);
    EXPECT_EQ(tc.n_switches(), 1);  // the start on one thread
    EXPECT_GE(full, 4000 - 1 - 10 * ThreadChoice::kTrialLen) << "trials that lose come back ever more rarely";
}

// All threads read a share of ~0.6 (a light neighbour; or, before each thread's CPU time was read
// from its own clock, any pass shorter than the kernel's tick) and still beat one thread. The
// share starts trials of one thread, which lose; all threads that won count as settled, or the
// cost guess, which reads t(1) only from settled passes, waited for the whole request.
TEST(ThreadChoice, AllThreadsThatWonTheirTrialAreSettled) {
    ThreadChoice tc(2, true);
    int settled = 0;
    for (int i = 0; i < 2000; ++i) {
        settled += tc.settled();
        tc.observe(tc.full() ? 0.7 : 1.1, tc.full() ? 0.6 : 1.0);
    }
    EXPECT_TRUE(tc.full());
    EXPECT_GE(tc.n_trials(), 4) << "the low share starts trials, ever more rarely";
    // not settled: each trial's passes and the kShareRun passes after it (2000 passes: ~8 trials)
    EXPECT_GE(settled, 2000 - 10 * (ThreadChoice::kTrialLen + ThreadChoice::kShareRun));
}

// The engine asks the kernel's count of running threads before a trial of all threads
// (cpu_cores_free_now): a busy loop is running at every read, and while it runs no pass stalls
// on all threads; once it leaves, the trial comes within kMinInterval passes.
TEST(ThreadChoice, NoTrialOfAllThreadsWhileTheCoresAreTaken) {
    bool taken = true;
    ThreadChoice tc(2, false, [&taken] { return !taken; });
    ASSERT_EQ(tc.threads(), 1);
    // one thread gets its core (share 1.0), which alone would start trials: every trial pass on
    // all threads would stall 10x
    EXPECT_EQ(run(tc, 5000, 10.0, 0.55, 1.8), 0);
    EXPECT_EQ(tc.n_trials(), 0);
    EXPECT_GE(tc.n_trials_held(), 5000 / ThreadChoice::kMinInterval - 2) << "asked again every kMinInterval passes";
    EXPECT_TRUE(tc.settled());
    // the neighbour leaves: the next ask starts a trial, which wins
    taken = false;
    int n = 0;
    while (!tc.full() && n < 4 * ThreadChoice::kMinInterval) { tc.observe(1.8, 1.0); ++n; }
    EXPECT_LE(n, ThreadChoice::kMinInterval) << "the trial waited for the back-off of lost trials";
    ASSERT_TRUE(tc.full());
    run(tc, ThreadChoice::kTrialLen, 1.0, 0.97, 1.8);
    EXPECT_FALSE(tc.trying());
    EXPECT_EQ(run(tc, 1000, 1.0, 0.97, 1.8), 1000);
}

// Without the ask (the constructor the tests above use) the same neighbour costs trials: what
// the ask removes.
TEST(ThreadChoice, WithoutTheAskTrialsStallBesideABusyProcess) {
    ThreadChoice tc(2, false);
    const int full = run(tc, 5000, 10.0, 0.55, 1.8);
    EXPECT_GE(tc.n_trials(), 4);
    EXPECT_GE(full, 4);
}

TEST(ThreadChoice, OneThreadHasNothingToChoose) {
    ThreadChoice tc(1);
    EXPECT_EQ(run(tc, 100, 10.0, 0.3, 1.0), 100);
    EXPECT_EQ(tc.threads(), 1);
    EXPECT_TRUE(tc.settled());
}

}  // namespace
