// The draft-model drafter (chains and trees, all slots batched in one llama_decode per depth) and
// the cost curve v(n) and draft cost ratio c that the draft-length policy uses: cached, probed
// briefly after the first token, refined online (spec/cost_estimator.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "common/log.h"
#include "engine/backend.h"
#include "engine/context.h"
#include "engine/cost_cache.h"
#include "engine/engine_impl.h"
#include "engine/test_hooks.h"
#include "llama.h"
#include "sampling/coupled_noise.h"
#include "spec/verify_select.h"

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

namespace {
// What a process measured, for the next engine of the same key in it (the disk cache may be off).
std::mutex                        g_cost_mutex;
std::map<std::string, CostRecord> g_cost_memo;
}  // namespace

void Engine::Impl::cost_publish() {
    cost.v     = cost_est.model().v;
    cost.c     = cost_est.model().c;
    t_target_1 = cost_est.t1();
    {
        std::lock_guard<std::mutex> lock(metrics_mutex);
        cost_snapshot = {cost.v, cost.c, cost.o, t_target_1};
    }
    // Saved after the probe and then at 32, 64, 128, ... observations: the next process starts
    // from what steady passes showed, not from the probe.
    if (cost_est.n_observed() < cost_next_save) return;
    cost_next_save = std::max<int64_t>(32, 2 * cost_est.n_observed());
    CostRecord rec{cost_est.model(), t_target_1, draft_threads};
    rec.cost.o = 0;
    const std::string key = cost_key_for(cost_threads);
    {
        std::lock_guard<std::mutex> lock(g_cost_mutex);
        g_cost_memo[key] = rec;
    }
    if (Status st = cost_cache_save(cost_cache_dir(), key, rec); !st)
        SPR_LOG_DEBUG("cost cache not written: %s", st.message().c_str());
}

void Engine::Impl::observe_pass(int32_t n, double ms, bool steady) {
    if (!cost_est.seeded()) return;
    cost_est.observe_pass(n, ms, steady);
    cost_publish();
}

void Engine::Impl::observe_draft(int32_t n_tokens, double ms) {
    if (n_tokens < 1 || !cost_est.seeded()) return;
    cost_est.observe_draft(ms / n_tokens);
    cost_publish();
}

static std::string cost_line(const CostModel & cm, double t1) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "t(1)=%.2f ms", t1);
    std::string vs = buf;
    for (size_t n : {2, 4, 8, 16})
        if (n < cm.v.size()) {
            std::snprintf(buf, sizeof buf, " v(%zu)=%.2f", n, cm.v[n]);
            vs += buf;
        }
    std::snprintf(buf, sizeof buf, " c=%.3f", cm.c);
    return vs + buf;
}

// The cost model on first speculative use, without timing anything: the one this process or an
// earlier one on this machine measured for the same key (model files, threads, cache layout,
// attention path, CPU, llama.cpp build), else a placeholder until the probe (cost_before_round).
void Engine::Impl::measure_costs(Slot &) {
    cost_measured = true;
    cost_key = "target " + file_identity(params.target.path) + "\ndraft " + file_identity(params.draft.path) +
               "\nthreads " + std::to_string(params.n_threads) + " unified " + std::to_string(kv_unified) +
               " flash_attn " + std::to_string(info.flash_attn) + "/" + std::to_string(info.draft_flash_attn) +
               " kv_f32 " + std::to_string(params.kv_f32) + "\ncpu " + cpu_identity() + "\nllama " +
               llama_lib_identity() + "\nprobe 2";  // 2: timed behind kProbeDepth cells
    if (cost_from_cache(params.n_threads)) return;
    cost           = CostModel{{0.0, 1.0}, 0.0, 0.02};  // v(n) = n until measured; the first round is held
    cost_probe_due = true;
}

// The key of a curve timed on nt threads: the engine's own key, or with the thread count it ran
// on beside a busy process (one), so that such a process does not time its costs every start.
std::string Engine::Impl::cost_key_for(int32_t nt) const {
    const size_t a = cost_key.find("\nthreads ");
    const size_t b = a == std::string::npos ? a : cost_key.find(' ', a + 9);
    if (b == std::string::npos || nt == params.n_threads) return cost_key;
    return cost_key.substr(0, a + 9) + std::to_string(nt) + "-of-" + cost_key.substr(a + 9);
}

