// Chi-square goodness-of-fit for the tests: do observed counts follow given probabilities?
// Header-only, test code only.
//
//   X² = Σ_i (O_i − E_i)² / E_i,   E_i = N · π_i,   dof = (number of bins after pooling) − 1,
//   p-value = P(χ²_dof ≥ X²) = Q(dof/2, X²/2),
// with Q(a, x) = Γ(a, x) / Γ(a) the regularized upper incomplete gamma function. The χ²
// approximation needs E_i ≳ 5, so bins with smaller expected counts are pooled first. A bin with
// π_i = 0 but O_i > 0 is an impossible outcome: X² = ∞, p-value 0.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

namespace specrpc::test {

// Q(a, x) = 1 − P(a, x) for a > 0, x ≥ 0.
//  - x < a + 1: the series P(a, x) = e^{−x} x^a / Γ(a) · Σ_{n≥0} x^n / (a (a+1) ··· (a+n)),
//    whose terms shrink fast there; Q = 1 − P.
//  - otherwise: the continued fraction
//    Q(a, x) = e^{−x} x^a / Γ(a) · 1/(x+1−a− 1·(1−a)/(x+3−a− 2·(2−a)/(x+5−a− ...))),
//    evaluated with the modified Lentz method.
inline double gamma_q(double a, double x) {
    if (x <= 0.0) return 1.0;
    if (a <= 0.0) return 0.0;
    const double log_prefactor = -x + a * std::log(x) - std::lgamma(a);
    if (x < a + 1.0) {
        double term = 1.0 / a, sum = term;
        for (int n = 1; n < 10000; ++n) {
            term *= x / (a + n);
            sum += term;
            if (std::fabs(term) < std::fabs(sum) * 1e-16) break;
        }
        return std::max(0.0, 1.0 - sum * std::exp(log_prefactor));
    }
    const double tiny = 1e-300;
    double       b    = x + 1.0 - a;  // b_n = x + 2n + 1 − a, a_n = −n (n − a)
    double       c    = 1.0 / tiny;
    double       d    = 1.0 / b;
    double       h    = d;
    for (int n = 1; n < 10000; ++n) {
        const double an = -n * (n - a);
        b += 2.0;
        d = an * d + b;
        if (std::fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (std::fabs(c) < tiny) c = tiny;
        d = 1.0 / d;
        const double delta = d * c;
        h *= delta;
        if (std::fabs(delta - 1.0) < 1e-16) break;
    }
    return std::exp(log_prefactor) * h;
}

struct ChiSquare {
    double statistic = 0.0;  // X²; +inf if an impossible bin was observed
    int    dof       = 0;    // pooled bins − 1
    double p_value   = 1.0;  // P(χ²_dof ≥ X²)
};

// Goodness of fit of `observed` counts to probabilities `expected_prob` (same length, scaled to
// sum 1). Bins with expected count < 5 are pooled, smallest first, into groups of ≥ 5; a
// remainder still < 5 joins the smallest big group.
inline ChiSquare chi_square_gof(const std::vector<int64_t> & observed,
                                const std::vector<double> &  expected_prob) {
    ChiSquare out;
    double    n = 0.0, psum = 0.0;
    for (int64_t o : observed) n += double(o);
    for (double pi : expected_prob) psum += pi;
    if (n <= 0.0 || psum <= 0.0 || observed.size() != expected_prob.size()) {
        out.p_value = 0.0;
        out.statistic = std::numeric_limits<double>::infinity();
        return out;
    }
    struct Group { double e = 0.0, o = 0.0; };
    std::vector<Group> big, small;
    for (size_t i = 0; i < observed.size(); ++i) {
        const double e = n * expected_prob[i] / psum;
        const double o = double(observed[i]);
        if (e <= 0.0) {
            if (o > 0.0) {  // an impossible outcome happened
                out.statistic = std::numeric_limits<double>::infinity();
                out.p_value   = 0.0;
                return out;
            }
            continue;
        }
        (e >= 5.0 ? big : small).push_back({e, o});
    }
    std::sort(small.begin(), small.end(), [](const Group & x, const Group & y) { return x.e < y.e; });
    Group pending;
    for (const Group & g : small) {
        pending.e += g.e;
        pending.o += g.o;
        if (pending.e >= 5.0) {
            big.push_back(pending);
            pending = {};
        }
    }
    if (pending.e > 0.0) {
        if (big.empty()) {
            big.push_back(pending);
        } else {
            auto it = std::min_element(big.begin(), big.end(),
                                       [](const Group & x, const Group & y) { return x.e < y.e; });
            it->e += pending.e;
            it->o += pending.o;
        }
    }
    for (const Group & g : big) out.statistic += (g.o - g.e) * (g.o - g.e) / g.e;
    out.dof     = int(big.size()) - 1;
    out.p_value = out.dof <= 0 ? 1.0 : gamma_q(0.5 * out.dof, 0.5 * out.statistic);
    return out;
}

// Goodness of fit of observed outcome counts to an exact law given as a map outcome → probability:
// outcomes the law does not list are pooled into one cell of probability 0 (any count there fails).
template <typename K>
inline ChiSquare chi_square_gof_map(std::map<K, int64_t> counts, const std::map<K, double> & law) {
    std::vector<int64_t> obs;
    std::vector<double>  pr;
    for (const auto & [k, p] : law) {
        obs.push_back(counts[k]);
        pr.push_back(p);
        counts.erase(k);
    }
    int64_t outside = 0;
    for (const auto & [k, n] : counts) outside += n;
    obs.push_back(outside);
    pr.push_back(0.0);
    return chi_square_gof(obs, pr);
}


// Two-sample chi-square homogeneity test: do two samples (counts per bin, cells[i] = {a_i, b_i})
// come from one distribution? X² = Σ_i Σ_s (O_is − E_is)² / E_is with E_is = (a_i + b_i) · N_s / N;
// bins whose pooled count is < 10 are merged into one (E ≳ 5 for equal sample sizes).
inline ChiSquare chi_square_two_sample(const std::vector<std::array<int64_t, 2>> & cells) {
    std::vector<std::array<double, 2>> kept;
    std::array<double, 2> rare{0, 0};
    double na = 0, nb = 0;
    for (const auto & c : cells) {
        na += double(c[0]);
        nb += double(c[1]);
        if (c[0] + c[1] < 10) { rare[0] += double(c[0]); rare[1] += double(c[1]); }
        else kept.push_back({double(c[0]), double(c[1])});
    }
    if (rare[0] + rare[1] > 0) kept.push_back(rare);
    ChiSquare out;
    if (na <= 0 || nb <= 0) return out;
    for (const auto & c : kept) {
        const double tot = c[0] + c[1], ea = tot * na / (na + nb), eb = tot * nb / (na + nb);
        out.statistic += (c[0] - ea) * (c[0] - ea) / ea + (c[1] - eb) * (c[1] - eb) / eb;
    }
    out.dof     = int(kept.size()) - 1;
    out.p_value = out.dof <= 0 ? 1.0 : gamma_q(0.5 * out.dof, 0.5 * out.statistic);
    return out;
}

}  // namespace specrpc::test
