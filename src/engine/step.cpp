// One round of generation for every active slot (Engine::Impl::step), told in four functions:
//
//   1. step_draft.     Each slot asks its drafter chain for up to γ tokens (γ from the adaptive
//                      policy); the first drafter that proposes wins. Model drafts are made for
//                      all slots at once.
//   2. step_verify.    One target pass over [pending, draft...] of every slot (a single llama_decode).
//   3. step_accept.    The verifier walks the draft with p, the target's transformed distribution at
//                      each node (penalties/grammar advanced along the draft path). Greedy: accept
//                      while draft == argmax p. Sampled: rejection sampling (speculative/verify.h). Either
//                      way one extra token comes from the target: the correction at the first
//                      rejection or the bonus after a full accept. So each round emits accepted + 1.
//   4. step_book_keep. Drop the rejected KV cells, emit the tokens (advancing the sampler state),
//                      update n-gram caches, statistics and the draft-length policy.
//
// Plain decoding is the same round with γ = 0.
#include <algorithm>
#include <cmath>

#include "common/log.h"
#include "engine/engine_impl.h"
#include "engine/test_hooks.h"
#include "engine/tokenizer.h"
#include "llama.h"
#include "speculative/prompt_lookup.h"
#include "speculative/tree_layout.h"
#include "engine/verifier_choice.h"

