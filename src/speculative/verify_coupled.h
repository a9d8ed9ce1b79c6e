// Coupled verification (temperature > 0, drafter-invariant): the target's token at every output
// position is the Gumbel-max draw of its p with noise keyed by (seed, position, token id)
// (speculative/coupled_noise.h), and a drafted token is accepted iff it equals that draw.
//
// Why it is lossless and drafter-invariant: the emitted token at position k is
// coupled_argmax(p_k, seed, k), where p_k is the target's distribution given the emitted prefix;
// the draft only decides how many of these draws one target pass gets to make, never their values.
// So the output is a pure function of (target, prompt, sampling parameters, seed), the same as
// plain decoding's with the same seed, and each token is an exact sample of p_k (Gumbel-max).
// A drafter that draws its own tokens with the same keyed noise on its q agrees with the target
// with probability ≥ (1 − TV) / (1 + TV) (Daliri et al., arXiv 2408.07978); deterministic drafters
// (n-gram, lookup, tree siblings) are accepted iff they guessed the draw.
#pragma once

#include <cstdint>

#include "speculative/verify.h"

namespace specrpc {

// Walks the tree like verify_greedy with argmax replaced by the keyed Gumbel-max draw: at node u
// (depth d) the target's token is coupled_argmax(p[u], seed, pos0 + d); the first child holding it
// is accepted, else it is `next`. pos0 is the output position of the token after the root.
Result<VerifyResult> verify_coupled(const DraftTree & tree, const DistAt & p, uint64_t seed, uint64_t pos0);
Result<VerifyResult> verify_coupled(const DraftTree & tree, const std::vector<Dist> & p, uint64_t seed,
                                    uint64_t pos0);

}  // namespace specrpc
