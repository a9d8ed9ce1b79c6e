// The thread count of the engine's passes, chosen from measured passes (see thread_choice.h).
#include "engine/thread_choice.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace specrpc {

void ThreadChoice::Window::add(double x) {
    xs.push_back(x);
    if (xs.size() > size_t(kWindow)) xs.erase(xs.begin());
}

double ThreadChoice::Window::median(int last) const {
    if (xs.empty()) return 0.0;
    std::vector<double> s(xs.end() - std::min<std::ptrdiff_t>(last, std::ptrdiff_t(xs.size())), xs.end());
    std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
    return s[s.size() / 2];
}

void ThreadChoice::start_trial() {
    ++n_trials_;
    trial_ = true;
    one_   = !one_;
    trial_win_.xs.clear();
}

void ThreadChoice::end_trial(bool adopt) {
    trial_ = false;
    since_ = 0;
    share_.xs.clear();
    if (adopt) {
        inc_win_  = trial_win_;  // the new incumbent's own recent passes
        interval_ = kMinInterval;
        gate_     = kMinInterval;
        ++n_switches_;
        return;
    }
    one_      = !one_;
    gate_     = interval_;
    interval_ = std::min(kMaxInterval, interval_ * 2);
}

bool ThreadChoice::settled() const {
    if (n_full_ <= 1) return true;
    if (trial_ || int(inc_win_.xs.size()) < kShareRun || since_ < kShareRun) return false;
    // all threads run outside a trial after one has ended: they won it (adopted, or one thread lost)
    return one_ || n_trials_ > 0 || (int(share_.xs.size()) >= kShareRun && share_.median(kShareRun) >= kShareMin);
}

bool ThreadChoice::observe(double x, double share) {
    if (n_full_ <= 1 || !(x > 0) || !std::isfinite(x)) return false;
    if (trial_) {
        const double inc = inc_win_.median(kShareRun);  // as it ran just before the trial
        trial_win_.add(x);
        const bool stalled = x > kAbort * inc;
        if (!stalled && int(trial_win_.xs.size()) < kTrialLen) return false;
        const bool adopt = !stalled && trial_win_.median() < kAdopt * inc;
        end_trial(adopt);
        return !adopt;
    }
    inc_win_.add(x);
    ++since_;
    if (std::isfinite(share) && share >= 0) share_.add(share);
    if (since_ < gate_ || share_.xs.empty()) return false;
    const double got = share_.median(kShareRun);
    // On all threads, one is tried as soon as the threads do not get their cores (a single low
    // share suffices: the trial, not the share, decides, and beside a busy process every pass
    // on all threads can cost 10-100 on one). On one thread, all are tried only when that one
    // gets its core: while the machine is oversubscribed a pass on all threads stalls anyway.
    if (one_ ? got < kShareAlone : got >= kShareMin) return false;
    if (one_ && cores_free_ && !cores_free_()) {
        // one thread gets its core, but another process holds the one the others need: the
        // trial would stall at its first barrier. Ask again after kMinInterval passes.
        since_ = 0;
        gate_  = kMinInterval;
        ++n_held_;
        return false;
    }
    start_trial();
    return true;
}

}  // namespace specrpc
