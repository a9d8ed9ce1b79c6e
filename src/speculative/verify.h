// Verifiers: which drafted tokens does the target accept, and which token does it emit next
// (docs/design.md §2.3). Pure functions of (draft tree, target distributions, rng): no llama.cpp,
// no allocation beyond scratch copies of the distributions, no exceptions. Thread-compatible (no shared state).
//
// A draft is a tree; a chain is the special case where every node has at most one child.
// The target distributions p come either as a vector (one Dist per node, all computed up front)
// or lazily through a DistAt callback, which is asked only for the nodes the walk reaches — in
// that order, each node after its parent — so a sampler whose state (penalties, grammar) must
// advance along accepted tokens only can compute p[u] after accepting the path root → u.
//
// Beside these: block verification of sampled chains (verify_block.h), coupled drafter-invariant
// verification (verify_coupled.h), and the choice between them per round (verify_select.h).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "common/status.h"
#include "speculative/dist.h"

namespace specrpc {

struct DraftNode {
    token_id token  = -1;  // drafted token (unused at the root)
    int32_t  parent = -1;  // index of the parent node, < own index; -1 at the root
    Dist     q;            // the exact distribution `token` was sampled from (given the earlier
                           // siblings, if the drafter samples siblings without replacement);
                           // empty => deterministic proposal (argmax, n-gram, lookup: one-hot)
};

struct DraftTree {
    std::vector<DraftNode> nodes;  // nodes[0] = root = the last accepted token (token/q unused);
                                   // parents precede children; a node's children are tried in
                                   // index order
};

struct VerifyResult {
    std::vector<int32_t> accepted_nodes;  // accepted path (node indices), root excluded, in order
    token_id             next = -1;       // correction (first rejection) or bonus (full accept)
                                          // token, sampled from the target
};

// p for node u: the target's transformed distribution of the token after node u. Returns nullptr
// if it cannot be computed (the verifier then fails with INTERNAL). The pointee must stay valid
// until the next call. An empty p means no token may follow u (a grammar completed or dead-ended
// there): the walk ends at u with next = -1, as plain decoding would end there.
using DistAt = std::function<const Dist *(int32_t node)>;

// A tree holding only the root (= `last_token`).
DraftTree draft_tree_init(token_id last_token);

// Appends a node under `parent` and returns its index. q empty = deterministic proposal.
int32_t draft_tree_add(DraftTree & tree, int32_t parent, token_id token, Dist q = {});

// A chain root → tokens[0] → tokens[1] → ...; qs empty = all deterministic, else one q per token.
DraftTree draft_tree_chain(token_id last_token, const std::vector<token_id> & tokens,
                           std::vector<Dist> qs = {});

// Number of drafted tokens (nodes minus the root).
int32_t draft_tree_size(const DraftTree & tree);

// Depth of the deepest node (0 for a root-only tree; the length for a chain).
int32_t draft_tree_depth(const DraftTree & tree);

// Ok iff the tree is well formed: a root, every parent in [0, own index). O(nodes).
Status draft_tree_check(const DraftTree & tree);

// The tokens the round emits: the accepted tokens in order, then `next`.
std::vector<token_id> verify_emitted(const DraftTree & tree, const VerifyResult & res);

// Temperature 0: walks down while some child's token equals argmax p[u] (= p[u].front(), the
// Dist order puts the argmax first, ties to the lower id), then emits argmax p at the node where
// no child matched (the bonus after a full accept). Token-identical to plain greedy decoding.
// p must hold one Dist per node (empty: nothing may follow, see DistAt).
Result<VerifyResult> verify_greedy(const DraftTree & tree, const std::vector<Dist> & p);
Result<VerifyResult> verify_greedy(const DraftTree & tree, const DistAt & p);

// Temperature > 0: recursive rejection sampling over the tree (SpecInfer / SpecTr). The emitted
// tokens are distributed exactly as plain sampling from the target would emit them, whatever the
// draft, provided each sampled node's q is the distribution its token was actually drawn from
// and deterministic tokens do not depend on `rng`. Uses fresh uniforms from `rng` for every
// accept test and every resample. The maths is in verify.cpp.
Result<VerifyResult> verify_stochastic(const DraftTree & tree, const std::vector<Dist> & p,
                                       std::mt19937_64 & rng);
Result<VerifyResult> verify_stochastic(const DraftTree & tree, const DistAt & p,
                                       std::mt19937_64 & rng);

// One token of plain decoding coupled with a token x drawn from q (a sampled probe compared with
// plain decoding in shadow, engine/step.cpp): the one-stage rejection step of verify_stochastic
// on the chain [x], without its bonus. The token has law p exactly whatever q, provided x was
// drawn from q independently of `rng`; it equals x exactly when the rejection verifier would
// accept x here (probability Σ_y min(p(y), q(y))), so a run of such positions has the law of the
// token-wise verification of the whole chain. q empty: x is deterministic (acceptance p(x)).
// Returns -1 when p is empty (nothing may follow).
Result<token_id> sample_coupled(const Dist & p, token_id x, const Dist & q, std::mt19937_64 & rng);

// One draw from d (weights need not sum exactly to 1; they are scaled by their sum).
// Returns -1 if d is empty.
token_id sample_from(const Dist & d, std::mt19937_64 & rng);

}  // namespace specrpc