namespace specrpc {

namespace test_hooks {
std::atomic<bool> verified_probes{false};
std::atomic<bool> shadow_every_draft{false};
std::atomic<int64_t> shadow_coupled{0}, shadow_coupled_kept{0};
}  // namespace test_hooks

// Synthetic drafter (tests/benchmarks only): proposes the continuation of a reference sequence,
// replacing the token at draft position i by a wrong one unless a deterministic hash of
// (output position, i) falls below rates[i]. Per-position acceptance is then exactly rates[i]
// when the reference is the target's own greedy output.
static std::vector<token_id> synth_draft(const SpecParams & sp, size_t n_out, int32_t gamma, int32_t n_vocab) {
    std::vector<token_id> d;
    if (sp.synth_rates.empty() || sp.synth_reference.empty()) return d;
    for (int32_t i = 0; i < gamma && n_out + i < sp.synth_reference.size(); ++i) {
        token_id t    = sp.synth_reference[n_out + i];
        uint64_t h    = (n_out + static_cast<uint64_t>(i)) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull * (i + 1);
        h ^= h >> 31; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 27;
        double   u    = static_cast<double>(h >> 11) / static_cast<double>(1ull << 53);
        float    rate = sp.synth_rates[std::min<size_t>(i, sp.synth_rates.size() - 1)];
        d.push_back(u < rate ? t : (t + 1) % n_vocab);
    }
    return d;
}

// Up to `gamma` tokens from one free drafter (n-gram caches, prompt lookup, synthetic); *cls gets
// the proposal's draft class (draft_length.h: prompt lookup's match length, 0 for the others).
std::vector<token_id> Engine::Impl::propose_free(Slot & s, SpecType t, int32_t gamma, int32_t * cls) {
    if (cls) *cls = 0;
    if (gamma <= 0) return {};
    if (t == SpecType::NGRAM) {
        std::lock_guard<std::mutex> lock(ngram_mutex);
        NgramDraftParams np;
        np.ngram_min = s.req.spec.ngram_min;
        np.ngram_max = s.req.spec.ngram_max;
        return ngram_draft(s.all, &s.ctx_ngrams, dyn_ngrams.size() ? &dyn_ngrams : nullptr,
                           has_static_ngrams ? &static_ngrams : nullptr, np, gamma);
    }
    if (t == SpecType::LOOKUP) {
        PromptLookupParams lp;
        // ngram_min's default 1 suits the n-gram caches, whose counts guard 1-grams; a lookup
        // match of 1 token has no such guard and its drafts mostly fail (docs/benchmarks.md)
        lp.n_match_min = std::max(s.req.spec.ngram_min, PromptLookupParams{}.n_match_min);
        lp.n_match_max = s.req.spec.ngram_max;
        int match = 0;
        std::vector<token_id> d = prompt_lookup_draft(s.all, lp, gamma, &match);
        if (cls) *cls = lookup_draft_class(match);
        return d;
    }
    if (t == SpecType::SYNTH) return synth_draft(s.req.spec, s.output.size(), gamma, info.n_vocab);
    if (t == SpecType::SUFFIX) return suffix_chain(s, gamma, cls);
    return {};
}

// Compares the shadow draft with a token plain decoding emitted; a finished comparison (a
// mismatch, or the whole shadow matched) is one observation for the draft-length policy.
void Engine::Impl::shadow_observe(Slot & s, token_id emitted) {
    if (s.shadow.empty()) return;
    if (s.shadow[s.shadow_matched] == emitted && ++s.shadow_matched < s.shadow.size()) return;
    const int n = static_cast<int>(s.shadow.size()), k = static_cast<int>(s.shadow_matched);
    if (!s.policy) {  // a test's shadow (test_hooks::shadow_every_draft): nothing to teach
    } else if (s.shadow_probe) {
        s.policy->observe_shadow_probe(n, k);
        if (!s.shadow_bins.empty()) s.policy->observe_confidence(s.shadow_bins, k);
    } else {
        s.policy->observe(n, k, s.shadow_cls);
    }
    s.drop_shadow();
}

// A probe of a model chain while the policy has the drafter off becomes the slot's shadow, and
// the round decodes plain (DraftLengthPolicy::shadow_probe): the comparison is the verification's
// outcome, or has its law, at the cost of the draft alone.
// - A greedy or one-hot draft (T = 0, sample_and_compare): a token is accepted iff it is the one
//   plain decoding emits.
// - A chain drawn with the target's keyed noise (coupled sampling, verify_coupled.h): its token at
//   output position k is coupled_argmax(q_k, seed, k), and the coupled verifier accepts it iff it
//   equals coupled_argmax(p_k, seed, k), which is the token a plain round emits at k.
// - A sampled chain (x ~ q): the plain rounds draw their tokens coupled with it (step_accept,
//   sample_coupled), each exactly from p and equal to x exactly when token-wise rejection would
//   accept x, so the comparison has the law of the token-wise verifier's outcome. (Block
//   verification, the default, accepts at least as much in expectation: the shadow errs low.)
// A tree, a first look or a slot already comparing a shadow is verified as drafted, and so is a
// probe whose pass the cost curve still guesses (CostEstimator::guessed) while its pass would be
// a sample of the curve (`timed`: CostTracker::samples): a shadow runs no pass, so a first-use
// guess that priced the drafter off would price it so for the whole process (docs/benchmarks.md,
// "The first-use guess kept a drafter off").
void Engine::Impl::probe_in_shadow(Slot & s, bool timed) {
    const size_t n = s.tree.nodes.size() - 1;
    const bool every = test_hooks::shadow_every_draft.load();
    if (every && !s.shadow.empty()) {  // the test's deep shadows: this round decodes plain
        s.tree = draft_tree_init(s.pending);
        s.draft_bins.clear();
        s.draft_path_p.clear();
        return;
    }
    if (n == 0 || !s.shadow.empty() || !s.dft_sampler) return;
    if (!every && (!s.policy || !s.policy->last_decision().probe)) return;
    if (static_cast<size_t>(draft_tree_depth(s.tree)) != n || test_hooks::verified_probes.load()) return;
    // keyed draws (coupled sampling) compare as drawn; tokens sampled from q couple with the plain
    // rounds, which mirostat's (not drawn from a p the coupling could use) cannot
    bool sampled = false;
    for (size_t i = 1; i <= n; ++i) sampled = sampled || !s.tree.nodes[i].q.empty();
    const bool couple = sampled && !verify_coupled_sampling(s.req.sampling, s.req.spec);
    if (couple && s.sampler->mirostat()) return;
    if (!every && timed && !test_hooks::fixed_cost.load() && costs.guessed(static_cast<int32_t>(n) + 1)) return;
    if (!every && !s.policy->shadow_probe()) return;
    for (size_t i = 1; i <= n; ++i) s.shadow.push_back(s.tree.nodes[i].token);
    if (couple)
        for (size_t i = 1; i <= n; ++i) s.shadow_q.push_back(std::move(s.tree.nodes[i].q));
    s.shadow_probe = true;
    s.shadow_cls   = 0;
    s.shadow_bins  = std::move(s.draft_bins);
    s.shadow_bins.resize(std::min(s.shadow_bins.size(), n));
    s.tree = draft_tree_init(s.pending);
    s.draft_bins.clear();
    s.draft_path_p.clear();
}

// Emits one token: stop checks, text stream, probabilities, sampler state. Returns false when the
// request is done (EOS, stop word, n_predict); the caller then finishes the slot.
bool Engine::Impl::emit(Slot & s, token_id tok, int32_t source, const float * logits, const Dist & p) {
    const bool eog = llama_vocab_is_eog(target->vocab(), tok);
    if (eog && !s.req.sampling.ignore_eos) {
        s.result.stop_type = StopType::EOS;
        return false;
    }
    if (Status st = s.sampler->accept(tok); !st) {
        s.result.warnings.push_back(st.message());
        s.result.stop_type = StopType::EOS;
        return false;
    }
    if (s.dft_sampler && !s.dft_sampler->accept(tok)) s.dft_sampler.reset();  // drafting stops, output unaffected
    s.output.push_back(tok);
    s.all.push_back(tok);

    TokenOutput out;
    out.id     = tok;
    out.piece  = token_to_piece(*target, tok);
    out.source = source;
    if (s.req.sampling.n_probs > 0 && logits) {
        std::vector<TokenProb> top = s.req.sampling.post_sampling_probs
            ? Dist(p.begin(), p.begin() + std::min<size_t>(p.size(), s.req.sampling.n_probs))
            : s.sampler->top_probs(logits, s.req.sampling.n_probs);
        out.prob = s.req.sampling.post_sampling_probs ? dist_prob(p, tok) : 0.0f;
        if (!s.req.sampling.post_sampling_probs) {
            // probability of the emitted token under the raw softmax
            auto all = s.sampler->top_probs(logits, info.n_vocab);
            out.prob = dist_prob(all, tok);
        }
        for (const auto & tp : top) out.top.push_back({tp.id, token_to_piece(*target, tp.id), tp.p});
    }
    std::string text = s.text->push(out.piece);
    s.result.tokens.push_back(out);
    if (s.req.stream && s.sink.on_chunk) {
        CompletionChunk c;
        c.content = std::move(text);
        c.tokens.push_back(std::move(out));
        s.sink.on_chunk(c);
    }
    if (s.text->stopped()) return false;
    if (s.req.n_predict >= 0 && static_cast<int32_t>(s.output.size()) >= s.req.n_predict) {
        s.result.stop_type = StopType::LIMIT;
        return false;
    }
    return true;
}

// Makes room when the slot's context is full: shift (keep n_keep, drop half of the rest) or stop.
static bool ensure_room(Engine::Impl & e, Slot & s) {
    if (static_cast<int32_t>(s.cache.size()) + 1 < e.n_ctx_slot) return true;
    if (!s.req.context_shift) return false;
    const int32_t n_past    = static_cast<int32_t>(s.cache.size());
    const int32_t n_keep    = s.req.n_keep < 0 ? s.n_prompt : std::min(s.req.n_keep, n_past / 2);
    const int32_t n_discard = (n_past - n_keep) / 2;
    if (n_discard <= 0) return false;
    for (llama_context * c : {e.ctx, e.dft_ctx}) {
        if (!c) continue;
        auto * mem = llama_get_memory(c);
        if (!llama_memory_can_shift(mem)) return false;
        llama_memory_seq_rm(mem, s.seq, n_keep, n_keep + n_discard);
        llama_memory_seq_add(mem, s.seq, n_keep + n_discard, -1, -n_discard);
    }
    s.cache.erase(s.cache.begin() + n_keep, s.cache.begin() + n_keep + n_discard);
    s.dft_cache.clear();  // re-synced from scratch: positions changed
    if (e.dft_ctx) llama_memory_seq_rm(llama_get_memory(e.dft_ctx), s.seq, -1, -1);
    s.result.truncated = true;
    return true;
}

// How many draft nodes (root excluded) each active slot may verify this round, and γ capped to
// match. The round is one llama_decode, which llama.cpp aborts on beyond n_batch tokens, and
// every node takes a KV cell of its slot: so the batch left after each slot's pending token is
// shared among the slots (water-filling: a slot wanting less leaves the rest to the others), and
// no slot gets more than its free cells (its context plus the tree headroom, minus its cache). A
// model tree grows at most one node per branch per depth, so γ is cut to cap / branches.
std::vector<int32_t> Engine::Impl::draft_node_caps(const std::vector<Slot *> & act) {
    const size_t n = act.size();
    std::vector<int32_t> want(n, 0), branches(n, 1), cap(n, 0);
    for (size_t i = 0; i < n; ++i) {
        const Slot & s = *act[i];
        if (s.gamma <= 0) continue;
        if (chain_has(s.req.spec.types, SpecType::DRAFT) || chain_has(s.req.spec.types, SpecType::SUFFIX))
            branches[i] = std::max(1, std::min(s.req.spec.n_parallel, n_seq_per_slot));
        const int32_t kv_free = n_ctx_slot + kv_tree_headroom - static_cast<int32_t>(s.cache.size()) - 1;
        want[i] = std::max(0, std::min(s.gamma * branches[i], kv_free));
    }
    int32_t left = std::max(0, params.n_batch - static_cast<int32_t>(n));
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return want[a] < want[b]; });
    for (size_t k = 0; k < n; ++k) {
        const size_t i = order[k];
        cap[i] = std::min(want[i], left / static_cast<int32_t>(n - k));
        left -= cap[i];
    }
    for (size_t i = 0; i < n; ++i) act[i]->gamma = std::min(act[i]->gamma, cap[i] / branches[i]);
    return cap;
}

