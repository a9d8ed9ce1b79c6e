// A probability distribution over token ids, as the verifiers see it: the *transformed*
// distribution (after penalties, logit bias, grammar, temperature and truncation) that the
// non-speculative sampler would draw from. Sparse: only tokens with p > 0 are listed.
#pragma once

#include <cstdint>
#include <vector>

namespace specrpc {

using token_id = int32_t;

struct TokenProb {
    token_id id;  // token id in [0, n_vocab)
    float    p;   // probability in (0, 1]
};

// Invariants (established by the sampling layer, assumed by the verifiers): ids are unique,
// every p > 0, the p sum to 1 (within float rounding), sorted by p descending (ties by id).
using Dist = std::vector<TokenProb>;

// Probability of `id` under `d` (0 if absent). O(|d|).
inline float dist_prob(const Dist & d, token_id id) {
    for (const auto & tp : d)
        if (tp.id == id) return tp.p;
    return 0.0f;
}

// One-hot distribution on `id`: the q of a deterministic drafter (argmax, n-gram, lookup).
inline Dist dist_one_hot(token_id id) { return Dist{{id, 1.0f}}; }

}  // namespace specrpc
