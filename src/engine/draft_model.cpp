// The draft-model drafter (chains and trees, all slots batched in one llama_decode per depth) and
// the measurement of the cost curve v(n) and draft cost ratio c that the draft-length policy uses.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <tuple>

#include "common/log.h"
#include "engine/context.h"
#include "engine/engine_impl.h"
#include "engine/test_hooks.h"
#include "llama.h"

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
            std::vector<token_id> path;
            for (int32_t n = b.node; n > 0; n = s.tree.nodes[n].parent) path.push_back(s.tree.nodes[n].token);
            std::reverse(path.begin(), path.end());
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
            token_id x;
            Dist     qx;
            if (deterministic) {
                x = q.front().id;  // the argmax the grammar/penalties allow
            } else {
                x  = s.dft_sampler->sample(q);
                qx = q;  // keep exactly the q it was sampled from
                if (bug == DraftBug::PMIN_FILTERS_SAMPLE && sp.p_min > 0 && dist_prob(q, x) < sp.p_min) {
                    b.alive = false;  // the old rule: the sample decides, the node keeps q unfiltered
                    continue;
                }
            }
            s.tree.nodes.push_back({x, b.node, std::move(qx)});
            const int32_t child = static_cast<int32_t>(s.tree.nodes.size()) - 1;

            // Tree: a further candidate with draft p > p_split opens a new branch (deterministic
            // proposal, tried after the sampled child: see spec/verify.h for why that is lossless).
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
            int32_t depth_pos = 0;
            for (int32_t n = b.node; n > 0; n = s.tree.nodes[n].parent) ++depth_pos;
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

// A longer pass never costs less than a shorter one. Noise only ever adds time, so the lower
// envelope from above is the better estimate: v(n) = min over m >= n of v(m) (a stalled
// measurement of v(3) is capped by v(4), not propagated to every longer pass).
// Values below 1 (0 = not measured) are not measurements and cap nothing.
void cost_make_monotone(CostModel & cm) {
    double cap = 1e300;
    for (size_t n = cm.v.size(); n-- > 2;)
        if (cm.v[n] >= 1.0) cap = cm.v[n] = std::min(cm.v[n], cap);
    for (size_t n = 2; n < cm.v.size(); ++n) cm.v[n] = std::max({cm.v[n], cm.v[n - 1], 1.0});
}

// Online refinement: every steady target pass of a known size and every model draft step adds
// a sample of its time; once seen a few times, the recent medians replace the start-up
// measurement (real depths, real load). Times in ms.
//
// Each refined ratio stays within a band around the start-up measurement (v: 0.8–1.25x, c:
// 0.67–2x): the samples of different sizes are taken at different times (1-token passes while
// off, long ones while on), and on a machine whose speed changes 2x within minutes their ratio
// can be far off; unbounded, one such ratio (v(9) = 1.54 on x25M) capped the whole curve below
// it and switched a draft on that cannot pay.
static double within(double x, double ref, double lo, double hi) {
    return ref > 0 ? std::clamp(x, lo * ref, hi * ref) : x;
}

// c from the recent draft-token times and t(1), within its band (needs 3 draft observations).
static void refine_c(CostModel & cost, const CostModel & probe, const RecentMedian & obs_draft, double t1) {
    if (obs_draft.count() >= 3 && t1 > 0) cost.c = within(obs_draft.median() / t1, probe.c, 0.67, 2.0);
}

void Engine::Impl::observe_pass(int32_t n, double ms) {
    if (n < 1 || n >= static_cast<int32_t>(cost.v.size()) || !(ms > 0)) return;
    obs_pass.resize(cost.v.size());
    obs_pass[n].add(ms);
    if (obs_pass[1].count() < 8) return;
    t_target_1 = obs_pass[1].median();
    for (size_t k = 2; k < obs_pass.size(); ++k)
        if (obs_pass[k].count() >= 4 && k < cost_probe.v.size())
            cost.v[k] = std::max(1.0, within(obs_pass[k].median() / t_target_1, cost_probe.v[k], 0.8, 1.25));
    cost_make_monotone(cost);
    refine_c(cost, cost_probe, obs_draft, t_target_1);
}