// Builds the verification batch of every slot's [pending, draft...] and decodes it; *n_tok gets
// its size. On failure the cells the pass may have left beyond each slot's cache are dropped.
Status Engine::Impl::verify_pass(const std::vector<Slot *> & act, int32_t * n_tok) {
    *n_tok = 0;
    for (Slot * s : act) *n_tok += static_cast<int32_t>(s->tree.nodes.size());
    llama_batch batch = llama_batch_init(std::max(*n_tok, 1), 0, n_seq_per_slot);
    auto * mem = llama_get_memory(ctx);
    for (Slot * s : act) {
        const DraftTree & t = s->tree;
        // each extra branch sequence starts as a copy of the slot's prefix (shared cells)
        for (int32_t b = 1; b < tree_n_branches(t); ++b) {
            llama_memory_seq_rm(mem, s->seq + b, -1, -1);
            llama_memory_seq_cp(mem, s->seq, s->seq + b, -1, -1);
        }
        s->batch_idx.assign(t.nodes.size(), -1);
        const std::vector<std::vector<int32_t>> seqs = tree_node_seqs(t, s->seq, n_seq_per_slot);
        for (size_t i = 0; i < t.nodes.size(); ++i) {
            int32_t k = batch.n_tokens++;
            batch.token[k] = t.nodes[i].token;
            batch.pos[k]   = static_cast<llama_pos>(s->cache.size() + tree_node_depth(t, static_cast<int32_t>(i)));
            batch.n_seq_id[k] = static_cast<int32_t>(seqs[i].size());
            for (size_t j = 0; j < seqs[i].size(); ++j) batch.seq_id[k][j] = seqs[i][j];
            batch.logits[k] = 1;
            s->batch_idx[i] = k;
        }
    }
    Status st = decode_or_error(ctx, batch, "verification");
    llama_batch_free(batch);
    if (!st)
        for (Slot * s : act) {
            llama_memory_seq_rm(mem, s->seq, static_cast<llama_pos>(s->cache.size()), -1);
            for (int32_t b = 1; b < n_seq_per_slot; ++b) llama_memory_seq_rm(mem, s->seq + b, -1, -1);
        }
    return st;
}

