// Verifiers (see verify.h). The maths of the stochastic verifier, which the tests check with a
// chi-square goodness-of-fit test (tests/verify_test.cpp):
//
// One stage. Let r be the distribution we must sample from (the "current residual"), and let x
// be a proposal drawn from q independently of a fresh uniform U ~ U[0,1). Accept x if
// U < min(1, r(x)/q(x)); otherwise output a draw from
//     r' = max(0, r − q) / β,   β = Σ_y max(0, r(y) − q(y)),
// taken over the union of both supports (y with q(y) = 0 keep their full r(y); y with r(y) = 0
// contribute nothing). The output Z then has law r exactly:
//     P(Z = y, accepted) = q(y) · min(1, r(y)/q(y)) = min(q(y), r(y))
//     P(rejected)        = 1 − Σ_y min(q(y), r(y)) = Σ_y (r(y) − min(q(y), r(y))) = β
//     P(Z = y)           = min(q(y), r(y)) + β · r'(y) = min(q(y), r(y)) + max(0, r(y) − q(y))
//                        = r(y).
// The lemma only needs the rejected branch to be *some* exact sampler of r'.
//
// Deterministic proposals (q empty) are the case q = δ_x for a fixed x: the accept probability
// is min(1, r(x)/1) = r(x), and max(0, r − δ_x) is r with x zeroed (r(x) ≤ 1), β = 1 − r(x):
// "r with x removed, renormalised". The lemma holds for any x that does not depend on U — this
// is "sample from r and compare with x". (So dropping the q of a sampled token and treating it
// as deterministic is still exact, only with a lower acceptance Σ q·p instead of Σ min(q, p);
// the converse — a deterministic token verified against a q it was not drawn from — is biased.)
//
// Siblings. At node u the children c1, c2, ... are tried in order, starting from r = p[u]. If
// c1 is rejected, the remaining list must be an exact sampler of r'. By induction on the number
// of remaining children it is: the next child's token is drawn from its q (i.i.d. siblings: the
// same q; without replacement: q conditioned on the earlier siblings, which is what the drafter
// must store), independently of the uniforms used so far, so the lemma applies to it with r';
// when no child is left we sample r directly with a fresh uniform.
//
// Depth. Given that child c (token y) is accepted, the emitted token is y and the walk restarts
// at c from p[c], the target's distribution given the prefix + y; c's subtree was drafted from
// y without looking at the verifier's uniforms. So by induction on depth the emitted sequence
// (accepted path, then `next`) has the target's joint law; at a leaf reached by acceptance the
// bonus is a plain draw from p[leaf]. Rounds compose: a round that stops after k+1 tokens leaves
// the next round to continue from the same conditional.
//
// Degenerate residual. β is exactly the rejection probability. If β ≤ 1e-12 (exactly 0 iff
// r = q, i.e. rejection is impossible in exact arithmetic) the rejection branch is reached with
// probability ≤ 1e-12 and whatever we sample there moves the output law by at most β in total
// variation. We then keep r unchanged instead of renormalising rounding noise (β → 0 divided by
// β): that keeps every emitted token inside the target's support (never a token the truncation
// removed) and leaves later siblings a well-defined residual: at the first sibling r = p, at
// later ones r is the correct law to fall back to.
#include "speculative/verify.h"

#include <algorithm>
#include <string>
#include <utility>

