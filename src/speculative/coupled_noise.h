// Keyed Gumbel noise for coupled sampling (Daliri et al., "Coupling without communication and
// drafter-invariant speculative decoding", arXiv 2408.07978).
//
// A draw from a distribution d at output position `pos` is the Gumbel-max
//     x* = argmax_{x : d(x) > 0}  log d(x) + G(seed, pos, x),   G = −log(−log U(seed, pos, x)),
// with U a counter-based hash of (seed, pos, token id) mapped to (0, 1). For fixed (seed, pos) the
// U(x) are independent uniforms over x (as far as the hash is), so x* is an exact sample of d
// (the Gumbel-max lemma). Because the noise depends on nothing but (seed, pos, x), two parties
// that draw from two distributions p and q at the same position agree (x*_p = x*_q) with
// probability ≥ (1 − TV(p, q)) / (1 + TV(p, q)) without exchanging anything: that is how a draft
// model's token and the target's token are coupled, and why the target's token at a position does
// not depend on what was drafted.
#pragma once

#include <cstdint>

#include "speculative/dist.h"

namespace specrpc {

// The uniform U(seed, pos, id) in (0, 1): splitmix64 rounds over the three keys (53-bit mantissa,
// never 0 or 1 so that both logarithms are finite). Pure, thread-safe.
double coupled_uniform(uint64_t seed, uint64_t pos, token_id id);

// argmax over d's support of log d(x) + G(seed, pos, x); ties (probability 0) to the lower id.
// Returns -1 if d is empty. O(|d|).
token_id coupled_argmax(const Dist & d, uint64_t seed, uint64_t pos);

}  // namespace specrpc