// A round as one debug line per slot (SPECRPC_LOG=debug), for accounting where a request's time
// went: bench/round_account.py reads these lines. Times are the round's, shared by its slots.
namespace {
struct RoundTrace {
    int32_t slot = 0, depth = 0, gamma = 0, drafted = 0, accepted = 0;
    double  predicted = 1.0;  // the policy's S for the γ it chose
    double  empty     = 0;    // the policy's share of empty rounds (observe_empty)
    bool    off       = false;
    bool    stop_cut  = false;  // the confidence stop cut the draft
    char    why       = '-';    // a γ > 0 the policy chose past what pays: p probe, e exploration,
                                // s switch-on after plain rounds (GammaDecision); '-' otherwise
};
}  // namespace

static RoundTrace round_trace(const Slot & s, const Verdict & v) {
    RoundTrace t;
    t.slot     = s.id;
    t.depth    = static_cast<int32_t>(s.cache.size());
    t.gamma    = s.gamma;
    t.drafted  = static_cast<int32_t>(s.tree.nodes.size()) - 1;
    t.accepted = static_cast<int32_t>(v.vr.accepted_nodes.size());
    if (s.policy) {
        const GammaDecision & d = s.policy->last_decision();
        t.predicted = d.predicted;
        t.off       = d.off;
        t.empty     = s.policy->empty_share();
        t.why       = d.probe ? 'p' : d.explore ? 'e' : d.switch_on ? 's' : '-';
    }
    t.stop_cut = s.stop_cut;
    return t;
}

static void log_round(const RoundTrace & t, const RoundTimes & r, double round_ms, size_t n_slots) {
    SPR_LOG_DEBUG("round: slot %d depth %d gamma %d drafted %d accepted %d off %d predicted %.3f "
                  "verify %.3f draft %.3f all %.3f ms slots %zu stop_cut %d empty_share %.3f why %c",
                  t.slot, t.depth, t.gamma, t.drafted, t.accepted, t.off ? 1 : 0, t.predicted, r.verify_ms,
                  r.draft_ms, round_ms, n_slots, t.stop_cut ? 1 : 0, t.empty, t.why);
}

