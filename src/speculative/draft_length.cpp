// Cost model and adaptive draft length (see draft_length.h for the maths).
#include "speculative/draft_length.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

namespace specrpc {

namespace {

bool measured(double x) { return std::isfinite(x) && x > 0.0; }

// Depth d's counts in ev made plausible, {successes, trials} with 0 ≤ s ≤ n ({0, 0} past its end):
// evidence handed over from earlier requests, perhaps through a file.
std::pair<double, double> counts_at(const DraftClassEvidence & ev, size_t d) {
    if (d >= ev.n.size() || d >= ev.s.size()) return {0.0, 0.0};
    const double n = std::max(0.0, ev.n[d]);
    return {std::clamp(ev.s[d], 0.0, n), n};
}

// The measured points (n, v(n)), n ascending, starting with (1, 1).
std::vector<std::pair<int, double>> measured_points(const CostModel & cm) {
    std::vector<std::pair<int, double>> pts{{1, 1.0}};
    for (size_t n = 2; n < cm.v.size(); ++n)
        if (measured(cm.v[n])) pts.emplace_back(int(n), cm.v[n]);
    return pts;
}

}  // namespace

Status cost_model_check(const CostModel & cm) {
    if (cm.v.size() >= 2 && measured(cm.v[1]) && std::fabs(cm.v[1] - 1.0) > 1e-6)
        return invalid_arg("cost model: v[1] must be 1", "v");
    for (double x : cm.v)
        if (std::isnan(x) || std::isinf(x)) return invalid_arg("cost model: v not finite", "v");
    if (!(cm.c >= 0.0) || !std::isfinite(cm.c)) return invalid_arg("cost model: c < 0", "c");
    if (!(cm.o >= 0.0) || !std::isfinite(cm.o)) return invalid_arg("cost model: o < 0", "o");
    return Status::ok();
}

double cost_model_v(const CostModel & cm, int n) {
    if (n <= 0) return 0.0;
    if (n == 1) return 1.0;
    // The measured points are (1, 1) and each (k, v[k]) with v[k] measured, k ascending; they are
    // walked in place: this runs for every γ of every decision and for every size each time the
    // estimator takes a pass, and building the list of points on the heap at each call cost ~4%
    // of the decode of a process whose draft model stayed off (docs/benchmarks.md).
    int    n1 = 1, n0 = 0;  // the last two measured points below n (n0 = 0: none before n1)
    double v1 = 1.0, v0 = 0.0;
    for (size_t k = 2; k < cm.v.size(); ++k) {
        if (!measured(cm.v[k])) continue;
        const int m = int(k);
        if (m == n) return cm.v[k];
        if (m > n) return v1 + (cm.v[k] - v1) * double(n - n1) / double(m - n1);  // interpolated
        n0 = n1, v0 = v1;
        n1 = m, v1 = cm.v[k];
    }
    if (n0 == 0) return double(n);  // nothing measured: no batching gain, v(n) = n
    // Beyond the last measured point: v(n) = v(n1) + s·(n − n1), s = slope of the last two
    // points, clamped ≥ 0 (a pass over more tokens never costs less).
    const double s = std::max(0.0, (v1 - v0) / double(n1 - n0));
    return v1 + s * double(n - n1);
}

// Cost of a round drafting γ tokens, in 1-token target passes (docs/design.md §3): v(γ+1) + γc + o.
static double round_cost(const CostModel & cm, int gamma) {
    return gamma <= 0 ? 1.0 : cost_model_v(cm, gamma + 1) + double(gamma) * cm.c + cm.o;
}

// The i.i.d. forms are the profile forms with a constant profile: E[N] = Σ_{i=0..γ} α^i, which
// equals (1 − α^(γ+1)) / (1 − α) and is exact at α = 1.
static std::vector<double> constant_profile(double alpha) { return {alpha, alpha}; }

double expected_tokens(double alpha, int gamma) {
    return expected_tokens(constant_profile(alpha), gamma);
}

double predicted_speedup(const CostModel & cm, double alpha, int gamma) {
    return predicted_speedup(cm, constant_profile(alpha), gamma);
}

// a[j] of a profile as expected_tokens reads it: past its end its last entry, clamped to [0, 1];
// 0 for a profile with no depth.
static double profile_at(const std::vector<double> & a, int j) {
    return a.size() > 1 ? std::clamp(a[std::min<size_t>(size_t(j), a.size() - 1)], 0.0, 1.0) : 0.0;
}

double expected_tokens(const std::vector<double> & a, int gamma) {
    double sum = 1.0, run = 1.0;
    for (int i = 1; i <= gamma; ++i) {
        run *= profile_at(a, i);
        sum += run;
    }
    return sum;
}

double predicted_speedup(const CostModel & cm, const std::vector<double> & a, int gamma) {
    if (gamma <= 0) return 1.0;
    const double cost = round_cost(cm, gamma);
    return cost > 0.0 ? expected_tokens(a, gamma) / cost : 0.0;
}

// The γ in [max(gamma_min, 1), gamma_max] with the best S, however small ({0, 0} when empty).
static GammaChoice best_gamma(const CostModel & cm, const std::vector<double> & a, int gamma_min, int gamma_max) {
    GammaChoice best{0, 0.0};
    for (int g = std::max(gamma_min, 1); g <= gamma_max; ++g) {
        const double s = predicted_speedup(cm, a, g);
        if (s > best.predicted) best = {g, s};
    }
    return best;
}

GammaChoice choose_gamma(const CostModel & cm, const std::vector<double> & a, int gamma_min, int gamma_max) {
    const GammaChoice best = best_gamma(cm, a, gamma_min, gamma_max);
    if (best.gamma == 0 || best.predicted < 1.0) return {0, 1.0};
    return best;
}

double speedup_limit(const CostModel & cm, int n_max) {
    if (n_max <= 0) n_max = measured_points(cm).back().first;
    double best = 1.0;  // n = 1
    for (int n = 2; n <= n_max; ++n) best = std::max(best, double(n) / cost_model_v(cm, n));
    return best;
}

GammaChoice choose_gamma(const CostModel & cm, double alpha, int gamma_min, int gamma_max) {
    return choose_gamma(cm, constant_profile(alpha), gamma_min, gamma_max);
}

Status draft_length_options_check(const DraftLengthOptions & o) {
    if (o.n_min < 0) return invalid_arg("n_min must be >= 0", "n_min");
    if (o.n_max < o.n_min) return invalid_arg("n_max must be >= n_min", "n_max");
    if (!(o.ema_weight > 0.0 && o.ema_weight <= 1.0))
        return invalid_arg("ema_weight must be in (0, 1]", "ema_weight");
    if (o.probe_interval < 0) return invalid_arg("probe_interval must be >= 0", "probe_interval");
    if (o.probe_gamma < 1) return invalid_arg("probe_gamma must be >= 1", "probe_gamma");
    if (!(o.alpha_prior >= 0.0 && o.alpha_prior <= 1.0))
        return invalid_arg("alpha_prior must be in [0, 1]", "alpha_prior");
    if (!(o.probe_budget >= 0.0) || !std::isfinite(o.probe_budget))
        return invalid_arg("probe_budget must be >= 0", "probe_budget");
    if (!(o.min_speedup > 0.0) || !std::isfinite(o.min_speedup))
        return invalid_arg("min_speedup must be > 0", "min_speedup");
    if (o.explore_every < 0) return invalid_arg("explore_every must be >= 0", "explore_every");
    if (!(o.slow_weight > 0.0 && o.slow_weight <= 1.0))
        return invalid_arg("slow_weight must be in (0, 1]", "slow_weight");
    if (!(o.off_relax >= 0.0 && o.off_relax <= 1.0)) return invalid_arg("off_relax must be in [0, 1]", "off_relax");
    if (!(o.prior_run >= 0.0) || !std::isfinite(o.prior_run)) return invalid_arg("prior_run must be >= 0", "prior_run");
    return Status::ok();
}

DraftLengthPolicy::DraftLengthPolicy(CostModel cm, DraftLengthOptions opts)
    : cm_(std::move(cm)),
      opts_(opts),
      alpha_(std::clamp(opts.alpha_prior, 0.0, 1.0)),
      off_streak_(std::max(opts.probe_ledger.since_probe, 0)),
      interval_(opts.probe_ledger.interval > 0 ? opts.probe_ledger.interval : opts.probe_interval),
      depth_ema_(size_t(std::max(opts.n_max, 0)) + 2, std::clamp(opts.alpha_prior, 0.0, 1.0)),
      depth_n_(size_t(std::max(opts.n_max, 0)) + 2, 0),
      depth_prior_w_(size_t(std::max(opts.n_max, 0)) + 2, 0.0),
      gamma_hist_(size_t(std::max(opts.n_max, 0)) + 1, 0),
      classes_(kDraftClasses),
      ledger_(opts.probe_ledger),
      conf_(opts.confidence_prior) {
    conf_.s.resize(kConfBins, 0.0);
    conf_.n.resize(kConfBins, 0.0);
    conf_.empty_share = std::isfinite(conf_.empty_share) ? std::clamp(conf_.empty_share, 0.0, 1.0) : 0.0;
    if (!std::isfinite(conf_.empty_excess)) conf_.empty_excess = -1;
    if (opts_.depth_prior.size() > 1) {
        for (size_t d = 1; d < depth_ema_.size(); ++d) {
            depth_ema_[d] = std::clamp(opts_.depth_prior[std::min(d, opts_.depth_prior.size() - 1)], 0.0, 1.0);
            depth_prior_w_[d] = kDepthFull;
        }
    }
    slow_s_.assign(depth_ema_.size(), 0.0);
    slow_n_.assign(depth_ema_.size(), 0.0);
    own_s_.assign(depth_ema_.size(), 0.0);
    // The longer run starts from what earlier requests measured (DraftLengthOptions::prior_run):
    // their pooled positions, each depth's rate smoothed towards the depth prior (or the depth
    // above) by one position, so a depth they seldom reached is not read off two or three.
    const DraftClassEvidence & lp = opts_.long_prior;
    const bool has_long = !lp.n.empty() && lp.s.size() == lp.n.size();
    if (has_long || opts_.depth_prior.size() > 1) {
        double above = depth_ema_.size() > 1 ? depth_ema_[1] : 0.0;
        for (size_t d = 1; d < depth_ema_.size(); ++d) {
            const double base = opts_.depth_prior.size() > 1 ? depth_ema_[d] : above;
            const auto [s, n] = counts_at(lp, d);
            const double rate = has_long ? (s + base) / (n + 1.0) : base;
            slow_n_[d] = opts_.prior_run;
            slow_s_[d] = opts_.prior_run * rate;
            above      = rate;
        }
    }
    for (size_t c = 1; c < classes_.size(); ++c) {
        DraftClassEvidence & ev = classes_[c];
        ev.s.assign(depth_ema_.size(), 0.0);
        ev.n.assign(depth_ema_.size(), 0.0);
        if (c >= opts_.class_prior.size()) continue;
        const DraftClassEvidence & pr = opts_.class_prior[c];
        for (size_t d = 1; d < ev.s.size(); ++d) std::tie(ev.s[d], ev.n[d]) = counts_at(pr, d);
    }
}

static int class_index(int cls) { return cls > 0 && cls < kDraftClasses ? cls : 0; }

std::vector<double> DraftLengthPolicy::depth_acceptance(int cls) const {
    std::vector<double> a(depth_ema_.size(), alpha_);
    for (size_t j = 1; j < a.size(); ++j) {
        const double above = j == 1 ? alpha_ : a[j - 1];
        const double wt    = std::min(double(depth_n_[j]) + depth_prior_w_[j], double(kDepthFull)) / kDepthFull;
        a[j] = wt * depth_ema_[j] + (1.0 - wt) * above;
    }
    if (const int c = class_index(cls)) {
        // Classes are ordered by confidence, so a class starts no lower than those below it: its
        // prior at depth j is the best of the pooled profile and the lower classes at j (b), or
        // its own depth above (a copy that held to depth 7 holds at 8 about as well). A fresh
        // process whose copies held at 4-5-token matches then drafts long at its first 6-9-token
        // match, and a class doing worse than the pooled profile pulls none above it down.
        std::vector<double> b = a;  // running max over the pooled profile and classes 1..k − 1
        for (int k = 1; k <= c; ++k) {
            const DraftClassEvidence & ev = classes_[size_t(k)];
            double above = 0;
            for (size_t j = 1; j < a.size(); ++j) {
                above = (ev.s[j] + kClassPseudo * std::max(b[j], above)) / (ev.n[j] + kClassPseudo);
                if (k == c) a[j] = above;
                else b[j] = std::max(b[j], above);
            }
        }
    }
    return a;
}

// The longer run at depth j, once it weighs kDepthFull positions (a run of a few rounds is no
// better a guess than the last ones); 0 before, which fades nothing.
double DraftLengthPolicy::long_run(size_t j) const {
    return slow_n_[j] >= kDepthFull ? slow_s_[j] / slow_n_[j] : 0.0;
}

DraftClassEvidence DraftLengthPolicy::next_long_prior() const {
    DraftClassEvidence out;
    out.s.assign(own_s_.size(), 0.0);
    out.n.assign(own_s_.size(), 0.0);
    for (size_t d = 1; d < out.n.size(); ++d) {
        const auto [s, n] = counts_at(opts_.long_prior, d);
        out.s[d] = kLongKeep * s + own_s_[d];
        out.n[d] = kLongKeep * n + double(depth_n_[d]);
    }
    return out;
}

std::vector<double> DraftLengthPolicy::next_depth_prior() const {
    std::vector<double> a = depth_acceptance();
    // Only at depths this request measured itself (kDepthFull positions): elsewhere the longer
    // run is the prior's, which came from this very profile, and the max would ratchet a depth
    // seldom reached up to the best it ever read (x100M-near at T = 0.8 drafted longer, accepted
    // 69% of its drafted tokens against 73%, and ran 1.57x against 1.62x).
    if (opts_.off_relax > 0)
        for (size_t j = 1; j < a.size(); ++j)
            if (depth_n_[j] >= kDepthFull) a[j] = std::max(a[j], long_run(j));
    return a;
}

// stop_below() for a paying round of γ = d.gamma chosen on the profile a (see the header). The stop
// never cuts a path that is as likely to be accepted as the profile expected of the round's last
// token (A_γ): with bins that tell nothing (a_b = α) the draft runs to γ, and a cut needs evidence.
double DraftLengthPolicy::confidence_stop(const std::vector<double> & a, const GammaDecision & d) const {
    const double per_token = (round_cost(cm_, d.gamma) - cm_.o - 1.0) / double(d.gamma);
    double a_gamma = 1.0;
    for (int j = 1; j <= d.gamma; ++j) a_gamma *= profile_at(a, j);
    return std::min(std::max(d.predicted, 1.0) * std::max(per_token, 0.0), a_gamma);
}

// S_e of observe_empty: the round's S with the stop's empty rounds mixed in at their share.
double DraftLengthPolicy::with_empty_rounds(const GammaChoice & best) const {
    const double e = conf_.empty_share;
    if (e <= 0 || best.gamma <= 0) return best.predicted;
    const double cost   = round_cost(cm_, best.gamma);
    const double tokens = best.predicted * cost;
    const double x      = conf_.empty_excess >= 0 ? conf_.empty_excess : cm_.c + cm_.o;
    return ((1 - e) * tokens + e) / ((1 - e) * cost + e * (1 + x));
}

GammaDecision DraftLengthPolicy::decide(int remaining, int cls) {
    GammaDecision d;
    const int     lo  = std::max(opts_.n_min, 1);
    const int     cap = remaining > 0 ? remaining - 1 : 0;  // the round emits up to γ + 1
    const int     hi  = std::min(opts_.n_max, cap);
    d.capped          = cap < opts_.n_max;
    if (hi < lo) return d;  // no room for a worthwhile draft: plain step

    const std::vector<double> a = depth_acceptance(cls);
    if (!opts_.adaptive) {
        d.gamma     = hi;
        d.predicted = predicted_speedup(cm_, a, hi);
        return d;
    }
    // the best γ on the profile, also when it does not pay: a probe drafts that deep (below)
    const GammaChoice best = best_gamma(cm_, a, lo, hi);
    // one bar for S and for S mixed with the stop's empty rounds: a gain and at least the margin
    const double      bar  = std::max(1.0, opts_.min_speedup);
    bool              pays = best.gamma > 0 && best.predicted >= bar && with_empty_rounds(best) >= bar;
    // Back on after plain rounds without a probe (a dip faded, off_relax): the draft first
    // catches up on the tokens emitted while it was off, which S does not price. A model draft
    // that only just pays (x25M beside stories260K: c ≈ 0.2) came back on again and again that
    // way, each time paying a catch-up of up to 140 tokens (~8 target passes) before its empty
    // and rejected rounds switched it off: 5% of a request in catch-ups alone, outside the
    // budget that bounds probes. It comes on only while the budget can pay the catch-up (about
    // the last one, as for a probe), and pays it from there (add_catch_up). A free proposal
    // (c = 0 this round: lookup in a chain) has nothing to catch up.
    const bool switch_on = pays && last_.off;  // the round before was off in this request
    if (switch_on && cm_.c > 0 && ledger_.catch_up > 0 && !within_budget(ledger_.catch_up)) pays = false;
    d.capped               = d.capped && pays && best.gamma == hi;  // only if the cap bound the choice
    const bool was_probe   = probing_;
    const bool was_looking = looking_;
    probing_               = false;
    looking_               = false;
    const bool first_look  = n_at_risk_ < opts_.first_look && n_decided_++ < opts_.first_look_rounds;
    if (pays) {
        off_streak_ = 0;
        d.switch_on = switch_on;
        interval_   = opts_.probe_interval;  // speculation pays again: probe eagerly next time
        d.gamma     = best.gamma;
        d.predicted = best.predicted;
        // Now and then draft longer, twice in a row: the engine times only a pass of the size
        // the round before had (a steady pass), and a size never drafted keeps whatever the
        // start-up probe or the guess said of it. Up to twice the chosen γ, not to the cap: S
        // is flat near its optimum, so the look is cheap, and a size that proves cheaper moves
        // the optimum, and the next look, further (a model drafter at γ 9 looking at n_max 32
        // paid 2%).
        if (explore_left_ == 0 && opts_.explore_every > 0 && best.gamma < hi && ++since_explore_ >= opts_.explore_every)
            explore_left_ = 2;
        if (explore_left_ > 0) {
            --explore_left_;
            since_explore_ = 0;
            d.gamma     = std::min(hi, 2 * best.gamma);
            d.predicted = predicted_speedup(cm_, a, d.gamma);
            d.explore   = true;
            return d;  // drafted whole: explorations, like probes, are how a bin the stop avoids
                       // is tested again
        }
        stop_below_ = confidence_stop(a, d);
        return d;
    }
    // Off. Every `interval_` plain rounds, draft a probe so α can recover; each probe
    // that does not turn speculation back on doubles the interval (exponential back-off), so a
    // drafter that never pays costs a vanishing share of the passes.
    // Back off after a probe that saw a rejection. A fully accepted probe keeps the interval:
    // α is climbing towards the point where speculation pays (backing off then would leave a
    // good drafter off for the rest of a request that merely started unluckily).
    // (A first-look round is no probe of a drafter judged off: it does not back off.)
    if (was_probe && probe_rejected_ && !was_looking) back_off();
    // Probing is pointless when even perfect acceptance (α = 1) could not pay.
    const GammaChoice best_case = choose_gamma(cm_, 1.0, lo, hi);
    const bool could_pay = best_case.gamma > 0 && best_case.predicted >= opts_.min_speedup;
    // A probe drafts as deep as speculation would if it turned on now (the γ of the best S on
    // the current profile, at least probe_gamma): the acceptance at those depths is what decides
    // whether it turns on. A 3-token probe cannot show that a 15-token draft pays: it refreshes
    // depths 1-3 only, while a learned profile keeps the deep ones where they were.
    const int pg = std::max(best.gamma, std::clamp(opts_.probe_gamma, lo, hi));
    // The probe budget: a probe costs its round net of the tokens it is expected to emit, plus
    // catching the draft up on the tokens emitted while it was off (about what the last catch-up
    // cost); it runs only if the spending stays within the budget share of all the work.
    const double probe_est = std::max(0.0, round_cost(cm_, pg) - expected_tokens(a, pg)) + ledger_.catch_up;
    const bool in_budget = within_budget(probe_est);
    // A fresh drafter's first rounds look before deciding (the prior is only a guess)
    if (could_pay && (first_look || (opts_.probe_interval > 0 && off_streak_ >= interval_ && in_budget))) {
        off_streak_ = 0;
        probing_    = true;
        looking_    = first_look;
        d.probe     = true;
        d.gamma     = pg;
        d.predicted = predicted_speedup(cm_, a, d.gamma);
        return d;
    }
    ++off_streak_;
    // The profile's last rounds grow old while the drafter is off: a dip fades to the longer run
    // (DraftLengthOptions::off_relax), and the drafter comes on again, without a probe, once that
    // pays. Only dips: a depth above the longer run got there from probes, news to keep.
    for (size_t j = 1; j < depth_ema_.size(); ++j)
        depth_ema_[j] += opts_.off_relax * std::max(0.0, long_run(j) - depth_ema_[j]);
    conf_.empty_share *= kEmptyFade;
    d.off = true;
    return d;
}

bool DraftLengthPolicy::within_budget(double est) const {
    return ledger_.spent + est <= opts_.probe_budget * (ledger_.work + est);
}

int DraftLengthPolicy::next_gamma(int remaining, int cls) {
    stop_below_ = 0;
    if (hold_ > 0) {
        --hold_;
        last_ = GammaDecision{};
        gamma_hist_[0]++;
        ledger_.work += 1.0;
        return 0;
    }
    last_ = decide(remaining, class_index(cls));
    gamma_hist_[size_t(last_.gamma)]++;
    if (last_.off) ++n_off_rounds_;
    ledger_.work += round_cost(cm_, last_.gamma);
    return last_.gamma;
}

// Bins of the draft's top probability, finer where a confident draft's tokens fall.
int DraftLengthPolicy::confidence_bin(double top_p) {
    static constexpr double kEdges[kConfBins - 1] = {0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95};
    int b = 0;
    while (b < kConfBins - 1 && top_p >= kEdges[b]) ++b;
    return b;
}

double DraftLengthPolicy::confidence_acceptance(int bin) const {
    const size_t b = size_t(std::clamp(bin, 0, kConfBins - 1));
    return std::clamp((conf_.s[b] + kConfPseudo * alpha_) / (conf_.n[b] + kConfPseudo), 0.0, 1.0);
}

bool DraftLengthPolicy::chain_pays(const std::vector<double> & path_p) const {
    if (path_p.empty()) return false;
    double tokens = 1.0;
    for (double p : path_p) tokens += p;
    return tokens / round_cost(cm_, int(path_p.size())) >= opts_.min_speedup;
}

void DraftLengthPolicy::observe_confidence(const std::vector<int8_t> & bins, int n_accepted) {
    const int k = std::clamp(n_accepted, 0, int(bins.size()));
    const int n = std::min(int(bins.size()), k + 1);  // positions at risk
    for (int i = 0; i < n; ++i) {
        const size_t b = size_t(std::clamp(int(bins[size_t(i)]), 0, kConfBins - 1));
        conf_.s[b] = kConfKeep * conf_.s[b] + (i < k ? 1.0 : 0.0);
        conf_.n[b] = kConfKeep * conf_.n[b] + 1.0;
    }
}

ProbeLedger DraftLengthPolicy::probe_ledger() const {
    ProbeLedger l = ledger_;
    l.interval    = interval_;
    l.since_probe = off_streak_;
    return l;
}

void DraftLengthPolicy::add_catch_up(double units) {
    if (!(units > 0)) return;
    ledger_.work += units;
    if (last_.probe || last_.switch_on) ledger_.spent += units;
    ledger_.catch_up = units;
}

void DraftLengthPolicy::observe_empty(double excess) {
    const double w = opts_.ema_weight;
    conf_.empty_share   = (1 - w) * conf_.empty_share + w;
    if (excess >= 0) conf_.empty_excess = conf_.empty_excess < 0 ? excess : (1 - w) * conf_.empty_excess + w * excess;
}

void DraftLengthPolicy::observe(int n_drafted, int n_accepted, int cls) {
    if (n_drafted <= 0) return;
    // a verified round under the stop: one of its paying rounds that was not empty
    if (stop_below_ > 0) conf_.empty_share *= 1 - opts_.ema_weight;
    const int k = std::clamp(n_accepted, 0, n_drafted);
    if (probing_) {
        probe_rejected_ = k < n_drafted;
        // net cost: the probe round's work minus the k + 1 tokens it emits (plain: 1 per pass)
        ledger_.spent += round_cost(cm_, last_.gamma) - double(k + 1);
    }
    learn(n_drafted, k, cls);
}

bool DraftLengthPolicy::shadow_probe() {
    if (!probing_ || looking_ || last_.gamma <= 0) return false;
    // the last probe in shadow was accepted whole: the drafter may be climbing back, and a
    // verified probe then both measures and emits what it drafted
    if (shadow_whole_) {
        shadow_whole_ = false;
        return false;
    }
    // the round is plain after all: its work is one pass and the draft, not the probe's round
    // next_gamma booked, and what it spends beyond plain decoding is the draft
    const double draft = double(last_.gamma) * cm_.c;
    ledger_.work += 1.0 + draft - round_cost(cm_, last_.gamma);
    ledger_.spent += draft;
    probing_ = false;  // no verified outcome to back off on at the next decision
    return true;
}

void DraftLengthPolicy::observe_shadow_probe(int n_drafted, int n_accepted) {
    if (n_drafted <= 0) return;
    const int k = std::clamp(n_accepted, 0, n_drafted);
    learn(n_drafted, k, 0);
    if (k < n_drafted) back_off();
    shadow_whole_ = k == n_drafted;
}

void DraftLengthPolicy::back_off() {
    interval_ = std::min(std::max(interval_, 1) * 2, std::max(opts_.probe_interval_max, opts_.probe_interval));
}

void DraftLengthPolicy::learn(int n_drafted, int k, int cls) {
    const int    n      = k + (k < n_drafted ? 1 : 0);  // positions at risk
    const double lambda = 1.0 - opts_.ema_weight;
    if (opts_.classes_apart && class_index(cls) > 0) {
        learn_class(class_index(cls), n, k);
        return;
    }
    const double keep   = std::pow(lambda, n);          // λ^n
    alpha_              = keep * alpha_ + (1.0 - keep) * double(k) / double(n);
    n_at_risk_ += n;
    n_accepted_ += k;
    // per depth: successes at 1..k, a failure at k + 1 (if the draft went that deep)
    for (int j = 1; j <= n && size_t(j) < depth_ema_.size(); ++j) {
        depth_ema_[j] = lambda * depth_ema_[j] + opts_.ema_weight * (j <= k ? 1.0 : 0.0);
        slow_s_[j] = (1.0 - opts_.slow_weight) * slow_s_[j] + (j <= k ? 1.0 : 0.0);
        slow_n_[j] = (1.0 - opts_.slow_weight) * slow_n_[j] + 1.0;
        ++depth_n_[j];
        own_s_[j] += j <= k ? 1.0 : 0.0;
    }
    // The depths this round did not reach keep what the prior said only for a while: a learned
    // profile is never refreshed past the γ it leads to (a draft that once fell apart after
    // depth 3 would be drafted to 3 for good), so its weight there fades (halving in ~7 rounds)
    // and those depths then borrow from the depth above, which lets γ grow and look again.
    for (size_t j = size_t(n) + 1; j < depth_prior_w_.size(); ++j) depth_prior_w_[j] *= kPriorFade;
    if (const int c = class_index(cls)) learn_class(c, n, k);
}

void DraftLengthPolicy::learn_class(int c, int n, int k) {
    const double         lambda = 1.0 - opts_.ema_weight;
    DraftClassEvidence & ev     = classes_[size_t(c)];
    for (int j = 1; j <= n && size_t(j) < ev.s.size(); ++j) {
        ev.s[size_t(j)] = lambda * ev.s[size_t(j)] + (j <= k ? 1.0 : 0.0);
        ev.n[size_t(j)] = lambda * ev.n[size_t(j)] + 1.0;
    }
}

}  // namespace specrpc
