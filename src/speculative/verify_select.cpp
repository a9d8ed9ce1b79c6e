#include "speculative/verify_select.h"

#include "speculative/verify_block.h"
#include "speculative/verify_coupled.h"

namespace specrpc {

Result<VerifyResult> verify_run(VerifierKind kind, const DraftTree & tree, const DistAt & p, std::mt19937_64 & rng,
                                uint64_t seed, uint64_t pos0) {
    switch (kind) {
        case VerifierKind::GREEDY:    return verify_greedy(tree, p);
        case VerifierKind::COUPLED:   return verify_coupled(tree, p, seed, pos0);
        case VerifierKind::BLOCK:     return verify_block(tree, p, rng);
        case VerifierKind::TOKENWISE: break;
    }
    return verify_stochastic(tree, p, rng);
}

}  // namespace specrpc
