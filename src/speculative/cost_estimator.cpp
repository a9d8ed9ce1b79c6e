// Online cost estimation (see cost_estimator.h).
#include "speculative/cost_estimator.h"

#include <algorithm>
#include <cmath>

namespace specrpc {

void cost_make_plausible(CostModel & cm) {
    if (cm.v.size() < 2) return;
    cm.v[1] = 1.0;
    for (size_t n = 2; n < cm.v.size(); ++n)
        if (std::isfinite(cm.v[n]) && cm.v[n] > 0) cm.v[n] = std::clamp(cm.v[n], 1.0, double(n));
        else cm.v[n] = 0.0;
    // fill the gaps from the measured points (v(n) = n past them when nothing is measured);
    // cost_model_v walks the curve without allocating, so a call per size stays cheap on this
    // path (every pass the estimator takes)
    std::vector<double> filled(cm.v.size(), 0.0);
    for (size_t n = 1; n < cm.v.size(); ++n) filled[n] = std::min(cost_model_v(cm, int(n)), double(n));
    cm.v = std::move(filled);
    double cap = 1e300;
    for (size_t n = cm.v.size(); n-- > 2;) cap = cm.v[n] = std::min(cm.v[n], cap);
    for (size_t n = 2; n < cm.v.size(); ++n) cm.v[n] = std::max({cm.v[n], cm.v[n - 1], 1.0});
}

// A size priced below n, its physical cap, shows batching; one at the cap (read under load, or
// filled in for want of a measurement) shows nothing of the machine.
static bool below_cap(double v, size_t n) { return v < 0.999 * double(n); }

bool cost_curve_measured(const CostModel & cm) {
    for (size_t n = 2; n < cm.v.size(); ++n)
        if (cm.v[n] >= 1.0 && below_cap(cm.v[n], n)) return true;
    return false;
}

double cost_guess_v(int n) {
    return n <= 1 ? 1.0 : 1.0 + kCostGuessScale * std::pow(double(n - 1), kCostGuessExponent);
}

double cost_guess_shape(int n, int m, double v_m) {
    if (n <= 1 || m < 2) return 1.0;
    return 1.0 + (v_m - 1.0) * std::pow(double(n - 1) / double(m - 1), kCostGuessExponent);
}

static double guess_v(size_t n) { return cost_guess_v(int(n)); }

CostModel cost_guess_curve(int n_max, double draft_bytes_ratio) {
    CostModel cm{std::vector<double>(size_t(std::max(n_max, 1)) + 1, 0.0), 0.0, 0.0};
    for (size_t n = 1; n < cm.v.size(); ++n) cm.v[n] = guess_v(n);
    cm.c = cost_guess_c(draft_bytes_ratio);
    return cm;
}

double cost_guess_c(double draft_bytes_ratio) {
    return draft_bytes_ratio > 0 ? std::clamp(1.2 * draft_bytes_ratio + 0.03, 0.03, 1.0) : 0.0;
}

bool cost_clamp_draft_to_guess(CostModel & cm, double draft_bytes_ratio) {
    const double g = cost_guess_c(draft_bytes_ratio);
    if (g <= 0 || !(cm.c > kCostCachedDraftSlack * g)) return false;
    cm.c = g;
    return true;
}

int cost_clamp_to_guess(CostModel & cm) {
    int lowered = 0;
    for (size_t n = 2; n < cm.v.size(); ++n) {
        const double g = guess_v(n);
        if (cm.v[n] > g) {
            cm.v[n] = g;
            ++lowered;
        }
    }
    return lowered;
}

double PassWindow::median_ratio(const std::vector<double> & t1_at) const {
    const int n = static_cast<int>(std::min<int64_t>(count_, RecentMedian::kWindow));
    if (n == 0) return 0.0;
    std::array<double, RecentMedian::kWindow> r{};
    for (int i = 0; i < n; ++i) r[size_t(i)] = buf_[size_t(i)].ms / t1_at[size_t(buf_[size_t(i)].bin)];
    std::nth_element(r.begin(), r.begin() + n / 2, r.begin() + n);
    return r[size_t(n / 2)];
}

void CostEstimator::seed(const CostModel & prior, double t1_ms, bool guess) {
    guess_ = guess;
    cm_ = prior;
    cost_make_plausible(cm_);
    // A size the prior prices at n (no batching gain at all) is no measurement but a sign of
    // load during the probe: it is left to interpolation from the sizes that are measured.
    prior_known_.assign(cm_.v.size(), 0);
    for (size_t n = 2; n < cm_.v.size(); ++n) prior_known_[n] = below_cap(cm_.v[n], n);
    guess_prior_.assign(cm_.v.size(), guess ? 1 : 0);
    anchor_ = cm_;
    t1_     = t1_ms > 0 && std::isfinite(t1_ms) ? t1_ms : 0.0;
    t1_cur_ = t1_;
    cur_bin_ = 0;
    t1_bin_.assign(kDepthBins, RecentMedian{});
    t1_read_.assign(kDepthBins, 0.0);
    t1_tab_.assign(kDepthBins, t1_);
    t1_cap_ = 0;
    steady_.assign(cm_.v.size(), PassWindow{});
    cold_.assign(cm_.v.size(), PassWindow{});
    anchored_at_.assign(cm_.v.size(), -1);
    last_seen_.assign(cm_.v.size(), 0);
    stale_after_.assign(cm_.v.size(), kStaleAfter);
    rechecking_.assign(cm_.v.size(), 0);
    draft_         = RecentMedian{};
    c_anchored_at_ = -1;
    n_obs_         = 0;
}

void CostEstimator::observe_pass(int n, double ms, bool steady, int depth) {
    if (!seeded() || n < 1 || n >= int(cm_.v.size()) || !(ms > 0) || !std::isfinite(ms)) return;
    const int bin = depth < 0 ? 0 : depth_bin(depth + n);
    if (n == 1 && steady) t1_bin_[size_t(bin)].add(ms);
    else if (steady) steady_[size_t(n)].add(ms, bin);
    else if (n > 1) cold_[size_t(n)].add(ms, bin);
    else return;
    cur_bin_ = bin;
    ++n_obs_;
    last_seen_[size_t(n)] = n_obs_;
    if (n == 1) forget_stale();
    update();
    // A size back from the guess, measured again: above the guess, the reading that made it dear
    // holds, and the next check comes twice as late; at or below, that reading was a stray one.
    const size_t k = size_t(n);
    if (n > 1 && rechecking_[k] && steady_[k].count() + cold_[k].count() >= kPriorTrust) {
        rechecking_[k]  = 0;
        stale_after_[k] = cm_.v[k] > guess_v(k) ? std::min(2 * stale_after_[k], kStaleBackoffMax * kStaleAfter) : kStaleAfter;
    }
}

int64_t CostEstimator::stale_after(int n) const {
    return n >= 0 && size_t(n) < stale_after_.size() ? stale_after_[size_t(n)] : kStaleAfter;
}

bool CostEstimator::guessed(int n) const {
    if (n < 2 || n >= int(cm_.v.size()) || !guess_prior_[size_t(n)]) return false;
    return steady_[size_t(n)].count() < kPriorTrust && cold_[size_t(n)].count() < kPriorTrust;
}

void CostEstimator::forget_stale() {
    for (size_t n = 2; n < cm_.v.size(); ++n) {
        if (n_obs_ - last_seen_[n] < stale_after_[n]) continue;  // the common case, decided without pow
        const double g = guess_v(n);
        if (!(cm_.v[n] > g)) continue;
        steady_[n]      = PassWindow{};
        cold_[n]        = PassWindow{};
        anchor_.v[n]    = g;
        anchored_at_[n] = -1;
        prior_known_[n] = 1;
        last_seen_[n]   = n_obs_;
        rechecking_[n]  = 1;
        guess_prior_[n] = 1;
        guess_          = true;
    }
}

void CostEstimator::set_t1(double ms, int depth) {
    if (!seeded() || !(ms > 0) || !std::isfinite(ms)) return;
    // The bands' centres taken from samples are ratios to the old t(1): rescaled with them while
    // every bin still prices by the one t(1) (no depth and no steady plain passes known yet).
    const bool one_t1 = std::all_of(t1_bin_.begin(), t1_bin_.end(), [](const RecentMedian & b) { return b.count() < kT1Samples; }) &&
                        std::all_of(t1_read_.begin(), t1_read_.end(), [](double x) { return x <= 0; });
    if (one_t1) {
        const double k = t1_ / ms;
        for (size_t n = 2; n < anchor_.v.size(); ++n)
            if (anchored_at_[n] >= 0) anchor_.v[n] *= k;
        if (c_anchored_at_ >= 0) anchor_.c *= k;
    }
    t1_ = ms;
    if (depth >= 0) t1_read_[size_t(depth_bin(depth + 1))] = ms;
    update();
}

double CostEstimator::t1_at_depth(int cells) const {
    return t1_tab_.empty() ? t1_ : t1_tab_[size_t(depth_bin(cells))];
}

// A bin's t(1): the median of its own steady plain passes (kT1Samples of them), else set_t1's
// reading there, else the nearest bin with either, preferring one on the same side of a 256-cell
// step (a bin across it is ~20% off, a neighbour on this side ≤ 10%); else the single t(1).
void CostEstimator::fill_t1_table() {
    std::vector<int> known;
    std::vector<double> val(kDepthBins, 0.0);
    for (int b = 0; b < kDepthBins; ++b) {
        if (t1_bin_[size_t(b)].count() >= kT1Samples) val[size_t(b)] = t1_bin_[size_t(b)].median();
        else if (t1_read_[size_t(b)] > 0) val[size_t(b)] = t1_read_[size_t(b)];
        if (val[size_t(b)] > 0) known.push_back(b);
    }
    constexpr int kPerStep = 256 / kDepthBin;
    for (int b = 0; b < kDepthBins; ++b) {
        double t = t1_;
        if (val[size_t(b)] > 0) {
            t = val[size_t(b)];
        } else if (!known.empty()) {
            int best = -1;
            for (int k : known) {
                if (best < 0) { best = k; continue; }
                const bool ks = k / kPerStep == b / kPerStep, bs = best / kPerStep == b / kPerStep;
                const int  dk = std::abs(k - b), db = std::abs(best - b);
                if (ks != bs ? ks : (dk < db || (dk == db && k > best))) best = k;
            }
            t = val[size_t(best)];
        }
        t1_tab_[size_t(b)] = t1_cap_ > 0 ? std::min(t, t1_cap_) : t;
    }
    t1_cur_ = t1_tab_[size_t(cur_bin_)];
}

void CostEstimator::observe_draft(double ms) {
    if (!seeded() || !(ms > 0) || !std::isfinite(ms)) return;
    draft_.add(ms);
    ++n_obs_;
    update();
}

// Each refined value stays within a band around its anchor (v: 0.8–1.25x, c: 0.67–2x): samples
// of different sizes are taken at different times (1-token passes while off, long ones while
// on), and on a machine whose speed changes 2x within minutes one stray ratio (v(9) = 1.54 on
// x25M) would cap the whole curve below it. The anchor is re-taken from the samples every full
// window, so the band delays a lasting change by one window and never holds it off for good.
static double refine(double m, double & anchor, int64_t & anchored_at, int64_t count, double lo, double hi) {
    if (anchored_at < 0 ? count >= CostEstimator::kPriorTrust : count - anchored_at >= RecentMedian::kWindow) {
        anchor      = m;
        anchored_at = count;
    }
    return anchored_at < 0 ? anchor : std::clamp(m, lo * anchor, hi * anchor);
}

void CostEstimator::update() {
    // t(1) ≤ t(n): while speculation runs, no plain pass refreshes t(1), and a t(1) read under load
    // is pulled down by the steady passes that run. There is no bound from below: t(n) ≤ n·t(1)
    // does not hold for small n on CPUs where llama.cpp switches kernels at 2 tokens (gemv for one,
    // a gemm from two: x100M Q8_0 here takes 2.4-2.5x t(1) for 2 tokens), and t(1) raised to t(2)/2
    // made every longer pass look a fifth cheaper than it was. The bound is over all depths: a
    // 2-token pass costs ~2.4 of one, more than depth adds (≤ 1.5x), so it binds only under load.
    t1_cap_ = 0;
    for (size_t n = 2; n < steady_.size(); ++n)
        if (steady_[n].count() >= kPriorTrust) t1_cap_ = t1_cap_ > 0 ? std::min(t1_cap_, steady_[n].median_ms()) : steady_[n].median_ms();
    fill_t1_table();
    CostModel est = cm_;
    std::vector<char> sampled(cm_.v.size(), 0);
    for (size_t n = 2; n < cm_.v.size(); ++n) {
        const PassWindow & r = steady_[n].count() >= kPriorTrust ? steady_[n] : cold_[n];
        if (r.count() < kPriorTrust) {
            est.v[n] = prior_known_[n] ? anchor_.v[n] : 0.0;  // 0: interpolated from the measured sizes
            continue;
        }
        const double m = std::clamp(r.median_ratio(t1_tab_), 1.0, double(n));
        est.v[n] = refine(m, anchor_.v[n], anchored_at_[n], steady_[n].count() + cold_[n].count(), 0.8, 1.25);
        sampled[n] = 1;
    }
    if (guess_) {
        // The guess's shape through the nearest size m that shows it (cost_guess_shape; the
        // longer on a tie). Not every sampled size does:
        // - only steady samples: a size's first pass after another size reads slow (llama.cpp
        //   rebuilds its graph), and drafters whose lengths vary (lookup, suffix) run few others;
        // - m >= kShapeMinSize: v(2) read 10% high moves every longer size's extra cost
        //   (v(n) − 1) by a fifth, and short drafts come first;
        // - v(m) < m: a size read at its physical cap (load) says nothing of the shape.
        // Extrapolated from such a size, every length was priced at n or near it, speculation
        // stayed off, no longer size ever ran, and nothing could correct the curve.
        std::vector<char> shape(cm_.v.size(), 0);
        for (size_t m = kShapeMinSize; m < cm_.v.size(); ++m)
            shape[m] = sampled[m] && steady_[m].count() >= kPriorTrust && below_cap(est.v[m], m);
        // No steady size shows the shape: a drafter that is mostly off runs no two passes of a
        // size in a row. Its first passes read a few percent slow (x100M with the stories260K
        // draft: 2-6%), which errs towards drafting less; left at the guess, a target that batches
        // worse than it (v(6) 4.2-4.5 read against 3.6) kept the draft on at a loss. They
        // shape only the sizes below the longest of them: extrapolated to 16 from first passes
        // of 4-6 tokens, they priced x100M-near's long drafts off (1.33x against 1.49x).
        size_t shape_max = cm_.v.size();
        if (std::none_of(shape.begin(), shape.end(), [](char c) { return c != 0; })) {
            shape_max = 0;
            for (size_t m = kShapeMinSize; m < cm_.v.size(); ++m)
                if ((shape[m] = sampled[m] && below_cap(est.v[m], m))) shape_max = m;
        }
        for (size_t n = 2; n < cm_.v.size(); ++n) {
            if (sampled[n] || n > shape_max) continue;
            size_t best = 0;
            for (size_t m = 2; m < cm_.v.size(); ++m)
                if (shape[m] && (best == 0 || std::abs(double(m) - double(n)) <= std::abs(double(best) - double(n))))
                    best = m;
            if (best != 0) est.v[n] = cost_guess_shape(int(n), int(best), est.v[best]);
        }
        // A longer pass costs no less than a shorter one, so a size still at the guess is priced
        // at least as a shorter size measured below its cap (one at the cap may be a reading under
        // load, as above): left below it, the lower envelope (a stalled size is capped by a longer
        // one) would lower the measurement to the guess (x100M with the stories260K draft: v(4)
        // read at 3.69 priced at 3.19, the guess's v(5)).
        double floor_v = 1.0;
        for (size_t n = 2; n < cm_.v.size(); ++n) {
            if (sampled[n] && below_cap(est.v[n], n)) floor_v = std::max(floor_v, est.v[n]);
            else est.v[n] = std::max(est.v[n], std::min(floor_v, double(n)));
        }
    }
    cost_make_plausible(est);
    cm_.v = std::move(est.v);
    if (draft_.count() >= kPriorTrust)
        cm_.c = refine(draft_.median() / t1_cur_, anchor_.c, c_anchored_at_, draft_.count(), 0.67, 2.0);
}

}  // namespace specrpc
