// The online estimate of the cost model (v(n) and c) from the passes the engine runs anyway,
// started from a prior (a short start-up probe or the on-disk cache). No llama.cpp: the engine
// times its passes and feeds them here.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "common/recent_median.h"
#include "speculative/draft_length.h"

namespace specrpc {

// Makes a measured curve physically plausible: v(1) = 1; 1 ≤ v(n) ≤ n (a pass over n tokens
// costs at least one over a single token and at most n of them: the weights are read once);
// unmeasured entries (≤ 0) filled by linear interpolation between measured neighbours; then the
// lower envelope from above (noise only adds time, so a stalled size is capped by a longer one)
// and non-decreasing. A curve read under a burst of load (v(8) = 206) is capped to v(n) = n.
void cost_make_plausible(CostModel & cm);

// Whether some size of the curve is priced below n: a curve at v(n) = n throughout (read under
// load, or never measured) is no measurement of the machine's batching and is not cached.
bool cost_curve_measured(const CostModel & cm);

// A first-use guess of a CPU's cost curve for n_max-token passes:
//     v(n) = 1 + k·(n − 1)^a,   k = kCostGuessScale, a = kCostGuessExponent,
// the extra cost of n − 1 tokens over one. This family of machines measures it (pass_bench, four
// upcycles of stories260K on 2 cores, docs/benchmarks.md "The first-use guess had the wrong
// shape"): a 2-token pass already costs ~2 of one (llama.cpp switches from a matrix-vector kernel
// to a matrix-matrix one), and the curve then flattens (v(16) 5.7-6.3, v(32) 10-12). The fit is
// within 17% of every size measured, where a power law n^a errs by up to 30% at one end or the
// other. Refined online, it only has to start speculation in the right region. c: the draft's
// share of the target's bytes plus a floor for a tiny draft's per-pass overhead (stories260K-F32
// for x100M: 0.04-0.05 measured); 0 for a ratio of 0 (no draft model).
constexpr double kCostGuessScale    = 0.92;
constexpr double kCostGuessExponent = 0.66;
double    cost_guess_v(int n);  // the guess's v(n); 1 for n ≤ 1
// The guess's shape through a measured size m: v(n) = 1 + (v_m − 1)·((n − 1)/(m − 1))^a, i.e. k
// rescaled so that v(m) = v_m (m ≥ 2). How a guessed curve follows the sizes measured.
double    cost_guess_shape(int n, int m, double v_m);
CostModel cost_guess_curve(int n_max, double draft_bytes_ratio);

// Lowers every size a cached curve prices above cost_guess_curve's v(n) to the guess; returns how
// many it lowered. A cached curve keeps speculation off where it prices long passes high, and then
// no long pass runs to correct it: one read in a slow period (another process, too many threads)
// kept every chain drafter of later processes from drafting. Lowered to the guess, the curve lets
// speculation start, and its first steady passes show which reading holds (the estimator runs it as
// a guess: one size measured reshapes the rest). A machine whose passes really cost more than the
// guess pays a few rounds per process for the check.
int cost_clamp_to_guess(CostModel & cm);

// The guess's draft cost c for a draft of draft_bytes_ratio of the target's bytes (0: none).
double cost_guess_c(double draft_bytes_ratio);
// A cached c more than this many times the guess starts from the guess. Measured c spread
// 0.6-1.1x the guess for the copy draft (0.13-0.22 against 0.205) and 0.9-2.1x for stories260K
// beside the copy target (0.04-0.09 against 0.043); a c read far above that was the machine's load
// (or a profiler), not the draft, and it keeps the draft off in every later process: a draft that
// never drafts never measures c again (one process under `perf` cached c = 2.09 for copy-F32).
constexpr double kCostCachedDraftSlack = 3.0;
// Lowers a cached c above kCostCachedDraftSlack times cost_guess_c(draft_bytes_ratio) to the
// guess; true if it did. The draft's first tokens then measure c again (CostEstimator replaces the
// prior after kPriorTrust samples).
bool cost_clamp_draft_to_guess(CostModel & cm, double draft_bytes_ratio);

// The last RecentMedian::kWindow passes of one size, each with the depth bin it ran at, so that
// its cost in 1-token passes is read against t(1) at its own depth (CostEstimator).
class PassWindow {
  public:
    void add(double ms, int bin) {
        buf_[static_cast<size_t>(count_ % RecentMedian::kWindow)] = {ms, bin};
        ++count_;
        ms_.add(ms);
    }
    int64_t count() const { return count_; }
    double  median_ms() const { return ms_.median(); }  // in ms, whatever the depths
    // The median of ms / t1_at[bin] over the window; 0 when there are no samples.
    double median_ratio(const std::vector<double> & t1_at) const;

