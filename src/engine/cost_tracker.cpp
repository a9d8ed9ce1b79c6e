// The engine's cost tracking (see cost_tracker.h): the cache lookup, the bounded probe, the online
// refinement and the timers the probe runs its passes with.
#include "engine/cost_tracker.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>

#include "common/log.h"
#include "engine/backend.h"
#include "engine/engine_impl.h"
#include "llama.h"

namespace specrpc {

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

CostMemo & CostMemo::process() {
    static CostMemo memo;
    return memo;
}

std::optional<CostRecord> CostMemo::get(const std::string & key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = records_.find(key); it != records_.end()) return it->second;
    return std::nullopt;
}

void CostMemo::put(const std::string & key, const CostRecord & rec) {
    std::lock_guard<std::mutex> lock(mutex_);
    records_[key] = rec;
}

CostCurve CostTracker::snapshot() const {
    std::lock_guard<std::mutex> lock(snapshot_mutex_);
    return snapshot_;
}

void CostTracker::publish() {
    cost_.v     = est_.model().v;
    cost_.c     = est_.model().c;
    t_target_1_ = est_.t1();
    {
        std::lock_guard<std::mutex> lock(snapshot_mutex_);
        snapshot_ = {cost_.v, cost_.c, cost_.o, t_target_1_};
    }
    // Saved after the probe and then at 32, 64, 128, ... observations: the next process starts
    // from what steady passes showed, not from the probe.
    if (est_.n_observed() < next_save_) return;
    next_save_ = std::max<int64_t>(32, 2 * est_.n_observed());
    CostRecord rec{est_.model(), t_target_1_, draft_threads_};
    rec.cost.o = 0;
    CostMemo::process().put(key_, rec);
    if (Status st = cost_cache_save(cost_cache_dir(), key_, rec); !st)
        SPR_LOG_DEBUG("cost cache not written: %s", st.message().c_str());
}

// A single slot's pass in steady state is a clean sample of v(n): the same size as the last
// round's (after a size change llama.cpp rebuilds the graph and the caches refill, so the first
// passes run slow), and for t(1) the kSteadyPlainRun-th plain pass in a row, as plain decoding runs.
void CostTracker::observe_verify(int32_t n_tok, double ms, bool single_slot) {
    pass_run_    = n_tok == pass_last_n_ ? pass_run_ + 1 : 1;
    pass_last_n_ = n_tok;
    if (!single_slot || !measured_ || !est_.seeded()) return;
    est_.observe_pass(n_tok, ms, pass_run_ >= (n_tok == 1 ? kSteadyPlainRun : 2));
    publish();
}

void CostTracker::observe_draft(int32_t n_tokens, double ms) {
    if (n_tokens < 1 || !est_.seeded()) return;
    est_.observe_draft(ms / n_tokens);
    publish();
}

