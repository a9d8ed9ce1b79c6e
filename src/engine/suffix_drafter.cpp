// The SUFFIX drafter in the engine's round (speculative/suffix_tree.h): the request's own trie, synced
// with its tokens before each proposal, and the store of recent responses every finished request
// feeds. Engine thread only, like the rest of a round.
#include <algorithm>

#include "engine/engine_impl.h"
#include "engine/test_hooks.h"
#include "speculative/prompt_lookup.h"

namespace specrpc {

namespace test_hooks {
std::atomic<bool> suffix_claims_q{false};
}  // namespace test_hooks

namespace {
// Prompt tokens stored before a response: the context its first tokens were drafted after.
constexpr size_t kPromptTail = 16;
}  // namespace

bool Engine::Impl::propose_suffix(Slot & s, int32_t node_cap) {
    if (s.gamma <= 0 || node_cap <= 0) return false;
    s.suffix.sync(s.req_id, s.all);
    SuffixDraftParams sp;
    sp.max_depth    = s.gamma;
    sp.max_nodes    = node_cap;
    sp.max_branches = std::max(1, std::min(s.req.spec.n_parallel, n_seq_per_slot));
    sp.alpha        = s.policy ? s.policy->alpha() : sp.alpha;
    // the match looked at before γ told the round's class: its profile, not the pooled α (a long
    // match copies on with the acceptance long matches have shown, deeper than the pooled α pays for)
    if (s.policy && s.proposal_cls > 0) sp.depth_alpha = s.policy->depth_acceptance(s.proposal_cls);
    CostModel cm = s.policy ? s.policy->cost_model() : slot_cost(s);
    if (!s.req.spec.adaptive) {
        // a fixed length was asked for: every continuation seen, as deep as allowed (min_prob and
        // the match length still bound it), not what the cost model would pay for
        sp.alpha = 1.0;
        cm       = CostModel{{0.0, 1.0, 1.0}, 0.0, 0.0};
    }
    SuffixProposal  p  = suffix_draft(&s.suffix.trie(), suffix_store.max_bytes() ? &suffix_store.trie() : nullptr,
                                      s.all, sp, cm);
    if (draft_tree_size(p.tree) == 0) return false;
    if (test_hooks::suffix_claims_q.load(std::memory_order_relaxed)) {
        // the bug the distribution test must catch: frequencies passed off as the distribution
        // the tokens were sampled from (they were not sampled at all)
        for (size_t i = 1; i < p.tree.nodes.size(); ++i) {
            Dist q;
            q.push_back({p.tree.nodes[i].token, 0.5f});
            q.push_back({(p.tree.nodes[i].token + 1) % info.n_vocab, 0.5f});
            p.tree.nodes[i].q = std::move(q);
        }
    }
    s.tree = std::move(p.tree);
    return true;
}

// The chain a shadow draft compares with plain decoding while the policy has speculation off. It
// must not depend on the low α that switched speculation off, or α could never recover: sized as if
// every continuation seen were accepted. Its match length gives the round's draft class, on the
// bounds prompt lookup's matches use (a continuation after a long match is a copy in progress,
// after one or two tokens a guess; draft_length.h).
std::vector<token_id> Engine::Impl::suffix_chain(Slot & s, int32_t n_max, int32_t * cls) {
    if (cls) *cls = 0;
    if (n_max <= 0) return {};
    s.suffix.sync(s.req_id, s.all);
    SuffixDraftParams sp;
    sp.max_depth    = n_max;
    sp.max_nodes    = n_max;
    sp.max_branches = 1;
    sp.alpha        = 1.0;
    const CostModel cm = s.policy ? s.policy->cost_model() : slot_cost(s);
    SuffixProposal  p  = suffix_draft(&s.suffix.trie(), suffix_store.max_bytes() ? &suffix_store.trie() : nullptr,
                                      s.all, sp, cm);
    std::vector<token_id> path = suffix_main_path(p.tree);
    if (cls && !path.empty()) *cls = lookup_draft_class(p.match_length);
    return path;
}

void Engine::Impl::suffix_record(const Slot & s) {
    if (suffix_store.max_bytes() == 0 || s.output.empty()) return;
    const size_t n_prompt = std::min<size_t>(static_cast<size_t>(std::max(0, s.n_prompt)), s.all.size());
    const size_t from     = n_prompt > kPromptTail ? n_prompt - kPromptTail : 0;
    suffix_store.add(std::vector<token_id>(s.all.begin() + static_cast<std::ptrdiff_t>(from), s.all.end()));
}

}  // namespace specrpc