void Engine::Impl::step() {
    std::vector<Slot *> act;
    for (auto & s : slots)
        if (s.active) {
            if (!ensure_room(*this, s)) { finish(s, StopType::CONTEXT); continue; }
            act.push_back(&s);
        }
    if (act.empty()) return;
    costs.before_round(*this, act);  // a fresh engine: the first round plain, then the bounded cost probe
    const auto t_round = Clock::now();

    RoundTimes r;
    r.one_slot = act.size() == 1;
    r.draft_ms = step_draft(act);
    if (Status st = step_verify(act, r); !st) {
        for (Slot * s : act) fail(*s, st);
        return;
    }
    const bool trace = log_get_level() == LogLevel::DEBUG;
    std::vector<RoundTrace> traced;
    for (Slot * s : act) {
        const auto t_accept = Clock::now();
        Verdict v;
        if (Status st = step_accept(*s, v); !st) { fail(*s, st); continue; }
        if (trace) traced.push_back(round_trace(*s, v));
        step_book_keep(*s, v, r, t_accept);
    }
    // The per-round overhead o of a speculative round: setting up the draft, sampling and testing
    // γ + 1 positions, i.e. what the round took beyond its draft and its target pass.
    const double round_ms = ms_since(t_round);
    if (r.drafted) costs.observe_round_overhead(round_ms - r.verify_ms - r.draft_ms);
    for (const RoundTrace & t : traced) log_round(t, r, round_ms, act.size());
}

// Drafters that propose before γ is chosen: those without a model (a proposal costs nothing next
// to a pass) and without a tree of their own (the suffix drafter sizes its tree from the policy).
static bool proposes_first(SpecType t) { return t != SpecType::DRAFT && t != SpecType::SUFFIX; }