// o, in units of a 1-token target pass, as a moving average over speculative rounds only: plain
// rounds' overhead is part of plain decoding (S(0) = 1), and averaged in, a request that is mostly
// off would price a 16-position round as if it sampled one.
void CostTracker::observe_round_overhead(double ms) {
    if (!measured_ || t_target_1_ <= 0) return;
    const double o = std::max(0.0, ms / t_target_1_);
    cost_.o = 0.9 * cost_.o + 0.1 * o;
    std::lock_guard<std::mutex> lock(snapshot_mutex_);
    snapshot_ = {cost_.v, cost_.c, cost_.o, t_target_1_};
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

// The key names what the costs depend on: model files, threads, cache layout, attention path,
// CPU, llama.cpp build.
void CostTracker::start(Engine::Impl & e) {
    measured_ = true;
    key_ = "target " + file_identity(e.params.target.path) + "\ndraft " + file_identity(e.params.draft.path) +
           "\nthreads " + std::to_string(e.params.n_threads) + " unified " + std::to_string(e.kv_unified) +
           " flash_attn " + std::to_string(e.info.flash_attn) + "/" + std::to_string(e.info.draft_flash_attn) +
           " kv_f32 " + std::to_string(e.params.kv_f32) + "\ncpu " + cpu_identity() + "\nllama " +
           llama_lib_identity() + "\nprobe 1";
    // Over RPC a pass costs round trips too: a curve measured locally (or via other workers) does not apply.
    for (const std::string & ep : e.params.target.rpc_servers) key_ += "\nrpc " + ep;
    std::optional<CostRecord> rec = CostMemo::process().get(key_);
    const std::string dir = cost_cache_dir();
    if (!rec && (rec = cost_cache_load(dir, key_))) {
        SPR_LOG_INFO("cost model from %s", cost_cache_path(dir, key_).c_str());
        CostMemo::process().put(key_, *rec);
    }
    if (!rec || (e.dft_ctx && rec->draft_threads < 1)) {
        cost_      = CostModel{{0.0, 1.0}, 0.0, 0.02};  // v(n) = n until measured; the first round is held
        probe_due_ = true;
        return;
    }
    est_.seed(rec->cost, rec->t1_ms);
    draft_threads_ = rec->draft_threads;
    if (e.dft_ctx) llama_set_n_threads(e.dft_ctx, draft_threads_, e.params.n_threads);
    cost_.o    = 0.02;
    next_save_ = 32;
    publish();
    SPR_LOG_INFO("cost curve (cached): %s", cost_line(cost_, t_target_1_).c_str());
}

void CostTracker::before_round(Engine::Impl & e, const std::vector<Slot *> & act) {
    if (probe_due_)
        for (Slot * s : act)
            if (s->spec_on && s->policy && !s->output.empty()) {
                probe(e, *s);
                if (!probe_due_) break;
            }
    if (!probe_due_ && !hold_first_) return;
    // A slot without a token yet decodes its first round plain (until the probe has run, and in
    // the engine's first speculative round): a speculative first round delivers its first token
    // only after the draft's catch-up on the prompt, γ draft passes and a pass of γ + 1 tokens
    // (~+3 passes on x100M), and a fresh process is judged by that token.
    for (Slot * s : act)
        if (s->spec_on && s->policy && s->output.empty()) {
            s->policy->hold(1);
            hold_first_ = false;
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
// after the slot's own context, at its real depth, and are removed again: 36 target passes and
// 48 draft passes whatever the model, against ~300 and ~180 of the probe of every size 1-17 it
// replaces (3.8 s before the first token on x100M).
void CostTracker::probe(Engine::Impl & e, Slot & s) {
    static constexpr int     kProbeRounds   = 3;
    static constexpr int     kProbePlainRun = 4;
    static constexpr int32_t kProbeSizes[]  = {2, 5, 9, 17};
    static constexpr int32_t kChain         = 8;
    const int32_t n_max = std::min<int32_t>(17, e.params.n_batch);
    const int32_t depth = static_cast<int32_t>(s.cache.size());
    if (depth + n_max + kChain + 2 > e.n_ctx_slot) return;  // no room after this slot's context
    probe_due_ = false;
    const auto t_start = Clock::now();
    // the round drafts next anyway: catch the draft up now and time its chains at the real depth
    if (e.dft_ctx) e.draft_sync(s);
    const int32_t ddepth = static_cast<int32_t>(s.dft_cache.size());
    const bool    timed_draft = e.dft_ctx && ddepth > 0 && ddepth + kChain + 2 <= e.n_ctx_slot;
    std::vector<double> best(static_cast<size_t>(n_max) + 1, 1e30);
    double c_all = 1e30, c_one = 1e30;
    llama_batch bt = llama_batch_init(n_max, 0, 1);
    llama_batch bd = llama_batch_init(1, 0, 1);
    for (int rep = 0; rep < kProbeRounds; ++rep) {
        double t = 1e30;
        for (int k = 0; k < kProbePlainRun; ++k) t = scratch_time_pass(e.ctx, bt, s.seq, depth, 1, e.info.n_vocab);
        best[1] = std::min(best[1], t);
        for (int32_t n : kProbeSizes) {
            n = std::min(n, n_max);
            scratch_time_pass(e.ctx, bt, s.seq, depth, n, e.info.n_vocab);
            best[n] = std::min(best[n], scratch_time_pass(e.ctx, bt, s.seq, depth, n, e.info.n_vocab));
            if (timed_draft && (n == 9 || n == n_max)) {
                const bool one = n == n_max && e.params.n_threads > 1;
                llama_set_n_threads(e.dft_ctx, one ? 1 : e.params.n_threads, e.params.n_threads);
                const double tc = scratch_time_chain(e.dft_ctx, bd, s.seq, ddepth, kChain, e.draft->n_vocab());
                (one ? c_one : c_all) = std::min(one ? c_one : c_all, tc);
            }
        }
    }
    llama_batch_free(bt);
    llama_batch_free(bd);
    pass_last_n_ = 0;  // the next round's pass follows the probe's: no steady pass
    const double t1 = best[1];
    if (!(t1 < 1e29)) { SPR_LOG_WARN("cost probe failed"); probe_due_ = true; return; }
    CostModel cm{std::vector<double>(static_cast<size_t>(n_max) + 1, 0.0), 0.0, 0.0};
    cm.v[1] = 1.0;
    for (int32_t n : kProbeSizes)
        if (best[std::min(n, n_max)] < 1e29) cm.v[std::min(n, n_max)] = best[std::min(n, n_max)] / t1;
    if (e.dft_ctx) {
        draft_threads_ = c_all <= c_one ? e.params.n_threads : 1;
        // batches (catching up after plain rounds, tree levels) keep every thread
        llama_set_n_threads(e.dft_ctx, draft_threads_, e.params.n_threads);
        // an untimed draft (no room) is priced at a tenth of a target pass until rounds time it
        cm.c = timed_draft ? std::min(c_all, c_one) / t1 : 0.1;
    }
    est_.seed(cm, t1);
    next_save_ = 0;  // saved now (publish), again once rounds have refined it
    publish();
    SPR_LOG_INFO("cost probe at depth %d in %.0f ms: %s (draft on %d thread(s))", depth, ms_since(t_start),
                 cost_line(cost_, t_target_1_).c_str(), draft_threads_);
}

// --- the probe's timers ----------------------------------------------------------------------

static std::atomic<int64_t> g_scratch_passes{0};
int64_t scratch_pass_count() { return g_scratch_passes.load(); }

// Fills b with n tokens of sequence seq at positions pos0.., all with or without logits.
static void scratch_fill(llama_batch & b, int32_t seq, int32_t pos0, int32_t n, int32_t n_vocab, bool logits) {
    b.n_tokens = n;
    for (int32_t i = 0; i < n; ++i) {
        b.token[i] = 1 + (pos0 + i) % std::max(1, n_vocab - 1); b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1; b.seq_id[i][0] = seq; b.logits[i] = logits;
    }
}

bool scratch_prefill(llama_context * ctx, int32_t seq, int32_t depth, int32_t n_vocab) {
    if (depth <= 0) return true;
    llama_batch b = llama_batch_init(depth, 0, 1);
    scratch_fill(b, seq, 0, depth, n_vocab, false);
    ++g_scratch_passes;
    const bool ok = llama_decode(ctx, b) == 0;
    llama_batch_free(b);
    return ok;
}

double scratch_time_pass(llama_context * ctx, llama_batch & b, int32_t seq, int32_t depth, int32_t n, int32_t n_vocab) {
    scratch_fill(b, seq, depth, n, n_vocab, true);
    ++g_scratch_passes;
    const auto t0 = std::chrono::steady_clock::now();
    const int32_t rc = llama_decode(ctx, b);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    llama_memory_seq_rm(llama_get_memory(ctx), seq, depth, -1);
    return rc == 0 ? ms : 1e30;
}

double scratch_time_chain(llama_context * ctx, llama_batch & b, int32_t seq, int32_t depth, int32_t n, int32_t n_vocab) {
    int32_t rc = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t i = 0; i < n && rc == 0; ++i) {
        scratch_fill(b, seq, depth + i, 1, n_vocab, true);
        ++g_scratch_passes;
        rc = llama_decode(ctx, b);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    llama_memory_seq_rm(llama_get_memory(ctx), seq, depth, -1);
    return rc == 0 && n > 0 ? ms / n : 1e30;
}

double median_ms(std::vector<double> ts) {
    if (ts.empty()) return 1e30;
    std::nth_element(ts.begin(), ts.begin() + ts.size() / 2, ts.end());
    return ts[ts.size() / 2];
}

}  // namespace specrpc