bool Engine::Impl::cost_from_cache(int32_t nt) {
    const std::string key = cost_key_for(nt);
    std::optional<CostRecord> rec;
    {
        std::lock_guard<std::mutex> lock(g_cost_mutex);
        if (auto it = g_cost_memo.find(key); it != g_cost_memo.end()) rec = it->second;
    }
    const std::string dir = cost_cache_dir();
    if (!rec && (rec = cost_cache_load(dir, key))) {
        SPR_LOG_INFO("cost model from %s", cost_cache_path(dir, key).c_str());
        std::lock_guard<std::mutex> lock(g_cost_mutex);
        g_cost_memo[key] = *rec;
    }
    if (!rec || (dft_ctx && rec->draft_threads < 1)) return false;
    cost_est.seed(rec->cost, rec->t1_ms);
    cost_threads  = nt;
    draft_threads = rec->draft_threads;
    // on one thread (beside a busy process) the draft stays there; cpu_threads_apply sets it later
    if (dft_ctx && thread_choice.threads() == params.n_threads) llama_set_n_threads(dft_ctx, draft_threads, params.n_threads);
    cost.o         = 0.02;
    cost_next_save = 32;
    cost_publish();
    SPR_LOG_INFO("cost curve (cached, %d thread(s)): %s", nt, cost_line(cost, t_target_1).c_str());
    return true;
}

void Engine::Impl::cost_before_round(const std::vector<Slot *> & act) {
    // A curve of one thread count is replaced when the engine has settled on the other: from the
    // cache, else timed again.
    const int32_t nt = thread_choice.threads();
    if (cost_measured && (cost_probe_due || (cost_est.seeded() && cost_threads != nt)) && thread_choice.settled()) {
        if (cost_from_cache(nt)) cost_probe_due = false;
        else cost_probe_due = true;
    }
    // the probe times what the engine runs: it waits until the thread choice has settled
    if (cost_probe_due && thread_choice.settled())
        for (Slot * s : act)
            if (s->spec_on && s->policy && !s->output.empty()) {
                cost_probe_run(*s);
                if (!cost_probe_due) break;
            }
    if (!cost_probe_due && !cost_hold_first) return;
    // A slot without a token yet decodes its first round plain (until the probe has run, and in
    // the engine's first speculative round): a speculative first round delivers its first token
    // only after the draft's catch-up on the prompt, γ draft passes and a pass of γ + 1 tokens
    // (~+3 passes on x100M), and a fresh process is judged by that token.
    for (Slot * s : act)
        if (s->spec_on && s->policy && s->output.empty()) {
            s->policy->hold(1);
            cost_hold_first = false;
        }
}

