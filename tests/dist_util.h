// Toy distributions for the verifier tests.
#pragma once

#include <algorithm>
#include <vector>

#include "speculative/dist.h"

namespace specrpc::test {

// A Dist from non-negative weights: zeros dropped, normalised, sorted by p desc then id (the order
// the verifiers expect of a target distribution).
inline Dist make_dist(const std::vector<double> & w) {
    double sum = 0.0;
    for (double x : w) sum += x;
    Dist d;
    for (size_t i = 0; i < w.size(); ++i)
        if (w[i] > 0.0) d.push_back({token_id(i), float(w[i] / sum)});
    std::sort(d.begin(), d.end(), [](const TokenProb & a, const TokenProb & b) {
        return a.p != b.p ? a.p > b.p : a.id < b.id;
    });
    return d;
}

}  // namespace specrpc::test
