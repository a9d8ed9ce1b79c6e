// Speculative-decoding statistics (see spec_stats.h).
#include "speculative/spec_stats.h"

#include <algorithm>
#include <string>

namespace specrpc {

namespace {

// a[i] += b[i], growing a as needed.
void add_into(std::vector<int64_t> & a, const std::vector<int64_t> & b) {
    if (a.size() < b.size()) a.resize(b.size(), 0);
    for (size_t i = 0; i < b.size(); ++i) a[i] += b[i];
}

// a[0..n) += 1, growing a as needed.
void bump_prefix(std::vector<int64_t> & a, int n) {
    if (n <= 0) return;
    if (a.size() < size_t(n)) a.resize(size_t(n), 0);
    for (int i = 0; i < n; ++i) a[size_t(i)]++;
}

int64_t sum(const std::vector<int64_t> & a) {
    int64_t s = 0;
    for (int64_t x : a) s += x;
    return s;
}

Status broken(const std::string & what) {
    return Status(ErrorCode::INTERNAL, "spec stats: " + what);
}

}  // namespace

void SpecStats::add_round(int drafted, int accepted_len, double t_draft, double t_verify,
                          double t_sample, int depth) {
    if (depth <= 0) depth = drafted;
    if (drafted < 0 || accepted_len < 0 || accepted_len > depth || depth > drafted) {
        ++n_bad_rounds;
        return;
    }
    n_drafted += drafted;
    n_accepted += accepted_len;
    n_steps += 1;
    n_emitted += accepted_len + 1;  // accepted prefix + correction/bonus
    bump_prefix(drafted_at_pos, depth);
    bump_prefix(accepted_at_pos, accepted_len);
    t_draft_ms += t_draft;
    t_verify_ms += t_verify;
    t_sample_ms += t_sample;
}

void SpecStats::add_decision(int gamma, bool off) {
    if (gamma < 0) return;
    if (gamma_hist.size() <= size_t(gamma)) gamma_hist.resize(size_t(gamma) + 1, 0);
    gamma_hist[size_t(gamma)]++;
    if (off) ++n_off_rounds;
}

void SpecStats::add_empty(double t_draft) {
    if (!(t_draft >= 0)) {
        ++n_bad_rounds;
        return;
    }
    ++n_empty_rounds;
    t_empty_draft_ms += t_draft;
}

void SpecStats::merge(const SpecStats & o) {
    n_drafted += o.n_drafted;
    n_accepted += o.n_accepted;
    n_steps += o.n_steps;
    n_emitted += o.n_emitted;
    add_into(drafted_at_pos, o.drafted_at_pos);
    add_into(accepted_at_pos, o.accepted_at_pos);
    t_draft_ms += o.t_draft_ms;
    t_verify_ms += o.t_verify_ms;
    t_sample_ms += o.t_sample_ms;
    add_into(gamma_hist, o.gamma_hist);
    n_off_rounds += o.n_off_rounds;
    n_empty_rounds += o.n_empty_rounds;
    t_empty_draft_ms += o.t_empty_draft_ms;
    n_bad_rounds += o.n_bad_rounds;
}

double SpecStats::accept_rate() const {
    return n_drafted > 0 ? double(n_accepted) / double(n_drafted) : 0.0;
}

double SpecStats::mean_accept_len() const {
    return n_steps > 0 ? 1.0 + double(n_accepted) / double(n_steps) : 0.0;
}

Status SpecStats::check_invariants() const {
    if (n_bad_rounds != 0)
        return broken(std::to_string(n_bad_rounds) + " round(s) recorded with impossible values");
    if (n_drafted < 0 || n_accepted < 0 || n_steps < 0 || n_emitted < 0 || n_off_rounds < 0 || n_empty_rounds < 0)
        return broken("negative count");
    if (n_accepted > n_drafted) return broken("accepted > drafted");
    if (n_emitted != n_accepted + n_steps) return broken("emitted != accepted + steps");
    if (sum(accepted_at_pos) != n_accepted) return broken("sum of accepted_at_pos != accepted");
    if (sum(drafted_at_pos) > n_drafted) return broken("sum of drafted_at_pos > drafted");
    for (size_t i = 0; i < accepted_at_pos.size(); ++i) {
        const int64_t d = i < drafted_at_pos.size() ? drafted_at_pos[i] : 0;
        if (accepted_at_pos[i] > d)
            return broken("accepted_at_pos[" + std::to_string(i) + "] > drafted_at_pos");
    }
    for (const auto * v : {&drafted_at_pos, &accepted_at_pos}) {
        for (size_t i = 0; i < v->size(); ++i) {
            if ((*v)[i] < 0) return broken("negative per-position count");
            if (i > 0 && (*v)[i] > (*v)[i - 1]) return broken("per-position count increases");
        }
    }
    if (!drafted_at_pos.empty() && drafted_at_pos[0] > n_steps)
        return broken("drafted_at_pos[0] > steps");
    for (int64_t x : gamma_hist)
        if (x < 0) return broken("negative gamma_hist entry");
    if (n_off_rounds > (gamma_hist.empty() ? 0 : gamma_hist[0]))
        return broken("off rounds > rounds with gamma 0");
    if (!gamma_hist.empty() && n_steps + n_empty_rounds > sum(gamma_hist) - gamma_hist[0])
        return broken("verification passes + empty rounds > rounds with gamma > 0");
    if (t_draft_ms < 0 || t_verify_ms < 0 || t_sample_ms < 0 || t_empty_draft_ms < 0) return broken("negative time");
    return Status::ok();
}

}  // namespace specrpc
