// How many threads a pass runs on, chosen from measured pass times. ggml's CPU thread pool meets at
// a spinning barrier after every operation of a graph (hundreds a pass): when another process
// takes one of the cores, the thread that is switched out holds its partner spinning until the
// scheduler runs it again, a time slice per barrier, and a pass runs 10-80x slower than alone.
// One thread has no barrier. So the engine watches the share of its threads' time it gets during a
// pass (its threads' CPU time ÷ (wall time × threads), each thread's read from its own clock:
// ~1 alone, ~0.5-0.7 beside a busy process; backend.h: cpu_threads_ms); when
// it falls, it times a few passes on one thread and keeps one thread if they are faster. On one
// thread, while that thread gets its core, it now and then times a pass or a few on all of them
// and goes back when they are faster.
// Trials that lose come back less and less often. No llama.cpp here: the engine times its passes
// and applies the choice (backend.h: cpu_threads_apply).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace specrpc {

class ThreadChoice {
  public:
    static constexpr int kWindow      = 8;    // recent samples per mode the choice compares
    static constexpr int kShareRun    = 4;    // passes on all threads whose median share decides
    // The share is read on every kShareEvery-th pass: reading the process's CPU time costs 1-2 µs,
    // 1-2% of a pass of the smallest models.
    static constexpr int kShareEvery  = 4;
    // Below this median share of its threads' time the engine drops to one thread: alone a pass
    // gets 0.95-1.0 (spinning at a barrier counts as running).
    static constexpr double kShareMin = 0.8;
    // On one thread, all are tried only while that thread gets at least this share of its core.
    static constexpr double kShareAlone = 0.9;
    // Timed passes of a trial of the other mode (the first, after the switch, may run cold: the
    // median of three is not moved by it).
    static constexpr int kTrialLen    = 3;
    static constexpr int kMinInterval = 16;   // passes of a mode, once chosen, before a trial
    static constexpr int kMaxInterval = 1024; // ... doubling after each trial that lost
    // A trial pass this many times the incumbent's median ends the trial at once (lost): trying
    // all threads beside a busy process must not cost a whole trial of stalled passes.
    static constexpr double kAbort    = 2.0;
    // A trial must be this much faster (median ratio) to be adopted.
    static constexpr double kAdopt    = 0.9;

    // n_full: the engine's thread count. With n_full ≤ 1 there is nothing to choose. It starts on
    // one thread, which tries all of them after its first pass if it got its core: beside a busy
    // process a single pass on all threads can cost seconds, alone the first pass on one costs
    // ~0.6 of a pass more.
    explicit ThreadChoice(int n_full = 1) : n_full_(n_full < 1 ? 1 : n_full), one_(n_full_ > 1) {}
    // `start_full`: the cores looked free at start-up (backend.h: cpu_cores_free), so the first
    // pass, the prompt, runs on all threads; on one it took 1.9x as long (141 tokens of x100M:
    // 440 ms against 233 ms). The share watch still drops to one thread if a process comes.
    ThreadChoice(int n_full, bool start_full) : ThreadChoice(n_full) { one_ = n_full_ > 1 && !start_full; }
    // `cores_free`: whether the cores that passes on all threads need are free now (the engine's
    // is backend.h: cpu_cores_free_now, one read of the kernel's count of running threads, ~12 µs).
    // On one thread it is asked before each trial of all of them: beside a busy process a trial's
    // pass waits at its barriers for the thread the scheduler switched out (x100M: 8-13 ms a unit
    // against 5 on one thread; stories260K: 106-157 ms for a pass of 0.1-0.5 ms; docs/benchmarks.md,
    // "A trial of all threads beside a busy process"). When they are taken the trial waits
    // kMinInterval passes and asks again; the share and the back-off still decide as before.
    using CoresFree = std::function<bool()>;
    ThreadChoice(int n_full, bool start_full, CoresFree cores_free) : ThreadChoice(n_full, start_full) {
        cores_free_ = std::move(cores_free);
    }

    // Whether the coming pass should read its share (not in a trial: every pass
    // until kShareRun are read, then one in kShareEvery); observe() takes NaN for the others.
    bool want_share() {
        return !trial_ && n_full_ > 1 && (++n_pass_ % kShareEvery == 0 || int(share_.xs.size()) < kShareRun);
    }
    // A pass ran on threads() and took `ms_per_unit` (its time ÷ its expected cost in 1-token
    // passes); `share` = the process's CPU time during it ÷ (its wall time × threads()). Returns
    // true when threads() changed: the caller applies it before the next pass.
    bool observe(double ms_per_unit, double share);

    int  threads() const { return one_ ? 1 : n_full_; }
    bool full() const { return !one_; }
    bool trying() const { return trial_; }
    // Not in a trial, the mode has run kShareRun passes, and on all threads they got their cores
    // or won the last trial against one thread: passes timed now measure what the engine will run
    // (the start-up cost probe and the cost guess wait for this; on one thread they time one
    // thread's costs). The trial counts because the share can read low while all threads still
    // beat one (a light neighbour): settled by the share alone, a first use there waited for t(1)
    // while the trials' back-off ran, up to a whole request.
    bool settled() const;
    int64_t n_switches() const { return n_switches_; }
    int64_t n_trials() const { return n_trials_; }
    int64_t n_trials_held() const { return n_held_; }  // trials of all threads not run: cores taken
    int  interval() const { return interval_; }

  private:
    struct Window {
        std::vector<double> xs;
        void   add(double x);
        double median(int last = kWindow) const;  // of the last `last` samples
    };
    void start_trial();
    void end_trial(bool adopt);

    int     n_full_;
    bool    one_;               // the mode running now: one thread (else n_full_)
    bool    trial_    = false;  // the mode running now is a trial of the other one
    int     interval_ = kMinInterval; // the gap after the next lost trial (doubles)
    int     gate_     = 1;      // passes of the incumbent before a trial may start
    int     since_    = 0;      // passes of the incumbent since it was chosen or last tried against
    Window  inc_win_, trial_win_, share_;
    CoresFree cores_free_;      // empty = always free
    int64_t n_switches_ = 0;
    int64_t n_trials_   = 0;
    int64_t n_held_     = 0;
    int64_t n_pass_     = 0;
};

}  // namespace specrpc
