// Which verifier a round uses (SpecParams::verifier resolved for one request and one draft). Keeps
// the choice in one place: the drafter needs to know whether its draws are coupled to the
// target's, and the round which verifier to run. It reads the API's option structs, so it lives
// in the engine, above the speculative core that runs the verifiers (speculative/verify_select.h).
#pragma once

#include "specrpc/engine.hpp"
#include "speculative/verify_select.h"

namespace specrpc {

// True iff the request's tokens are drawn by keyed Gumbel-max (plain rounds, drafts and
// verification alike): temperature > 0, no mirostat, and verifier COUPLED, or AUTO with a seed
// set (seed != 0xFFFFFFFF).
bool verify_coupled_sampling(const SamplingParams & sampling, const SpecParams & spec);

// The verifier for one round's draft.
VerifierKind verify_choose(const SamplingParams & sampling, const SpecParams & spec, const DraftTree & tree);

}  // namespace specrpc
