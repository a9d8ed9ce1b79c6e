// The verifiers a round can run, and the one call the engine's round makes. Which one a request
// uses is decided from its public options above this layer (engine/verifier_choice.h), so the
// speculative core knows nothing of the API's option structs.
#pragma once

#include <cstdint>
#include <random>

#include "speculative/verify.h"

namespace specrpc {

enum class VerifierKind { GREEDY, TOKENWISE, BLOCK, COUPLED };

// Runs `kind`. seed is the request's resolved seed and pos0 the output position of the token after
// the root (both used by COUPLED only); rng feeds TOKENWISE and BLOCK.
Result<VerifyResult> verify_run(VerifierKind kind, const DraftTree & tree, const DistAt & p, std::mt19937_64 & rng,
                                uint64_t seed, uint64_t pos0);

}  // namespace specrpc
