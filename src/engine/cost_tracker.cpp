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
#include "engine/test_hooks.h"
#include "llama.h"

namespace specrpc {

namespace test_hooks {
std::atomic<bool> force_cost_probe{false};
std::atomic<const CostModel *> fixed_cost{nullptr};
}  // namespace test_hooks

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

void CostMemo::clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    records_.clear();
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
    // A curve at v(n) = n would start every later process with speculation off for good (no
    // longer pass would ever run to correct it): such a process guesses afresh instead.
    if (!cost_curve_measured(est_.model())) return;
    CostRecord rec{est_.model(), t_target_1_, draft_threads_};
    rec.cost.o = 0;
    CostMemo::process().put(key_threads_, rec);
    if (Status st = cost_cache_save(cost_cache_dir(), key_threads_, rec); !st)
        SPR_LOG_DEBUG("cost cache not written: %s", st.message().c_str());
}

// A single slot's pass in steady state is a clean sample of v(n): the same size as the last
// round's (after a size change llama.cpp rebuilds the graph and the caches refill, so the first
// passes run slow), and for t(1) the kSteadyPlainRun-th plain pass in a row, as plain decoding runs.
void CostTracker::observe_verify(int32_t n_tok, double ms, bool single_slot, int32_t threads, int32_t depth) {
    pass_run_    = n_tok == pass_last_n_ ? pass_run_ + 1 : 1;
    pass_last_n_ = n_tok;
    if ((guess_due_ || deep_reading_) && single_slot && n_tok == 1 && pass_run_ >= 2) {
        if (threads != t1_threads_) t1_reads_.clear();
        t1_threads_ = threads;
        t1_reads_.push_back(ms);
    }
    if (!samples(single_slot, threads)) return;
    est_.observe_pass(n_tok, ms, pass_run_ >= (n_tok == 1 ? kSteadyPlainRun : 2), depth);
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
    for (size_t n : {2, 4, 8, 16, 32})
        if (n < cm.v.size()) {
            std::snprintf(buf, sizeof buf, " v(%zu)=%.2f", n, cm.v[n]);
            vs += buf;
        }
    std::snprintf(buf, sizeof buf, " c=%.3f", cm.c);
    return vs + buf;
}

// The draft model's share of the target's bytes (0 without one): what the first-use guess prices
// a drafted token from.
static double draft_bytes_ratio(const Engine::Impl & e) {
    if (!e.dft_ctx) return 0.0;
    const double tb = double(llama_model_size(e.target->get()));
    return tb > 0 ? double(llama_model_size(e.draft->get())) / tb : 1.0;
}

// The key names what the costs depend on: model files, threads, cache layout, attention path,
// CPU, llama.cpp build.
void CostTracker::start(Engine::Impl & e) {
    measured_ = true;
    key_ = "target " + file_identity(e.params.target.path) + "\ndraft " + file_identity(e.params.draft.path) +
           "\nthreads " + std::to_string(e.params.n_threads) + " unified " + std::to_string(e.kv_unified) +
           " flash_attn " + std::to_string(e.info.flash_attn) + "/" + std::to_string(e.info.draft_flash_attn) +
           " kv_f32 " + std::to_string(e.params.kv_f32) + "\ncpu " + cpu_identity() + "\nllama " +
           llama_lib_identity() + "\nprobe 3";  // 2: timed behind kProbeDepth cells; 3: to kCurveMax tokens
    // Over RPC a pass costs round trips too: a curve measured locally (or via other workers) does not apply.
    for (const std::string & ep : e.params.target.rpc_servers) key_ += "\nrpc " + ep;
    looked_up_ = e.params.n_threads;
    if (from_cache(e, e.params.n_threads)) return;
    cost_      = CostModel{{0.0, 1.0}, 0.0, 0.02};  // v(n) = n until guessed; the rounds are held
    guess_due_ = true;
}

int32_t CostTracker::curve_len(const Engine::Impl & e) { return std::min(kCurveMax, e.params.n_batch); }