  private:
    struct Sample { double ms; int bin; };
    std::array<Sample, RecentMedian::kWindow> buf_{};
    int64_t                                   count_ = 0;
    RecentMedian                              ms_;
};

class CostEstimator {
  public:
    // Online samples of a size that replace the prior outright: a prior is a guess or a probe that
    // a burst of load may have poisoned, and must never bound what steady passes show.
    static constexpr int kPriorTrust = 3;
    // Samples of t(1) before they replace the prior's.
    static constexpr int kT1Samples  = 5;
    // The shortest size whose steady samples rescale a guessed curve (see update()).
    static constexpr size_t kShapeMinSize = 4;
    // The cells a pass attends over, in bins of kDepthBin: t(1) is read per bin, and a pass of n
    // tokens is priced against the 1-token passes of its own bin. A 1-token pass of x100M grows
    // by 43% from a shallow context to 250-299 cells (6.8 ms to 9.8-10.3 on this machine), 21%
    // of it in one step past 256 cells, where llama.cpp pads the cells a pass attends over to the
    // next multiple of 256 (llama_kv_cache::get_n_kv); a bin never straddles such a step. With
    // one t(1) for all depths (the median of the last plain passes, the deepest of a request),
    // every pass of the rounds before them read 5-16% too cheap, and a mismatched draft was
    // predicted ~7% faster than it ran (docs/benchmarks.md, "t(1) by depth").
    static constexpr int kDepthBin  = 64;
    static constexpr int kDepthBins = 128;  // deeper contexts share the last bin
    static int depth_bin(int cells) { return std::clamp((cells - 1) / kDepthBin, 0, kDepthBins - 1); }
    // Observations after which a size without a sample of its own, priced above the first-use
    // guess, goes back to the guess (see observe_pass): the in-process form of the cache's
    // cost_clamp_to_guess. Most of them are plain 1-token passes: ~256 rounds with speculation off.
    static constexpr int64_t kStaleAfter = 256;
    // A size measured above the guess again after going back to it was no stray reading: its
    // period doubles, up to this many times kStaleAfter (one measured at or below the guess
    // restarts at kStaleAfter). Where passes really cost more than the guess (x100M with the
    // stories260K draft: v(3) 2.9-3.0, v(4) 3.4-3.6 against the guess's 2.45 and 2.90), every
    // return to the guess priced a mostly-off draft at 1.1x for the rounds it took to re-learn
    // that it runs at ~0.85x: every ~2 requests of 128 tokens.
    static constexpr int64_t kStaleBackoffMax = 16;

    // Starts from `prior` (v and c; o is left to the caller) with t(1) = t1_ms; the prior is made
    // plausible. Forgets earlier observations. `guess`: the prior's v is no measurement of this
    // machine but a shape (cost_guess_curve); a size without samples of its own then follows the
    // shape scaled to the nearest sampled size (cost_guess_shape), so one size
    // measured moves the whole curve and the policy can find lengths the guess priced wrongly.
    void seed(const CostModel & prior, double t1_ms, bool guess = false);
    bool seeded() const { return t1_ > 0; }