// 1. Draft: γ per slot from its policy (capped by the context, n_predict and the batch), then a
// draft from the first drafter of the chain that proposes; model drafts for all slots at once.
// A chain that starts with free drafters asks them first, as far as n_max, and the policy chooses
// γ on what they proposed: its length caps γ and its class (a lookup's match length) picks the
// acceptance profile γ is chosen on. Returns the ms the step took.
double Engine::Impl::step_draft(const std::vector<Slot *> & act) {
    const auto t0 = Clock::now();
    std::vector<Slot *> want_model;
    std::vector<char>   off(act.size(), 0);
    std::vector<size_t> n_asked(act.size(), 0);  // the chain's leading free drafters asked first
    // the suffix drafter's chain, when it was looked at for its class: the shadow draft of a
    // round that then decodes plain (the same call the shadow loop would make)
    std::vector<std::vector<token_id>> suffix_look(act.size());
    std::vector<char>                  looked(act.size(), 0);
    for (size_t i = 0; i < act.size(); ++i) {
        Slot * s = act[i];
        s->tree = draft_tree_init(s->pending);
        s->gamma = 0;
        s->proposal.clear();
        s->proposal_cls = 0;
        s->draft_bins.clear();
        s->draft_path_p.clear();
        s->stop_cut = false;
        if (!s->spec_on) continue;
        // never draft past the context end or past n_predict (the round emits accepted + 1)
        int32_t room = n_ctx_slot - static_cast<int32_t>(s->cache.size()) - 2;
        if (s->req.n_predict >= 0) room = std::min(room, s->req.n_predict - static_cast<int32_t>(s->output.size()) - 1);
        if (room <= 0) continue;
        s->policy->set_cost_model(slot_cost(*s));  // o is re-estimated every round
        int32_t remaining = room + 1;
        for (SpecType t : s->req.spec.types) {
            if (!proposes_first(t)) {
                // The suffix drafter sizes its tree from γ, so it proposes after; its match, known
                // now, still picks the class γ is chosen on. Its chain is only looked at here.
                if (t == SpecType::SUFFIX) {
                    suffix_look[i] = suffix_chain(*s, s->req.spec.n_max, &s->proposal_cls);
                    looked[i]      = 1;
                }
                break;
            }
            ++n_asked[i];
            s->proposal = propose_free(*s, t, std::min(room, s->req.spec.n_max), &s->proposal_cls);
            if (s->proposal.empty()) continue;
            remaining = static_cast<int32_t>(s->proposal.size()) + 1;
            break;
        }
        if (!s->proposal.empty() && s->policy->cost_model().c != 0) {  // no model drafts this round
            CostModel free = s->policy->cost_model();
            free.c = 0;
            s->policy->set_cost_model(std::move(free));
        }
        s->gamma = s->policy->next_gamma(remaining, s->proposal_cls);
        off[i] = s->policy->last_decision().off;
    }
    std::vector<int32_t> node_cap = draft_node_caps(act);
    for (size_t i = 0; i < act.size(); ++i) {
        Slot * s = act[i];
        if (!s->spec_on) continue;
        s->stats.add_decision(s->gamma, off[i]);
        if (s->gamma <= 0) continue;
        if (!s->proposal.empty()) {
            s->proposal.resize(std::min<size_t>(s->proposal.size(), static_cast<size_t>(s->gamma)));
            s->tree = draft_tree_chain(s->pending, s->proposal);
            continue;
        }
        const auto & types = s->req.spec.types;
        for (size_t k = n_asked[i]; k < types.size(); ++k) {  // those asked above proposed nothing
            const SpecType t = types[k];
            if (t == SpecType::DRAFT) { want_model.push_back(s); break; }
            if (t == SpecType::SUFFIX) { if (propose_suffix(*s, node_cap[i])) break; continue; }
            std::vector<token_id> d = propose_free(*s, t, s->gamma);
            if (!d.empty()) { s->tree = draft_tree_chain(s->pending, d); break; }
        }
    }
    // Shadow drafts for free drafters whose round decodes plain (see Slot::shadow): switched off
    // by the policy, or declined by the drafter itself. The suffix drafter sizes its tree with the
    // policy's α and proposes nothing when α is low; no round then taught the policy anything, and
    // α stayed low for good (0 tokens drafted through whole requests of text it could copy).
    for (size_t i = 0; i < act.size(); ++i) {
        Slot * s = act[i];
        if (!s->spec_on || !s->free_drafters || s->tree.nodes.size() > 1 || !s->shadow.empty()) continue;
        s->shadow     = s->proposal;
        s->shadow_cls = s->proposal_cls;
        const auto & types = s->req.spec.types;
        for (size_t k = n_asked[i]; k < types.size() && s->shadow.empty(); ++k) {  // the others proposed nothing
            if (k == n_asked[i] && looked[i]) {  // the suffix drafter's chain, its class set above
                s->shadow = std::move(suffix_look[i]);
                continue;
            }
            s->shadow = propose_free(*s, types[k], s->req.spec.n_max, &s->shadow_cls);
        }
        s->shadow_matched = 0;
    }
    if (!want_model.empty()) {
        auto td = Clock::now();
        const double catch_up_ms = draft_with_model(want_model);
        int32_t n_drafted_tok = 0;
        for (Slot * s : want_model) n_drafted_tok += static_cast<int32_t>(s->tree.nodes.size()) - 1;
        // c is the cost of a drafted token in a round that follows a speculative one; catching
        // the draft up after plain rounds is paid once per switch-on, not per drafted token
        // (counted in, it would make a short probe after many plain rounds look prohibitive).
        if (want_model.size() == 1 && thread_choice.threads() == costs.threads())
            costs.observe_draft(std::max(1, n_drafted_tok), ms_since(td) - catch_up_ms);
        // ... but it is work all the same: a probe pays it from its budget
        // (not under a test's fixed curve: timed, it would make the probes the policy runs, and
        // with them the test's outcome, depend on the machine's timings)
        if (costs.t1() > 0 && !test_hooks::fixed_cost.load())
            for (Slot * s : want_model) s->policy->add_catch_up(s->catch_up_ms / costs.t1());
        // Under the confidence stop, a chain it cut too short to pay for its pass (one unsure
        // token after another) is not verified: a deterministic draft, so nothing to bias.
        for (Slot * s : want_model)
            if (!s->draft_path_p.empty() && static_cast<int32_t>(s->draft_path_p.size()) < s->gamma &&
                s->policy->stop_below() > 0 && !s->policy->chain_pays(s->draft_path_p)) {
                s->tree = draft_tree_init(s->pending);
                s->draft_bins.clear();
            }
        const bool timed = costs.samples(act.size() == 1, thread_choice.threads());
        for (Slot * s : want_model) probe_in_shadow(*s, timed);
    }
    // A draft shorter than n_min is not worth a pass, unless it holds sampled tokens: discarding
    // those by a length their own values decided would bias the output (draft_with_model).
    for (size_t i = 0; i < act.size(); ++i) {
        Slot *        s = act[i];
        const int32_t n = static_cast<int32_t>(s->tree.nodes.size()) - 1;
        if (n < std::max(1, s->req.spec.n_min)) {
            const bool sampled = n > 0 && !s->tree.nodes[1].q.empty() &&
                                 test_hooks::draft_bug.load() != DraftBug::NMIN_DISCARDS_SAMPLED;
            if (!sampled) s->tree = draft_tree_init(s->pending);
        }
        // the safety net of draft_node_caps: nodes are in creation order, parents first, so a
        // prefix of them is a tree whose sampled nodes keep their q (later siblings only go)
        if (static_cast<int32_t>(s->tree.nodes.size()) - 1 > node_cap[i]) s->tree.nodes.resize(1 + node_cap[i]);
    }
    return ms_since(t0);
}