// The first use of a configuration on this machine: the guessed curve with t(1) read from the
// plain passes the request ran anyway (the median of kGuessT1Passes: noise only adds time, but a
// t(1) read low would price every longer pass high and keep speculation off).
void CostTracker::guess(Engine::Impl & e, int32_t nt) {
    const int32_t n_max = curve_len(e);
    est_.seed(cost_guess_curve(n_max, draft_bytes_ratio(e)), median_ms(t1_reads_), true);
    guess_due_     = false;
    deep_due_      = true;
    threads_       = nt;
    key_threads_   = key_for(e, nt);
    draft_threads_ = nt;
    if (e.dft_ctx) llama_set_n_threads(e.dft_ctx, nt, nt);
    cost_.o    = 0.02;
    next_save_ = 16;  // saved once t(1) is read at depth (before_round), or rounds have measured something
    publish();
    SPR_LOG_INFO("cost curve guessed on %d thread(s), t(1) from %zu plain passes: %s", nt, t1_reads_.size(),
                 cost_line(cost_, t_target_1_).c_str());
    t1_reads_.clear();
}

// The key of a curve timed on nt threads: the engine's own key, or with the thread count it ran
// on beside a busy process (one), so that such a process does not time its costs every start.
std::string CostTracker::key_for(const Engine::Impl & e, int32_t nt) const {
    const size_t a = key_.find("\nthreads ");
    const size_t b = a == std::string::npos ? a : key_.find(' ', a + 9);
    if (b == std::string::npos || nt == e.params.n_threads) return key_;
    return key_.substr(0, a + 9) + std::to_string(nt) + "-of-" + key_.substr(a + 9);
}

bool CostTracker::from_cache(Engine::Impl & e, int32_t nt) {
    const std::string key = key_for(e, nt);
    std::optional<CostRecord> rec = CostMemo::process().get(key);
    const std::string dir = cost_cache_dir();
    if (!rec && (rec = cost_cache_load(dir, key))) {
        SPR_LOG_INFO("cost model from %s", cost_cache_path(dir, key).c_str());
        CostMemo::process().put(key, *rec);
    }
    if (!rec || (e.dft_ctx && rec->draft_threads < 1)) return false;
    if (!cost_curve_measured(rec->cost)) {  // written before publish() refused such curves
        SPR_LOG_INFO("cached cost curve prices every pass at its length: guessed again");
        return false;
    }
    CostModel prior = rec->cost;
    const int lowered = cost_clamp_to_guess(prior);
    if (lowered > 0)
        SPR_LOG_INFO("cached cost curve prices %d size(s) above the first-use guess: they start from the guess (%s)",
                     lowered, cost_line(rec->cost, rec->t1_ms).c_str());
    if (cost_clamp_draft_to_guess(prior, draft_bytes_ratio(e)))
        SPR_LOG_INFO("cached draft cost c=%.3f is over %.0fx the first-use guess: it starts from the guess (c=%.3f)",
                     rec->cost.c, kCostCachedDraftSlack, prior.c);
    est_.seed(prior, rec->t1_ms, lowered > 0);
    threads_       = nt;
    key_threads_   = key;
    draft_threads_ = rec->draft_threads;
    // on one thread (beside a busy process) the draft stays there; cpu_threads_apply sets it later
    if (e.dft_ctx && e.thread_choice.threads() == e.params.n_threads)
        llama_set_n_threads(e.dft_ctx, draft_threads_, e.params.n_threads);
    cost_.o    = 0.02;
    next_save_ = 32;
    publish();
    SPR_LOG_INFO("cost curve (cached, %d thread(s)): %s", nt, cost_line(cost_, t_target_1_).c_str());
    return true;
}