    // A target pass over n tokens took ms. `steady`: the same size as the pass before (llama.cpp
    // reused its graph; for n = 1 the kSteadyPlainRun-th in a row), the clean sample. Other passes
    // of n > 1 (a probe after plain rounds) are used only while a size has too few steady ones:
    // they read a few percent slow, and without them a size judged too dear from a bad prior is
    // never seen again (speculation stays off, so no steady pass of that size ever runs).
    // For the same reason a size read in a slow period (another process busy for a minute) would
    // keep speculation off for the rest of the process: a size priced above the guess and not
    // sampled for kStaleAfter observations forgets its samples and starts from the guess again
    // (the curve is then run as a guess, so the first size measured reshapes the rest); a size
    // that measures above the guess again waits twice as long the next time (kStaleBackoffMax).
    // `depth`: the cells in the sequence before the pass (< 0: unknown, all passes in one bin).
    void observe_pass(int n, double ms, bool steady, int depth = -1);
    int64_t stale_after(int n) const;  // observations without a sample before size n goes stale
    // t(1) read again, at `depth` cells (< 0: unknown): the t(1) of that bin until its own steady
    // passes come, and of every bin without any; the ratios are recomputed from their samples.
    void set_t1(double ms, int depth = -1);
    // One model-drafted token took ms (as rounds pay it).
    void observe_draft(double ms);

    const CostModel & model() const { return cm_; }  // v and c
    // v(n) is still the first-use guess's: its prior is the guess (seed's guess, or the size went
    // back to it as stale) and it has fewer than kPriorTrust passes of its own, steady or not. A
    // size of a cached or probed curve is a measurement, sampled in this process or not (a cached
    // curve that cost_clamp_to_guess lowered is seeded as a guess: all its sizes count). The engine
    // verifies a probe of such a size instead of comparing it in shadow (probe_in_shadow): a
    // shadow runs no pass, so a guess that priced a drafter off would never be measured.
    bool              guessed(int n) const;
    // ms of a 1-token target pass at the depth of the last pass observed
    double            t1() const { return t1_cur_; }
    double            t1_at_depth(int cells) const;  // ... at a pass over `cells` cells
    int64_t           n_observed() const { return n_obs_; }

  private:
    void update();
    void forget_stale();
    void fill_t1_table();  // t1_tab_ from the bins

    CostModel                 cm_;
    CostModel                 anchor_;       // the band's centre per size: the prior until
                                             // kPriorTrust samples, then the online median,
                                             // re-taken each full window
    double                    t1_ = 0;       // the seed's or set_t1's: bins with nothing of their own
    double                    t1_cur_ = 0;   // t(1) in the last pass's bin
    int                       cur_bin_ = 0;  // the last pass's bin
    std::vector<RecentMedian> t1_bin_;       // [bin]: steady 1-token passes
    std::vector<double>       t1_read_;      // [bin]: set_t1's reading there (0: none)
    std::vector<double>       t1_tab_;       // [bin]: t(1) as priced (own samples, else the nearest)
    double                    t1_cap_ = 0;   // t(1) ≤ t(n) of every steady size (0: no bound)
    std::vector<PassWindow>   steady_, cold_;
    std::vector<char>         prior_known_;  // [n]: the prior's v(n) is a measurement (below n)
    bool                      guess_ = false;  // unsampled sizes follow the shape of the sampled ones
                                             // (seed's guess; a size lowered to the guess)
    std::vector<int64_t>      anchored_at_;  // samples of size n when anchor_.v[n] was taken; -1 = prior
    std::vector<int64_t>      last_seen_;    // [n]: n_obs_ at size n's last sample (or its seeding)
    std::vector<int64_t>      stale_after_;  // [n]: its period (kStaleAfter, doubled per confirmation)
    std::vector<char>         rechecking_;   // [n]: went back to the guess; not measured again yet
    std::vector<char>         guess_prior_;  // [n]: its prior is the guess's (seed's, or went back to it)
    RecentMedian              draft_;
    int64_t                   c_anchored_at_ = -1;
    int64_t                   n_obs_ = 0;
};

}  // namespace specrpc
