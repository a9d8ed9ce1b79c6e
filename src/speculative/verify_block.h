// Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding",
// ICLR 2025, arXiv 2403.10444): a sampled draft chain is verified jointly instead of token by
// token. Lossless like token-wise rejection sampling, and it accepts at least as many tokens in
// expectation (it is optimal among verifiers that see only the on-chain distributions). The maths
// is in verify_block.cpp. Pure function, no llama.cpp, no shared state.
#pragma once

#include <random>

#include "speculative/verify.h"

namespace specrpc {

// True iff block verification applies to `tree`: a chain (every node's parent is the node
// before it) of at least one drafted token, each with the q it was sampled from (non-empty).
bool verify_block_applies(const DraftTree & tree);

// Verifies a chain jointly. Asks p for every node 0..γ in order (block verification needs the
// target's distribution at every position, not only up to the first rejection). Draws at most
// γ + 1 uniforms from `rng`. A tree it does not apply to (see verify_block_applies), or a chain
// whose target distribution is empty after a drafted token, is handed to verify_stochastic.
Result<VerifyResult> verify_block(const DraftTree & tree, const DistAt & p, std::mt19937_64 & rng);
Result<VerifyResult> verify_block(const DraftTree & tree, const std::vector<Dist> & p, std::mt19937_64 & rng);

// Test only: the same walk with the weight h_i of every inner position replaced by π_i (the
// probability that token-wise verification would have accepted the prefix): a deliberately wrong
// variant, biased, which the statistical tests must catch.
Result<VerifyResult> verify_block_wrong_for_test(const DraftTree & tree, const std::vector<Dist> & p,
                                                 std::mt19937_64 & rng);

}  // namespace specrpc