void CostTracker::before_round(Engine::Impl & e, const std::vector<Slot *> & act) {
    // A curve of one thread count is replaced when the engine has settled on the other: from the
    // cache, else timed again.
    const int32_t nt = e.thread_choice.threads();
    const bool    settled = e.thread_choice.settled();
    if (measured_ && settled && nt != looked_up_ && (guess_due_ || probe_due_ || (est_.seeded() && threads_ != nt))) {
        looked_up_ = nt;
        if (from_cache(e, nt)) {
            guess_due_ = probe_due_ = false;
        } else if (!guess_due_ && !probe_due_) {
            guess_due_    = true;  // a curve of the other thread count: read t(1) again, guess again
            guess_rounds_ = 0;
        }
    }
    if (guess_due_) {
        if (!settled) t1_reads_.clear();  // t(1) of the thread count the engine keeps
        if (settled && t1_reads_.size() >= size_t(kGuessT1Passes)) {
            guess(e, nt);
        } else if (++guess_rounds_ > kGuessMaxRounds || test_hooks::force_cost_probe.load()) {
            guess_due_ = false;  // never one slot alone: time the costs instead
            probe_due_ = true;
        } else {
            for (Slot * s : act)  // plain rounds until t(1) is read (they cost what plain decoding does)
                if (s->spec_on && s->policy) s->policy->hold(1);
            hold_first_ = false;
            return;
        }
    }
    // t(1) once more behind kDeepT1Depth cells of context: attention over a real context makes a
    // pass dearer (x100M-near: t(1) 4.0 ms right after a short prompt, 4.7-5.0 ms at 128 cells)
    // and the steady passes that refine v(n) run there; divided by a shallow t(1) they read v(16)
    // ~20% steeper and the policy drafts short. The guess's reads are shallow, so they are
    // replaced by reads at depth when a single slot gets there (a few plain rounds, once).
    if (deep_due_ && est_.seeded() && act.size() == 1 && act[0]->cache.size() >= size_t(kDeepT1Depth) &&
        act[0]->spec_on && act[0]->policy && settled && nt == threads_) {
        if (!deep_reading_) {
            deep_reading_ = true;
            t1_reads_.clear();
            pass_last_n_ = 0;  // the first plain pass after speculative ones is no sample
        }
        if (t1_reads_.size() >= size_t(kGuessT1Passes) && t1_threads_ == nt) {
            est_.set_t1(median_ms(t1_reads_), static_cast<int32_t>(act[0]->cache.size()));
            deep_due_ = deep_reading_ = false;
            t1_reads_.clear();
            // Saved now, whatever the rounds have measured: a copy drafts long and runs few passes
            // (16 for 128 tokens, 6 of them observations), and a guess saved only after 16 of those
            // left every such process to guess again, 10 of its 16 rounds plain while t(1) was read.
            next_save_ = 0;
            publish();
            SPR_LOG_INFO("t(1) at depth %zu: %s", act[0]->cache.size(), cost_line(cost_, t_target_1_).c_str());
        } else {
            act[0]->policy->hold(1);
            return;
        }
    } else if (deep_reading_) {
        deep_reading_ = false;  // interrupted (another slot came): read again later
        t1_reads_.clear();
    }
    // the probe times what the engine runs: it waits until the thread choice has settled
    if (probe_due_ && settled)
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
// behind a context of at least kProbeDepth cells (the slot's own, extended by scratch tokens that
// are removed again): right after a short prompt a pass attends over a few cells and v(n) reads
// steeper than in use (v(16) 7.1-7.6 at depth ~1 against 5.5-6.2 at 128 on x100M-near), and the
// policy drafted 6 where 13-15 pays. One prefill and 26 target passes whatever the model.
void CostTracker::probe(Engine::Impl & e, Slot & s) {
    static constexpr int     kProbeRounds   = 2;
    static constexpr int     kProbePlainRun = 4;
    static constexpr int32_t kProbeSizes[]  = {2, 9, 17};
    static constexpr int32_t kChain         = 8;
    static constexpr int32_t kProbeDepth    = 128;
    const int32_t n_max  = std::min<int32_t>(17, e.params.n_batch);  // the longest pass timed
    const int32_t depth0 = static_cast<int32_t>(s.cache.size());
    const int32_t room   = e.n_ctx_slot - n_max - kChain - 2;  // the deepest a probe pass may start
    if (depth0 > room) return;  // no room after this slot's context
    const int32_t depth = std::max(depth0, std::min(kProbeDepth, room));
    probe_due_ = false;
    const auto    t_start = Clock::now();
    const int32_t nt      = e.thread_choice.threads();  // one beside a busy process (thread_choice.h)
    // the round drafts next anyway: catch the draft up now and time its chains at the same depth
    if (e.dft_ctx) e.draft_sync(s);
    const int32_t ddepth0 = static_cast<int32_t>(s.dft_cache.size());
    const int32_t ddepth  = std::max(ddepth0, std::min(depth, room));
    bool ok = scratch_extend(e.ctx, s.seq, depth0, depth, e.info.n_vocab, e.params.n_batch);
    const bool timed_draft = ok && e.dft_ctx && ddepth0 > 0 && ddepth + kChain + 2 <= e.n_ctx_slot &&
                             scratch_extend(e.dft_ctx, s.seq, ddepth0, ddepth, e.draft->n_vocab(), e.params.n_batch);
    std::vector<double> best(static_cast<size_t>(n_max) + 1, 1e30);
    double c_all = 1e30, c_one = 1e30;
    llama_batch bt = llama_batch_init(n_max, 0, 1);
    llama_batch bd = llama_batch_init(1, 0, 1);
    for (int rep = 0; ok && rep < kProbeRounds; ++rep) {
        double t = 1e30;
        for (int k = 0; k < kProbePlainRun; ++k) t = scratch_time_pass(e.ctx, bt, s.seq, depth, 1, e.info.n_vocab);
        best[1] = std::min(best[1], t);
        for (int32_t n : kProbeSizes) {
            n = std::min(n, n_max);
            scratch_time_pass(e.ctx, bt, s.seq, depth, n, e.info.n_vocab);
            best[n] = std::min(best[n], scratch_time_pass(e.ctx, bt, s.seq, depth, n, e.info.n_vocab));
            if (timed_draft && (n == 9 || n == n_max)) {
                const bool one = n == n_max && nt > 1;
                llama_set_n_threads(e.dft_ctx, one ? 1 : nt, nt);
                const double tc = scratch_time_chain(e.dft_ctx, bd, s.seq, ddepth, kChain, e.draft->n_vocab());
                (one ? c_one : c_all) = std::min(one ? c_one : c_all, tc);
            }
        }
    }
    llama_batch_free(bt);
    llama_batch_free(bd);
    llama_memory_seq_rm(llama_get_memory(e.ctx), s.seq, depth0, -1);
    if (e.dft_ctx) llama_memory_seq_rm(llama_get_memory(e.dft_ctx), s.seq, ddepth0, -1);
    pass_last_n_ = 0;  // the next round's pass follows the probe's: no steady pass
    const double t1 = best[1];
    if (!(t1 < 1e29)) { SPR_LOG_WARN("cost probe failed"); probe_due_ = true; return; }
    // a worker lost during the probe: its passes timed placeholder replies, not the target
    if (!e.rpc_status()) { probe_due_ = true; return; }
    // sizes past the probe's are extrapolated from its last two (cost_make_plausible), then refined
    CostModel cm{std::vector<double>(static_cast<size_t>(curve_len(e)) + 1, 0.0), 0.0, 0.0};
    cm.v[1] = 1.0;
    for (int32_t n : kProbeSizes)
        if (best[std::min(n, n_max)] < 1e29) cm.v[std::min(n, n_max)] = best[std::min(n, n_max)] / t1;
    if (e.dft_ctx) {
        draft_threads_ = c_all <= c_one ? nt : 1;
        // batches (catching up after plain rounds, tree levels) keep every thread
        llama_set_n_threads(e.dft_ctx, draft_threads_, nt);
        // an untimed draft (no room) is priced at a tenth of a target pass until rounds time it
        cm.c = timed_draft ? std::min(c_all, c_one) / t1 : 0.1;
    }
    est_.seed(cm, t1);
    threads_     = nt;
    key_threads_ = key_for(e, nt);
    next_save_ = 0;  // saved now (publish), again once rounds have refined it
    publish();
    SPR_LOG_INFO("cost probe on %d thread(s) at depth %d in %.0f ms: %s (draft on %d thread(s))", nt, depth,
                 ms_since(t_start), cost_line(cost_, t_target_1_).c_str(), draft_threads_);
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

bool scratch_extend(llama_context * ctx, int32_t seq, int32_t from, int32_t to, int32_t n_vocab, int32_t n_batch) {
    if (to <= from) return true;
    n_batch = std::max(1, std::min(n_batch, to - from));
    llama_batch b = llama_batch_init(n_batch, 0, 1);
    bool ok = true;
    for (int32_t pos = from; ok && pos < to; pos += n_batch) {
        scratch_fill(b, seq, pos, std::min(n_batch, to - pos), n_vocab, false);
        ++g_scratch_passes;
        ok = llama_decode(ctx, b) == 0;
    }
    llama_batch_free(b);
    return ok;
}

bool scratch_prefill(llama_context * ctx, int32_t seq, int32_t depth, int32_t n_vocab) {
    return scratch_extend(ctx, seq, 0, depth, n_vocab, depth);
}

double scratch_time_pass(llama_context * ctx, llama_batch & b, int32_t seq, int32_t depth, int32_t n, int32_t n_vocab) {
    scratch_fill(b, seq, depth, n, n_vocab, true);
    ++g_scratch_passes;
    const auto t0 = std::chrono::steady_clock::now();
    const int32_t rc = llama_decode(ctx, b);
    llama_synchronize(ctx);  // the whole pass, also on an asynchronous backend (see decode_or_error)
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
        llama_synchronize(ctx);  // a drafted token waits for the one before it
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
