#include "speculative/verify_select.h"

#include "speculative/verify_block.h"
#include "speculative/verify_coupled.h"

namespace specrpc {

bool verify_coupled_sampling(const SamplingParams & sampling, const SpecParams & spec) {
    if (sampling.temperature <= 0.0f || sampling.mirostat != 0) return false;
    return spec.verifier == SpecVerifier::COUPLED ||
           (spec.verifier == SpecVerifier::AUTO && sampling.seed != 0xFFFFFFFFu);
}

VerifierKind verify_choose(const SamplingParams & sampling, const SpecParams & spec, const DraftTree & tree) {
    if (sampling.temperature <= 0.0f) return VerifierKind::GREEDY;
    if (verify_coupled_sampling(sampling, spec)) return VerifierKind::COUPLED;
    if (spec.verifier != SpecVerifier::TOKENWISE && verify_block_applies(tree)) return VerifierKind::BLOCK;
    return VerifierKind::TOKENWISE;
}

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