// 2. Verify: one target pass over every slot's [pending, draft...]; the logits of node u of a
// slot's tree are then at batch index s->batch_idx[u]. Fills r.verify_ms and r.drafted.
Status Engine::Impl::step_verify(const std::vector<Slot *> & act, RoundTimes & r) {
    const auto t0 = Clock::now();
    const double cpu0 = threads_cpu_mark();
    int32_t n_tok = 0;
    Status st = verify_pass(act, &n_tok);
    if (!st && st.code() != ErrorCode::UNAVAILABLE && n_tok > static_cast<int32_t>(act.size())) {  // not a lost RPC worker
        // Drafts are sized to fit (draft_node_caps); should llama.cpp still refuse the pass, the
        // slots go on without their drafts rather than all failing.
        SPR_LOG_WARN("%s; retrying the round without drafts", st.message().c_str());
        for (Slot * s : act) s->tree = draft_tree_init(s->pending);
        st = verify_pass(act, &n_tok);
    }
    r.drafted   = n_tok > static_cast<int32_t>(act.size());  // some slot verifies a draft
    r.verify_ms = ms_since(t0);
    // a pass on another thread count than the cost curve's is no sample of it
    // depth: the slot's cells before the pass (llama.cpp also counts other slots' cells in the
    // cells a pass attends over, but only a single slot's pass is a sample)
    costs.observe_verify(n_tok, r.verify_ms, act.size() == 1, thread_choice.threads(),
                         act.empty() ? 0 : static_cast<int32_t>(act[0]->cache.size()));
    threads_after_pass(n_tok, r.verify_ms, cpu0);
    return st;
}

// 3. Accept: the verifier walks the draft tree from the root. At node u it needs p(u), the
// target's transformed distribution of the token after u, with penalties and grammar advanced
// along the path root → u; p is computed lazily, only at the nodes the walk reaches (each after
// its parent). Greedy accepts a child while its token is argmax p; the rejection verifiers accept
// x drawn from q with probability min(1, p(x)/q(x)) and on rejection draw from the residual
// norm(max(0, p − q)), so every emitted token has law p exactly (speculative/verify.h). Either way the
// round ends with one token of the target's: the correction at the first rejection or the bonus
// after a full accept, so a round emits accepted + 1 tokens.
Status Engine::Impl::step_accept(Slot & s, Verdict & v) {
    const DraftTree & t = s.tree;
    const size_t n_nodes = t.nodes.size();
    v.p.assign(n_nodes, Dist{});
    std::vector<char> have_p(n_nodes, 0);
    auto p_at = [&](int32_t u) -> const Dist * {
        if (!have_p[u]) {
            v.p[u] = s.sampler->dist(llama_get_logits_ith(ctx, s.batch_idx[u]), tree_path(t, u));
            have_p[u] = 1;
        }
        return &v.p[u];
    };
    if (s.sampler->mirostat()) {
        v.vr.next = s.sampler->sample_mirostat(llama_get_logits_ith(ctx, s.batch_idx[0]));
    } else if (p_at(0)->empty()) {
        v.vr.next = -1;  // the grammar allows nothing: end the request
    } else if (n_nodes == 1 && s.shadow_matched < s.shadow_q.size()) {
        // a plain round beside a sampled probe in shadow (probe_in_shadow): its token, drawn
        // exactly from p, is the shadow's next token exactly when token-wise verification would
        // have accepted it
        Result<token_id> y = couple_with_shadow(s, *p_at(0));
        if (!y) return y.status();
        v.vr.next = y.value();
    } else {
        // engine/verifier_choice.h: greedy, token-wise, block or coupled (keyed by output position)
        Result<VerifyResult> r = verify_run(verify_choose(s.req.sampling, s.req.spec, t), t, DistAt(p_at),
                                            s.sampler->rng(), s.sampler->params().seed, s.output.size());
        if (!r) return r.status();
        v.vr = std::move(r.value());
    }
    return Status::ok();
}

// The token of a plain round beside a sampled shadow x ~ q: sample_coupled, or under the test's
// SHADOW_REJECTION_DRAWS_P the broken coupling that draws from p after a rejection.
Result<token_id> Engine::Impl::couple_with_shadow(Slot & s, const Dist & p) {
    const token_id x = s.shadow[s.shadow_matched];
    const Dist &   q = s.shadow_q[s.shadow_matched];
    Result<token_id> y = token_id{-1};
    if (test_hooks::draft_bug.load(std::memory_order_relaxed) == DraftBug::SHADOW_REJECTION_DRAWS_P) {
        const double u  = std::uniform_real_distribution<double>(0.0, 1.0)(s.sampler->rng());
        const double qx = q.empty() ? 1.0 : double(dist_prob(q, x));
        y = u < std::min(1.0, double(dist_prob(p, x)) / qx) ? x : sample_from(p, s.sampler->rng());
    } else {
        y = sample_coupled(p, x, q, s.sampler->rng());
    }
    test_hooks::shadow_coupled.fetch_add(1, std::memory_order_relaxed);
    if (y && y.value() == x) test_hooks::shadow_coupled_kept.fetch_add(1, std::memory_order_relaxed);
    return y;
}

