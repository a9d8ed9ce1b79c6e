#include "speculative/verify_coupled.h"

#include <string>

#include "speculative/coupled_noise.h"

namespace specrpc {

Result<VerifyResult> verify_coupled(const DraftTree & tree, const DistAt & p, uint64_t seed, uint64_t pos0) {
    if (Status s = draft_tree_check(tree); !s) return s;
    VerifyResult res;
    int32_t      u = 0;
    for (uint64_t depth = 0;; ++depth) {
        const Dist * pu = p(u);
        if (pu == nullptr)
            return Status(ErrorCode::INTERNAL, "verify: no target distribution for draft node " + std::to_string(u));
        if (pu->empty()) return res;  // nothing may follow u (a grammar ended): next = -1, see DistAt
        const token_id y   = coupled_argmax(*pu, seed, pos0 + depth);
        int32_t        hit = -1;
        for (size_t c = size_t(u) + 1; c < tree.nodes.size(); ++c)  // children follow their parent
            if (tree.nodes[c].parent == u && tree.nodes[c].token == y) {
                hit = int32_t(c);
                break;
            }
        if (hit < 0) {
            res.next = y;  // the draw itself: a correction, or the bonus after a full accept
            return res;
        }
        res.accepted_nodes.push_back(hit);
        u = hit;
    }
}

Result<VerifyResult> verify_coupled(const DraftTree & tree, const std::vector<Dist> & p, uint64_t seed,
                                    uint64_t pos0) {
    if (p.size() != tree.nodes.size())
        return Status(ErrorCode::INTERNAL, "verify: " + std::to_string(p.size()) + " target distributions for " +
                                               std::to_string(tree.nodes.size()) + " draft nodes");
    return verify_coupled(
        tree, DistAt([&p](int32_t n) -> const Dist * { return size_t(n) < p.size() ? &p[size_t(n)] : nullptr; }),
        seed, pos0);
}

}  // namespace specrpc
