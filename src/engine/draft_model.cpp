// The draft-model drafter: chains and trees, all slots batched in one llama_decode per depth.
#include <algorithm>
#include <atomic>

#include "common/log.h"
#include "engine/engine_impl.h"
#include "engine/test_hooks.h"
#include "llama.h"
#include "speculative/coupled_noise.h"
#include "speculative/tree_layout.h"
#include "engine/verifier_choice.h"

namespace specrpc {

namespace test_hooks {
std::atomic<DraftBug> draft_bug{DraftBug::NONE};
std::atomic<float>    draft_temperature{0.0f};
}  // namespace test_hooks

// Brings the draft KV of slot `s` (main sequence) up to cache + pending, leaving the logits of
// `pending` at batch index 0 of the last decode. Returns the number of tokens decoded: 1–2 after
// a speculative round (pending, and the last draft token after a full accept), more after plain
// rounds or a new prompt. On decode failure the draft cache is cleared (no logits).
int32_t Engine::Impl::draft_sync(Slot & s) {
    auto * mem = llama_get_memory(dft_ctx);
    std::vector<token_id> want = s.cache;
    want.push_back(s.pending);
    size_t n = 0;
    while (n < s.dft_cache.size() && n < want.size() && s.dft_cache[n] == want[n]) ++n;
    if (n == want.size()) --n;  // always re-decode pending to get its logits
    llama_memory_seq_rm(mem, s.seq, static_cast<llama_pos>(n), -1);
    for (int32_t b = 1; b < n_seq_per_slot; ++b) llama_memory_seq_rm(mem, s.seq + b, -1, -1);
    s.dft_cache.resize(n);
    const int32_t n_decode = static_cast<int32_t>(want.size() - n);
    llama_batch batch = llama_batch_init(params.n_batch, 0, 1);
    while (s.dft_cache.size() < want.size()) {
        batch.n_tokens = 0;
        while (s.dft_cache.size() < want.size() && batch.n_tokens < params.n_batch) {
            int32_t k = batch.n_tokens++;
            size_t  i = s.dft_cache.size();
            batch.token[k] = want[i]; batch.pos[k] = static_cast<llama_pos>(i);
            batch.n_seq_id[k] = 1; batch.seq_id[k][0] = s.seq; batch.logits[k] = 0;
            s.dft_cache.push_back(want[i]);
        }
        batch.logits[batch.n_tokens - 1] = 1;
        if (!decode_or_error(dft_ctx, batch, "draft sync")) { s.dft_cache.clear(); break; }
    }
    llama_batch_free(batch);
    return n_decode;
}

namespace {
struct Branch {
    Slot *  slot;
    int32_t seq_off;   // branch index b: sequence slot.seq + b in the draft context
    int32_t node;      // last node of this branch in slot.tree
    int32_t logit_idx; // where its logits are in the last decode (-1: take from sync)
    bool    alive;
    double  path_p = 1.0;  // learned confidence stop: the chance its path so far is accepted
};
}  // namespace

double Engine::Impl::draft_with_model(std::vector<Slot *> & need) {
    // Sync each slot's draft KV; the logits of `pending` are then the last output of its sync.
    std::vector<Branch> br;
    std::vector<std::vector<float>> root_logits;
    double catch_up_ms = 0;
    for (Slot * s : need) {
        const auto t0 = Clock::now();
        const int32_t n_sync = draft_sync(*s);
        s->catch_up_ms = n_sync > 2 ? ms_since(t0) : 0.0;
        if (n_sync > 2) SPR_LOG_DEBUG("slot %d: draft caught up on %d tokens in %.2f ms", s->id, n_sync, s->catch_up_ms);
        catch_up_ms += s->catch_up_ms;
        if (s->dft_cache.empty() || !s->dft_sampler) continue;
        const float * l = llama_get_logits_ith(dft_ctx, -1);
        root_logits.emplace_back(l, l + draft->n_vocab());
        br.push_back({s, 0, 0, -static_cast<int32_t>(root_logits.size()), true});
    }
    auto * mem = llama_get_memory(dft_ctx);
    const int32_t n_vocab = draft->n_vocab();
    llama_batch batch = llama_batch_init(static_cast<int32_t>(need.size()) * n_seq_per_slot + 1, 0, 1);

    for (int32_t depth = 0;; ++depth) {
        std::vector<Branch> grown;
        batch.n_tokens = 0;
        for (Branch & b : br) {
            if (!b.alive) continue;
            Slot & s = *b.slot;
            const SpecParams & sp = s.req.spec;
            if (depth >= s.gamma) { b.alive = false; continue; }
            const float * logits = b.logit_idx < 0 ? root_logits[-b.logit_idx - 1].data()
                                                   : llama_get_logits_ith(dft_ctx, b.logit_idx);
            // q: the draft's transformed distribution along this branch's path
            const std::vector<token_id> path = tree_path(s.tree, b.node);
            Dist q = s.dft_sampler->dist(logits, path);
            if (q.empty()) { b.alive = false; continue; }
            const bool deterministic = s.dft_sampler->greedy() || sp.sample_and_compare;
            const bool may_branch = sp.n_parallel > 1 && tree_n_branches(s.tree) < std::min(sp.n_parallel, n_seq_per_slot);
            // confidence (p_min) and branching (p_split) look at the draft's probabilities before
            // truncation at T = 0 (q is one-hot there), else at q itself; a chain without p_min
            // needs neither (a full softmax and sort per drafted token saved)
            Dist conf;
            if (sp.p_min > 0 || may_branch) conf = deterministic ? s.dft_sampler->candidates(logits, path) : q;
            // p_min stops the branch when the draft's top probability is below p_min, decided
            // BEFORE a sampled token is drawn, and (sampled drafts) never below n_min tokens.
            // Why this is lossless: rejection sampling is exact iff each sampled token x has the
            // law of the q stored with it, given everything before it. Whether node d+1 exists may
            // depend on the path x_1..x_d (the verifier emits p at a node with or without a
            // child), but not on x_{d+1} itself. The old rule, drop x when q(x) < p_min, drew x
            // from q' = q·1{q >= p_min} / Z while the node claimed q; the verifier then emits y with
            // probability min(q'(y), p(y) q'(y)/q(y)) + residual, not p(y) (measured: the top
            // token at 0.89 where p is 0.66). Likewise step.cpp discards a draft shorter than
            // n_min: if a sampled draft's length depended on its tokens, the verified drafts would
            // be those whose x_1..x_k led to confident continuations, i.e. x_1 drawn from q
            // conditioned on that event. So p_min does not cut a sampled draft below n_min, and
            // step.cpp verifies a sampled draft that ends short for another reason (the grammar
            // allows nothing after it) instead of discarding it. Deterministic drafts (argmax)
            // depend on no random draw: any stop or discard rule keeps them exact.
            const DraftBug bug = test_hooks::draft_bug.load(std::memory_order_relaxed);
            const float    top = deterministic ? dist_prob(conf, q.front().id) : q.front().p;
            const bool     rule_ok = deterministic || (bug != DraftBug::PMIN_FILTERS_SAMPLE &&
                                     (depth >= sp.n_min || bug == DraftBug::NMIN_DISCARDS_SAMPLED));
            if (sp.p_min > 0 && rule_ok && top < sp.p_min) {
                b.alive = false;
                continue;
            }
            // The learned confidence stop (p_min < 0, left so only for deterministic drafts; chains):
            // draft on while the next token earns its verification (DraftLengthPolicy::stop_below:
            // the chance its path is accepted against the round's cost per token and speed-up)
            if (sp.p_min < 0 && deterministic && sp.n_parallel <= 1 && s.policy) {
                const float  sure = conf.empty() ? s.dft_sampler->candidate_prob(logits, path, q.front().id) : top;
                const int    bin  = bug == DraftBug::STOP_IGNORES_CONFIDENCE ? 0 : DraftLengthPolicy::confidence_bin(sure);
                const double p   = b.path_p * s.policy->confidence_acceptance(bin);
                if (p < s.policy->stop_below()) {
                    b.alive    = false;
                    s.stop_cut = true;
                    continue;
                }
                b.path_p = p;
                s.draft_bins.push_back(static_cast<int8_t>(bin));
                s.draft_path_p.push_back(p);
            }
            token_id x;
            Dist     qx;
            if (deterministic) {
                x = q.front().id;  // the argmax the grammar/penalties allow
            } else {
                // coupled: the target's own keyed draw at this output position, made on q
                x  = verify_coupled_sampling(s.req.sampling, sp)
                         ? coupled_argmax(q, s.sampler->params().seed, s.output.size() + depth)
                         : s.dft_sampler->sample(q);
                qx = q;  // keep exactly the q it was sampled from
                if (bug == DraftBug::PMIN_FILTERS_SAMPLE && sp.p_min > 0 && dist_prob(q, x) < sp.p_min) {
                    b.alive = false;  // the old rule: the sample decides, the node keeps q unfiltered
                    continue;
                }
            }
            s.tree.nodes.push_back({x, b.node, std::move(qx)});
            const int32_t child = static_cast<int32_t>(s.tree.nodes.size()) - 1;

            // Tree: a further candidate with draft p > p_split opens a new branch (deterministic
            // proposal, tried after the sampled child: see speculative/verify.h for why that is lossless).
            if (may_branch) {
                for (const auto & tp : conf) {
                    if (tp.id == x) continue;
                    if (tp.p <= sp.p_split) break;
                    int32_t nb = tree_n_branches(s.tree);  // new branch index = next free sequence
                    llama_memory_seq_cp(mem, s.seq + b.seq_off, s.seq + nb, -1, -1);
                    s.tree.nodes.push_back({tp.id, b.node, {}});
                    grown.push_back({&s, nb, static_cast<int32_t>(s.tree.nodes.size()) - 1, 0, true});
                    break;
                }
            }
            b.node = child;
        }
        for (auto & g : grown) br.push_back(g);
        // decode every live branch's newest node (only if it may draft further)
        for (Branch & b : br) {
            if (!b.alive) continue;
            Slot & s = *b.slot;
            if (depth + 1 >= s.gamma) { b.alive = false; continue; }
            const int32_t depth_pos = tree_node_depth(s.tree, b.node);
            int32_t k = batch.n_tokens++;
            batch.token[k] = s.tree.nodes[b.node].token;
            batch.pos[k]   = static_cast<llama_pos>(s.cache.size() + depth_pos);
            batch.n_seq_id[k] = 1; batch.seq_id[k][0] = s.seq + b.seq_off; batch.logits[k] = 1;
            b.logit_idx = k;
            if (b.seq_off == 0) s.dft_cache.push_back(s.tree.nodes[b.node].token);
        }
        if (batch.n_tokens == 0) break;
        if (!decode_or_error(dft_ctx, batch, "drafting")) {
            for (Branch & b : br) b.alive = false;
            break;
        }
        (void)n_vocab;
    }
    llama_batch_free(batch);
    return catch_up_ms;
}

}  // namespace specrpc