namespace specrpc {

namespace {

constexpr double k_residual_eps = 1e-12;  // β at or below this counts as "rejection impossible"

double draw_uniform(std::mt19937_64 & rng) {
    return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

// The current residual as unnormalised weights: r(y) = w_y / total.
struct Residual {
    std::vector<std::pair<token_id, double>> w;  // weights > 0, unique ids
    double                                   total = 0.0;
};

Residual residual_from(const Dist & d) {
    Residual r;
    r.w.reserve(d.size());
    for (const auto & tp : d) {
        if (tp.p <= 0.0f) continue;
        r.w.emplace_back(tp.id, double(tp.p));
        r.total += double(tp.p);
    }
    return r;
}

// r(x), normalised. O(|r|).
double residual_prob(const Residual & r, token_id x) {
    for (const auto & [id, w] : r.w)
        if (id == x) return w / r.total;
    return 0.0;
}

// One draw from r with a fresh uniform: the smallest prefix whose weight exceeds U·total.
token_id residual_sample(const Residual & r, std::mt19937_64 & rng) {
    const double target = draw_uniform(rng) * r.total;
    double       cum    = 0.0;
    for (const auto & [id, w] : r.w) {
        cum += w;
        if (target < cum) return id;
    }
    return r.w.back().first;  // U·total rounded up to the total
}

// r := r with x removed, renormalised (the rejection of a deterministic proposal x);
// β = 1 − r(x) ≤ ε keeps r (see the file comment).
void residual_remove(Residual & r, token_id x) {
    for (size_t i = 0; i < r.w.size(); ++i) {
        if (r.w[i].first != x) continue;
        const double rest = r.total - r.w[i].second;
        if (rest / r.total <= k_residual_eps) return;
        r.w.erase(r.w.begin() + std::ptrdiff_t(i));
        r.total = rest;
        return;
    }
}

// q normalised by its sum and sorted by id, for O(log |q|) look-ups.
std::vector<std::pair<token_id, double>> by_id_normalised(const Dist & q) {
    std::vector<std::pair<token_id, double>> out;
    out.reserve(q.size());
    double sum = 0.0;
    for (const auto & tp : q) {
        if (tp.p <= 0.0f) continue;
        out.emplace_back(tp.id, double(tp.p));
        sum += double(tp.p);
    }
    for (auto & e : out) e.second /= sum;
    std::sort(out.begin(), out.end());
    return out;
}

double lookup(const std::vector<std::pair<token_id, double>> & sorted, token_id x) {
    auto it = std::lower_bound(sorted.begin(), sorted.end(), std::make_pair(x, -1.0));
    return (it != sorted.end() && it->first == x) ? it->second : 0.0;
}

// r := max(0, r − q) / β over the union of supports (the rejection of a sampled proposal);
// y outside r's support have max(0, 0 − q(y)) = 0, so only r's entries need visiting.
// β ≤ ε keeps r (see the file comment).
void residual_subtract(Residual & r, const std::vector<std::pair<token_id, double>> & q) {
    std::vector<std::pair<token_id, double>> out;
    out.reserve(r.w.size());
    double beta = 0.0;
    for (const auto & [id, w] : r.w) {
        const double d = w / r.total - lookup(q, id);
        if (d > 0.0) {
            out.emplace_back(id, d);
            beta += d;
        }
    }
    if (beta <= k_residual_eps) return;
    r.w     = std::move(out);
    r.total = beta;
}

// Child links in index order: first_child[u], next_sibling[c]; -1 terminates.
struct Links {
    std::vector<int32_t> first_child;
    std::vector<int32_t> next_sibling;
};

Links build_links(const DraftTree & tree) {
    const size_t n = tree.nodes.size();
    Links        l{std::vector<int32_t>(n, -1), std::vector<int32_t>(n, -1)};
    for (size_t i = n; i-- > 1;) {  // descending, so each list ends up in ascending index order
        const int32_t par = tree.nodes[i].parent;
        l.next_sibling[i] = l.first_child[par];
        l.first_child[par] = int32_t(i);
    }
    return l;
}

Status bad_p(int32_t node) {
    return Status(ErrorCode::INTERNAL,
                  "verify: no target distribution for draft node " + std::to_string(node));
}

DistAt dist_at_vector(const std::vector<Dist> & p) {
    return [&p](int32_t node) -> const Dist * {
        return (node >= 0 && size_t(node) < p.size()) ? &p[size_t(node)] : nullptr;
    };
}

Status check_p_size(const DraftTree & tree, const std::vector<Dist> & p) {
    if (p.size() == tree.nodes.size()) return Status::ok();
    return Status(ErrorCode::INTERNAL, "verify: " + std::to_string(p.size()) +
                                           " target distributions for " +
                                           std::to_string(tree.nodes.size()) + " draft nodes");
}

}  // namespace

DraftTree draft_tree_init(token_id last_token) {
    DraftTree t;
    t.nodes.push_back(DraftNode{last_token, -1, {}});
    return t;
}

int32_t draft_tree_add(DraftTree & tree, int32_t parent, token_id token, Dist q) {
    tree.nodes.push_back(DraftNode{token, parent, std::move(q)});
    return int32_t(tree.nodes.size() - 1);
}

DraftTree draft_tree_chain(token_id last_token, const std::vector<token_id> & tokens,
                           std::vector<Dist> qs) {
    DraftTree t = draft_tree_init(last_token);
    for (size_t i = 0; i < tokens.size(); ++i)
        draft_tree_add(t, int32_t(i), tokens[i], i < qs.size() ? std::move(qs[i]) : Dist{});
    return t;
}

int32_t draft_tree_size(const DraftTree & tree) {
    return tree.nodes.empty() ? 0 : int32_t(tree.nodes.size() - 1);
}

int32_t draft_tree_depth(const DraftTree & tree) {
    std::vector<int32_t> depth(tree.nodes.size(), 0);
    int32_t              best = 0;
    for (size_t i = 1; i < tree.nodes.size(); ++i) {
        depth[i] = depth[size_t(tree.nodes[i].parent)] + 1;  // parents precede children
        best     = std::max(best, depth[i]);
    }
    return best;
}

Status draft_tree_check(const DraftTree & tree) {
    if (tree.nodes.empty()) return Status(ErrorCode::INTERNAL, "verify: draft tree has no root");
    for (size_t i = 1; i < tree.nodes.size(); ++i) {
        const int32_t par = tree.nodes[i].parent;
        if (par < 0 || size_t(par) >= i)
            return Status(ErrorCode::INTERNAL, "verify: draft node " + std::to_string(i) +
                                                   " has parent " + std::to_string(par));
    }
    return Status::ok();
}

std::vector<token_id> verify_emitted(const DraftTree & tree, const VerifyResult & res) {
    std::vector<token_id> out;
    out.reserve(res.accepted_nodes.size() + 1);
    for (int32_t n : res.accepted_nodes) out.push_back(tree.nodes[size_t(n)].token);
    out.push_back(res.next);
    return out;
}

Result<VerifyResult> verify_greedy(const DraftTree & tree, const DistAt & p) {
    if (Status s = draft_tree_check(tree); !s) return s;
    const Links  links = build_links(tree);
    VerifyResult res;
    int32_t      u = 0;
    for (;;) {
        const Dist * pu = p(u);
        if (pu == nullptr) return bad_p(u);
        if (pu->empty()) return res;  // nothing may follow u (a grammar ended): next = -1
        const token_id best = pu->front().id;  // argmax (Dist is sorted by p desc, ties by id)
        int32_t        hit  = -1;
        for (int32_t c = links.first_child[size_t(u)]; c != -1; c = links.next_sibling[size_t(c)]) {
            if (tree.nodes[size_t(c)].token == best) {
                hit = c;
                break;
            }
        }
        if (hit < 0) {
            res.next = best;  // correction, or bonus at a fully accepted leaf
            return res;
        }
        res.accepted_nodes.push_back(hit);
        u = hit;
    }
}

Result<VerifyResult> verify_greedy(const DraftTree & tree, const std::vector<Dist> & p) {
    if (Status s = check_p_size(tree, p); !s) return s;
    return verify_greedy(tree, dist_at_vector(p));
}

Result<VerifyResult> verify_stochastic(const DraftTree & tree, const DistAt & p,
                                       std::mt19937_64 & rng) {
    if (Status s = draft_tree_check(tree); !s) return s;
    const Links  links = build_links(tree);
    VerifyResult res;
    int32_t      u = 0;
    for (;;) {
        const Dist * pu = p(u);
        if (pu == nullptr) return bad_p(u);
        if (pu->empty()) return res;  // nothing may follow u (a grammar ended): next = -1
        Residual r = residual_from(*pu);  // r := p[u]
        if (r.w.empty() || r.total <= 0.0) return bad_p(u);

        int32_t accepted = -1;
        for (int32_t c = links.first_child[size_t(u)]; c != -1; c = links.next_sibling[size_t(c)]) {
            const DraftNode & node = tree.nodes[size_t(c)];
            const double      rx   = residual_prob(r, node.token);
            if (node.q.empty()) {
                // Deterministic x: accept with probability r(x); else r := r \ {x}, renormalised.
                if (draw_uniform(rng) < rx) {
                    accepted = c;
                    break;
                }
                residual_remove(r, node.token);
            } else {
                // x ~ q: accept with probability min(1, r(x)/q(x)); else r := norm(max(0, r − q)).
                const auto   q  = by_id_normalised(node.q);
                const double qx = lookup(q, node.token);
                if (qx <= 0.0)
                    return Status(ErrorCode::INTERNAL,
                                  "verify: draft node " + std::to_string(c) + " token " +
                                      std::to_string(node.token) + " has q = 0 (not sampled from q)");
                if (draw_uniform(rng) < std::min(1.0, rx / qx)) {
                    accepted = c;
                    break;
                }
                residual_subtract(r, q);
            }
        }
        if (accepted < 0) {
            res.next = residual_sample(r, rng);  // correction; or the bonus from p[leaf]
            return res;
        }
        res.accepted_nodes.push_back(accepted);
        u = accepted;
    }
}

Result<VerifyResult> verify_stochastic(const DraftTree & tree, const std::vector<Dist> & p,
                                       std::mt19937_64 & rng) {
    if (Status s = check_p_size(tree, p); !s) return s;
    return verify_stochastic(tree, dist_at_vector(p), rng);
}

Result<token_id> sample_coupled(const Dist & p, token_id x, const Dist & q, std::mt19937_64 & rng) {
    // the chain root → x, with "nothing may follow x": an accepted x ends the walk without a
    // bonus draw (next = -1), a rejected one is replaced by a draw from the residual
    const DraftTree chain = draft_tree_chain(-1, {x}, q.empty() ? std::vector<Dist>{} : std::vector<Dist>{q});
    const Dist      none;
    Result<VerifyResult> r = verify_stochastic(chain, [&](int32_t u) { return u == 0 ? &p : &none; }, rng);
    if (!r) return r.status();
    return r.value().accepted_nodes.empty() ? r.value().next : x;
}

token_id sample_from(const Dist & d, std::mt19937_64 & rng) {
    double total = 0.0;
    for (const auto & tp : d) total += double(tp.p);
    if (d.empty() || total <= 0.0) return -1;
    const double target = draw_uniform(rng) * total;
    double       cum    = 0.0;
    for (const auto & tp : d) {
        cum += double(tp.p);
        if (target < cum) return tp.id;
    }
    for (auto it = d.rbegin(); it != d.rend(); ++it)  // U·total rounded up to the total
        if (it->p > 0.0f) return it->id;
    return d.back().id;
}

}  // namespace specrpc
