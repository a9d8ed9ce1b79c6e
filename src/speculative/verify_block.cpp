// Block verification of a sampled draft chain (see verify_block.h).
//
// Notation. The chain is X_1 … X_γ; X_i was drawn from q_i = q(· | c, X_<i) (node i's q), and
// p_i = p(· | c, X_≤i) is the target's distribution after node i (p_0 after the root). Token-wise
// rejection accepts X_i with probability min(1, p_{i−1}(X_i) / q_i(X_i)) independently per token
// and stops at the first rejection. Block verification instead carries the running ratio
//     π_0 = 1,   π_i = min(1, π_{i−1} · p_{i−1}(X_i) / q_i(X_i)),
// (the largest probability with which the prefix X_≤i can be kept, given how it was drawn) and
// the unnormalised residual after the prefix
//     w_i = Σ_x max(0, π_i · p_i(x) − q_{i+1}(x))          (i < γ),
// and keeps the prefix X_≤i with weight
//     h_i = w_i / (w_i + 1 − π_i)   (i < γ; 0/0 := 1),     h_γ = π_γ.
// With independent uniforms η_i, the accepted length is τ = max{i ≥ 1 : η_i ≤ h_i} (0 if none):
// unlike token-wise verification, a later position whose ratio recovers (π_i back up to 1, or a
// large h_i) keeps the whole prefix even if an earlier token alone would have been rejected. The
// emitted token after X_≤τ is
//     Y ~ p_γ                                        if τ = γ,
//     Y ~ max(0, π_τ · p_τ − q_{τ+1}) / w_τ           otherwise.
// Given the chain, P(τ = i | X) = h_i · Π_{j>i} (1 − h_j), so only the η of positions ≥ τ matter
// and the walk below draws them from γ down, stopping at the first success.
//
// Why the output has the target's law is the paper's theorem (block verification is a valid
// verification scheme, and optimal in the expected accepted length among those that see only the
// chain's p and q); tests/block_verify_test.cpp checks the law exactly on small vocabularies (every
// chain and every outcome of τ enumerated, with the tokens after the block completed from p) and
// with chi-square tests on sampled rounds. With γ = 1 it is token-wise rejection (h_1 = π_1).
//
// Degenerate residual. If τ < γ is chosen with w_τ ≤ 1e-12 (possible only by rounding: in exact
// arithmetic h_τ > 0 needs w_τ > 0), Y is drawn from p_τ instead, which moves the output law by
// at most that mass (as in verify.cpp).
#include "speculative/verify_block.h"

#include <algorithm>
#include <string>
#include <utility>