// 4. Book-keep: the KV keeps [pending, accepted...] on the slot's main sequence and the rejected
// cells go; the emitted tokens advance the sampler, the text and the stop conditions (emit); the
// policy, the shadow draft, the n-gram cache and the statistics learn from the round.
void Engine::Impl::step_book_keep(Slot & s, const Verdict & v, const RoundTimes & r, Clock::time_point t_accept) {
    const DraftTree &    t  = s.tree;
    const VerifyResult & vr = v.vr;
    const size_t n_nodes = t.nodes.size();
    const int32_t n_acc   = static_cast<int32_t>(vr.accepted_nodes.size());
    const llama_pos base  = static_cast<llama_pos>(s.cache.size());
    auto * mem = llama_get_memory(ctx);
    const int32_t last = n_acc ? vr.accepted_nodes.back() : 0;
    const int32_t branch = tree_node_branch(t, last);
    if (branch != 0) {  // the accepted path lives on a side branch: move it to the main sequence
        if (test_hooks::draft_bug.load(std::memory_order_relaxed) != DraftBug::TREE_KEEPS_REJECTED)
            llama_memory_seq_rm(mem, s.seq, base + 1, -1);
        llama_memory_seq_cp(mem, s.seq + branch, s.seq, base + 1, base + 1 + n_acc);
    }
    llama_memory_seq_rm(mem, s.seq, base + 1 + n_acc, -1);
    for (int32_t b = 1; b < n_seq_per_slot; ++b) llama_memory_seq_rm(mem, s.seq + b, -1, -1);
    s.cache.push_back(s.pending);
    for (int32_t n : vr.accepted_nodes) s.cache.push_back(t.nodes[n].token);

    // statistics and policy
    s.n_passes++;
    const int32_t n_drafted = static_cast<int32_t>(n_nodes) - 1;
    // A round the confidence stop left with nothing worth verifying decoded plain after running
    // the draft: what it cost beyond a plain round is its draft step (on one slot, timed; else
    // unknown), which the policy weighs against what its verified rounds deliver. A catch-up on
    // tokens emitted while off is paid once per switch-on, not by every empty round (counted in,
    // the first round after a plain stretch priced the stop's rounds off for good).
    if (s.policy && n_drafted == 0 && s.stop_cut) {
        const bool   timed = r.one_slot && costs.t1() > 0 && !test_hooks::fixed_cost.load();
        const double ms    = std::max(0.0, r.draft_ms - s.catch_up_ms);
        s.policy->observe_empty(timed ? ms / costs.t1() : -1.0);
        s.stats.add_empty(ms);
    }
    if (s.policy && n_drafted > 0) {
        // positions at risk: the whole depth, unless the accepted path ended at a leaf
        bool at_leaf = true;
        for (size_t i = 1; i < n_nodes; ++i)
            if (t.nodes[i].parent == last) { at_leaf = false; break; }
        s.policy->observe(at_leaf ? n_acc : draft_tree_depth(t), n_acc, s.proposal_cls);
        if (!s.draft_bins.empty()) {  // a chain: bins[i] is the token at depth i + 1
            // (the node cap may have trimmed the chain; the bins are cleared next round)
            s.draft_bins.resize(std::min(s.draft_bins.size(), static_cast<size_t>(n_drafted)));
            s.policy->observe_confidence(s.draft_bins, n_acc);
        }
    }

    // emit accepted draft tokens, then the target's own token
    bool go = true;
    int32_t parent = 0;
    for (int32_t n : vr.accepted_nodes) {
        go = emit(s, t.nodes[n].token, tree_node_branch(t, n) + 1, llama_get_logits_ith(ctx, s.batch_idx[parent]), v.p[parent]);
        parent = n;
        if (!go) break;
    }
    if (go) {
        if (vr.next < 0) { s.result.stop_type = StopType::EOS; s.result.warnings.push_back("grammar allows no further token"); go = false; }
        else go = emit(s, vr.next, 0, llama_get_logits_ith(ctx, s.batch_idx[last]), v.p[last]);
    }
    s.pending = vr.next;
    if (n_drafted == 0 && !s.shadow.empty()) {
        if (!s.output.empty() && s.output.back() == vr.next) shadow_observe(s, vr.next);
    } else if (n_drafted > 0) {
        s.drop_shadow();  // a real draft was verified: the shadow is stale
    }
    if (s.feeds_ngrams) s.ctx_ngrams.update(s.all, static_cast<size_t>(n_acc + 1));
    if (n_drafted > 0)
        s.stats.add_round(n_drafted, n_acc, r.draft_ms, r.verify_ms, ms_since(t_accept), draft_tree_depth(t));
    if (!go) finish(s, s.result.stop_type == StopType::NONE ? StopType::EOS : s.result.stop_type);
}

}  // namespace specrpc