// The bounded probe, run once per key on this machine (then cached): kProbeRounds rounds, each a
// run of kProbePlainRun 1-token passes (the last timed: a 1-token pass reaches plain decoding's
// speed only after a few in a row, once a longer pass has evicted the weights) and two passes of
// each size in kProbeSizes (the second timed: the first rebuilds llama.cpp's graph), with a
// drafted chain of 8 timed right after the 9- and the 17-token pass (a round drafts right after
// its verification, with the draft's weights evicted), once on all threads and once on one (a
// small draft may run faster without barriers between threads). The minimum of the rounds is
// kept (noise only adds time); other sizes are interpolated and refined online. The passes run
// behind a context of at least kProbeDepth cells (the slot's own, extended by scratch tokens that
// are removed again): right after a short prompt a pass attends over a few cells and v(n) reads
// steeper than in use (v(16) 7.1-7.6 at depth ~1 against 5.5-6.2 at 128 on x100M-near), and the
// policy drafted 6 where 13-15 pays. One prefill and 26 target passes whatever the model.
void Engine::Impl::cost_probe_run(Slot & s) {
    static constexpr int     kProbeRounds   = 2;
    static constexpr int     kProbePlainRun = 4;
    static constexpr int32_t kProbeSizes[]  = {2, 9, 17};
    static constexpr int32_t kChain         = 8;
    static constexpr int32_t kProbeDepth    = 128;
    const int32_t n_max  = std::min<int32_t>(17, params.n_batch);
    const int32_t depth0 = static_cast<int32_t>(s.cache.size());
    const int32_t room   = n_ctx_slot - n_max - kChain - 2;  // the deepest a probe pass may start
    if (depth0 > room) return;  // no room after this slot's context
    const int32_t depth = std::max(depth0, std::min(kProbeDepth, room));
    cost_probe_due = false;
    const auto    t_start = Clock::now();
    const int32_t nt      = thread_choice.threads();  // one beside a busy process (thread_choice.h)
    // the round drafts next anyway: catch the draft up now and time its chains at the same depth
    if (dft_ctx) draft_sync(s);
    const int32_t ddepth0 = static_cast<int32_t>(s.dft_cache.size());
    const int32_t ddepth  = std::max(ddepth0, std::min(depth, room));
    bool ok = scratch_extend(ctx, s.seq, depth0, depth, info.n_vocab, params.n_batch);
    const bool timed_draft = ok && dft_ctx && ddepth0 > 0 && ddepth + kChain + 2 <= n_ctx_slot &&
                             scratch_extend(dft_ctx, s.seq, ddepth0, ddepth, draft->n_vocab(), params.n_batch);
    std::vector<double> best(static_cast<size_t>(n_max) + 1, 1e30);
    double c_all = 1e30, c_one = 1e30;
    llama_batch bt = llama_batch_init(n_max, 0, 1);
    llama_batch bd = llama_batch_init(1, 0, 1);
    for (int rep = 0; ok && rep < kProbeRounds; ++rep) {
        double t = 1e30;
        for (int k = 0; k < kProbePlainRun; ++k) t = scratch_time_pass(ctx, bt, s.seq, depth, 1, info.n_vocab);
        best[1] = std::min(best[1], t);
        for (int32_t n : kProbeSizes) {
            n = std::min(n, n_max);
            scratch_time_pass(ctx, bt, s.seq, depth, n, info.n_vocab);
            best[n] = std::min(best[n], scratch_time_pass(ctx, bt, s.seq, depth, n, info.n_vocab));
            if (timed_draft && (n == 9 || n == n_max)) {
                const bool one = n == n_max && nt > 1;
                llama_set_n_threads(dft_ctx, one ? 1 : nt, nt);
                const double tc = scratch_time_chain(dft_ctx, bd, s.seq, ddepth, kChain, draft->n_vocab());
                (one ? c_one : c_all) = std::min(one ? c_one : c_all, tc);
            }
        }
    }
    llama_batch_free(bt);
    llama_batch_free(bd);
    llama_memory_seq_rm(llama_get_memory(ctx), s.seq, depth0, -1);
    if (dft_ctx) llama_memory_seq_rm(llama_get_memory(dft_ctx), s.seq, ddepth0, -1);
    pass_last_n = 0;  // the next round's pass follows the probe's: no steady pass
    const double t1 = best[1];
    if (!(t1 < 1e29)) { SPR_LOG_WARN("cost probe failed"); cost_probe_due = true; return; }
    CostModel cm{std::vector<double>(static_cast<size_t>(n_max) + 1, 0.0), 0.0, 0.0};
    cm.v[1] = 1.0;
    for (int32_t n : kProbeSizes)
        if (best[std::min(n, n_max)] < 1e29) cm.v[std::min(n, n_max)] = best[std::min(n, n_max)] / t1;
    if (dft_ctx) {
        draft_threads = c_all <= c_one ? nt : 1;
        // batches (catching up after plain rounds, tree levels) keep every thread
        llama_set_n_threads(dft_ctx, draft_threads, nt);
        // an untimed draft (no room) is priced at a tenth of a target pass until rounds time it
        cm.c = timed_draft ? std::min(c_all, c_one) / t1 : 0.1;
    }
    cost_est.seed(cm, t1);
    cost_threads   = nt;
    cost_next_save = 0;  // saved now (cost_publish), again once rounds have refined it
    cost_publish();
    SPR_LOG_INFO("cost probe on %d thread(s) at depth %d in %.0f ms: %s (draft on %d thread(s))", nt, depth,
                 ms_since(t_start), cost_line(cost, t_target_1).c_str(), draft_threads);
}

}  // namespace specrpc