namespace specrpc {

namespace {

constexpr double k_residual_eps = 1e-12;

using ById = std::vector<std::pair<token_id, double>>;  // sorted by id, normalised

ById by_id(const Dist & d) {
    ById   out;
    double sum = 0.0;
    out.reserve(d.size());
    for (const auto & tp : d)
        if (tp.p > 0.0f) {
            out.emplace_back(tp.id, double(tp.p));
            sum += double(tp.p);
        }
    for (auto & e : out) e.second /= sum;
    std::sort(out.begin(), out.end());
    return out;
}

double prob(const ById & d, token_id x) {
    auto it = std::lower_bound(d.begin(), d.end(), std::make_pair(x, -1.0));
    return (it != d.end() && it->first == x) ? it->second : 0.0;
}

double draw_uniform(std::mt19937_64 & rng) { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); }

// One draw from unnormalised weights (w > 0) with a fresh uniform.
token_id draw(const ById & w, double total, std::mt19937_64 & rng) {
    const double target = draw_uniform(rng) * total;
    double       cum    = 0.0;
    for (const auto & [id, x] : w) {
        cum += x;
        if (target < cum) return id;
    }
    return w.back().first;
}

// max(0, π·p − q) over p's support (outside it the term is ≤ 0), and its total w.
ById residual(const ById & p, const ById & q, double pi, double * total) {
    ById r;
    *total = 0.0;
    for (const auto & [id, px] : p) {
        const double d = pi * px - prob(q, id);
        if (d > 0.0) {
            r.emplace_back(id, d);
            *total += d;
        }
    }
    return r;
}

Result<VerifyResult> block_walk(const DraftTree & tree, const DistAt & p_at, std::mt19937_64 & rng, bool wrong) {
    if (Status s = draft_tree_check(tree); !s) return s;
    if (!verify_block_applies(tree)) return verify_stochastic(tree, p_at, rng);
    const size_t gamma = tree.nodes.size() - 1;
    std::vector<ById> p(gamma + 1), q(gamma + 1);
    for (size_t i = 0; i <= gamma; ++i) {
        const Dist * pi = p_at(int32_t(i));
        if (pi == nullptr)
            return Status(ErrorCode::INTERNAL, "verify: no target distribution for draft node " + std::to_string(i));
        if (pi->empty()) return verify_stochastic(tree, p_at, rng);  // nothing may follow X_i: see the header
        p[i] = by_id(*pi);
        if (i >= 1) q[i] = by_id(tree.nodes[i].q);
    }
    // π_i and h_i, i = 1..γ
    std::vector<double> pi(gamma + 1, 1.0), h(gamma + 1, 1.0);
    for (size_t i = 1; i <= gamma; ++i) {
        const token_id x  = tree.nodes[i].token;
        const double   qx = prob(q[i], x);
        if (qx <= 0.0)
            return Status(ErrorCode::INTERNAL, "verify: draft node " + std::to_string(i) + " token " +
                                                   std::to_string(x) + " has q = 0 (not sampled from q)");
        pi[i] = std::min(1.0, pi[i - 1] * prob(p[i - 1], x) / qx);
        if (i == gamma || wrong) {
            h[i] = pi[i];
        } else {
            double w = 0.0;
            residual(p[i], q[i + 1], pi[i], &w);
            const double den = w + 1.0 - pi[i];
            h[i] = den > 0.0 ? w / den : 1.0;
        }
    }
    size_t tau = 0;
    for (size_t i = gamma; i >= 1; --i)
        if (draw_uniform(rng) <= h[i]) {
            tau = i;
            break;
        }
    VerifyResult res;
    for (size_t i = 1; i <= tau; ++i) res.accepted_nodes.push_back(int32_t(i));
    if (tau == gamma) {
        res.next = draw(p[gamma], 1.0, rng);
        return res;
    }
    double     w = 0.0;
    const ById r = residual(p[tau], q[tau + 1], pi[tau], &w);
    res.next     = w > k_residual_eps ? draw(r, w, rng) : draw(p[tau], 1.0, rng);
    return res;
}

DistAt dist_at(const std::vector<Dist> & p) {
    return [&p](int32_t n) -> const Dist * { return (n >= 0 && size_t(n) < p.size()) ? &p[size_t(n)] : nullptr; };
}

}  // namespace

bool verify_block_applies(const DraftTree & tree) {
    if (tree.nodes.size() < 2) return false;
    for (size_t i = 1; i < tree.nodes.size(); ++i)
        if (tree.nodes[i].parent != int32_t(i) - 1 || tree.nodes[i].q.empty()) return false;
    return true;
}

Result<VerifyResult> verify_block(const DraftTree & tree, const DistAt & p, std::mt19937_64 & rng) {
    return block_walk(tree, p, rng, false);
}

Result<VerifyResult> verify_block(const DraftTree & tree, const std::vector<Dist> & p, std::mt19937_64 & rng) {
    if (p.size() != tree.nodes.size())
        return Status(ErrorCode::INTERNAL, "verify: " + std::to_string(p.size()) + " target distributions for " +
                                               std::to_string(tree.nodes.size()) + " draft nodes");
    return block_walk(tree, dist_at(p), rng, false);
}

Result<VerifyResult> verify_block_wrong_for_test(const DraftTree & tree, const std::vector<Dist> & p,
                                                 std::mt19937_64 & rng) {
    return block_walk(tree, dist_at(p), rng, true);
}

}  // namespace specrpc
