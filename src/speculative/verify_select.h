// Which verifier a round uses (SpecParams::verifier resolved for one request and one draft), and
// the one call the engine's round makes. Keeps the choice in one place: the drafter needs to know
// whether its draws are coupled to the target's, and the round which verifier to run.
#pragma once

#include <cstdint>
#include <random>

#include "speculative/verify.h"
#include "specrpc/engine.hpp"

namespace specrpc {

enum class VerifierKind { GREEDY, TOKENWISE, BLOCK, COUPLED };

// True iff the request's tokens are drawn by keyed Gumbel-max (plain rounds, drafts and
// verification alike): temperature > 0, no mirostat, and verifier COUPLED, or AUTO with a seed
// set (seed != 0xFFFFFFFF).
bool verify_coupled_sampling(const SamplingParams & sampling, const SpecParams & spec);

// The verifier for one round's draft.
VerifierKind verify_choose(const SamplingParams & sampling, const SpecParams & spec, const DraftTree & tree);

// Runs `kind`. seed is the request's resolved seed and pos0 the output position of the token after
// the root (both used by COUPLED only); rng feeds TOKENWISE and BLOCK.
Result<VerifyResult> verify_run(VerifierKind kind, const DraftTree & tree, const DistAt & p, std::mt19937_64 & rng,
                                uint64_t seed, uint64_t pos0);

}  // namespace specrpc