void Engine::Impl::observe_draft(int32_t n_tokens, double ms) {
    if (n_tokens < 1 || !(ms > 0)) return;
    obs_draft.add(ms / n_tokens);
    // c is refined even when no plain pass refines t(1) (speculation always on)
    refine_c(cost, cost_probe, obs_draft, t_target_1);
}

// v(n) for n = 1..17 on the target, and c = (1-token draft pass) / (1-token target pass), measured
// once per (model, draft, threads, cache layout) in this process on a scratch sequence. Without a
// unified cache the only sequence is the starting slot's own: its cached prefix is given up.
void Engine::Impl::measure_costs(Slot & starting) {
    static std::mutex                                               cache_mutex;
    struct Measured { CostModel cost; double t1; int32_t draft_threads; };
    static std::map<std::tuple<std::string, std::string, int, bool>, Measured> cache;
    cost_measured = true;
    const auto key = std::make_tuple(params.target.path, params.draft.path, params.n_threads, kv_unified);
    {
        std::lock_guard<std::mutex> lock(cache_mutex);
        auto it = cache.find(key);
        if (it != cache.end()) {
            cost = cost_probe = it->second.cost; t_target_1 = it->second.t1;
            if (dft_ctx) llama_set_n_threads(dft_ctx, it->second.draft_threads, params.n_threads);
            std::lock_guard<std::mutex> l2(metrics_mutex);
            cost_snapshot = {cost.v, cost.c, cost.o, t_target_1};
            return;
        }
    }
    // Passes are timed at a representative depth: a prefix of `depth` tokens sits in the scratch
    // sequence (attention over it costs every pass the same, which flattens v(n) as in real use).
    const int32_t scratch = scratch_seq;
    if (scratch == starting.seq) {
        llama_memory_seq_rm(llama_get_memory(ctx), scratch, -1, -1);
        if (dft_ctx) llama_memory_seq_rm(llama_get_memory(dft_ctx), scratch, -1, -1);
        starting.cache.clear();
        starting.dft_cache.clear();
    }
    const int32_t depth   = std::min<int32_t>({128, n_ctx_slot / 4, params.n_batch});
    auto prefill = [&](llama_context * c) {
        if (!scratch_prefill(c, scratch, depth, info.n_vocab)) SPR_LOG_WARN("cost probe: prefill failed");
    };
    auto time_one = [&](llama_context * c, int32_t n, llama_batch & b) {
        return scratch_time_pass(c, b, scratch, depth, n, info.n_vocab);
    };
    auto time_pass = [&](llama_context * c, int32_t n) {
        llama_batch b = llama_batch_init(n, 0, 1);
        std::vector<double> ts;
        for (int rep = 0; rep < 7; ++rep) ts.push_back(time_one(c, n, b));
        llama_batch_free(b);
        return median_ms(std::move(ts));
    };
    prefill(ctx);
    if (dft_ctx) prefill(dft_ctx);
    // Sizes 1..17: a draft of up to 16 tokens is verified in a pass of up to 17.
    const int32_t n_max = std::min<int32_t>(17, params.n_batch);
    // Sizes are timed round-robin (1, 2, ..., n_max, 1, 2, ...), 7 rounds, median per size: a
    // burst of load from another process lands on several sizes once each instead of on all
    // repetitions of one size (which a median cannot undo). Within a round each size runs twice
    // and the second pass is timed: llama.cpp reuses the compute graph of a pass of the same
    // shape, as in steady decoding, while the first pass after a size change rebuilds it
    // (+0.5–0.8 ms on x100M, which read t(1) 20% slow and flattened v(n)).
    //
    // A 1-token pass reaches plain decoding's speed only after several in a row: after a 17-token
    // pass, 1-token passes #1..#6 took 1.47 1.15 1.06 1.03 1.01 0.99 ms on x25M (4.74 4.03 3.83
    // 3.83 3.83 3.82 on x100M): the longer pass evicts the weights from the caches. Timed at #2,
    // t(1) read 5–15% slower than plain decoding really runs, every v(n) came out too flat, and
    // speculation looked cheaper than it is (x25M switched on where it cannot pay). So t(1) is
    // the kSteadyPlainRun-th pass of a run, as in plain decoding.
    time_pass(ctx, 1);  // warm-up
    std::vector<std::vector<double>> ts(static_cast<size_t>(n_max) + 1);
    {
        llama_batch b = llama_batch_init(n_max, 0, 1);
        for (int rep = 0; rep < 7; ++rep)
            for (int32_t n = 1; n <= n_max; ++n) {
                for (int32_t k = 1; k < (n == 1 ? kSteadyPlainRun : 2); ++k) time_one(ctx, n, b);
                ts[n].push_back(time_one(ctx, n, b));
            }
        llama_batch_free(b);
    }
    const double t1 = median_ms(ts[1]);
    cost.v.assign(n_max + 1, 0.0);
    cost.v[1] = 1.0;
    for (int32_t n = 2; n <= n_max; ++n) cost.v[n] = std::max(1.0, median_ms(ts[n]) / t1);
    cost_make_monotone(cost);
    cost.c = 0;
    int32_t draft_threads = params.n_threads;
    if (dft_ctx) {
        // c is a drafted token's cost as a round pays it. A round drafts right after the target's
        // verification pass, which evicts the small draft's weights and KV from the caches: the
        // first draft pass then costs ~2x a hot one (stories260K after an x100M pass: 0.45 vs
        // 0.20 ms) and a chain of 15 ~1.2x per pass. Timed hot, c read 0.023 where rounds paid
        // 0.04 per token, and every prediction on x100M-near was ~10% too high. So each sample
        // is a chain of 8 draft passes (a typical draft) right after a 9-token target pass.
        auto time_draft_round = [&]() {
            llama_batch bt = llama_batch_init(9, 0, 1);
            llama_batch bd = llama_batch_init(1, 0, 1);
            std::vector<double> per;
            for (int rep = 0; rep < 5; ++rep) {
                time_one(ctx, 9, bt);
                per.push_back(scratch_time_chain(dft_ctx, bd, scratch, depth, 8, info.n_vocab));
            }
            llama_batch_free(bt);
            llama_batch_free(bd);
            return median_ms(std::move(per));
        };
        // A small draft model may run faster on one thread (no barrier between threads per op):
        // keep whichever thread count drafts faster.
        time_draft_round();
        const double t_all = time_draft_round();
        llama_set_n_threads(dft_ctx, 1, 1);
        time_draft_round();
        const double t_one = time_draft_round();
        draft_threads = t_all < t_one ? params.n_threads : 1;
        // batches (catching up after plain rounds, tree levels) keep every thread
        llama_set_n_threads(dft_ctx, draft_threads, params.n_threads);
        cost.c = std::min(t_all, t_one) / t1;
        SPR_LOG_INFO("draft model: %.3f ms per drafted token on %d thread(s) (8-token chains after a target pass)",
                     std::min(t_all, t_one), draft_threads);
    }
    cost.o = 0.02;
    t_target_1 = t1;
    llama_memory_seq_rm(llama_get_memory(ctx), scratch, -1, -1);
    if (dft_ctx) llama_memory_seq_rm(llama_get_memory(dft_ctx), scratch, -1, -1);
    pass_last_n = 0;
    std::string vs;
    for (int32_t n : {2, 3, 4, 6, 8, 16, 17})
        if (n <= n_max) vs += " v(" + std::to_string(n) + ")=" + std::to_string(cost.v[n]).substr(0, 4);
    SPR_LOG_INFO("cost curve at depth %d: t(1)=%.2f ms%s c=%.3f", depth, t1, vs.c_str(), cost.c);
    {
        std::lock_guard<std::mutex> l2(metrics_mutex);
        cost_snapshot = {cost.v, cost.c, cost.o, t_target_1};
    }
    std::lock_guard<std::mutex> lock(cache_mutex);
    cost_probe = cost;
    cache[key] = {cost, t1, draft_threads};
}

}  // namespace specrpc
