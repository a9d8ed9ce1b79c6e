#include "engine/verifier_choice.h"

#include "speculative/verify_block.h"

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

}  // namespace specrpc
